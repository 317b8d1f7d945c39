// NCCL bindings: near 1:1 wrappers over the subset of libnccl.so.2 declared in nccl_abi.h, found
// at run time and never linked.
//
// A library is opened by path with dlopen(RTLD_NOW | RTLD_LOCAL): TypeScript chooses which, after
// a throw-away child process loaded the same file without crashing (src/nccl/probe.ts). It stays
// loaded for the life of the process, as libcuda does. Calls return NCCL's result as a number and
// TypeScript checks every one (src/nccl/errors.ts): ncclInProgress is an ordinary answer of a
// non-blocking communicator, not an error, so throwing here would be wrong.
//
// Communicators cross into JavaScript as bigint handles that this file registered, per
// environment: a handle it does not know is refused with a TypeError, so JavaScript can never hand
// NCCL a communicator that was aborted or destroyed. Each remembers its device's primary context
// (the one the rest of the addon uses), which is made current around every call that may touch
// CUDA, since NCCL's runtime works on the thread's current device; whatever was current before is
// restored after, so the rest of the addon finds the context it left (src/cuda/device.ts caches it).
//
// ncclCommAbort and ncclCommDestroy block until NCCL's threads are joined and its memory freed
// (abort also waits for a pending init to give up): they run on a thread of their own and report
// back through a thread-safe function, so neither the event loop nor a libuv pool thread waits.
// The environment cleanup hook joins those threads and aborts every communicator still open, and
// so does ncclEndAllNow, which TypeScript calls on process exit (where cleanup hooks do not run).
#include <dlfcn.h>
#include <napi.h>

#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common.h"
#include "cuda_abi.h"
#include "driver.h"
#include "nccl_abi.h"

namespace cuda_ipc {

namespace {
using namespace ncclabi;
using cuabi::CUcontext;
using cuabi::CUresult;

// ---------------------------------------------------------------------------------------------
// Libraries (process-wide: every thread and worker shares them).

struct Library {
  void* handle = nullptr;
  std::string path;  // the file the loader chose (dladdr), or the path given
  int version = 0;
#define NCCL_MEMBER(name, ret, params) PFN_##name name = nullptr;
  NCCLABI_FUNCTIONS(NCCL_MEMBER)
#undef NCCL_MEMBER
};

std::mutex g_librariesMutex;
std::vector<Library*> g_libraries;  // never freed: a loaded NCCL is never unloaded

Library* ArgLibrary(const Napi::CallbackInfo& info, size_t i) {
  uint32_t index = ArgU32(info, i, "library");
  std::lock_guard<std::mutex> lock(g_librariesMutex);
  if (index >= g_libraries.size()) ThrowType(info.Env(), "library is not an NCCL library this process loaded");
  return g_libraries[index];
}

Napi::Error LoadError(Napi::Env env, const std::string& code, const std::string& message) {
  Napi::Error e = Napi::Error::New(env, message);
  e.Set("code", Napi::String::New(env, code));
  return e;
}

// ncclOpen(path) -> { library, path, version }: dlopens the file, resolves every entry point of
// nccl_abi.h and asks its version. Throws an Error whose code is ERR_DLOPEN (the loader's
// message), ERR_NCCL_SYMBOLS (entry points missing: not NCCL, or older than 2.14) or
// ERR_NCCL_VERSION (ncclGetVersion failed).
Napi::Value Open(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  std::string path = ArgString(info, 0, "path");
  if (path.empty() || path.find('\0') != std::string::npos) ThrowType(env, "path must be a non-empty string without NUL");
  dlerror();
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* e = dlerror();
    throw LoadError(env, "ERR_DLOPEN", e ? e : "dlopen failed");
  }
  auto* lib = new Library();
  lib->handle = handle;
  std::string missing;
#define NCCL_RESOLVE(name, ret, params)                                   \
  lib->name = reinterpret_cast<PFN_##name>(dlsym(handle, #name));          \
  if (!lib->name) missing += (missing.empty() ? "" : ", ") + std::string(#name);
  NCCLABI_FUNCTIONS(NCCL_RESOLVE)
#undef NCCL_RESOLVE
  if (!missing.empty()) {
    delete lib;
    dlclose(handle);
    throw LoadError(env, "ERR_NCCL_SYMBOLS", "it does not export " + missing + " (not NCCL, or NCCL older than 2.14)");
  }
  int version = 0;
  ncclResult_t r = lib->ncclGetVersion(&version);
  if (r != ncclSuccess) {
    delete lib;
    dlclose(handle);
    throw LoadError(env, "ERR_NCCL_VERSION", "ncclGetVersion returned " + std::to_string(r));
  }
  lib->version = version;
  Dl_info where{};
  lib->path = dladdr(reinterpret_cast<void*>(lib->ncclGetVersion), &where) && where.dli_fname ? where.dli_fname : path;

  uint32_t index = 0;
  {
    std::lock_guard<std::mutex> lock(g_librariesMutex);
    for (index = 0; index < g_libraries.size(); index++) {
      if (g_libraries[index]->handle == handle) break;
    }
    if (index < g_libraries.size()) {
      delete lib;  // the same file again: one entry, and the loader's extra reference dropped
      dlclose(handle);
      lib = g_libraries[index];
    } else {
      g_libraries.push_back(lib);
    }
  }
  Napi::Object out = Napi::Object::New(env);
  out.Set("library", Napi::Number::New(env, index));
  out.Set("path", Napi::String::New(env, lib->path));
  out.Set("version", Napi::Number::New(env, lib->version));
  return out;
}

// ---------------------------------------------------------------------------------------------
// The CUDA context around calls.

// Makes `ctx` current on this thread for the scope's life, then puts back what was current before
// (also when NCCL changed it meanwhile). A null ctx leaves the thread alone: a communicator made
// for tests with a stand-in device (src/nccl/testing.ts), where no driver is needed.
class ContextScope {
 public:
  ContextScope(Napi::Env env, CUcontext ctx) {
    if (!ctx) return;
    CU_CALL(env, cuCtxGetCurrent, &previous_);
    if (previous_ != ctx) CU_CALL(env, cuCtxSetCurrent, ctx);
    active_ = true;
  }
  ~ContextScope() {
    if (!active_) return;  // active: the driver is loaded (the constructor called it)
    CUcontext now = nullptr;
    if (g_driver.cuCtxGetCurrent(&now) != cuabi::CUDA_SUCCESS || now != previous_) g_driver.cuCtxSetCurrent(previous_);
  }
  ContextScope(const ContextScope&) = delete;
  ContextScope& operator=(const ContextScope&) = delete;

 private:
  CUcontext previous_ = nullptr;
  bool active_ = false;
};

// ---------------------------------------------------------------------------------------------
// Communicators, per environment.

struct Comm {
  Library* lib;
  CUcontext ctx;
};

struct NcclEnvState {
  std::unordered_map<ncclComm_t, Comm> comms;
  // Threads running ncclCommAbort / ncclCommDestroy, by id; joined when they report, or at teardown.
  std::map<uint64_t, std::thread> ending;
  uint64_t nextEnding = 1;
};
thread_local NcclEnvState* t_nccl = nullptr;

struct CommArg {
  ncclComm_t comm;
  Comm entry;
};

CommArg ArgComm(const Napi::CallbackInfo& info, size_t i) {
  auto comm = ArgHandle<ncclComm_t>(info, i, "comm");
  auto it = t_nccl->comms.find(comm);
  if (comm == nullptr || it == t_nccl->comms.end()) {
    ThrowType(info.Env(), "comm is not an open NCCL communicator of this thread (it was aborted or destroyed)");
  }
  return {comm, it->second};
}

Napi::Array Pair(Napi::Env env, ncclResult_t r, napi_value second) {
  Napi::Array a = Napi::Array::New(env, 2);
  a.Set(0u, Napi::Number::New(env, r));
  a.Set(1u, second);
  return a;
}

// ncclGetErrorString(library, result) -> the library's text for a result.
Napi::Value GetErrorString(const Napi::CallbackInfo& info) {
  Library* lib = ArgLibrary(info, 0);
  const char* s = lib->ncclGetErrorString(ArgI32(info, 1, "result"));
  return Napi::String::New(info.Env(), s ? s : "");
}

// ncclGetLastError(library, comm) -> the text of the last error on this thread (comm 0n: none
// given, as NCCL allows).
Napi::Value GetLastError(const Napi::CallbackInfo& info) {
  Library* lib = ArgLibrary(info, 0);
  ncclComm_t comm = nullptr;
  if (ArgU64(info, 1, "comm") != 0) comm = ArgComm(info, 1).comm;
  const char* s = lib->ncclGetLastError(comm);
  return Napi::String::New(info.Env(), s ? s : "");
}

// ncclGetUniqueId(library, out) -> result; `out` (128 bytes) receives the id on success.
Napi::Value GetUniqueId(const Napi::CallbackInfo& info) {
  Library* lib = ArgLibrary(info, 0);
  Bytes out = ArgBytes(info, 1, "out");
  if (out.length != kUniqueIdBytes) ThrowType(info.Env(), "out must be exactly 128 bytes");
  ncclUniqueId id;
  std::memset(&id, 0, sizeof id);
  ncclResult_t r = lib->ncclGetUniqueId(&id);
  if (r == ncclSuccess) std::memcpy(out.data, id.internal, kUniqueIdBytes);
  return Napi::Number::New(info.Env(), r);
}

// ncclCommInitRankConfig(library, context, nranks, uniqueId, rank, blocking) -> [result, comm].
// The config is ours (nccl_abi.h): blocking as given, everything else NCCL's default. A non-null
// comm is registered (with `context`, made current around this and every later call on it)
// whatever the result: a non-blocking init that failed still has a communicator to abort.
Napi::Value CommInitRankConfig(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Library* lib = ArgLibrary(info, 0);
  auto ctx = ArgHandle<CUcontext>(info, 1, "context");
  int nranks = ArgI32(info, 2, "nranks");
  ncclUniqueId id;
  ArgFixedBytes<kUniqueIdBytes>(info, 3, "uniqueId", id.internal);
  int rank = ArgI32(info, 4, "rank");
  bool blocking = ArgBool(info, 5, "blocking");

  ncclConfig_v21700 config;
  std::memset(&config, 0, sizeof config);
  config.size = sizeof config;
  config.magic = kApiMagic;
  config.version = kConfigVersion;
  config.blocking = blocking ? 1 : 0;
  config.cgaClusterSize = kConfigUndefInt;
  config.minCTAs = kConfigUndefInt;
  config.maxCTAs = kConfigUndefInt;
  config.netName = nullptr;

  ncclComm_t comm = nullptr;
  ncclResult_t r;
  {
    ContextScope scope(env, ctx);
    r = lib->ncclCommInitRankConfig(&comm, nranks, id, rank, &config);
  }
  if (comm) t_nccl->comms[comm] = Comm{lib, ctx};
  return Pair(env, r, HandleValue(env, comm));
}

// ncclCommGetAsyncError(comm) -> [result, asyncError].
Napi::Value CommGetAsyncError(const Napi::CallbackInfo& info) {
  CommArg c = ArgComm(info, 0);
  ncclResult_t state = ncclSuccess;
  ncclResult_t r = c.entry.lib->ncclCommGetAsyncError(c.comm, &state);
  return Pair(info.Env(), r, Napi::Number::New(info.Env(), state));
}

// ncclCommFinalize(comm) -> result (ncclInProgress on a non-blocking communicator: poll
// ncclCommGetAsyncError, then end it with ncclCommEnd).
Napi::Value CommFinalize(const Napi::CallbackInfo& info) {
  CommArg c = ArgComm(info, 0);
  ContextScope scope(info.Env(), c.entry.ctx);
  return Napi::Number::New(info.Env(), c.entry.lib->ncclCommFinalize(c.comm));
}

// ncclCommCount / ncclCommCuDevice / ncclCommUserRank(comm) -> [result, value].
#define COMM_QUERY(Binding, fn)                                                       \
  Napi::Value Binding(const Napi::CallbackInfo& info) {                              \
    CommArg c = ArgComm(info, 0);                                                     \
    int v = -1;                                                                       \
    ncclResult_t r = c.entry.lib->fn(c.comm, &v);                                     \
    return Pair(info.Env(), r, Napi::Number::New(info.Env(), v));                     \
  }
COMM_QUERY(CommCount, ncclCommCount)
COMM_QUERY(CommCuDevice, ncclCommCuDevice)
COMM_QUERY(CommUserRank, ncclCommUserRank)
#undef COMM_QUERY

// ncclSend / ncclRecv(comm, pointer, count, datatype, peer, stream) -> result.
Napi::Value Send(const Napi::CallbackInfo& info) {
  CommArg c = ArgComm(info, 0);
  auto ptr = ArgHandle<const void*>(info, 1, "pointer");
  size_t count = ArgSize(info, 2, "count");
  int datatype = ArgI32(info, 3, "datatype");
  int peer = ArgI32(info, 4, "peer");
  auto stream = ArgHandle<cudaStream_t>(info, 5, "stream");
  ContextScope scope(info.Env(), c.entry.ctx);
  return Napi::Number::New(info.Env(), c.entry.lib->ncclSend(ptr, count, datatype, peer, c.comm, stream));
}

Napi::Value Recv(const Napi::CallbackInfo& info) {
  CommArg c = ArgComm(info, 0);
  auto ptr = ArgHandle<void*>(info, 1, "pointer");
  size_t count = ArgSize(info, 2, "count");
  int datatype = ArgI32(info, 3, "datatype");
  int peer = ArgI32(info, 4, "peer");
  auto stream = ArgHandle<cudaStream_t>(info, 5, "stream");
  ContextScope scope(info.Env(), c.entry.ctx);
  return Napi::Number::New(info.Env(), c.entry.lib->ncclRecv(ptr, count, datatype, peer, c.comm, stream));
}

// ncclBroadcast(comm, sendPointer, recvPointer, count, datatype, root, stream) -> result.
Napi::Value Broadcast(const Napi::CallbackInfo& info) {
  CommArg c = ArgComm(info, 0);
  auto send = ArgHandle<const void*>(info, 1, "sendPointer");
  auto recv = ArgHandle<void*>(info, 2, "recvPointer");
  size_t count = ArgSize(info, 3, "count");
  int datatype = ArgI32(info, 4, "datatype");
  int root = ArgI32(info, 5, "root");
  auto stream = ArgHandle<cudaStream_t>(info, 6, "stream");
  ContextScope scope(info.Env(), c.entry.ctx);
  return Napi::Number::New(info.Env(), c.entry.lib->ncclBroadcast(send, recv, count, datatype, root, c.comm, stream));
}

// ncclGroupStart / ncclGroupEnd(comm) -> result. NCCL's groups are per thread, not per
// communicator: `comm` names the library and the context to make current (ncclGroupEnd launches
// the group's work).
Napi::Value GroupStart(const Napi::CallbackInfo& info) {
  CommArg c = ArgComm(info, 0);
  ContextScope scope(info.Env(), c.entry.ctx);
  return Napi::Number::New(info.Env(), c.entry.lib->ncclGroupStart());
}

Napi::Value GroupEnd(const Napi::CallbackInfo& info) {
  CommArg c = ArgComm(info, 0);
  ContextScope scope(info.Env(), c.entry.ctx);
  return Napi::Number::New(info.Env(), c.entry.lib->ncclGroupEnd());
}

// ncclCommEnd(comm, abort, callback): unregisters the communicator now, then runs ncclCommAbort
// (abort true) or ncclCommDestroy on a thread of its own, which calls back with (result,
// lastError) on this thread when it returns.
struct EndResult {
  uint64_t id;
  ncclResult_t result;
  std::string lastError;
};

void EndCallJs(napi_env env, napi_value callback, void* context, void* data) {
  std::unique_ptr<EndResult> done(static_cast<EndResult*>(data));
  if (env == nullptr || t_nccl == nullptr) return;  // torn down: the cleanup hook joins the thread
  auto it = t_nccl->ending.find(done->id);
  if (it != t_nccl->ending.end()) {
    it->second.join();  // it returns right after this call was queued
    t_nccl->ending.erase(it);
  }
  napi_value args[2];
  napi_create_int32(env, done->result, &args[0]);
  napi_create_string_utf8(env, done->lastError.data(), done->lastError.size(), &args[1]);
  napi_value global;
  napi_get_global(env, &global);
  napi_call_function(env, global, callback, 2, args, nullptr);
}

ncclResult_t EndOnThisThread(ncclComm_t comm, const Comm& c, bool abort, std::string* lastError) {
  // NCCL's teardown works on the communicator's device: its context current meanwhile (a thread of
  // our own has none), then what was current put back (this may be the JavaScript thread, at exit or
  // where no thread could start, whose current context src/cuda/device.ts caches). The driver is
  // loaded: a communicator with a context was made inside a ContextScope.
  CUcontext previous = nullptr;
  bool switched = c.ctx && g_driver.cuCtxGetCurrent(&previous) == cuabi::CUDA_SUCCESS && previous != c.ctx &&
                  g_driver.cuCtxSetCurrent(c.ctx) == cuabi::CUDA_SUCCESS;
  ncclResult_t r = abort ? c.lib->ncclCommAbort(comm) : c.lib->ncclCommDestroy(comm);
  if (switched) g_driver.cuCtxSetCurrent(previous);
  if (r != ncclSuccess && lastError) {
    const char* s = c.lib->ncclGetLastError(nullptr);
    if (s) *lastError = s;
  }
  return r;
}

Napi::Value CommEnd(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  CommArg c = ArgComm(info, 0);
  bool abort = ArgBool(info, 1, "abort");
  if (info.Length() < 3 || !info[2].IsFunction()) ThrowType(env, "callback must be a function");
  napi_threadsafe_function tsfn = nullptr;
  napi_value name = Napi::String::New(env, abort ? "cuda-ipc ncclCommAbort" : "cuda-ipc ncclCommDestroy");
  if (napi_create_threadsafe_function(env, info[2], nullptr, name, 0, 1, nullptr, nullptr, nullptr, EndCallJs, &tsfn) != napi_ok) {
    throw Napi::Error::New(env, "napi_create_threadsafe_function failed");
  }
  t_nccl->comms.erase(c.comm);
  uint64_t id = t_nccl->nextEnding++;
  ncclComm_t comm = c.comm;
  Comm entry = c.entry;
  try {
    t_nccl->ending.emplace(id, std::thread([tsfn, id, comm, entry, abort] {
      auto* done = new EndResult{id, ncclSuccess, {}};
      done->result = EndOnThisThread(comm, entry, abort, &done->lastError);
      if (napi_call_threadsafe_function(tsfn, done, napi_tsfn_nonblocking) != napi_ok) delete done;
      napi_release_threadsafe_function(tsfn, napi_tsfn_release);
    }));
  } catch (const std::system_error& e) {
    // No thread: end it here rather than leak it.
    napi_release_threadsafe_function(tsfn, napi_tsfn_release);
    ncclResult_t r = EndOnThisThread(comm, entry, abort, nullptr);
    throw Napi::Error::New(env, std::string("could not start a thread for ncclCommEnd (") + e.what() +
                                    "); it ran on this thread and returned " + std::to_string(r));
  }
  return env.Undefined();
}

// ncclCommsOpen() -> how many communicators this thread has registered and not ended (tests).
Napi::Value CommsOpen(const Napi::CallbackInfo& info) {
  return Napi::Number::New(info.Env(), static_cast<double>(t_nccl->comms.size()));
}

// Joins the threads still ending communicators and aborts those still open (never destroys: that
// is collective and could wait forever for a peer that is gone or leaking its own). Returns how many
// it aborted. Their callbacks never run (EndCallJs finds no thread and the loop is gone).
size_t EndAllNow(NcclEnvState* state) {
  for (auto& [id, thread] : state->ending) {
    if (thread.joinable()) thread.join();
  }
  state->ending.clear();
  size_t aborted = state->comms.size();
  for (auto& [comm, entry] : state->comms) EndOnThisThread(comm, entry, true, nullptr);
  state->comms.clear();
  return aborted;
}

// ncclEndAllNow() -> communicators aborted. For process exit: exit() tears down CUDA and NCCL's
// globals while NCCL's proxy threads (or ours, mid ncclCommDestroy) still run, which crashes the
// process (SIGSEGV seen after a test file's last test). Blocks until every communicator is gone.
Napi::Value EndAllNowJs(const Napi::CallbackInfo& info) {
  return Napi::Number::New(info.Env(), static_cast<double>(EndAllNow(t_nccl)));
}

void CleanupEnv(void* arg) {
  auto* state = static_cast<NcclEnvState*>(arg);
  EndAllNow(state);
  if (t_nccl == state) t_nccl = nullptr;
  delete state;
}

}  // namespace

void InitNccl(Napi::Env env, Napi::Object exports) {
  t_nccl = new NcclEnvState();
  napi_add_env_cleanup_hook(env, CleanupEnv, t_nccl);
#define FN(jsName, fn) exports.Set(jsName, Napi::Function::New(env, fn, jsName));
  FN("ncclOpen", Open)
  FN("ncclGetErrorString", GetErrorString)
  FN("ncclGetLastError", GetLastError)
  FN("ncclGetUniqueId", GetUniqueId)
  FN("ncclCommInitRankConfig", CommInitRankConfig)
  FN("ncclCommGetAsyncError", CommGetAsyncError)
  FN("ncclCommFinalize", CommFinalize)
  FN("ncclCommCount", CommCount)
  FN("ncclCommCuDevice", CommCuDevice)
  FN("ncclCommUserRank", CommUserRank)
  FN("ncclSend", Send)
  FN("ncclRecv", Recv)
  FN("ncclBroadcast", Broadcast)
  FN("ncclGroupStart", GroupStart)
  FN("ncclGroupEnd", GroupEnd)
  FN("ncclCommEnd", CommEnd)
  FN("ncclCommsOpen", CommsOpen)
  FN("ncclEndAllNow", EndAllNowJs)
#undef FN
}

}  // namespace cuda_ipc
