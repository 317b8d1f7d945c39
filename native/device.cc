// Devices and contexts: near 1:1 bindings of the driver API (driver.h).
#include "driver.h"

namespace cuda_ipc {
using namespace cuabi;

namespace {

Napi::Value DeviceGetCount(const Napi::CallbackInfo& info) {
  int n = 0;
  CU_CALL(info.Env(), cuDeviceGetCount, &n);
  return Napi::Number::New(info.Env(), n);
}

Napi::Value DeviceGet(const Napi::CallbackInfo& info) {
  CUdevice d = 0;
  CU_CALL(info.Env(), cuDeviceGet, &d, ArgI32(info, 0, "ordinal"));
  return Napi::Number::New(info.Env(), d);
}

Napi::Value DeviceGetName(const Napi::CallbackInfo& info) {
  char name[256] = {0};
  CU_CALL(info.Env(), cuDeviceGetName, name, sizeof(name) - 1, ArgI32(info, 0, "device"));
  return Napi::String::New(info.Env(), name);
}

Napi::Value DeviceGetUuid(const Napi::CallbackInfo& info) {
  CUuuid u;
  CU_CALL(info.Env(), cuDeviceGetUuid, &u, ArgI32(info, 0, "device"));
  return CopyBytes(info.Env(), u.bytes, sizeof(u.bytes));
}

Napi::Value DeviceGetAttribute(const Napi::CallbackInfo& info) {
  int v = 0;
  CU_CALL(info.Env(), cuDeviceGetAttribute, &v, ArgI32(info, 0, "attribute"), ArgI32(info, 1, "device"));
  return Napi::Number::New(info.Env(), v);
}

Napi::Value DeviceTotalMem(const Napi::CallbackInfo& info) {
  size_t bytes = 0;
  CU_CALL(info.Env(), cuDeviceTotalMem, &bytes, ArgI32(info, 0, "device"));
  return Napi::Number::New(info.Env(), static_cast<double>(bytes));
}

Napi::Value DeviceGetPCIBusId(const Napi::CallbackInfo& info) {
  char id[64] = {0};
  CU_CALL(info.Env(), cuDeviceGetPCIBusId, id, sizeof(id) - 1, ArgI32(info, 0, "device"));
  return Napi::String::New(info.Env(), id);
}

Napi::Value DevicePrimaryCtxRetain(const Napi::CallbackInfo& info) {
  CUcontext ctx = nullptr;
  CU_CALL(info.Env(), cuDevicePrimaryCtxRetain, &ctx, ArgI32(info, 0, "device"));
  return HandleValue(info.Env(), ctx);
}

Napi::Value DevicePrimaryCtxRelease(const Napi::CallbackInfo& info) {
  CU_CALL(info.Env(), cuDevicePrimaryCtxRelease, ArgI32(info, 0, "device"));
  return info.Env().Undefined();
}

Napi::Value CtxSetCurrent(const Napi::CallbackInfo& info) {
  CU_CALL(info.Env(), cuCtxSetCurrent, ArgHandle<CUcontext>(info, 0, "context"));
  return info.Env().Undefined();
}

Napi::Value CtxGetCurrent(const Napi::CallbackInfo& info) {
  CUcontext ctx = nullptr;
  CU_CALL(info.Env(), cuCtxGetCurrent, &ctx);
  return HandleValue(info.Env(), ctx);
}

Napi::Value CtxSynchronize(const Napi::CallbackInfo& info) {
  CU_CALL(info.Env(), cuCtxSynchronize);
  return info.Env().Undefined();
}

}  // namespace

void InitDevices(Napi::Env env, Napi::Object exports) {
  exports.Set("deviceGetCount", Napi::Function::New(env, DeviceGetCount, "deviceGetCount"));
  exports.Set("deviceGet", Napi::Function::New(env, DeviceGet, "deviceGet"));
  exports.Set("deviceGetName", Napi::Function::New(env, DeviceGetName, "deviceGetName"));
  exports.Set("deviceGetUuid", Napi::Function::New(env, DeviceGetUuid, "deviceGetUuid"));
  exports.Set("deviceGetAttribute", Napi::Function::New(env, DeviceGetAttribute, "deviceGetAttribute"));
  exports.Set("deviceTotalMem", Napi::Function::New(env, DeviceTotalMem, "deviceTotalMem"));
  exports.Set("deviceGetPCIBusId", Napi::Function::New(env, DeviceGetPCIBusId, "deviceGetPCIBusId"));
  exports.Set("devicePrimaryCtxRetain", Napi::Function::New(env, DevicePrimaryCtxRetain, "devicePrimaryCtxRetain"));
  exports.Set("devicePrimaryCtxRelease", Napi::Function::New(env, DevicePrimaryCtxRelease, "devicePrimaryCtxRelease"));
  exports.Set("ctxSetCurrent", Napi::Function::New(env, CtxSetCurrent, "ctxSetCurrent"));
  exports.Set("ctxGetCurrent", Napi::Function::New(env, CtxGetCurrent, "ctxGetCurrent"));
  exports.Set("ctxSynchronize", Napi::Function::New(env, CtxSynchronize, "ctxSynchronize"));
}

}  // namespace cuda_ipc
