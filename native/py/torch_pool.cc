// The allocator behind cuda_ipc.tensors.torch_pool (python/cuda_ipc/tensors/torch_pool.py): PyTorch's
// CUDAPluggableAllocator calls
//   void* cip_torch_alloc(ssize_t size, int device, cudaStream_t stream)
//   void  cip_torch_free(void* ptr, ssize_t size, int device, cudaStream_t stream)
// for the segments of a torch.cuda.MemPool, and these take them from a CUDA memory pool of the
// device made for IPC (cuMemPoolCreate with POSIX file descriptors as its handle type): a model
// allocated under `torch.cuda.use_mem_pool(pool)` lives in one IPC pool, which a peer imports once
// (one fd), then maps each segment from 64 bytes of export data (cuMemPoolImportPointer, about a
// microsecond) instead of opening a legacy handle per segment (cuIpcOpenMemHandle, ~90 us).
//
// One pool per device, made on first use and kept for the life of the process (PyTorch keeps its
// segments cached too); its release threshold is the maximum, so memory freed back to it stays
// reserved instead of going back to the driver at each synchronization. The driver is opened with
// dlopen on first use and its entry points resolved with cuGetProcAddress for the ABI version of
// native/cuda_abi.h, as the addon does (native/driver.cc); this file shares no state with the addon.
//
// An allocation that fails returns NULL (PyTorch then raises its out-of-memory error);
// cip_torch_last_error says what the driver answered. Every call is checked.
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>

#include "../cuda_abi.h"

using namespace cuabi;

#define CIP_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

constexpr int kMaxDevices = 64;

struct Driver {
  PFN_cuInit init;
  PFN_cuGetErrorName errorName;
  PFN_cuDeviceGet deviceGet;
  PFN_cuDevicePrimaryCtxRetain primaryRetain;
  PFN_cuDevicePrimaryCtxRelease primaryRelease;
  PFN_cuCtxGetCurrent ctxGet;
  PFN_cuCtxSetCurrent ctxSet;
  PFN_cuMemPoolCreate poolCreate;
  PFN_cuMemPoolSetAttribute poolSetAttribute;
  PFN_cuMemAllocFromPoolAsync allocFromPool;
  PFN_cuMemFreeAsync freeAsync;
};

Driver g_drv;
bool g_loaded = false;
pthread_once_t g_once = PTHREAD_ONCE_INIT;
pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
// Per device: its pool and primary context (made once, under g_lock; read without it after).
CUmemoryPool g_pools[kMaxDevices];
CUcontext g_contexts[kMaxDevices];
char g_error[256] = "";

void SetError(const char* what, CUresult r) {
  const char* name = nullptr;
  if (g_drv.errorName) g_drv.errorName(r, &name);
  pthread_mutex_lock(&g_lock);
  snprintf(g_error, sizeof g_error, "%s failed: %s (%d)", what, name ? name : "unknown error", r);
  pthread_mutex_unlock(&g_lock);
}

void SetErrorText(const char* text) {
  pthread_mutex_lock(&g_lock);
  snprintf(g_error, sizeof g_error, "%s", text);
  pthread_mutex_unlock(&g_lock);
}

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
  if (!ok) return;
  CUresult r = g_drv.init(0);
  if (r != CUDA_SUCCESS) {
    SetError("cuInit", r);
    return;
  }
  g_loaded = true;
}

// The pool of `device` (made on first use), or nullptr with g_error set.
CUmemoryPool PoolOf(int device) {
  pthread_once(&g_once, Load);
  if (!g_loaded) return nullptr;
  if (device < 0 || device >= kMaxDevices) {
    SetErrorText("device ordinal out of range");
    return nullptr;
  }
  CUmemoryPool pool = __atomic_load_n(&g_pools[device], __ATOMIC_ACQUIRE);
  if (pool) return pool;
  pthread_mutex_lock(&g_lock);
  pool = g_pools[device];
  CUresult r = CUDA_SUCCESS;
  const char* what = nullptr;
  if (!pool) {
    CUdevice dev = 0;
    CUcontext ctx = nullptr;
    CUmemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.handleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    props.location.id = device;
    CUmemoryPool made = nullptr;
    if ((r = g_drv.deviceGet(&dev, device)) != CUDA_SUCCESS) {
      what = "cuDeviceGet";
    } else if ((r = g_drv.primaryRetain(&ctx, dev)) != CUDA_SUCCESS) {
      what = "cuDevicePrimaryCtxRetain";
    } else if ((r = g_drv.poolCreate(&made, &props)) != CUDA_SUCCESS) {
      what = "cuMemPoolCreate (an IPC pool with POSIX fds)";
      g_drv.primaryRelease(dev);
    } else {
      // Keep freed memory reserved. A pool that cannot still works (it returns memory to the
      // driver at synchronizations): the answer is not an error of the allocation.
      cuuint64_t keep = ~static_cast<cuuint64_t>(0);
      (void)g_drv.poolSetAttribute(made, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep);
      g_contexts[device] = ctx;  // (the retain is kept for the pool's life: the process's)
      __atomic_store_n(&g_pools[device], made, __ATOMIC_RELEASE);
      pool = made;
    }
  }
  pthread_mutex_unlock(&g_lock);
  if (what) SetError(what, r);
  return pool;
}

// Runs `fn` with `device`'s primary context current on this thread (PyTorch has it current already;
// anything else is restored after).
template <typename Fn>
CUresult InContext(int device, Fn fn) {
  CUcontext cur = nullptr;
  CUresult r = g_drv.ctxGet(&cur);
  if (r != CUDA_SUCCESS) return r;
  CUcontext want = g_contexts[device];
  if (cur == want) return fn();
  if ((r = g_drv.ctxSet(want)) != CUDA_SUCCESS) return r;
  CUresult out = fn();
  g_drv.ctxSet(cur);
  return out;
}

}  // namespace

CIP_EXPORT void* cip_torch_alloc(ssize_t size, int device, CUstream stream) {
  if (size <= 0) return nullptr;
  CUmemoryPool pool = PoolOf(device);
  if (!pool) return nullptr;
  CUdeviceptr p = 0;
  CUresult r = InContext(device, [&] { return g_drv.allocFromPool(&p, static_cast<size_t>(size), pool, stream); });
  if (r != CUDA_SUCCESS) {
    SetError("cuMemAllocFromPoolAsync", r);
    return nullptr;
  }
  return reinterpret_cast<void*>(p);
}

CIP_EXPORT void cip_torch_free(void* ptr, ssize_t size, int device, CUstream stream) {
  if (!ptr || !g_loaded || device < 0 || device >= kMaxDevices || !__atomic_load_n(&g_pools[device], __ATOMIC_ACQUIRE)) return;
  CUresult r = InContext(device, [&] { return g_drv.freeAsync(reinterpret_cast<CUdeviceptr>(ptr), stream); });
  if (r != CUDA_SUCCESS) SetError("cuMemFreeAsync", r);
}

// The pool of `device` as an address (CUmemoryPool), made now if need be; 0 on failure (see
// cip_torch_last_error).
CIP_EXPORT unsigned long long cip_torch_pool(int device) {
  return reinterpret_cast<unsigned long long>(PoolOf(device));
}

// What the last failure was ("" when none), copied into `out` (NUL-terminated, at most `len` bytes).
CIP_EXPORT void cip_torch_last_error(char* out, int len) {
  if (!out || len <= 0) return;
  pthread_mutex_lock(&g_lock);
  snprintf(out, static_cast<size_t>(len), "%s", g_error);
  pthread_mutex_unlock(&g_lock);
}
