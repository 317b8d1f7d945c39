// See py_driver.h. Every call is checked; a driver that is missing or too old is said in the last error.
#include "py_driver.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>

using namespace cuabi;

namespace cip {

Driver g_drv;

namespace {

bool g_loaded = false;
pthread_once_t g_once = PTHREAD_ONCE_INIT;
pthread_mutex_t g_error_lock = PTHREAD_MUTEX_INITIALIZER;
char g_error[256] = "";

void Load() {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    SetErrorText("libcuda.so.1 could not be loaded (no NVIDIA driver here)");
    return;
  }
  auto getProc = reinterpret_cast<PFN_cuGetProcAddress_v2>(dlsym(lib, "cuGetProcAddress_v2"));
  if (!getProc) {
    SetErrorText("libcuda.so.1 has no cuGetProcAddress_v2: the NVIDIA driver is older than CUDA 12.0");
    return;
  }
  bool ok = true;
  auto resolve = [&](const char* name, void** out) {
    int status = 0;
    if (getProc(name, out, kCudaAbiVersion, CU_GET_PROC_ADDRESS_DEFAULT, &status) != CUDA_SUCCESS || !*out) {
      char text[128];
      snprintf(text, sizeof text, "the driver does not export %s", name);
      SetErrorText(text);
      ok = false;
    }
  };
  resolve("cuInit", reinterpret_cast<void**>(&g_drv.init));
  resolve("cuGetErrorName", reinterpret_cast<void**>(&g_drv.errorName));
  resolve("cuDeviceGet", reinterpret_cast<void**>(&g_drv.deviceGet));
  resolve("cuDevicePrimaryCtxRetain", reinterpret_cast<void**>(&g_drv.primaryRetain));
  resolve("cuDevicePrimaryCtxRelease", reinterpret_cast<void**>(&g_drv.primaryRelease));
  resolve("cuCtxGetCurrent", reinterpret_cast<void**>(&g_drv.ctxGet));
  resolve("cuCtxSetCurrent", reinterpret_cast<void**>(&g_drv.ctxSet));
  resolve("cuMemPoolCreate", reinterpret_cast<void**>(&g_drv.poolCreate));
  resolve("cuMemPoolSetAttribute", reinterpret_cast<void**>(&g_drv.poolSetAttribute));
  resolve("cuMemAllocFromPoolAsync", reinterpret_cast<void**>(&g_drv.allocFromPool));
  resolve("cuMemFreeAsync", reinterpret_cast<void**>(&g_drv.freeAsync));
  resolve("cuStreamSynchronize", reinterpret_cast<void**>(&g_drv.streamSynchronize));
  resolve("cuCtxSynchronize", reinterpret_cast<void**>(&g_drv.ctxSynchronize));
  resolve("cuMemPoolImportPointer", reinterpret_cast<void**>(&g_drv.poolImportPointer));
  if (!ok) return;
  CUresult r = g_drv.init(0);
  if (r != CUDA_SUCCESS) {
    SetError("cuInit", r);
    return;
  }
  __atomic_store_n(&g_loaded, true, __ATOMIC_RELEASE);
}

}  // namespace

bool EnsureLoaded() {
  pthread_once(&g_once, Load);
  return Loaded();
}

bool Loaded() { return __atomic_load_n(&g_loaded, __ATOMIC_ACQUIRE); }

void SetError(const char* what, CUresult r) {
  const char* name = nullptr;
  if (g_drv.errorName) g_drv.errorName(r, &name);
  pthread_mutex_lock(&g_error_lock);
  snprintf(g_error, sizeof g_error, "%s failed: %s (%d)", what, name ? name : "unknown error", r);
  pthread_mutex_unlock(&g_error_lock);
}

void SetErrorText(const char* text) {
  pthread_mutex_lock(&g_error_lock);
  snprintf(g_error, sizeof g_error, "%s", text);
  pthread_mutex_unlock(&g_error_lock);
}

void CopyLastError(char* out, int len) {
  if (!out || len <= 0) return;
  pthread_mutex_lock(&g_error_lock);
  snprintf(out, static_cast<size_t>(len), "%s", g_error);
  pthread_mutex_unlock(&g_error_lock);
}

}  // namespace cip
