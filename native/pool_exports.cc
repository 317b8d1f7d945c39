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
#include "driver.h"

#include <condition_variable>
#include <deque>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>

namespace cuda_ipc {
using namespace cuabi;

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

namespace {

constexpr size_t kExportSlotBytes = 128;
constexpr size_t kExportDataOffset = 64;
constexpr int32_t kSlotQueued = 1, kSlotRunning = 2, kSlotReady = 3, kSlotFailed = 4;

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
    // Through a lambda of this file, so that the std::thread code made for it stays local to the
    // addon (ExportWorker has external linkage, being named in driver.h).
    w->thread = std::thread([w] { RunExportWorker(w); });
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

}  // namespace

void DeleteExportWorker(napi_env env, ExportWorker* w) {
  // Joined before the table goes: the thread finishes the export it is in, then stops.
  StopExportWorker(w);
  napi_delete_reference(env, w->tableRef);
  delete w;
}

void InitPoolExports(Napi::Env env, Napi::Object exports) {
  exports.Set("exportWorkerStart", Napi::Function::New(env, ExportWorkerStart, "exportWorkerStart"));
  exports.Set("exportWorkerPost", Napi::Function::New(env, ExportWorkerPost, "exportWorkerPost"));
}

}  // namespace cuda_ipc
