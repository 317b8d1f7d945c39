// Module entry: each native file registers the functions of its concept on the exports object.
#include <napi.h>

namespace cuda_ipc {
// The CUDA driver (driver.h): first, since it makes the environment's state.
void InitDriver(Napi::Env env, Napi::Object exports);
void InitDevices(Napi::Env env, Napi::Object exports);
void InitPeerAccess(Napi::Env env, Napi::Object exports);
void InitMemory(Napi::Env env, Napi::Object exports);
void InitPoolExports(Napi::Env env, Napi::Object exports);
void InitLegacyIpc(Napi::Env env, Napi::Object exports);
void InitStreams(Napi::Env env, Napi::Object exports);
void InitModules(Napi::Env env, Napi::Object exports);
void InitCopy(Napi::Env env, Napi::Object exports);
void InitNvrtc(Napi::Env env, Napi::Object exports);
// POSIX. fd.cc, socket.cc and shared_memory.cc each add to posixConstants, in this order.
void InitFds(Napi::Env env, Napi::Object exports);
void InitSockets(Napi::Env env, Napi::Object exports);
void InitSharedMemory(Napi::Env env, Napi::Object exports);
void InitChannel(Napi::Env env, Napi::Object exports);
void InitCRing(Napi::Env env, Napi::Object exports);
// NCCL (nccl.cc): libnccl.so.2, dlopened by path on first use.
void InitNccl(Napi::Env env, Napi::Object exports);
}  // namespace cuda_ipc

static Napi::Object Init(Napi::Env env, Napi::Object exports) {
  cuda_ipc::InitDriver(env, exports);
  cuda_ipc::InitDevices(env, exports);
  cuda_ipc::InitPeerAccess(env, exports);
  cuda_ipc::InitMemory(env, exports);
  cuda_ipc::InitPoolExports(env, exports);
  cuda_ipc::InitLegacyIpc(env, exports);
  cuda_ipc::InitStreams(env, exports);
  cuda_ipc::InitModules(env, exports);
  cuda_ipc::InitCopy(env, exports);
  cuda_ipc::InitNvrtc(env, exports);
  cuda_ipc::InitFds(env, exports);
  cuda_ipc::InitSockets(env, exports);
  cuda_ipc::InitSharedMemory(env, exports);
  cuda_ipc::InitChannel(env, exports);
  cuda_ipc::InitCRing(env, exports);
  cuda_ipc::InitNccl(env, exports);
  return exports;
}

NODE_API_MODULE(cuda_ipc, Init)
