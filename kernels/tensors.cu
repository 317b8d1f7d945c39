// Kernels of cuda-ipc's tensor layer (src/tensors), shipped as PTX (kernels/tensors.ptx, made by
// scripts/gen-ptx.sh) and loaded with cuModuleLoadData. src/tensors/kernels.ts lists them.
//
// copy_runs: many runs of bytes (dst <- src, bytes) in one launch, the contiguous pairs of an
// in-place update: a table of runs in device memory, each cut into chunks of chunk_bytes; blocks
// take tiles of up to 16 chunks grid-stride (as torch's multi_tensor_apply does with its chunks),
// so a few large tensors and thousands of small ones spread over every SM alike, and copy with the
// widest loads both addresses allow (16 bytes where both are 16-aligned; the host splits off the
// head of a run whose addresses share a misalignment, so that the rest is aligned).
//
// copy_strided: copies between tensors whose layouts differ or have gaps, which one run of bytes
// cannot do. One
// launch covers up to 65535 copies: blockIdx.y picks the copy, a grid-stride loop over x its
// elements. Strides are in bytes; the host merges and drops dimensions first, so 8 are plenty.

#include <stdint.h>

namespace cuda_ipc_tensors {

typedef unsigned long long u64;

constexpr int kMaxDims = 8;

// One copy, laid out as src/tensors/kernels.ts writes it (little-endian, 224 bytes).
struct StridedCopy {
  u64 dst;
  u64 src;
  u64 count;  // elements
  unsigned int itemsize;  // 1, 2, 4 or 8
  unsigned int ndim;  // 1..kMaxDims
  u64 shape[kMaxDims];
  u64 dst_strides[kMaxDims];
  u64 src_strides[kMaxDims];
};

// One run, laid out as src/tensors/kernels.ts and python/cuda_ipc/kernels.py write it (32 bytes).
struct CopyRun {
  u64 dst;
  u64 src;
  u64 bytes;  // > 0
  u64 first_chunk;  // chunks of the runs before this one, summed: increasing
};

// Copies bytes [begin, end) of a run with loads of V (its size divides both addresses and begin);
// returns where the V-sized part ended. Four loads in flight per thread before their stores.
template <typename V> __device__ u64 copy_vectors(u64 dst, u64 src, u64 begin, u64 end) {
  const u64 n = (end - begin) / sizeof(V);
  const V* __restrict__ s = reinterpret_cast<const V*>(src + begin);
  V* __restrict__ d = reinterpret_cast<V*>(dst + begin);
  const u64 step = blockDim.x;
  for (u64 i = threadIdx.x; i < n; i += 4 * step) {
    V v[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (i + j * step < n) v[j] = s[i + j * step];
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (i + j * step < n) d[i + j * step] = v[j];
    }
  }
  return begin + n * sizeof(V);
}

__device__ void copy_range(u64 dst, u64 src, u64 begin, u64 end) {
  const u64 align = dst | src;
  u64 at;
  if ((align & 15) == 0) at = copy_vectors<uint4>(dst, src, begin, end);
  else if ((align & 7) == 0) at = copy_vectors<u64>(dst, src, begin, end);
  else if ((align & 3) == 0) at = copy_vectors<unsigned int>(dst, src, begin, end);
  else if ((align & 1) == 0) at = copy_vectors<unsigned short>(dst, src, begin, end);
  else at = begin;
  for (u64 i = at + threadIdx.x; i < end; i += blockDim.x) {
    reinterpret_cast<unsigned char*>(dst)[i] = reinterpret_cast<const unsigned char*>(src)[i];
  }
}

template <typename T> __device__ void copy_elements(const StridedCopy& op) {
  const u64 step = static_cast<u64>(gridDim.x) * blockDim.x;
  for (u64 i = static_cast<u64>(blockIdx.x) * blockDim.x + threadIdx.x; i < op.count; i += step) {
    u64 rest = i;
    u64 dst_offset = 0;
    u64 src_offset = 0;
    for (int d = static_cast<int>(op.ndim) - 1; d >= 0; --d) {
      const u64 index = rest % op.shape[d];
      rest /= op.shape[d];
      dst_offset += index * op.dst_strides[d];
      src_offset += index * op.src_strides[d];
    }
    *reinterpret_cast<T*>(op.dst + dst_offset) = *reinterpret_cast<const T*>(op.src + src_offset);
  }
}

}  // namespace cuda_ipc_tensors

using namespace cuda_ipc_tensors;

// chunk_bytes: a multiple of 16, so that every chunk of a run starts as aligned as the run.
// Blocks take tiles of consecutive chunks grid-stride (so that large and small runs spread over
// every block alike), find the run of a tile's first chunk with one binary search and walk the
// table forward through the tile: a table of many small runs (the rows of a strided copy, one
// chunk each) costs one search per tile instead of one per chunk, which dominated when tens of
// thousands of rows each held a few KiB. A tile is up to 16 chunks, fewer where that would leave
// a block fewer than four tiles (a small table keeps every block busy).
constexpr u64 kMaxTileChunks = 16;

extern "C" __global__ void copy_runs(const CopyRun* runs, unsigned int run_count, u64 chunk_count, u64 chunk_bytes) {
  u64 tile_chunks = chunk_count / (4ull * gridDim.x);
  tile_chunks = tile_chunks < 1 ? 1 : tile_chunks > kMaxTileChunks ? kMaxTileChunks : tile_chunks;
  unsigned int r = 0;
  for (u64 tile = blockIdx.x; tile * tile_chunks < chunk_count; tile += gridDim.x) {
    const u64 first = tile * tile_chunks;
    const u64 last = first + tile_chunks < chunk_count ? first + tile_chunks : chunk_count;
    // The run holding chunk `first`: the last one whose first chunk is <= it, searched from the
    // previous run found (this block's tiles only go up). Every thread searches alike: no barrier.
    unsigned int lo = r;
    unsigned int hi = run_count - 1;
    while (lo < hi) {
      const unsigned int mid = lo + (hi - lo + 1) / 2;
      if (runs[mid].first_chunk <= first) lo = mid;
      else hi = mid - 1;
    }
    r = lo;
    for (u64 c = first; c < last; ++c) {
      while (r + 1 < run_count && runs[r + 1].first_chunk <= c) ++r;
      const u64 dst = runs[r].dst;
      const u64 src = runs[r].src;
      const u64 bytes = runs[r].bytes;
      const u64 begin = (c - runs[r].first_chunk) * chunk_bytes;
      const u64 end = begin + chunk_bytes < bytes ? begin + chunk_bytes : bytes;
      copy_range(dst, src, begin, end);
    }
  }
}

extern "C" __global__ void copy_strided(const StridedCopy* ops, unsigned int op_count) {
  __shared__ StridedCopy op;
  if (blockIdx.y >= op_count) return;
  if (threadIdx.x == 0) op = ops[blockIdx.y];
  __syncthreads();
  switch (op.itemsize) {
    case 1: copy_elements<unsigned char>(op); break;
    case 2: copy_elements<unsigned short>(op); break;
    case 4: copy_elements<unsigned int>(op); break;
    case 8: copy_elements<u64>(op); break;
    default: break;
  }
}
