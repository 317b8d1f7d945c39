// Kernels of cuda-ipc's tensor layer (src/tensors), shipped as PTX (kernels/tensors.ptx, made by
// scripts/gen-ptx.sh) and loaded with cuModuleLoadData. src/tensors/kernels.ts lists them.
//
// copy_strided: copies between tensors whose layouts differ or have gaps, which one run of bytes
// cannot do (the contiguous pairs of an in-place update go to cuMemcpyBatchAsync instead). One
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
