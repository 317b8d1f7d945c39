// CUDA driver bindings: near 1:1 wrappers over the driver API, resolved at run time.
//
// libcuda.so.1 is opened on the first CUDA call (never at import), and every entry point is found
// with cuGetProcAddress for the ABI version in cuda_abi.h. A failed call throws the CudaError class
// that TypeScript registers with setErrorClass, carrying the driver's name and description.
//
// The only state kept here is what must be shared by every thread of the process (the legacy IPC
// import cache and the table of local exports) or what must live on the native side (the
// thread-safe function that reports stream completions, and the thread that prepares pool
// exports off the event loop).
#include <dlfcn.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "common.h"
#include "cuda_abi.h"

namespace cuda_ipc {
using namespace cuabi;

namespace {

// ---------------------------------------------------------------------------------------------
// Driver loading (process-wide, once).

struct Driver {
#define CUABI_MEMBER(name, params) PFN_##name name = nullptr;
  CUABI_FUNCTIONS(CUABI_MEMBER)
#undef CUABI_MEMBER
};

Driver g_driver;
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

// ---------------------------------------------------------------------------------------------
// Per-environment state (one per main thread or worker thread).

struct ExportWorker;

struct EnvState {
  Napi::FunctionReference errorClass;
  napi_threadsafe_function completions = nullptr;
  uint32_t pendingCompletions = 0;
  ExportWorker* exportWorker = nullptr;
  napi_env env = nullptr;
};
thread_local EnvState* t_state = nullptr;

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
    CUresult r_;                                                                                    \
    CU_CALL_STATUS(env, r_, name, __VA_ARGS__);                                                     \
    if (r_ != CUDA_SUCCESS) ThrowCuda(env, r_, #name);                                              \
  } while (0)

template <class T> T ArgHandle(const Napi::CallbackInfo& info, size_t i, const char* what) {
  return reinterpret_cast<T>(static_cast<uintptr_t>(ArgU64(info, i, what)));
}
template <class T> Napi::BigInt HandleValue(Napi::Env env, T h) {
  return U64(env, static_cast<uint64_t>(reinterpret_cast<uintptr_t>(h)));
}

Napi::Uint8Array CopyBytes(Napi::Env env, const void* p, size_t n) {
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

// ---------------------------------------------------------------------------------------------
// Driver, devices, contexts.

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

// ctxEnablePeerAccess(peerContext): lets the current context use memory of peerContext. Returns
// true when enabled now, false when it already was (CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED).
Napi::Value CtxEnablePeerAccess(const Napi::CallbackInfo& info) {
  CUresult r;
  CU_CALL_STATUS(info.Env(), r, cuCtxEnablePeerAccess, ArgHandle<CUcontext>(info, 0, "peerContext"), 0);
  if (r == CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED) return Napi::Boolean::New(info.Env(), false);
  if (r != CUDA_SUCCESS) ThrowCuda(info.Env(), r, "cuCtxEnablePeerAccess");
  return Napi::Boolean::New(info.Env(), true);
}

Napi::Value CtxSynchronize(const Napi::CallbackInfo& info) {
  CU_CALL(info.Env(), cuCtxSynchronize);
  return info.Env().Undefined();
}

Napi::Value MemGetInfo(const Napi::CallbackInfo& info) {
  size_t freeBytes = 0, total = 0;
  CU_CALL(info.Env(), cuMemGetInfo, &freeBytes, &total);
  auto out = Napi::Array::New(info.Env(), 2);
  out.Set(0u, Napi::Number::New(info.Env(), static_cast<double>(freeBytes)));
  out.Set(1u, Napi::Number::New(info.Env(), static_cast<double>(total)));
  return out;
}

// ---------------------------------------------------------------------------------------------
// Memory.

Napi::Value MemAlloc(const Napi::CallbackInfo& info) {
  CUdeviceptr p = 0;
  CU_CALL(info.Env(), cuMemAlloc, &p, ArgSize(info, 0, "bytes"));
  return U64(info.Env(), p);
}

Napi::Value MemFree(const Napi::CallbackInfo& info) {
  CU_CALL(info.Env(), cuMemFree, ArgU64(info, 0, "pointer"));
  return info.Env().Undefined();
}

Napi::Value MemAllocManaged(const Napi::CallbackInfo& info) {
  CUdeviceptr p = 0;
  CU_CALL(info.Env(), cuMemAllocManaged, &p, ArgSize(info, 0, "bytes"), CU_MEM_ATTACH_GLOBAL);
  return U64(info.Env(), p);
}

Napi::Value MemAllocHost(const Napi::CallbackInfo& info) {
  void* p = nullptr;
  CU_CALL(info.Env(), cuMemAllocHost, &p, ArgSize(info, 0, "bytes"));
  return HandleValue(info.Env(), p);
}

Napi::Value MemFreeHost(const Napi::CallbackInfo& info) {
  CU_CALL(info.Env(), cuMemFreeHost, ArgHandle<void*>(info, 0, "pointer"));
  return info.Env().Undefined();
}

// Page-locks and maps host memory for the device (channel control blocks: stream memory
// operations on their fence words). memHostRegister(address, bytes, flags).
Napi::Value MemHostRegister(const Napi::CallbackInfo& info) {
  CU_CALL(info.Env(), cuMemHostRegister, ArgHandle<void*>(info, 0, "address"), ArgSize(info, 1, "bytes"), ArgU32(info, 2, "flags"));
  return info.Env().Undefined();
}

Napi::Value MemHostUnregister(const Napi::CallbackInfo& info) {
  CU_CALL(info.Env(), cuMemHostUnregister, ArgHandle<void*>(info, 0, "address"));
  return info.Env().Undefined();
}

Napi::Value MemHostGetDevicePointer(const Napi::CallbackInfo& info) {
  CUdeviceptr p = 0;
  CU_CALL(info.Env(), cuMemHostGetDevicePointer, &p, ArgHandle<void*>(info, 0, "address"), 0);
  return U64(info.Env(), p);
}

Napi::Value MemGetAddressRange(const Napi::CallbackInfo& info) {
  CUdeviceptr base = 0;
  size_t size = 0;
  CU_CALL(info.Env(), cuMemGetAddressRange, &base, &size, ArgU64(info, 0, "pointer"));
  auto out = Napi::Array::New(info.Env(), 2);
  out.Set(0u, U64(info.Env(), base));
  out.Set(1u, Napi::Number::New(info.Env(), static_cast<double>(size)));
  return out;
}

// Integer-valued pointer attributes (memory type, is-managed, device ordinal, mapped).
Napi::Value PointerGetAttributeInt(const Napi::CallbackInfo& info) {
  unsigned int v = 0;
  CU_CALL(info.Env(), cuPointerGetAttribute, &v, ArgI32(info, 0, "attribute"), ArgU64(info, 1, "pointer"));
  return Napi::Number::New(info.Env(), v);
}

// Pointer-valued attributes (range start, context, mempool handle).
Napi::Value PointerGetAttributeU64(const Napi::CallbackInfo& info) {
  uint64_t v = 0;
  CU_CALL(info.Env(), cuPointerGetAttribute, &v, ArgI32(info, 0, "attribute"), ArgU64(info, 1, "pointer"));
  return U64(info.Env(), v);
}

Napi::Value MemcpyHtoD(const Napi::CallbackInfo& info) {
  Bytes src = ArgBytes(info, 1, "source");
  CU_CALL(info.Env(), cuMemcpyHtoD, ArgU64(info, 0, "destination"), src.data, src.length);
  return info.Env().Undefined();
}

Napi::Value MemcpyDtoH(const Napi::CallbackInfo& info) {
  Bytes dst = ArgBytes(info, 0, "destination");
  CU_CALL(info.Env(), cuMemcpyDtoH, dst.data, ArgU64(info, 1, "source"), dst.length);
  return info.Env().Undefined();
}

Napi::Value MemcpyDtoD(const Napi::CallbackInfo& info) {
  CU_CALL(info.Env(), cuMemcpyDtoD, ArgU64(info, 0, "destination"), ArgU64(info, 1, "source"), ArgSize(info, 2, "bytes"));
  return info.Env().Undefined();
}

Napi::Value MemcpyHtoDAsync(const Napi::CallbackInfo& info) {
  Bytes src = ArgBytes(info, 1, "source");
  CU_CALL(info.Env(), cuMemcpyHtoDAsync, ArgU64(info, 0, "destination"), src.data, src.length,
          ArgHandle<CUstream>(info, 2, "stream"));
  return info.Env().Undefined();
}

Napi::Value MemcpyDtoHAsync(const Napi::CallbackInfo& info) {
  Bytes dst = ArgBytes(info, 0, "destination");
  CU_CALL(info.Env(), cuMemcpyDtoHAsync, dst.data, ArgU64(info, 1, "source"), dst.length,
          ArgHandle<CUstream>(info, 2, "stream"));
  return info.Env().Undefined();
}

Napi::Value MemcpyDtoDAsync(const Napi::CallbackInfo& info) {
  CU_CALL(info.Env(), cuMemcpyDtoDAsync, ArgU64(info, 0, "destination"), ArgU64(info, 1, "source"),
          ArgSize(info, 2, "bytes"), ArgHandle<CUstream>(info, 3, "stream"));
  return info.Env().Undefined();
}

Napi::Value MemsetD8(const Napi::CallbackInfo& info) {
  CU_CALL(info.Env(), cuMemsetD8, ArgU64(info, 0, "pointer"), static_cast<unsigned char>(ArgU32(info, 1, "value")),
          ArgSize(info, 2, "count"));
  return info.Env().Undefined();
}

Napi::Value MemsetD32(const Napi::CallbackInfo& info) {
  CU_CALL(info.Env(), cuMemsetD32, ArgU64(info, 0, "pointer"), ArgU32(info, 1, "value"), ArgSize(info, 2, "count"));
  return info.Env().Undefined();
}

Napi::Value MemsetD8Async(const Napi::CallbackInfo& info) {
  CU_CALL(info.Env(), cuMemsetD8Async, ArgU64(info, 0, "pointer"), static_cast<unsigned char>(ArgU32(info, 1, "value")),
          ArgSize(info, 2, "count"), ArgHandle<CUstream>(info, 3, "stream"));
  return info.Env().Undefined();
}

Napi::Value MemsetD32Async(const Napi::CallbackInfo& info) {
  CU_CALL(info.Env(), cuMemsetD32Async, ArgU64(info, 0, "pointer"), ArgU32(info, 1, "value"), ArgSize(info, 2, "count"),
          ArgHandle<CUstream>(info, 3, "stream"));
  return info.Env().Undefined();
}

// ---------------------------------------------------------------------------------------------
// Legacy IPC handles, with the process-wide import cache and table of local exports.
//
// The driver refuses to open a handle in the process that exported it, and every thread of a
// process shares one address space, so both tables are process-wide. Exports are keyed by the
// handle bytes; imports by the handle bytes and the context they were opened in, because
// cuIpcOpenMemHandle maps into the current context: a process working on two GPUs may map one
// allocation once for each.

struct LegacyImport {
  CUdeviceptr ptr;
  size_t size;       // of the allocation (cuMemGetAddressRange at the open), for range checks
  CUcontext ctx;     // the importing context: the mapping is closed there
  uint32_t refs;
  uint64_t lastUse;  // for evicting the least recently used idle mapping
  bool gone = false; // its exporter said the allocation is freed: close at the last release
};
// A local export: the allocation's base and the context it was exported in (for the sweep).
struct LegacyExport {
  CUdeviceptr base;
  CUcontext ctx;
};
std::mutex g_legacyMutex;
std::map<std::string, LegacyImport> g_legacyImports;
std::map<std::string, LegacyExport> g_legacyExports;
uint64_t g_legacyClock = 0;
uint32_t g_legacyIdleLimit = 16;  // mappings kept open with no user, so that reopening is free
uint64_t g_legacyOpens = 0;        // [tensors hook] cuIpcOpenMemHandle calls made, for "a repeated send opens no handle"

std::string HandleKey(const Napi::CallbackInfo& info, size_t i) {
  char h[kIpcHandleSize];
  ArgFixedBytes<kIpcHandleSize>(info, i, "handle", h);
  return std::string(h, sizeof(h));
}

// The import key: the handle bytes, then the context's address.
std::string ImportKey(const std::string& handleKey, CUcontext ctx) {
  uintptr_t c = reinterpret_cast<uintptr_t>(ctx);
  return handleKey + std::string(reinterpret_cast<const char*>(&c), sizeof(c));
}

// Closes a mapping in the context it was opened in, restoring the caller's current context.
CUresult CloseImport(const LegacyImport& m) {
  if (!g_driver.cuIpcCloseMemHandle || !g_driver.cuCtxGetCurrent || !g_driver.cuCtxSetCurrent) return CUDA_SUCCESS;
  CUcontext current = nullptr;
  CUresult r = g_driver.cuCtxGetCurrent(&current);
  if (r != CUDA_SUCCESS) return r;
  if (current != m.ctx && (r = g_driver.cuCtxSetCurrent(m.ctx)) != CUDA_SUCCESS) return r;
  r = g_driver.cuIpcCloseMemHandle(m.ptr);
  if (current != m.ctx) {
    CUresult back = g_driver.cuCtxSetCurrent(current);
    if (r == CUDA_SUCCESS) r = back;
  }
  return r;
}

// Closes idle mappings, least recently used first, until at most `keep` remain. Caller holds the
// mutex. Returns the first failure, after trying them all.
CUresult TrimIdleLocked(uint32_t keep) {
  CUresult first = CUDA_SUCCESS;
  for (;;) {
    uint32_t idle = 0;
    auto victim = g_legacyImports.end();
    for (auto it = g_legacyImports.begin(); it != g_legacyImports.end(); ++it) {
      if (it->second.refs != 0) continue;
      idle++;
      if (victim == g_legacyImports.end() || it->second.lastUse < victim->second.lastUse) victim = it;
    }
    if (idle <= keep || victim == g_legacyImports.end()) return first;
    LegacyImport m = victim->second;
    g_legacyImports.erase(victim);
    CUresult r = CloseImport(m);
    if (r != CUDA_SUCCESS && first == CUDA_SUCCESS) first = r;
  }
}

// ipcGetMemHandle(pointer, out?): the 64-byte handle, in `out` when given.
Napi::Value IpcGetMemHandle(const Napi::CallbackInfo& info) {
  CUipcMemHandle h;
  CU_CALL(info.Env(), cuIpcGetMemHandle, &h, ArgU64(info, 0, "pointer"));
  return PutBytes<sizeof(h.reserved)>(info, 1, h.reserved);
}

Napi::Value IpcOpenMemHandle(const Napi::CallbackInfo& info) {
  CUipcMemHandle h;
  ArgFixedBytes<kIpcHandleSize>(info, 0, "handle", h.reserved);
  CUdeviceptr p = 0;
  CU_CALL(info.Env(), cuIpcOpenMemHandle, &p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
  return U64(info.Env(), p);
}

Napi::Value IpcCloseMemHandle(const Napi::CallbackInfo& info) {
  CU_CALL(info.Env(), cuIpcCloseMemHandle, ArgU64(info, 0, "pointer"));
  return info.Env().Undefined();
}

// Records that this process exported `handle` for the allocation at `base`, in the current
// context.
Napi::Value LegacyExportRegister(const Napi::CallbackInfo& info) {
  std::string key = HandleKey(info, 0);
  CUdeviceptr base = ArgU64(info, 1, "base");
  CUcontext ctx = nullptr;
  if (g_driver.cuCtxGetCurrent) g_driver.cuCtxGetCurrent(&ctx);
  std::lock_guard<std::mutex> lock(g_legacyMutex);
  g_legacyExports[key] = LegacyExport{base, ctx};
  return info.Env().Undefined();
}

// Whether the allocation at `e.base` is still the one exported as `key`: it still starts there
// and its handle is still `key` (a new allocation at a reused address has another handle). Asked
// in the export's context, restoring the caller's.
bool ExportStillLive(const std::string& key, const LegacyExport& e) {
  if (!g_driver.cuCtxGetCurrent || !g_driver.cuCtxSetCurrent || !g_driver.cuMemGetAddressRange || !g_driver.cuIpcGetMemHandle) return true;
  CUcontext current = nullptr;
  if (g_driver.cuCtxGetCurrent(&current) != CUDA_SUCCESS) return true;
  if (e.ctx && current != e.ctx && g_driver.cuCtxSetCurrent(e.ctx) != CUDA_SUCCESS) return true;
  CUdeviceptr base = 0;
  size_t size = 0;
  bool live = g_driver.cuMemGetAddressRange(&base, &size, e.base) == CUDA_SUCCESS && base == e.base;
  if (live) {
    CUipcMemHandle h;
    live = g_driver.cuIpcGetMemHandle(&h, e.base) == CUDA_SUCCESS && std::memcmp(h.reserved, key.data(), sizeof(h.reserved)) == 0;
  }
  if (e.ctx && current != e.ctx) g_driver.cuCtxSetCurrent(current);
  return live;
}

// legacyExportSweep() -> entries dropped: forgets the exports (exportPointer) whose allocation
// was freed since, so that the table holds live allocations only.
Napi::Value LegacyExportSweep(const Napi::CallbackInfo& info) {
  std::lock_guard<std::mutex> lock(g_legacyMutex);
  uint32_t dropped = 0;
  for (auto it = g_legacyExports.begin(); it != g_legacyExports.end();) {
    if (ExportStillLive(it->first, it->second)) {
      ++it;
    } else {
      it = g_legacyExports.erase(it);
      dropped++;
    }
  }
  return Napi::Number::New(info.Env(), dropped);
}

// legacyImportForget(handle) -> mappings closed: the exporter freed the allocation behind
// `handle`. Idle mappings of it (in any context) are closed now; ones still in use are closed at
// their last release instead of being cached.
Napi::Value LegacyImportForget(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  std::string handleKey = HandleKey(info, 0);
  std::lock_guard<std::mutex> lock(g_legacyMutex);
  uint32_t closed = 0;
  CUresult first = CUDA_SUCCESS;
  for (auto it = g_legacyImports.begin(); it != g_legacyImports.end();) {
    if (it->first.compare(0, handleKey.size(), handleKey) != 0) {
      ++it;
      continue;
    }
    if (it->second.refs > 0) {
      it->second.gone = true;
      ++it;
      continue;
    }
    LegacyImport m = it->second;
    it = g_legacyImports.erase(it);
    CUresult r = CloseImport(m);
    if (r != CUDA_SUCCESS && first == CUDA_SUCCESS) first = r;
    closed++;
  }
  if (first != CUDA_SUCCESS) ThrowCuda(env, first, "cuIpcCloseMemHandle");
  return Napi::Number::New(env, closed);
}

Napi::Value LegacyExportUnregister(const Napi::CallbackInfo& info) {
  std::string key = HandleKey(info, 0);
  std::lock_guard<std::mutex> lock(g_legacyMutex);
  g_legacyExports.erase(key);
  return info.Env().Undefined();
}

// legacyImportAcquire(handle, context): maps the allocation behind `handle` once per process and
// context: returns [base, local, size] where local is true when this process exported it (no
// mapping made; size 0: unknown) and size is the allocation's (asked once, at the open). The cache is keyed by the handle's 64 bytes (and the context), so a handle the exporter
// made for a new allocation at a reused address never matches an old entry. `context` must be
// current on the caller's thread: the mapping is made there (CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS
// lets it be another device's memory).
Napi::Value LegacyImportAcquire(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  std::string handleKey = HandleKey(info, 0);
  CUcontext ctx = ArgHandle<CUcontext>(info, 1, "context");
  std::string key = ImportKey(handleKey, ctx);
  auto out = Napi::Array::New(env, 3);
  std::lock_guard<std::mutex> lock(g_legacyMutex);
  auto ex = g_legacyExports.find(handleKey);
  if (ex != g_legacyExports.end()) {
    out.Set(0u, U64(env, ex->second.base));
    out.Set(1u, Napi::Boolean::New(env, true));
    out.Set(2u, Napi::Number::New(env, 0));
    return out;
  }
  auto it = g_legacyImports.find(key);
  if (it != g_legacyImports.end() && it->second.gone && it->second.refs == 0) {
    // Freed by its exporter (the handle cannot be open still): drop it, then try afresh.
    LegacyImport m = it->second;
    g_legacyImports.erase(it);
    CloseImport(m);
    it = g_legacyImports.end();
  }
  if (it != g_legacyImports.end()) {
    it->second.refs++;
    it->second.lastUse = ++g_legacyClock;
    out.Set(0u, U64(env, it->second.ptr));
    out.Set(1u, Napi::Boolean::New(env, false));
    out.Set(2u, Napi::Number::New(env, static_cast<double>(it->second.size)));
    return out;
  }
  CUipcMemHandle h;
  std::memcpy(h.reserved, handleKey.data(), sizeof(h.reserved));
  CUdeviceptr p = 0;
  CU_CALL(env, cuIpcOpenMemHandle, &p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
  g_legacyOpens++;
  // The allocation's size, for the caller's range check: asked once here, not on every reuse.
  CUdeviceptr base = 0;
  size_t size = 0;
  try {
    CU_CALL(env, cuMemGetAddressRange, &base, &size, p);
  } catch (...) {
    g_driver.cuIpcCloseMemHandle(p);  // not cached: nobody would ever close it
    throw;
  }
  // An idle entry of this context at the same address belongs to an allocation the driver no
  // longer maps here (its handle differs, or the lookup above would have found it): stale, drop it.
  for (auto s = g_legacyImports.begin(); s != g_legacyImports.end();) {
    if (s->second.ptr == p && s->second.ctx == ctx && s->second.refs == 0) s = g_legacyImports.erase(s);
    else ++s;
  }
  g_legacyImports[key] = LegacyImport{p, size, ctx, 1, ++g_legacyClock};
  out.Set(0u, U64(env, p));
  out.Set(1u, Napi::Boolean::New(env, false));
  out.Set(2u, Napi::Number::New(env, static_cast<double>(size)));
  return out;
}

// legacyImportRelease(handle, context): drops one reference. A mapping with no users stays cached
// (idle) up to the idle limit, least recently used closed first. Returns true when a mapping was
// closed.
Napi::Value LegacyImportRelease(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  std::string key = ImportKey(HandleKey(info, 0), ArgHandle<CUcontext>(info, 1, "context"));
  std::lock_guard<std::mutex> lock(g_legacyMutex);
  auto it = g_legacyImports.find(key);
  if (it == g_legacyImports.end() || it->second.refs == 0) return Napi::Boolean::New(env, false);
  if (--it->second.refs > 0) return Napi::Boolean::New(env, false);
  if (it->second.gone) {
    // Its exporter freed the allocation: caching the mapping would keep that memory alive.
    LegacyImport m = it->second;
    g_legacyImports.erase(it);
    CUresult r = CloseImport(m);
    if (r != CUDA_SUCCESS) ThrowCuda(env, r, "cuIpcCloseMemHandle");
    return Napi::Boolean::New(env, true);
  }
  size_t before = g_legacyImports.size();
  CUresult r = TrimIdleLocked(g_legacyIdleLimit);
  if (r != CUDA_SUCCESS) ThrowCuda(env, r, "cuIpcCloseMemHandle");
  return Napi::Boolean::New(env, g_legacyImports.size() < before);
}

// [tensors hook] legacyImportDrop(handle, context): closes the mapping now if nothing uses it (it
// would otherwise stay idle in the cache). Tensor sets drop their mappings so that an idle one
// never keeps a sender's freed memory. Returns true when a mapping was closed.
Napi::Value LegacyImportDrop(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  std::string key = ImportKey(HandleKey(info, 0), ArgHandle<CUcontext>(info, 1, "context"));
  std::lock_guard<std::mutex> lock(g_legacyMutex);
  auto it = g_legacyImports.find(key);
  if (it == g_legacyImports.end() || it->second.refs != 0) return Napi::Boolean::New(env, false);
  LegacyImport m = it->second;
  g_legacyImports.erase(it);
  CUresult r = CloseImport(m);
  if (r != CUDA_SUCCESS) ThrowCuda(env, r, "cuIpcCloseMemHandle");
  return Napi::Boolean::New(env, true);
}

// legacyCacheConfigure(idleLimit): sets the idle limit and trims to it.
Napi::Value LegacyCacheConfigure(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  uint32_t limit = ArgU32(info, 0, "idleLimit");
  std::lock_guard<std::mutex> lock(g_legacyMutex);
  g_legacyIdleLimit = limit;
  CUresult r = TrimIdleLocked(limit);
  if (r != CUDA_SUCCESS) ThrowCuda(env, r, "cuIpcCloseMemHandle");
  return env.Undefined();
}

Napi::Value LegacyCacheStats(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  std::lock_guard<std::mutex> lock(g_legacyMutex);
  uint64_t refs = 0, idle = 0;
  for (auto& kv : g_legacyImports) {
    refs += kv.second.refs;
    if (kv.second.refs == 0) idle++;
  }
  auto out = Napi::Object::New(env);
  out.Set("mappings", Napi::Number::New(env, static_cast<double>(g_legacyImports.size())));
  out.Set("idle", Napi::Number::New(env, static_cast<double>(idle)));
  out.Set("idleLimit", Napi::Number::New(env, g_legacyIdleLimit));
  out.Set("references", Napi::Number::New(env, static_cast<double>(refs)));
  out.Set("exports", Napi::Number::New(env, static_cast<double>(g_legacyExports.size())));
  out.Set("opened", Napi::Number::New(env, static_cast<double>(g_legacyOpens)));
  return out;
}

Napi::Value IpcGetEventHandle(const Napi::CallbackInfo& info) {
  CUipcEventHandle h;
  CU_CALL(info.Env(), cuIpcGetEventHandle, &h, ArgHandle<CUevent>(info, 0, "event"));
  return CopyBytes(info.Env(), h.reserved, sizeof(h.reserved));
}

Napi::Value IpcOpenEventHandle(const Napi::CallbackInfo& info) {
  CUipcEventHandle h;
  ArgFixedBytes<kIpcHandleSize>(info, 0, "handle", h.reserved);
  CUevent ev = nullptr;
  CU_CALL(info.Env(), cuIpcOpenEventHandle, &ev, h);
  return HandleValue(info.Env(), ev);
}

// ---------------------------------------------------------------------------------------------
// Streams and events.

// A query's answer: true when the work is done, false while some is pending (NOT_READY).
Napi::Value DoneOrPending(Napi::Env env, CUresult r, const char* call) {
  if (r == CUDA_ERROR_NOT_READY) return Napi::Boolean::New(env, false);
  if (r != CUDA_SUCCESS) ThrowCuda(env, r, call);
  return Napi::Boolean::New(env, true);
}

Napi::Value StreamCreate(const Napi::CallbackInfo& info) {
  CUstream s = nullptr;
  CU_CALL(info.Env(), cuStreamCreate, &s, ArgU32(info, 0, "flags"));
  return HandleValue(info.Env(), s);
}

Napi::Value StreamDestroy(const Napi::CallbackInfo& info) {
  CU_CALL(info.Env(), cuStreamDestroy, ArgHandle<CUstream>(info, 0, "stream"));
  return info.Env().Undefined();
}

// true when all work is done, false while some is pending.
Napi::Value StreamQuery(const Napi::CallbackInfo& info) {
  CUresult r;
  CU_CALL_STATUS(info.Env(), r, cuStreamQuery, ArgHandle<CUstream>(info, 0, "stream"));
  return DoneOrPending(info.Env(), r, "cuStreamQuery");
}

// Blocks the calling thread: for the CLI's synchronous paths only; libraries use onComplete.
Napi::Value StreamSynchronize(const Napi::CallbackInfo& info) {
  CU_CALL(info.Env(), cuStreamSynchronize, ArgHandle<CUstream>(info, 0, "stream"));
  return info.Env().Undefined();
}

Napi::Value StreamWaitEvent(const Napi::CallbackInfo& info) {
  CU_CALL(info.Env(), cuStreamWaitEvent, ArgHandle<CUstream>(info, 0, "stream"), ArgHandle<CUevent>(info, 1, "event"), 0);
  return info.Env().Undefined();
}

// cuStream{Wait,Write}Value{32,64}(stream, address, value, flags): four bindings of one shape,
// apart only in the entry point and the width of `value`.
#define STREAM_MEM_OP(Binding, name, ArgValue)                                                      \
  Napi::Value Binding(const Napi::CallbackInfo& info) {                                             \
    CU_CALL(info.Env(), name, ArgHandle<CUstream>(info, 0, "stream"), ArgU64(info, 1, "address"),    \
            ArgValue(info, 2, "value"), ArgU32(info, 3, "flags"));                                  \
    return info.Env().Undefined();                                                                  \
  }
STREAM_MEM_OP(StreamWaitValue32, cuStreamWaitValue32, ArgU32)
STREAM_MEM_OP(StreamWaitValue64, cuStreamWaitValue64, ArgU64)
STREAM_MEM_OP(StreamWriteValue32, cuStreamWriteValue32, ArgU32)
STREAM_MEM_OP(StreamWriteValue64, cuStreamWriteValue64, ArgU64)
#undef STREAM_MEM_OP

Napi::Value EventCreate(const Napi::CallbackInfo& info) {
  CUevent ev = nullptr;
  CU_CALL(info.Env(), cuEventCreate, &ev, ArgU32(info, 0, "flags"));
  return HandleValue(info.Env(), ev);
}

Napi::Value EventDestroy(const Napi::CallbackInfo& info) {
  CU_CALL(info.Env(), cuEventDestroy, ArgHandle<CUevent>(info, 0, "event"));
  return info.Env().Undefined();
}

Napi::Value EventRecord(const Napi::CallbackInfo& info) {
  CU_CALL(info.Env(), cuEventRecord, ArgHandle<CUevent>(info, 0, "event"), ArgHandle<CUstream>(info, 1, "stream"));
  return info.Env().Undefined();
}

Napi::Value EventQuery(const Napi::CallbackInfo& info) {
  CUresult r;
  CU_CALL_STATUS(info.Env(), r, cuEventQuery, ArgHandle<CUevent>(info, 0, "event"));
  return DoneOrPending(info.Env(), r, "cuEventQuery");
}

// Stream completions: cuLaunchHostFunc runs HostFn on a driver thread when the stream reaches
// it; HostFn posts the id to the JS thread through a thread-safe function, and JS resolves the
// matching promise. No thread of ours or libuv's is ever parked waiting.
struct Completion {
  napi_threadsafe_function tsfn;
  double id;
};

void CompletionHostFn(void* data) {
  auto* c = static_cast<Completion*>(data);
  napi_threadsafe_function tsfn = c->tsfn;
  if (napi_call_threadsafe_function(tsfn, c, napi_tsfn_nonblocking) != napi_ok) delete c;
  // Each pending completion acquired the function, so it stays valid until this release.
  napi_release_threadsafe_function(tsfn, napi_tsfn_release);
}

void CompletionCallJs(napi_env env, napi_value callback, void* context, void* data) {
  auto* c = static_cast<Completion*>(data);
  double id = c->id;
  delete c;
  if (env == nullptr || t_state == nullptr) return;  // torn down: nothing to report to
  if (--t_state->pendingCompletions == 0) napi_unref_threadsafe_function(env, t_state->completions);
  napi_value arg;
  napi_create_double(env, id, &arg);
  napi_value global;
  napi_get_global(env, &global);
  napi_call_function(env, global, callback, 1, &arg, nullptr);
}

Napi::Value SetCompletionHandler(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (!info[0].IsFunction()) ThrowType(env, "setCompletionHandler expects a function");
  if (t_state->completions) ThrowType(env, "the completion handler is already set");
  napi_value name = Napi::String::New(env, "cuda-ipc stream completion");
  napi_status s = napi_create_threadsafe_function(env, info[0], nullptr, name, 0, 1, nullptr, nullptr, nullptr,
                                                  CompletionCallJs, &t_state->completions);
  if (s != napi_ok) throw Napi::Error::New(env, "napi_create_threadsafe_function failed");
  napi_unref_threadsafe_function(env, t_state->completions);  // only pending work keeps the loop alive
  return env.Undefined();
}

// Calls the completion handler with `id` once all work queued on `stream` so far is done.
Napi::Value StreamOnComplete(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  CUstream stream = ArgHandle<CUstream>(info, 0, "stream");
  if (!info[1].IsNumber()) ThrowType(env, "id must be a number");
  if (!t_state->completions) ThrowType(env, "setCompletionHandler must be called first");
  auto* c = new Completion{t_state->completions, info[1].As<Napi::Number>().DoubleValue()};
  if (napi_acquire_threadsafe_function(c->tsfn) != napi_ok) {
    delete c;
    throw Napi::Error::New(env, "the completion channel is closing");
  }
  CUresult r;
  try {
    CU_CALL_STATUS(env, r, cuLaunchHostFunc, stream, CompletionHostFn, c);
  } catch (...) {
    napi_release_threadsafe_function(c->tsfn, napi_tsfn_release);
    delete c;
    throw;
  }
  if (r != CUDA_SUCCESS) {
    napi_release_threadsafe_function(c->tsfn, napi_tsfn_release);
    delete c;
    ThrowCuda(env, r, "cuLaunchHostFunc");
  }
  if (t_state->pendingCompletions++ == 0) napi_ref_threadsafe_function(env, t_state->completions);
  return env.Undefined();
}

// ---------------------------------------------------------------------------------------------
// Memory pools.

Napi::Value MemPoolCreate(const Napi::CallbackInfo& info) {
  CUmemPoolProps props;
  std::memset(&props, 0, sizeof(props));
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.handleTypes = static_cast<int>(ArgU32(info, 1, "handleTypes"));
  props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  props.location.id = ArgI32(info, 0, "device");
  props.maxSize = ArgSize(info, 2, "maxSize");
  CUmemoryPool pool = nullptr;
  CU_CALL(info.Env(), cuMemPoolCreate, &pool, &props);
  return HandleValue(info.Env(), pool);
}

Napi::Value MemPoolDestroy(const Napi::CallbackInfo& info) {
  CU_CALL(info.Env(), cuMemPoolDestroy, ArgHandle<CUmemoryPool>(info, 0, "pool"));
  return info.Env().Undefined();
}

Napi::Value MemPoolSetReleaseThreshold(const Napi::CallbackInfo& info) {
  cuuint64_t v = ArgU64(info, 1, "bytes");
  CU_CALL(info.Env(), cuMemPoolSetAttribute, ArgHandle<CUmemoryPool>(info, 0, "pool"), CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &v);
  return info.Env().Undefined();
}

Napi::Value MemPoolSetAccess(const Napi::CallbackInfo& info) {
  CUmemAccessDesc d;
  d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  d.location.id = ArgI32(info, 1, "device");
  d.flags = static_cast<int>(ArgU32(info, 2, "flags"));
  CU_CALL(info.Env(), cuMemPoolSetAccess, ArgHandle<CUmemoryPool>(info, 0, "pool"), &d, 1);
  return info.Env().Undefined();
}

Napi::Value MemPoolTrimTo(const Napi::CallbackInfo& info) {
  CU_CALL(info.Env(), cuMemPoolTrimTo, ArgHandle<CUmemoryPool>(info, 0, "pool"), ArgSize(info, 1, "bytes"));
  return info.Env().Undefined();
}

// Returns a new file descriptor owned by the caller.
Napi::Value MemPoolExportToFd(const Napi::CallbackInfo& info) {
  int fd = -1;
  CU_CALL(info.Env(), cuMemPoolExportToShareableHandle, &fd, ArgHandle<CUmemoryPool>(info, 0, "pool"),
          CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
  return Napi::Number::New(info.Env(), fd);
}

// Does not take ownership of the fd: the caller closes it.
Napi::Value MemPoolImportFromFd(const Napi::CallbackInfo& info) {
  int fd = ArgI32(info, 0, "fd");
  CUmemoryPool pool = nullptr;
  CU_CALL(info.Env(), cuMemPoolImportFromShareableHandle, &pool, reinterpret_cast<void*>(static_cast<intptr_t>(fd)),
          CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
  return HandleValue(info.Env(), pool);
}

// memPoolExportPointer(pointer, out?): the 64 bytes of export data, in `out` when given.
Napi::Value MemPoolExportPointer(const Napi::CallbackInfo& info) {
  CUmemPoolPtrExportData d;
  CU_CALL(info.Env(), cuMemPoolExportPointer, &d, ArgU64(info, 0, "pointer"));
  return PutBytes<sizeof(d.reserved)>(info, 1, d.reserved);
}

Napi::Value MemPoolImportPointer(const Napi::CallbackInfo& info) {
  CUmemPoolPtrExportData d;
  ArgFixedBytes<sizeof(d.reserved)>(info, 1, "exportData", d.reserved);
  CUdeviceptr p = 0;
  CU_CALL(info.Env(), cuMemPoolImportPointer, &p, ArgHandle<CUmemoryPool>(info, 0, "pool"), &d);
  return U64(info.Env(), p);
}

Napi::Value MemAllocFromPoolAsync(const Napi::CallbackInfo& info) {
  CUdeviceptr p = 0;
  CU_CALL(info.Env(), cuMemAllocFromPoolAsync, &p, ArgSize(info, 0, "bytes"), ArgHandle<CUmemoryPool>(info, 1, "pool"),
          ArgHandle<CUstream>(info, 2, "stream"));
  return U64(info.Env(), p);
}

Napi::Value MemFreeAsync(const Napi::CallbackInfo& info) {
  CU_CALL(info.Env(), cuMemFreeAsync, ArgU64(info, 0, "pointer"), ArgHandle<CUstream>(info, 1, "stream"));
  return info.Env().Undefined();
}

// ---------------------------------------------------------------------------------------------
// Prepared pool exports. cuMemPoolExportPointer costs 15-18 us (H100, driver 580), on the path of
// every first send of a pool buffer. TypeScript (src/ipc/prepared-exports.ts) asks for it right
// after the allocation instead, and this thread makes the call off the event loop; the send then
// finds the 64 bytes ready. The slots live in an ArrayBuffer that TypeScript made and reads with
// Atomics; this side only runs the driver call for each slot it is posted. One thread per
// environment (worker threads have their own), started by exportWorkerStart, stopped and joined
// by the environment's cleanup hook.
//
// A slot (kExportSlotBytes): i32 state @0, i32 CUresult @4, u64 pointer @8, u64 context @16, export
// data @64. States: 0 free, 1 queued (TypeScript wrote pointer and context, then posted it), 2
// running (this thread took it), 3 ready (data written), 4 failed (status written). TypeScript may
// take a queued slot back (queued -> free); only this thread moves queued -> running, and only
// TypeScript moves ready/failed -> free, after waiting out a running slot: a pointer is never
// exported after TypeScript freed its memory.
constexpr size_t kExportSlotBytes = 128;
constexpr size_t kExportDataOffset = 64;
constexpr int32_t kSlotQueued = 1, kSlotRunning = 2, kSlotReady = 3, kSlotFailed = 4;

struct ExportWorker {
  std::thread thread;
  std::mutex mutex;
  std::condition_variable wake;
  std::deque<uint32_t> queue;
  bool stop = false;
  uint8_t* table = nullptr;
  size_t slots = 0;
  napi_ref tableRef = nullptr;
};

void RunExportWorker(ExportWorker* w) {
  CUcontext current = nullptr;
  for (;;) {
    uint32_t slot;
    {
      std::unique_lock<std::mutex> lock(w->mutex);
      w->wake.wait(lock, [w] { return w->stop || !w->queue.empty(); });
      if (w->stop) return;
      slot = w->queue.front();
      w->queue.pop_front();
    }
    uint8_t* s = w->table + slot * kExportSlotBytes;
    auto* state = reinterpret_cast<int32_t*>(s);
    int32_t expected = kSlotQueued;
    // Taken back by TypeScript, or already done through an earlier post of the same slot.
    if (!__atomic_compare_exchange_n(state, &expected, kSlotRunning, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) continue;
    uint64_t pointer = 0, context = 0;
    std::memcpy(&pointer, s + 8, sizeof pointer);
    std::memcpy(&context, s + 16, sizeof context);
    CUresult r = CUDA_SUCCESS;
    auto ctx = reinterpret_cast<CUcontext>(static_cast<uintptr_t>(context));
    if (ctx != current) {
      r = g_driver.cuCtxSetCurrent(ctx);
      current = r == CUDA_SUCCESS ? ctx : nullptr;
    }
    CUmemPoolPtrExportData d;
    if (r == CUDA_SUCCESS) r = g_driver.cuMemPoolExportPointer(&d, pointer);
    if (r == CUDA_SUCCESS) std::memcpy(s + kExportDataOffset, d.reserved, sizeof d.reserved);
    __atomic_store_n(reinterpret_cast<int32_t*>(s + 4), static_cast<int32_t>(r), __ATOMIC_RELAXED);
    __atomic_store_n(state, r == CUDA_SUCCESS ? kSlotReady : kSlotFailed, __ATOMIC_RELEASE);
  }
}

void StopExportWorker(ExportWorker* w) {
  {
    std::lock_guard<std::mutex> lock(w->mutex);
    w->stop = true;
  }
  w->wake.notify_one();
  if (w->thread.joinable()) w->thread.join();
}

// exportWorkerStart(table: ArrayBuffer): starts this environment's thread over `table` (a whole
// number of slots), which it keeps alive. Once per environment.
Napi::Value ExportWorkerStart(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (t_state->exportWorker) ThrowType(env, "the export worker is already started");
  if (info.Length() < 1 || !info[0].IsArrayBuffer()) ThrowType(env, "table must be an ArrayBuffer");
  auto table = info[0].As<Napi::ArrayBuffer>();
  size_t bytes = table.ByteLength();
  if (bytes == 0 || bytes % kExportSlotBytes != 0 || bytes / kExportSlotBytes > 65536)
    ThrowType(env, "table must hold 1..65536 slots of " + std::to_string(kExportSlotBytes) + " bytes");
  EnsureDriver(env);
  if (!g_driver.cuMemPoolExportPointer || !g_driver.cuCtxSetCurrent)
    throw Napi::Error(env, MakeCudaError(env, -2, "CUDA_SYMBOL_NOT_FOUND", "the installed driver does not provide cuMemPoolExportPointer: update the NVIDIA driver",
                                         "cuGetProcAddress(cuMemPoolExportPointer)"));
  auto* w = new ExportWorker;
  w->table = static_cast<uint8_t*>(table.Data());
  w->slots = bytes / kExportSlotBytes;
  if (napi_create_reference(env, table, 1, &w->tableRef) != napi_ok) {
    delete w;
    throw Napi::Error::New(env, "napi_create_reference failed");
  }
  try {
    w->thread = std::thread(RunExportWorker, w);
  } catch (const std::system_error& e) {
    napi_delete_reference(env, w->tableRef);
    delete w;
    throw Napi::Error::New(env, std::string("could not start the export worker thread: ") + e.what());
  }
  t_state->exportWorker = w;
  return env.Undefined();
}

// exportWorkerPost(slot): the slot is queued (pointer and context written): export it.
Napi::Value ExportWorkerPost(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  ExportWorker* w = t_state->exportWorker;
  if (!w) ThrowType(env, "exportWorkerStart must be called first");
  uint32_t slot = ArgU32(info, 0, "slot");
  if (slot >= w->slots) ThrowType(env, "slot out of range");
  {
    std::lock_guard<std::mutex> lock(w->mutex);
    w->queue.push_back(slot);
  }
  w->wake.notify_one();
  return env.Undefined();
}

// ---------------------------------------------------------------------------------------------
// Modules and kernels.

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

// ---------------------------------------------------------------------------------------------

void CleanupEnv(void* arg) {
  auto* state = static_cast<EnvState*>(arg);
  if (state->completions) napi_release_threadsafe_function(state->completions, napi_tsfn_abort);
  if (ExportWorker* w = state->exportWorker) {
    // Joined before the table goes: the thread finishes the export it is in, then stops.
    StopExportWorker(w);
    napi_delete_reference(state->env, w->tableRef);
    delete w;
    state->exportWorker = nullptr;
  }
  if (t_state == state) t_state = nullptr;
  delete state;
}

}  // namespace

// [tensors hook] For native/copy.cc: entry points newer than kCudaAbiVersion, resolved at their own
// version once the driver is loaded (nullptr where the driver lacks them), and CudaErrors thrown
// the same way as every call here.
void* ResolveDriverEntry(Napi::Env env, const char* name, int abiVersion) {
  EnsureDriver(env);
  if (!g_getProc) return nullptr;
  void* fn = nullptr;
  int status = 0;
  if (g_getProc(name, &fn, abiVersion, CU_GET_PROC_ADDRESS_DEFAULT, &status) != CUDA_SUCCESS) return nullptr;
  return fn;
}

[[noreturn]] void ThrowCudaFailure(Napi::Env env, int status, const char* call) { ThrowCuda(env, status, call); }

void InitCuda(Napi::Env env, Napi::Object exports) {
  t_state = new EnvState();
  t_state->env = env;
  napi_add_env_cleanup_hook(env, CleanupEnv, t_state);
#define FN(jsName, fn) exports.Set(jsName, Napi::Function::New(env, fn, jsName));
  FN("setErrorClass", SetErrorClass)
  FN("setCompletionHandler", SetCompletionHandler)
  FN("driverGetVersion", DriverGetVersion)
  FN("deviceGetCount", DeviceGetCount)
  FN("deviceGet", DeviceGet)
  FN("deviceGetName", DeviceGetName)
  FN("deviceGetUuid", DeviceGetUuid)
  FN("deviceGetAttribute", DeviceGetAttribute)
  FN("deviceTotalMem", DeviceTotalMem)
  FN("deviceGetPCIBusId", DeviceGetPCIBusId)
  FN("deviceCanAccessPeer", DeviceCanAccessPeer)
  FN("deviceGetP2PAttribute", DeviceGetP2PAttribute)
  FN("devicePrimaryCtxRetain", DevicePrimaryCtxRetain)
  FN("devicePrimaryCtxRelease", DevicePrimaryCtxRelease)
  FN("ctxSetCurrent", CtxSetCurrent)
  FN("ctxGetCurrent", CtxGetCurrent)
  FN("ctxSynchronize", CtxSynchronize)
  FN("ctxEnablePeerAccess", CtxEnablePeerAccess)
  FN("memGetInfo", MemGetInfo)
  FN("memAlloc", MemAlloc)
  FN("memFree", MemFree)
  FN("memAllocManaged", MemAllocManaged)
  FN("memAllocHost", MemAllocHost)
  FN("memFreeHost", MemFreeHost)
  FN("memHostRegister", MemHostRegister)
  FN("memHostUnregister", MemHostUnregister)
  FN("memHostGetDevicePointer", MemHostGetDevicePointer)
  FN("memGetAddressRange", MemGetAddressRange)
  FN("pointerGetAttributeInt", PointerGetAttributeInt)
  FN("pointerGetAttributeU64", PointerGetAttributeU64)
  FN("memcpyHtoD", MemcpyHtoD)
  FN("memcpyDtoH", MemcpyDtoH)
  FN("memcpyDtoD", MemcpyDtoD)
  FN("memcpyHtoDAsync", MemcpyHtoDAsync)
  FN("memcpyDtoHAsync", MemcpyDtoHAsync)
  FN("memcpyDtoDAsync", MemcpyDtoDAsync)
  FN("memsetD8", MemsetD8)
  FN("memsetD32", MemsetD32)
  FN("memsetD8Async", MemsetD8Async)
  FN("memsetD32Async", MemsetD32Async)
  FN("ipcGetMemHandle", IpcGetMemHandle)
  FN("ipcOpenMemHandle", IpcOpenMemHandle)
  FN("ipcCloseMemHandle", IpcCloseMemHandle)
  FN("legacyExportRegister", LegacyExportRegister)
  FN("legacyExportUnregister", LegacyExportUnregister)
  FN("legacyImportAcquire", LegacyImportAcquire)
  FN("legacyImportRelease", LegacyImportRelease)
  FN("legacyImportDrop", LegacyImportDrop)
  FN("legacyImportForget", LegacyImportForget)
  FN("legacyExportSweep", LegacyExportSweep)
  FN("legacyCacheStats", LegacyCacheStats)
  FN("legacyCacheConfigure", LegacyCacheConfigure)
  FN("ipcGetEventHandle", IpcGetEventHandle)
  FN("ipcOpenEventHandle", IpcOpenEventHandle)
  FN("streamCreate", StreamCreate)
  FN("streamDestroy", StreamDestroy)
  FN("streamQuery", StreamQuery)
  FN("streamSynchronize", StreamSynchronize)
  FN("streamWaitEvent", StreamWaitEvent)
  FN("streamOnComplete", StreamOnComplete)
  FN("streamWaitValue32", StreamWaitValue32)
  FN("streamWaitValue64", StreamWaitValue64)
  FN("streamWriteValue32", StreamWriteValue32)
  FN("streamWriteValue64", StreamWriteValue64)
  FN("eventCreate", EventCreate)
  FN("eventDestroy", EventDestroy)
  FN("eventRecord", EventRecord)
  FN("eventQuery", EventQuery)
  FN("memPoolCreate", MemPoolCreate)
  FN("memPoolDestroy", MemPoolDestroy)
  FN("memPoolSetReleaseThreshold", MemPoolSetReleaseThreshold)
  FN("memPoolSetAccess", MemPoolSetAccess)
  FN("memPoolTrimTo", MemPoolTrimTo)
  FN("memPoolExportToFd", MemPoolExportToFd)
  FN("memPoolImportFromFd", MemPoolImportFromFd)
  FN("memPoolExportPointer", MemPoolExportPointer)
  FN("memPoolImportPointer", MemPoolImportPointer)
  FN("memAllocFromPoolAsync", MemAllocFromPoolAsync)
  FN("memFreeAsync", MemFreeAsync)
  FN("exportWorkerStart", ExportWorkerStart)
  FN("exportWorkerPost", ExportWorkerPost)
  FN("moduleLoadData", ModuleLoadData)
  FN("moduleUnload", ModuleUnload)
  FN("moduleGetFunction", ModuleGetFunction)
  FN("launchKernel", LaunchKernel)
#undef FN
}

}  // namespace cuda_ipc
