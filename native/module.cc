// Modules and kernels: load PTX/cubin images, find functions, launch them. Near 1:1 bindings of
// the driver API (driver.h).
#include "driver.h"

#include <string>
#include <vector>

namespace cuda_ipc {
using namespace cuabi;

namespace {

Napi::Value ModuleLoadData(const Napi::CallbackInfo& info) {
  Bytes image = ArgBytes(info, 0, "image");
  // PTX must be NUL-terminated; cubin/fatbin images are passed as they are.
  std::string copy(reinterpret_cast<const char*>(image.data), image.length);
  CUmodule m = nullptr;
  CU_CALL(info.Env(), cuModuleLoadData, &m, copy.c_str());
  return HandleValue(info.Env(), m);
}

Napi::Value ModuleUnload(const Napi::CallbackInfo& info) {
  CU_CALL(info.Env(), cuModuleUnload, ArgHandle<CUmodule>(info, 0, "module"));
  return info.Env().Undefined();
}

Napi::Value ModuleGetFunction(const Napi::CallbackInfo& info) {
  if (!info[1].IsString()) ThrowType(info.Env(), "name must be a string");
  std::string name = info[1].As<Napi::String>().Utf8Value();
  CUfunction f = nullptr;
  CU_CALL(info.Env(), cuModuleGetFunction, &f, ArgHandle<CUmodule>(info, 0, "module"), name.c_str());
  return HandleValue(info.Env(), f);
}

// launchKernel(fn, grid[3], block[3], sharedMemBytes, stream, packedArgs, offsets)
// Each parameter is passed by pointer into the packed buffer (kernelParams), so the driver copies
// exactly the size it declares; a whole-buffer `extra` launch would have to match the function's
// parameter size to the byte.
Napi::Value LaunchKernel(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  CUfunction f = ArgHandle<CUfunction>(info, 0, "function");
  unsigned dims[6];
  for (int i = 0; i < 6; i++) dims[i] = ArgU32(info, 1 + i, "dimension");
  unsigned shared = ArgU32(info, 7, "sharedMemBytes");
  CUstream stream = ArgHandle<CUstream>(info, 8, "stream");
  Bytes args = ArgBytes(info, 9, "packedArgs");
  if (info.Length() <= 10 || !info[10].IsTypedArray() || info[10].As<Napi::TypedArray>().TypedArrayType() != napi_uint32_array)
    ThrowType(env, "offsets must be a Uint32Array");
  auto offsets = info[10].As<Napi::Uint32Array>();
  std::vector<void*> params(offsets.ElementLength());
  for (size_t i = 0; i < params.size(); i++) {
    if (offsets[i] >= args.length) ThrowType(env, "argument offset " + std::to_string(offsets[i]) + " is outside the packed arguments");
    params[i] = args.data + offsets[i];
  }
  CU_CALL(env, cuLaunchKernel, f, dims[0], dims[1], dims[2], dims[3], dims[4], dims[5], shared, stream,
          params.empty() ? nullptr : params.data(), nullptr);
  return env.Undefined();
}

}  // namespace

void InitModules(Napi::Env env, Napi::Object exports) {
  exports.Set("moduleLoadData", Napi::Function::New(env, ModuleLoadData, "moduleLoadData"));
  exports.Set("moduleUnload", Napi::Function::New(env, ModuleUnload, "moduleUnload"));
  exports.Set("moduleGetFunction", Napi::Function::New(env, ModuleGetFunction, "moduleGetFunction"));
  exports.Set("launchKernel", Napi::Function::New(env, LaunchKernel, "launchKernel"));
}

}  // namespace cuda_ipc
