// Peer access between devices: near 1:1 bindings of the driver API (driver.h).
#include "driver.h"

namespace cuda_ipc {
using namespace cuabi;

namespace {

Napi::Value DeviceCanAccessPeer(const Napi::CallbackInfo& info) {
  int can = 0;
  CU_CALL(info.Env(), cuDeviceCanAccessPeer, &can, ArgI32(info, 0, "device"), ArgI32(info, 1, "peer"));
  return Napi::Boolean::New(info.Env(), can != 0);
}

// deviceGetP2PAttribute(attribute, srcDevice, dstDevice): the link from src to dst. The driver
// refuses src == dst (CUDA_ERROR_INVALID_DEVICE); TypeScript never asks that.
Napi::Value DeviceGetP2PAttribute(const Napi::CallbackInfo& info) {
  int v = 0;
  CU_CALL(info.Env(), cuDeviceGetP2PAttribute, &v, ArgI32(info, 0, "attribute"), ArgI32(info, 1, "srcDevice"),
          ArgI32(info, 2, "dstDevice"));
  return Napi::Number::New(info.Env(), v);
}

// ctxEnablePeerAccess(peerContext): lets the current context use memory of peerContext. Returns
// true when enabled now, false when it already was (CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED).
Napi::Value CtxEnablePeerAccess(const Napi::CallbackInfo& info) {
  CUresult r;
  CU_CALL_STATUS(info.Env(), r, cuCtxEnablePeerAccess, ArgHandle<CUcontext>(info, 0, "peerContext"), 0);
  if (r == CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED) return Napi::Boolean::New(info.Env(), false);
  if (r != CUDA_SUCCESS) ThrowCuda(info.Env(), r, "cuCtxEnablePeerAccess");
  return Napi::Boolean::New(info.Env(), true);
}

}  // namespace

void InitPeerAccess(Napi::Env env, Napi::Object exports) {
  exports.Set("deviceCanAccessPeer", Napi::Function::New(env, DeviceCanAccessPeer, "deviceCanAccessPeer"));
  exports.Set("deviceGetP2PAttribute", Napi::Function::New(env, DeviceGetP2PAttribute, "deviceGetP2PAttribute"));
  exports.Set("ctxEnablePeerAccess", Napi::Function::New(env, CtxEnablePeerAccess, "ctxEnablePeerAccess"));
}

}  // namespace cuda_ipc
