// POSIX primitives: memfd + mmap, Unix sockets with fd passing, uv_poll readiness.
#include "common.h"

namespace cuda_ipc {
void InitPosix(Napi::Env env, Napi::Object exports) {}
}  // namespace cuda_ipc
