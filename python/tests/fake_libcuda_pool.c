// A stand-in libcuda.so.1 for the IPC pool allocator of the native helper (native/py/torch_pool.cc),
// built by test_torch_pool_arena.py: the entry points that allocator resolves, with pool
// allocations bookkept (addresses far apart, so that a segment running past its chunk would land
// in no allocation) and a byte limit that answers CUDA_ERROR_OUT_OF_MEMORY. fake_* functions let the
// test read what the allocator asked for.
#include <stdlib.h>
#include <string.h>

#define MAX_LIVE 4096
#define EXPORT __attribute__((visibility("default")))

typedef int CUresult;
static unsigned long long next_address = 0x100000000000ull;
static unsigned long long live_base[MAX_LIVE], live_size[MAX_LIVE];
static int live_count = 0;
static unsigned long long live_bytes = 0, limit = ~0ull;
static int bad_frees = 0, stream_syncs = 0, ctx_syncs = 0, allocs_asked = 0;
static unsigned long long last_asked = 0;
static void* current = 0;
static char context;  // the one primary context's handle is its address

static CUresult Init(unsigned flags) { (void)flags; return 0; }
static CUresult ErrorName(CUresult r, const char** out) {
  *out = r == 2 ? "CUDA_ERROR_OUT_OF_MEMORY" : r == 1 ? "CUDA_ERROR_INVALID_VALUE" : "CUDA_ERROR_UNKNOWN";
  return 0;
}
static CUresult DeviceGet(int* dev, int ordinal) { *dev = ordinal; return ordinal == 0 ? 0 : 101; }
static CUresult PrimaryRetain(void** ctx, int dev) { (void)dev; *ctx = &context; return 0; }
static CUresult PrimaryRelease(int dev) { (void)dev; return 0; }
static CUresult CtxGet(void** ctx) { *ctx = current; return 0; }
static CUresult CtxSet(void* ctx) { current = ctx; return 0; }
static CUresult PoolCreate(void** pool, const void* props) { (void)props; *pool = (void*)0x5000; return 0; }
static CUresult PoolSetAttribute(void* pool, int attr, void* value) { (void)pool; (void)attr; (void)value; return 0; }
static CUresult AllocFromPool(unsigned long long* p, size_t size, void* pool, void* stream) {
  (void)pool; (void)stream;
  allocs_asked++;
  last_asked = size;
  if (current != &context) return 201;  // CUDA_ERROR_INVALID_CONTEXT: the allocator must make it current
  if (size == 0 || live_bytes + size > limit || live_count == MAX_LIVE) return 2;
  *p = next_address;
  next_address += (size + (1ull << 30) + 0xfffffull) & ~0xfffffull;  // a gap of at least 1 GiB after each
  live_base[live_count] = *p;
  live_size[live_count++] = size;
  live_bytes += size;
  return 0;
}
static CUresult FreeAsync(unsigned long long p, void* stream) {
  (void)stream;
  for (int i = 0; i < live_count; i++) {
    if (live_base[i] != p) continue;
    live_bytes -= live_size[i];
    live_base[i] = live_base[live_count - 1];
    live_size[i] = live_size[live_count - 1];
    live_count--;
    return 0;
  }
  bad_frees++;
  return 1;
}
static CUresult StreamSynchronize(void* stream) { (void)stream; stream_syncs++; return 0; }
static CUresult CtxSynchronize(void) { ctx_syncs++; return 0; }

struct Entry { const char* name; void* fn; };
static const struct Entry table[] = {
  {"cuInit", (void*)Init}, {"cuGetErrorName", (void*)ErrorName}, {"cuDeviceGet", (void*)DeviceGet},
  {"cuDevicePrimaryCtxRetain", (void*)PrimaryRetain}, {"cuDevicePrimaryCtxRelease", (void*)PrimaryRelease},
  {"cuCtxGetCurrent", (void*)CtxGet}, {"cuCtxSetCurrent", (void*)CtxSet}, {"cuMemPoolCreate", (void*)PoolCreate},
  {"cuMemPoolSetAttribute", (void*)PoolSetAttribute}, {"cuMemAllocFromPoolAsync", (void*)AllocFromPool},
  {"cuMemFreeAsync", (void*)FreeAsync}, {"cuStreamSynchronize", (void*)StreamSynchronize},
  {"cuCtxSynchronize", (void*)CtxSynchronize},
};

EXPORT CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int version, unsigned long long flags, int* status) {
  (void)version; (void)flags;
  for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
    if (strcmp(symbol, table[i].name) == 0) {
      *pfn = table[i].fn;
      if (status) *status = 1;
      return 0;
    }
  }
  *pfn = 0;
  if (status) *status = 0;
  return 500;  // CUDA_ERROR_NOT_FOUND
}

EXPORT int fake_live_count(void) { return live_count; }
EXPORT unsigned long long fake_live_bytes(void) { return live_bytes; }
EXPORT unsigned long long fake_live_base(int i) { return i < live_count ? live_base[i] : 0; }
EXPORT unsigned long long fake_live_size(int i) { return i < live_count ? live_size[i] : 0; }
EXPORT unsigned long long fake_last_asked(void) { return last_asked; }
EXPORT int fake_allocs_asked(void) { return allocs_asked; }
EXPORT int fake_bad_frees(void) { return bad_frees; }
EXPORT int fake_stream_syncs(void) { return stream_syncs; }
EXPORT int fake_ctx_syncs(void) { return ctx_syncs; }
EXPORT void fake_set_limit(unsigned long long bytes) { limit = bytes; }
