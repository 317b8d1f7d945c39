// Built-in kernels of cuda-ipc, shipped as PTX (kernels/builtin.ptx, made by scripts/gen-ptx.sh)
// and loaded with cuModuleLoadData. Every kernel is extern "C" so its PTX entry name is the name
// listed in src/cuda/builtin-kernels.ts; a test keeps the two in step.
//
// Launch rules shared by all kernels: 1-D grids and blocks of any size (block size need not be a
// multiple of 32); element counts are 64-bit; grid-stride loops, so any grid size covers any n.
//
// Element-type suffixes: i32 int, u32 unsigned int, i64 long long, u64 unsigned long long,
// f32 float, f64 double.

#include <stdint.h>

// A named namespace, not an anonymous one: nvcc names internal-linkage symbols (such as
// block_sum's shared scratch) with a hash of the source's path, which would make the PTX
// differ between checkouts.
namespace cuda_ipc {

typedef unsigned long long u64;

__device__ __forceinline__ u64 global_thread_index() {
  return static_cast<u64>(blockIdx.x) * blockDim.x + threadIdx.x;
}

__device__ __forceinline__ u64 grid_thread_count() {
  return static_cast<u64>(gridDim.x) * blockDim.x;
}

// ---- pattern arithmetic -------------------------------------------------------------------
// pattern(a, b, i) = a + i*b. Integers wrap modulo 2^bits (computed in the unsigned type, so no
// signed-overflow UB; i is reduced modulo 2^bits too). Floats use explicitly rounded operations
// so nvcc cannot contract them into an FMA: the host can reproduce every value exactly as
// round(a + round(round(i) * b)), e.g. Math.fround for f32.

template <typename T> struct Pattern;

template <typename T, typename U> struct IntegerPattern {
  __device__ static T value(T a, T b, u64 i) {
    return static_cast<T>(static_cast<U>(a) + static_cast<U>(i) * static_cast<U>(b));
  }
  __device__ static T scaled(T x, T s) {
    return static_cast<T>(static_cast<U>(x) * static_cast<U>(s));
  }
  __device__ static bool same(T x, T y) { return x == y; }
};

template <> struct Pattern<int> : IntegerPattern<int, unsigned int> {};
template <> struct Pattern<unsigned int> : IntegerPattern<unsigned int, unsigned int> {};
template <> struct Pattern<long long> : IntegerPattern<long long, u64> {};
template <> struct Pattern<u64> : IntegerPattern<u64, u64> {};

template <> struct Pattern<float> {
  __device__ static float value(float a, float b, u64 i) {
    return __fadd_rn(a, __fmul_rn(__ull2float_rn(i), b));
  }
  __device__ static float scaled(float x, float s) { return __fmul_rn(x, s); }
  // Bitwise, so a NaN pattern verifies and -0 differs from +0: verify checks what fill wrote.
  __device__ static bool same(float x, float y) { return __float_as_uint(x) == __float_as_uint(y); }
};

template <> struct Pattern<double> {
  __device__ static double value(double a, double b, u64 i) {
    return __dadd_rn(a, __dmul_rn(__ull2double_rn(i), b));
  }
  __device__ static double scaled(double x, double s) { return __dmul_rn(x, s); }
  __device__ static bool same(double x, double y) {
    return __double_as_longlong(x) == __double_as_longlong(y);
  }
};

// ---- block reduction ----------------------------------------------------------------------
// Sums one value per thread over the block; thread 0 gets the total. Every thread of the block
// must call it. Handles a partial last warp (block sizes that are not multiples of 32).

__device__ u64 block_sum(u64 value) {
  __shared__ u64 warp_totals[32];
  const unsigned lane = threadIdx.x & 31u;
  const unsigned warp = threadIdx.x >> 5;
  const unsigned warp_count = (blockDim.x + 31u) >> 5;
  const unsigned lanes_in_warp = min(32u, blockDim.x - (warp << 5));
  const unsigned mask = lanes_in_warp == 32u ? 0xffffffffu : ((1u << lanes_in_warp) - 1u);
  for (unsigned offset = 16; offset > 0; offset >>= 1) {
    const u64 other = __shfl_down_sync(mask, value, offset);
    if (lane + offset < lanes_in_warp) value += other;
  }
  if (lane == 0) warp_totals[warp] = value;
  __syncthreads();
  u64 total = 0;
  if (threadIdx.x == 0) {
    for (unsigned w = 0; w < warp_count; ++w) total += warp_totals[w];
  }
  return total;
}

// ---- kernel bodies ------------------------------------------------------------------------

template <typename T> __device__ void fill_pattern(T* out, u64 n, T a, T b) {
  for (u64 i = global_thread_index(); i < n; i += grid_thread_count()) {
    out[i] = Pattern<T>::value(a, b, i);
  }
}

// Adds the number of elements that differ from the pattern to *mismatch_count. When
// first_mismatch is not null, lowers *first_mismatch to the smallest mismatching index (the
// caller sets it to UINT64_MAX first; it stays there when everything matches).
template <typename T>
__device__ void verify_pattern(const T* in, u64 n, T a, T b, u64* mismatch_count,
                               u64* first_mismatch) {
  u64 mismatches = 0;
  u64 first = ~0ull;
  for (u64 i = global_thread_index(); i < n; i += grid_thread_count()) {
    if (!Pattern<T>::same(in[i], Pattern<T>::value(a, b, i))) {
      if (mismatches == 0) first = i;  // this thread's indices only grow
      ++mismatches;
    }
  }
  if (first_mismatch != nullptr && mismatches != 0) atomicMin(first_mismatch, first);
  const u64 block_mismatches = block_sum(mismatches);
  if (threadIdx.x == 0 && block_mismatches != 0) atomicAdd(mismatch_count, block_mismatches);
}

template <typename T> __device__ void scale(T* x, u64 n, T s) {
  for (u64 i = global_thread_index(); i < n; i += grid_thread_count()) {
    x[i] = Pattern<T>::scaled(x[i], s);
  }
}

__device__ __forceinline__ u64 global_timer_ns() {
  u64 t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ void spin_for(u64 ns) {
  const u64 start = global_timer_ns();
  while (global_timer_ns() - start < ns) {
    __nanosleep(256);  // be kind to the SM; the globaltimer is far coarser than this anyway
  }
}

}  // namespace cuda_ipc

using namespace cuda_ipc;

// ---- exported entry points ----------------------------------------------------------------

#define CUDA_IPC_PATTERN_KERNELS(SUFFIX, T)                                                   \
  extern "C" __global__ void fill_pattern_##SUFFIX(T* out, u64 n, T a, T b) {               \
    fill_pattern<T>(out, n, a, b);                                                          \
  }                                                                                         \
  extern "C" __global__ void verify_pattern_##SUFFIX(const T* in, u64 n, T a, T b,          \
                                                     u64* mismatch_count,                   \
                                                     u64* first_mismatch) {                 \
    verify_pattern<T>(in, n, a, b, mismatch_count, first_mismatch);                         \
  }                                                                                         \
  extern "C" __global__ void scale_##SUFFIX(T* x, u64 n, T s) { scale<T>(x, n, s); }

CUDA_IPC_PATTERN_KERNELS(i32, int)
CUDA_IPC_PATTERN_KERNELS(u32, unsigned int)
CUDA_IPC_PATTERN_KERNELS(i64, long long)
CUDA_IPC_PATTERN_KERNELS(u64, unsigned long long)
CUDA_IPC_PATTERN_KERNELS(f32, float)
CUDA_IPC_PATTERN_KERNELS(f64, double)

#undef CUDA_IPC_PATTERN_KERNELS

// Checksum of n bytes, added into sums[0] and sums[1] (the caller zeroes them first):
//   sums[0] += sum of data[i]              (mod 2^64)
//   sums[1] += sum of data[i] * (i + 1)    (mod 2^64)
// Both are sums, so the result does not depend on thread scheduling; the weight (i + 1) makes
// sums[1] sensitive to byte order and counts a change at index 0. Reads 16 bytes at a time over
// the 16-byte-aligned middle of the range; any alignment of data works.
extern "C" __global__ void checksum_bytes(const unsigned char* data, u64 n, u64* sums) {
  const u64 misalignment = reinterpret_cast<uintptr_t>(data) & 15u;
  const u64 head = min(n, (16u - misalignment) & 15u);
  const u64 word_count = (n - head) / 16u;
  const u64 tail = head + word_count * 16u;
  const u64 first = global_thread_index();
  const u64 stride = grid_thread_count();

  u64 byte_sum = 0;
  u64 weighted_sum = 0;
  // Unaligned head and tail: at most 15 bytes each.
  for (u64 i = first; i < head + (n - tail); i += stride) {
    const u64 index = i < head ? i : tail + (i - head);
    byte_sum += data[index];
    weighted_sum += data[index] * (index + 1u);
  }
  const uint4* words = reinterpret_cast<const uint4*>(data + head);
  for (u64 w = first; w < word_count; w += stride) {
    const uint4 word = words[w];
    const unsigned int parts[4] = {word.x, word.y, word.z, word.w};
    const u64 base = head + w * 16u + 1u;  // weight of the word's first byte
#pragma unroll
    for (int k = 0; k < 16; ++k) {
      const u64 byte = (parts[k >> 2] >> ((k & 3) * 8)) & 0xffu;  // little-endian byte order
      byte_sum += byte;
      weighted_sum += byte * (base + k);
    }
  }
  const u64 block_byte_sum = block_sum(byte_sum);
  __syncthreads();  // block_sum reuses its shared scratch
  const u64 block_weighted_sum = block_sum(weighted_sum);
  if (threadIdx.x == 0) {
    atomicAdd(&sums[0], block_byte_sum);
    atomicAdd(&sums[1], block_weighted_sum);
  }
}

// Busy-waits for ns nanoseconds of the GPU's global timer (one thread is enough; extra threads
// spin too). Useful to hold a stream busy in ordering tests.
extern "C" __global__ void spin(u64 ns) { spin_for(ns); }

// Busy-waits for ns nanoseconds, then thread 0 of block 0 stores value to *flag: a volatile store,
// so it reaches memory while the kernel still runs, then a system-scope fence so it is ordered
// before anything the kernel or its stream does afterwards. Other threads only return. The global
// timer ticks coarsely on some GPUs (up to about 1 us), so ns is a lower bound, not a precise time.
extern "C" __global__ void spin_then_write_u32(unsigned int* flag, unsigned int value, u64 ns) {
  if (global_thread_index() != 0) return;
  spin_for(ns);
  *static_cast<volatile unsigned int*>(flag) = value;
  __threadfence_system();
}
