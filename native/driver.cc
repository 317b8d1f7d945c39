// CUDA driver loading: libcuda.so.1 is opened on the first CUDA call (never at import), and
// every entry point is found with cuGetProcAddress for the ABI version in cuda_abi.h. A failed
// call throws the CudaError class that TypeScript registers with setErrorClass, carrying the
// driver's name and description. Also here: the per-environment state and its cleanup.
//
// The driver bindings, one file per concept, all near 1:1 wrappers over the driver API: device.cc
// (devices, contexts), peer.cc (peer access), memory.cc (allocations, pools), pool_exports.cc
// (pool exports prepared off the event loop), legacy_ipc.cc (cuIpc* handles and the import
// cache), stream.cc (streams, events, completions), module.cc (modules, launches), copy.cc
// (copies and fills).
//
// The only state kept on the native side is what must be shared by every thread of the process
// (the legacy IPC import cache and the table of local exports) or what must live there (the
// thread-safe function that reports stream completions, and the thread that prepares pool
// exports off the event loop).
#include "driver.h"

#include <dlfcn.h>

#include <atomic>
#include <mutex>
#include <string>

namespace cuda_ipc {
using namespace cuabi;

Driver g_driver;
thread_local EnvState* t_state = nullptr;

namespace {

// ---------------------------------------------------------------------------------------------
// Driver loading (process-wide, once).

std::once_flag g_loadOnce;
std::string g_loadError;  // empty when the driver loaded
std::mutex g_initMutex;
bool g_initialized = false;
// Set once the driver is loaded and initialised: every later call checks only this.
std::atomic<bool> g_ready{false};
// Kept for entry points resolved at other ABI versions (ResolveDriverEntry, below).
PFN_cuGetProcAddress_v2 g_getProc = nullptr;

void LoadDriver() {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* e = dlerror();
    g_loadError = std::string("the NVIDIA driver library libcuda.so.1 could not be loaded (") +
                  (e ? e : "unknown reason") +
                  "). Install the NVIDIA driver, or run where a GPU is visible";
    return;
  }
  auto getProc = reinterpret_cast<PFN_cuGetProcAddress_v2>(dlsym(lib, "cuGetProcAddress_v2"));
  if (!getProc) {
    g_loadError = "libcuda.so.1 has no cuGetProcAddress_v2: the NVIDIA driver is older than CUDA 12.0; update the driver";
    return;
  }
  g_getProc = getProc;
  // A symbol the driver lacks stays null and fails at its first call with a clear error.
#define CUABI_RESOLVE(name, params)                                                              \
  {                                                                                              \
    void* fn = nullptr;                                                                          \
    int status = 0;                                                                              \
    if (getProc(#name, &fn, kCudaAbiVersion, CU_GET_PROC_ADDRESS_DEFAULT, &status) == CUDA_SUCCESS && fn) \
      g_driver.name = reinterpret_cast<PFN_##name>(fn);                                          \
  }
  CUABI_FUNCTIONS(CUABI_RESOLVE)
#undef CUABI_RESOLVE
  // The library stays loaded for the life of the process, as the CUDA runtime does.
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// CudaError, and the check before every call.

Napi::Value MakeCudaError(Napi::Env env, int status, const std::string& name, const std::string& description,
                          const std::string& call) {
  if (t_state && !t_state->errorClass.IsEmpty()) {
    return t_state->errorClass.New({Napi::Number::New(env, status), Napi::String::New(env, name),
                                    Napi::String::New(env, description), Napi::String::New(env, call)});
  }
  Napi::Error e = Napi::Error::New(env, call + " failed: " + name + ": " + description);
  e.Set("code", Napi::String::New(env, name));
  e.Set("status", Napi::Number::New(env, status));
  e.Set("call", Napi::String::New(env, call));
  e.Set("description", Napi::String::New(env, description));
  return e.Value();
}

[[noreturn]] void ThrowCuda(Napi::Env env, CUresult r, const char* call) {
  const char* name = nullptr;
  const char* desc = nullptr;
  if (!g_driver.cuGetErrorName || g_driver.cuGetErrorName(r, &name) != CUDA_SUCCESS) name = nullptr;
  if (!g_driver.cuGetErrorString || g_driver.cuGetErrorString(r, &desc) != CUDA_SUCCESS) desc = nullptr;
  throw Napi::Error(env, MakeCudaError(env, r, name ? name : "CUDA_ERROR_UNKNOWN_STATUS",
                                       desc ? desc : "unrecognized error code", call));
}

// Ensures the driver is loaded and initialised; throws CudaError otherwise.
void EnsureDriver(Napi::Env env) {
  if (g_ready.load(std::memory_order_acquire)) return;
  std::call_once(g_loadOnce, LoadDriver);
  if (!g_loadError.empty())
    throw Napi::Error(env, MakeCudaError(env, -1, "CUDA_DRIVER_NOT_FOUND", g_loadError, "dlopen(libcuda.so.1)"));
  std::lock_guard<std::mutex> lock(g_initMutex);
  if (g_initialized) return;
  if (!g_driver.cuInit)
    throw Napi::Error(env, MakeCudaError(env, -2, "CUDA_SYMBOL_NOT_FOUND", "the driver does not export cuInit", "cuGetProcAddress(cuInit)"));
  CUresult r = g_driver.cuInit(0);
  if (r != CUDA_SUCCESS) ThrowCuda(env, r, "cuInit");
  g_initialized = true;
  g_ready.store(true, std::memory_order_release);
}

namespace {

// ---------------------------------------------------------------------------------------------
// Bindings and the environment's cleanup.

Napi::Value SetErrorClass(const Napi::CallbackInfo& info) {
  if (!info[0].IsFunction()) ThrowType(info.Env(), "setErrorClass expects a constructor");
  t_state->errorClass = Napi::Persistent(info[0].As<Napi::Function>());
  return info.Env().Undefined();
}

Napi::Value DriverGetVersion(const Napi::CallbackInfo& info) {
  int v = 0;
  CU_CALL(info.Env(), cuDriverGetVersion, &v);
  return Napi::Number::New(info.Env(), v);
}

void CleanupEnv(void* arg) {
  auto* state = static_cast<EnvState*>(arg);
  if (state->completions) napi_release_threadsafe_function(state->completions, napi_tsfn_abort);
  if (ExportWorker* w = state->exportWorker) {
    DeleteExportWorker(state->env, w);
    state->exportWorker = nullptr;
  }
  if (t_state == state) t_state = nullptr;
  delete state;
}

}  // namespace

void* ResolveDriverEntry(Napi::Env env, const char* name, int abiVersion) {
  EnsureDriver(env);
  if (!g_getProc) return nullptr;
  void* fn = nullptr;
  int status = 0;
  if (g_getProc(name, &fn, abiVersion, CU_GET_PROC_ADDRESS_DEFAULT, &status) != CUDA_SUCCESS) return nullptr;
  return fn;
}

void InitDriver(Napi::Env env, Napi::Object exports) {
  t_state = new EnvState();
  t_state->env = env;
  napi_add_env_cleanup_hook(env, CleanupEnv, t_state);
  exports.Set("setErrorClass", Napi::Function::New(env, SetErrorClass, "setErrorClass"));
  exports.Set("driverGetVersion", Napi::Function::New(env, DriverGetVersion, "driverGetVersion"));
}

}  // namespace cuda_ipc
