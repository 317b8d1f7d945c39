// Module entry: each native file registers its own functions on the exports object.
#include <napi.h>

namespace cuda_ipc {
void InitCuda(Napi::Env env, Napi::Object exports);
void InitPosix(Napi::Env env, Napi::Object exports);
void InitNvrtc(Napi::Env env, Napi::Object exports);
void InitChannel(Napi::Env env, Napi::Object exports);
void InitCopy(Napi::Env env, Napi::Object exports);  // [tensors hook] native/copy.cc
void InitNccl(Napi::Env env, Napi::Object exports);  // native/nccl.cc
}  // namespace cuda_ipc

static Napi::Object Init(Napi::Env env, Napi::Object exports) {
  cuda_ipc::InitCuda(env, exports);
  cuda_ipc::InitPosix(env, exports);
  cuda_ipc::InitNvrtc(env, exports);
  cuda_ipc::InitChannel(env, exports);
  cuda_ipc::InitCopy(env, exports);
  cuda_ipc::InitNccl(env, exports);
  return exports;
}

NODE_API_MODULE(cuda_ipc, Init)
