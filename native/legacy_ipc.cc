// Legacy IPC (cuIpc*): memory handles, with the process-wide import cache and table of local
// exports, and event handles.
//
// The driver refuses to open a handle in the process that exported it, and every thread of a
// process shares one address space, so both tables are process-wide. Exports are keyed by the
// handle bytes; imports by the handle bytes and the context they were opened in, because
// cuIpcOpenMemHandle maps into the current context: a process working on two GPUs may map one
// allocation once for each.
#include "driver.h"

#include <map>
#include <mutex>
#include <string>

namespace cuda_ipc {
using namespace cuabi;

namespace {

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

}  // namespace

void InitLegacyIpc(Napi::Env env, Napi::Object exports) {
  exports.Set("ipcGetMemHandle", Napi::Function::New(env, IpcGetMemHandle, "ipcGetMemHandle"));
  exports.Set("ipcOpenMemHandle", Napi::Function::New(env, IpcOpenMemHandle, "ipcOpenMemHandle"));
  exports.Set("ipcCloseMemHandle", Napi::Function::New(env, IpcCloseMemHandle, "ipcCloseMemHandle"));
  exports.Set("legacyExportRegister", Napi::Function::New(env, LegacyExportRegister, "legacyExportRegister"));
  exports.Set("legacyExportUnregister", Napi::Function::New(env, LegacyExportUnregister, "legacyExportUnregister"));
  exports.Set("legacyImportAcquire", Napi::Function::New(env, LegacyImportAcquire, "legacyImportAcquire"));
  exports.Set("legacyImportRelease", Napi::Function::New(env, LegacyImportRelease, "legacyImportRelease"));
  exports.Set("legacyImportDrop", Napi::Function::New(env, LegacyImportDrop, "legacyImportDrop"));
  exports.Set("legacyImportForget", Napi::Function::New(env, LegacyImportForget, "legacyImportForget"));
  exports.Set("legacyExportSweep", Napi::Function::New(env, LegacyExportSweep, "legacyExportSweep"));
  exports.Set("legacyCacheStats", Napi::Function::New(env, LegacyCacheStats, "legacyCacheStats"));
  exports.Set("legacyCacheConfigure", Napi::Function::New(env, LegacyCacheConfigure, "legacyCacheConfigure"));
  exports.Set("ipcGetEventHandle", Napi::Function::New(env, IpcGetEventHandle, "ipcGetEventHandle"));
  exports.Set("ipcOpenEventHandle", Napi::Function::New(env, IpcOpenEventHandle, "ipcOpenEventHandle"));
}

}  // namespace cuda_ipc
