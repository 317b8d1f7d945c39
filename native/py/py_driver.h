// The CUDA driver as the native helper (cuda_ipc_py.so) sees it: libcuda opened with dlopen on first
// use and its entry points resolved with cuGetProcAddress for the ABI version of native/cuda_abi.h, as
// the addon does (native/driver.cc); this library shares no state with the addon. One table for the
// helper's CUDA files (torch_pool.cc, pool_imports.cc), and one last-error text they all set
// (cip_torch_last_error reads it).
#pragma once

#include "../cuda_abi.h"

#define CIP_EXPORT extern "C" __attribute__((visibility("default")))

namespace cip {

struct Driver {
  cuabi::PFN_cuInit init;
  cuabi::PFN_cuGetErrorName errorName;
  cuabi::PFN_cuDeviceGet deviceGet;
  cuabi::PFN_cuDevicePrimaryCtxRetain primaryRetain;
  cuabi::PFN_cuDevicePrimaryCtxRelease primaryRelease;
  cuabi::PFN_cuCtxGetCurrent ctxGet;
  cuabi::PFN_cuCtxSetCurrent ctxSet;
  cuabi::PFN_cuMemPoolCreate poolCreate;
  cuabi::PFN_cuMemPoolSetAttribute poolSetAttribute;
  cuabi::PFN_cuMemAllocFromPoolAsync allocFromPool;
  cuabi::PFN_cuMemFreeAsync freeAsync;
  cuabi::PFN_cuStreamSynchronize streamSynchronize;
  cuabi::PFN_cuCtxSynchronize ctxSynchronize;
  cuabi::PFN_cuMemPoolImportPointer poolImportPointer;
};

extern Driver g_drv;

// Loads the driver once (every later call answers at once); false, with the last error set, when it
// cannot be used.
bool EnsureLoaded();
// Whether it was loaded (without trying).
bool Loaded();

void SetError(const char* what, cuabi::CUresult r);
void SetErrorText(const char* text);
void CopyLastError(char* out, int len);

// Runs `fn` with `want` current on this thread, and the thread's context restored after.
template <typename Fn>
cuabi::CUresult InContextOf(cuabi::CUcontext want, Fn fn) {
  cuabi::CUcontext cur = nullptr;
  cuabi::CUresult r = g_drv.ctxGet(&cur);
  if (r != cuabi::CUDA_SUCCESS) return r;
  if (cur == want) return fn();
  if ((r = g_drv.ctxSet(want)) != cuabi::CUDA_SUCCESS) return r;
  cuabi::CUresult out = fn();
  g_drv.ctxSet(cur);
  return out;
}

}  // namespace cip
