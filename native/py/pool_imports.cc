// Maps the pool buffers of a received set in one call (python/cuda_ipc/ipc/pool.py import_pointers):
// Python calls it through ctypes without the GIL, so the mapping of a first sync runs on its thread
// while the decoding thread plans the update. Through ctypes one driver call at a time, that thread
// had to win the GIL back after each call from a thread busy planning (the interpreter switches
// every 5 ms), and the plan's end found it still mapping (bench:weights on an H200: 9-11 ms of a
// 70-95 ms pool-backed first sync waited for the mapping; with a 0.2 ms switch interval, none).
#include <stddef.h>

#include "py_driver.h"

using namespace cuabi;

// Imports `count` pointers of `pool` (64 bytes of export data each, back to back in `exports`) with
// `context` current: out[i] the address and results[i] the driver's answer (CUDA_SUCCESS or the
// error) of each, all attempted. Returns 0; -1 when the driver cannot be used (nothing attempted;
// cip_torch_last_error says why), or when the context could not be made current (results[] all
// hold that answer).
CIP_EXPORT int cip_pool_import_pointers(unsigned long long context, unsigned long long pool, int count,
                                        const unsigned char* exports, unsigned long long* out, int* results) {
  if (count < 0 || (count > 0 && (!exports || !out || !results))) {
    cip::SetErrorText("cip_pool_import_pointers: bad arguments");
    return -1;
  }
  if (!cip::EnsureLoaded()) return -1;
  auto want = reinterpret_cast<CUcontext>(context);
  auto p = reinterpret_cast<CUmemoryPool>(pool);
  int made = 0;
  CUresult r = cip::InContextOf(want, [&] {
    for (int i = 0; i < count; i++, made++) {
      CUdeviceptr ptr = 0;
      CUmemPoolPtrExportData data;
      __builtin_memcpy(&data, exports + static_cast<size_t>(i) * sizeof data, sizeof data);
      results[i] = static_cast<int>(cip::g_drv.poolImportPointer(&ptr, p, &data));
      out[i] = ptr;
    }
    return CUDA_SUCCESS;
  });
  if (r != CUDA_SUCCESS) {
    cip::SetError("cuCtxSetCurrent (for cip_pool_import_pointers)", r);
    for (int i = made; i < count; i++) {
      results[i] = r;
      out[i] = 0;
    }
    return -1;
  }
  return 0;
}
