// The allocator behind cuda_ipc.tensors.torch_pool (python/cuda_ipc/tensors/torch_pool.py): PyTorch's
// CUDAPluggableAllocator calls
//   void* cip_torch_alloc(ssize_t size, int device, cudaStream_t stream)
//   void  cip_torch_free(void* ptr, ssize_t size, int device, cudaStream_t stream)
// for the segments of a torch.cuda.MemPool, and these take them from a CUDA memory pool of the
// device made for IPC (cuMemPoolCreate with POSIX file descriptors as its handle type): a model
// allocated under `torch.cuda.use_mem_pool(pool)` lives in one IPC pool, which a peer imports once
// (one fd), then maps each pool allocation from 64 bytes of export data (cuMemPoolImportPointer)
// instead of opening a legacy handle per segment (cuIpcOpenMemHandle, 150-700 us on an H200).
//
// Segments are carved out of a few large pool allocations (chunks: the first 32 MiB, each next as
// large as all before it, up to 2 GiB; a larger segment gets a chunk of its own size), because a
// sender exports and a receiver imports each pool allocation once, and a model's caching-allocator
// segments are hundreds (392 for an 8 GiB, 3,000-tensor model: as many exports on a first sync, and
// as many imports at 40-80 us each). Sub-allocation is first fit on 512-byte boundaries with
// coalescing; a chunk whose segments were all freed goes back to the pool (PyTorch frees segments
// in torch.cuda.empty_cache()). A new chunk is synchronized on its stream before its first segment
// is handed out, and the device before a chunk goes back, because PyTorch may use a chunk's
// segments on other streams than the one it came on.
//
// One pool per device, made on first use and kept for the life of the process (PyTorch keeps its
// segments cached too); its release threshold is the maximum, so memory freed back to it stays
// reserved instead of going back to the driver at each synchronization. The driver is opened with
// dlopen on first use and its entry points resolved with cuGetProcAddress for the ABI version of
// native/cuda_abi.h, as the addon does (native/driver.cc); this file shares no state with the addon.
//
// An allocation that fails returns NULL (PyTorch then raises its out-of-memory error);
// cip_torch_last_error says what the driver answered. Every call is checked.
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>

#include <iterator>
#include <map>

#include "../cuda_abi.h"

using namespace cuabi;

#define CIP_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

constexpr int kMaxDevices = 64;

struct Driver {
  PFN_cuInit init;
  PFN_cuGetErrorName errorName;
  PFN_cuDeviceGet deviceGet;
  PFN_cuDevicePrimaryCtxRetain primaryRetain;
  PFN_cuDevicePrimaryCtxRelease primaryRelease;
  PFN_cuCtxGetCurrent ctxGet;
  PFN_cuCtxSetCurrent ctxSet;
  PFN_cuMemPoolCreate poolCreate;
  PFN_cuMemPoolSetAttribute poolSetAttribute;
  PFN_cuMemAllocFromPoolAsync allocFromPool;
  PFN_cuMemFreeAsync freeAsync;
  PFN_cuStreamSynchronize streamSynchronize;
  PFN_cuCtxSynchronize ctxSynchronize;
};

Driver g_drv;
bool g_loaded = false;
pthread_once_t g_once = PTHREAD_ONCE_INIT;
pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
// Per device: its pool and primary context (made once, under g_lock; read without it after).
CUmemoryPool g_pools[kMaxDevices];
CUcontext g_contexts[kMaxDevices];
char g_error[256] = "";

void SetError(const char* what, CUresult r) {
  const char* name = nullptr;
  if (g_drv.errorName) g_drv.errorName(r, &name);
  pthread_mutex_lock(&g_lock);
  snprintf(g_error, sizeof g_error, "%s failed: %s (%d)", what, name ? name : "unknown error", r);
  pthread_mutex_unlock(&g_lock);
}

void SetErrorText(const char* text) {
  pthread_mutex_lock(&g_lock);
  snprintf(g_error, sizeof g_error, "%s", text);
  pthread_mutex_unlock(&g_lock);
}

void Load() {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    SetErrorText("libcuda.so.1 could not be loaded (no NVIDIA driver here)");
    return;
  }
  auto getProc = reinterpret_cast<PFN_cuGetProcAddress_v2>(dlsym(lib, "cuGetProcAddress_v2"));
  if (!getProc) {
    SetErrorText("libcuda.so.1 has no cuGetProcAddress_v2: the NVIDIA driver is older than CUDA 12.0");
    return;
  }
  bool ok = true;
  auto resolve = [&](const char* name, void** out) {
    int status = 0;
    if (getProc(name, out, kCudaAbiVersion, CU_GET_PROC_ADDRESS_DEFAULT, &status) != CUDA_SUCCESS || !*out) {
      char text[128];
      snprintf(text, sizeof text, "the driver does not export %s", name);
      SetErrorText(text);
      ok = false;
    }
  };
  resolve("cuInit", reinterpret_cast<void**>(&g_drv.init));
  resolve("cuGetErrorName", reinterpret_cast<void**>(&g_drv.errorName));
  resolve("cuDeviceGet", reinterpret_cast<void**>(&g_drv.deviceGet));
  resolve("cuDevicePrimaryCtxRetain", reinterpret_cast<void**>(&g_drv.primaryRetain));
  resolve("cuDevicePrimaryCtxRelease", reinterpret_cast<void**>(&g_drv.primaryRelease));
  resolve("cuCtxGetCurrent", reinterpret_cast<void**>(&g_drv.ctxGet));
  resolve("cuCtxSetCurrent", reinterpret_cast<void**>(&g_drv.ctxSet));
  resolve("cuMemPoolCreate", reinterpret_cast<void**>(&g_drv.poolCreate));
  resolve("cuMemPoolSetAttribute", reinterpret_cast<void**>(&g_drv.poolSetAttribute));
  resolve("cuMemAllocFromPoolAsync", reinterpret_cast<void**>(&g_drv.allocFromPool));
  resolve("cuMemFreeAsync", reinterpret_cast<void**>(&g_drv.freeAsync));
  resolve("cuStreamSynchronize", reinterpret_cast<void**>(&g_drv.streamSynchronize));
  resolve("cuCtxSynchronize", reinterpret_cast<void**>(&g_drv.ctxSynchronize));
  if (!ok) return;
  CUresult r = g_drv.init(0);
  if (r != CUDA_SUCCESS) {
    SetError("cuInit", r);
    return;
  }
  g_loaded = true;
}

// The pool of `device` (made on first use), or nullptr with g_error set.
CUmemoryPool PoolOf(int device) {
  pthread_once(&g_once, Load);
  if (!g_loaded) return nullptr;
  if (device < 0 || device >= kMaxDevices) {
    SetErrorText("device ordinal out of range");
    return nullptr;
  }
  CUmemoryPool pool = __atomic_load_n(&g_pools[device], __ATOMIC_ACQUIRE);
  if (pool) return pool;
  pthread_mutex_lock(&g_lock);
  pool = g_pools[device];
  CUresult r = CUDA_SUCCESS;
  const char* what = nullptr;
  if (!pool) {
    CUdevice dev = 0;
    CUcontext ctx = nullptr;
    CUmemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.handleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    props.location.id = device;
    CUmemoryPool made = nullptr;
    if ((r = g_drv.deviceGet(&dev, device)) != CUDA_SUCCESS) {
      what = "cuDeviceGet";
    } else if ((r = g_drv.primaryRetain(&ctx, dev)) != CUDA_SUCCESS) {
      what = "cuDevicePrimaryCtxRetain";
    } else if ((r = g_drv.poolCreate(&made, &props)) != CUDA_SUCCESS) {
      what = "cuMemPoolCreate (an IPC pool with POSIX fds)";
      g_drv.primaryRelease(dev);
    } else {
      // Keep freed memory reserved. A pool that cannot still works (it returns memory to the
      // driver at synchronizations): the answer is not an error of the allocation.
      cuuint64_t keep = ~static_cast<cuuint64_t>(0);
      (void)g_drv.poolSetAttribute(made, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep);
      g_contexts[device] = ctx;  // (the retain is kept for the pool's life: the process's)
      __atomic_store_n(&g_pools[device], made, __ATOMIC_RELEASE);
      pool = made;
    }
  }
  pthread_mutex_unlock(&g_lock);
  if (what) SetError(what, r);
  return pool;
}

// Runs `fn` with `device`'s primary context current on this thread (PyTorch has it current already;
// anything else is restored after).
template <typename Fn>
CUresult InContext(int device, Fn fn) {
  CUcontext cur = nullptr;
  CUresult r = g_drv.ctxGet(&cur);
  if (r != CUDA_SUCCESS) return r;
  CUcontext want = g_contexts[device];
  if (cur == want) return fn();
  if ((r = g_drv.ctxSet(want)) != CUDA_SUCCESS) return r;
  CUresult out = fn();
  g_drv.ctxSet(cur);
  return out;
}

// ---- Chunks and the segments carved from them (per device, under g_arena_lock) ----

constexpr size_t kAlign = 512;               // what PyTorch's caching allocator assumes of a segment
constexpr size_t kChunkGrain = size_t{2} << 20;
constexpr size_t kMinChunk = size_t{32} << 20;
constexpr size_t kMaxChunk = size_t{2} << 30;

struct Chunk {
  size_t size = 0;
  size_t used = 0;
  std::map<size_t, size_t> free;  // offset -> length, coalesced
};

struct Arena {
  std::map<CUdeviceptr, Chunk> chunks;     // by base address
  std::map<CUdeviceptr, size_t> segments;  // handed out: address -> rounded length
  size_t reserved = 0;                     // bytes in chunks
  size_t used = 0;                         // bytes in segments
};

pthread_mutex_t g_arena_lock = PTHREAD_MUTEX_INITIALIZER;
Arena g_arenas[kMaxDevices];

size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

// Takes `n` bytes (a multiple of kAlign) from `chunk` at `base`: first fit; 0 where none fits.
CUdeviceptr Carve(CUdeviceptr base, Chunk& chunk, size_t n) {
  for (auto it = chunk.free.begin(); it != chunk.free.end(); ++it) {
    if (it->second < n) continue;
    size_t offset = it->first, length = it->second;
    chunk.free.erase(it);
    if (length > n) chunk.free.emplace(offset + n, length - n);
    chunk.used += n;
    return base + offset;
  }
  return 0;
}

// A new chunk of at least `n` bytes from `pool`, ready for use on any stream, or 0 with g_error set.
CUdeviceptr NewChunk(Arena& arena, int device, CUmemoryPool pool, CUstream stream, size_t n, size_t* size) {
  size_t grow = arena.reserved < kMinChunk ? kMinChunk : arena.reserved > kMaxChunk ? kMaxChunk : arena.reserved;
  size_t exact = RoundUp(n, kChunkGrain);
  size_t want = exact > grow ? exact : RoundUp(grow, kChunkGrain);
  CUdeviceptr p = 0;
  CUresult r = InContext(device, [&] { return g_drv.allocFromPool(&p, want, pool, stream); });
  if (r == CUDA_ERROR_OUT_OF_MEMORY && want > exact) {  // the device is nearly full: no room to grow ahead
    want = exact;
    r = InContext(device, [&] { return g_drv.allocFromPool(&p, want, pool, stream); });
  }
  if (r != CUDA_SUCCESS) {
    SetError("cuMemAllocFromPoolAsync", r);
    return 0;
  }
  r = InContext(device, [&] { return g_drv.streamSynchronize(stream); });
  if (r != CUDA_SUCCESS) {
    SetError("cuStreamSynchronize (a new chunk of the IPC pool)", r);
    (void)InContext(device, [&] { return g_drv.freeAsync(p, stream); });
    return 0;
  }
  *size = want;
  return p;
}

}  // namespace

CIP_EXPORT void* cip_torch_alloc(ssize_t size, int device, CUstream stream) {
  if (size <= 0) return nullptr;
  CUmemoryPool pool = PoolOf(device);
  if (!pool) return nullptr;
  size_t n = RoundUp(static_cast<size_t>(size), kAlign);
  CUdeviceptr p = 0;
  pthread_mutex_lock(&g_arena_lock);
  try {
    Arena& arena = g_arenas[device];
    for (auto& [base, chunk] : arena.chunks) {
      if (chunk.size - chunk.used >= n && (p = Carve(base, chunk, n)) != 0) break;
    }
    if (!p) {
      size_t chunkSize = 0;
      CUdeviceptr base = NewChunk(arena, device, pool, stream, n, &chunkSize);
      if (base) {
        Chunk& chunk = arena.chunks[base];
        chunk.size = chunkSize;
        chunk.free.emplace(0, chunkSize);
        arena.reserved += chunkSize;
        p = Carve(base, chunk, n);
      }
    }
    if (p) {
      arena.segments[p] = n;
      arena.used += n;
    }
  } catch (...) {  // std::bad_alloc from the maps: PyTorch sees an out-of-memory error
    SetErrorText("out of host memory for the IPC pool's bookkeeping");
    p = 0;
  }
  pthread_mutex_unlock(&g_arena_lock);
  return reinterpret_cast<void*>(p);
}

CIP_EXPORT void cip_torch_free(void* ptr, ssize_t size, int device, CUstream stream) {
  (void)size;  // the length handed out is the one recorded
  if (!ptr || !g_loaded || device < 0 || device >= kMaxDevices || !__atomic_load_n(&g_pools[device], __ATOMIC_ACQUIRE)) return;
  CUdeviceptr p = reinterpret_cast<CUdeviceptr>(ptr);
  CUdeviceptr release = 0;
  pthread_mutex_lock(&g_arena_lock);
  try {
    Arena& arena = g_arenas[device];
    auto seg = arena.segments.find(p);
    auto it = arena.chunks.upper_bound(p);
    if (seg == arena.segments.end() || it == arena.chunks.begin()) {
      SetErrorText("cip_torch_free: an address this allocator did not hand out (ignored)");
    } else {
      --it;
      Chunk& chunk = it->second;
      size_t n = seg->second, offset = p - it->first;
      arena.segments.erase(seg);
      arena.used -= n;
      chunk.used -= n;
      auto next = chunk.free.lower_bound(offset);
      if (next != chunk.free.end() && next->first == offset + n) {  // joins the free range after it
        n += next->second;
        next = chunk.free.erase(next);
      }
      if (next != chunk.free.begin()) {
        auto prev = std::prev(next);
        if (prev->first + prev->second == offset) {  // and the one before it
          prev->second += n;
          n = 0;
        }
      }
      if (n) chunk.free.emplace(offset, n);
      if (chunk.used == 0) {
        release = it->first;
        arena.reserved -= chunk.size;
        arena.chunks.erase(it);
      }
    }
  } catch (...) {
    SetErrorText("out of host memory for the IPC pool's bookkeeping (a freed segment stays reserved)");
  }
  pthread_mutex_unlock(&g_arena_lock);
  if (!release) return;
  // Other streams may still read the chunk's other (already freed) segments: the device first.
  CUresult r = InContext(device, [&] { return g_drv.ctxSynchronize(); });
  if (r != CUDA_SUCCESS) {
    SetError("cuCtxSynchronize (before a chunk of the IPC pool goes back)", r);
    return;
  }
  r = InContext(device, [&] { return g_drv.freeAsync(release, stream); });
  if (r != CUDA_SUCCESS) SetError("cuMemFreeAsync", r);
}

// What the IPC pool of `device` holds: out[0] chunks, out[1] bytes in chunks, out[2] bytes in
// segments handed out. 0, or -1 for a device out of range.
CIP_EXPORT int cip_torch_pool_stats(int device, unsigned long long* out) {
  if (device < 0 || device >= kMaxDevices || !out) return -1;
  pthread_mutex_lock(&g_arena_lock);
  const Arena& arena = g_arenas[device];
  out[0] = arena.chunks.size();
  out[1] = arena.reserved;
  out[2] = arena.used;
  pthread_mutex_unlock(&g_arena_lock);
  return 0;
}

// The pool of `device` as an address (CUmemoryPool), made now if need be; 0 on failure (see
// cip_torch_last_error).
CIP_EXPORT unsigned long long cip_torch_pool(int device) {
  return reinterpret_cast<unsigned long long>(PoolOf(device));
}

// What the last failure was ("" when none), copied into `out` (NUL-terminated, at most `len` bytes).
CIP_EXPORT void cip_torch_last_error(char* out, int len) {
  if (!out || len <= 0) return;
  pthread_mutex_lock(&g_lock);
  snprintf(out, static_cast<size_t>(len), "%s", g_error);
  pthread_mutex_unlock(&g_lock);
}
