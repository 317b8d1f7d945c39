// The CUDA driver as every driver file sees it (defined in driver.cc): the entry points, resolved
// at run time once per process; the per-environment state; CudaError; the CU_CALL macros that
// check each call; and the argument helpers for handles and fixed-size byte strings.
#pragma once
#include <cstring>
#include <string>

#include "common.h"
#include "cuda_abi.h"

namespace cuda_ipc {

// Every entry point of CUABI_FUNCTIONS (cuda_abi.h); null where the driver lacks it.
struct Driver {
#define CUABI_MEMBER(name, params) cuabi::PFN_##name name = nullptr;
  CUABI_FUNCTIONS(CUABI_MEMBER)
#undef CUABI_MEMBER
};
extern Driver g_driver;

// Per-environment state (one per main thread or worker thread).
struct ExportWorker;  // pool_exports.cc

struct EnvState {
  Napi::FunctionReference errorClass;
  napi_threadsafe_function completions = nullptr;
  uint32_t pendingCompletions = 0;
  ExportWorker* exportWorker = nullptr;
  napi_env env = nullptr;
};
extern thread_local EnvState* t_state;

// Stops and joins the environment's export thread and frees it (pool_exports.cc); for the
// environment's cleanup hook.
void DeleteExportWorker(napi_env env, ExportWorker* w);

// A CudaError (the class TypeScript registers with setErrorClass, or a plain Error shaped like
// one before it does).
Napi::Value MakeCudaError(Napi::Env env, int status, const std::string& name, const std::string& description,
                          const std::string& call);
[[noreturn]] void ThrowCuda(Napi::Env env, cuabi::CUresult r, const char* call);

// Ensures the driver is loaded and initialised; throws CudaError otherwise.
void EnsureDriver(Napi::Env env);

// [tensors hook] For copy.cc: entry points newer than kCudaAbiVersion, resolved at their own
// version once the driver is loaded (nullptr where the driver lacks them).
void* ResolveDriverEntry(Napi::Env env, const char* name, int abiVersion);

// Calls a driver entry point after making sure it exists and puts its status in `out`, for the
// caller to interpret (queries that answer NOT_READY).
#define CU_CALL_STATUS(env, out, name, ...)                                                         \
  do {                                                                                              \
    EnsureDriver(env);                                                                              \
    if (!g_driver.name)                                                                             \
      throw Napi::Error(env, MakeCudaError(env, -2, "CUDA_SYMBOL_NOT_FOUND",                        \
                                           "the installed driver does not provide " #name ": update the NVIDIA driver", \
                                           "cuGetProcAddress(" #name ")"));                         \
    out = g_driver.name(__VA_ARGS__);                                                               \
  } while (0)

// Same, throwing CudaError on failure.
#define CU_CALL(env, name, ...)                                                                     \
  do {                                                                                              \
    cuabi::CUresult r_;                                                                             \
    CU_CALL_STATUS(env, r_, name, __VA_ARGS__);                                                     \
    if (r_ != cuabi::CUDA_SUCCESS) ThrowCuda(env, r_, #name);                                       \
  } while (0)

template <class T> T ArgHandle(const Napi::CallbackInfo& info, size_t i, const char* what) {
  return reinterpret_cast<T>(static_cast<uintptr_t>(ArgU64(info, i, what)));
}
template <class T> Napi::BigInt HandleValue(Napi::Env env, T h) {
  return U64(env, static_cast<uint64_t>(reinterpret_cast<uintptr_t>(h)));
}

inline Napi::Uint8Array CopyBytes(Napi::Env env, const void* p, size_t n) {
  auto a = Napi::Uint8Array::New(env, n);
  std::memcpy(a.Data(), p, n);
  return a;
}

// Where a call that produces N bytes puts them: the caller's typed array at argument i (at least
// N bytes; returned as is), or else a new Uint8Array. A typed array made in JS is far cheaper than
// one made here, whose memory is a separate native allocation.
template <size_t N> Napi::Value PutBytes(const Napi::CallbackInfo& info, size_t i, const void* p) {
  if (info.Length() > i && !info[i].IsUndefined()) {
    Bytes out = ArgBytes(info, i, "out");
    if (out.length < N) ThrowType(info.Env(), "out must hold at least " + std::to_string(N) + " bytes");
    std::memcpy(out.data, p, N);
    return info[i];
  }
  return CopyBytes(info.Env(), p, N);
}

template <size_t N> void ArgFixedBytes(const Napi::CallbackInfo& info, size_t i, const char* what, void* out) {
  Bytes b = ArgBytes(info, i, what);
  if (b.length != N) ThrowType(info.Env(), std::string(what) + " must be exactly " + std::to_string(N) + " bytes");
  std::memcpy(out, b.data, N);
}

}  // namespace cuda_ipc
