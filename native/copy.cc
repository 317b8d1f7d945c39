// Copies and fills: thin bindings of the driver API (driver.h), each checked.
//
//  memcpy{HtoD,DtoH,DtoD}(destination, source[, bytes]) and their Async forms (with a stream),
//    memsetD{8,32}(pointer, value, count) and theirs: one cuMemcpy* / cuMemset* call each.
//
// Bulk copies for tensors (src/tensors):
//  memcpyBatchAsync(dsts, srcs, sizes, stream): cuMemcpyBatchAsync (CUDA 12.8+) over n copies in
//    one driver call, stream-ordered, one attribute set for all (source read in stream order).
//    Resolved at its own ABI version (cuda_abi.h) the first time it is used.
//  hasMemcpyBatch(): whether the driver provides it (false on drivers older than 12.8).
//  hostArrayBuffer(address, length): an ArrayBuffer over host memory the caller owns (pinned
//    staging from cuMemAllocHost), so that file reads land in it directly. It has no finalizer:
//    the caller detaches it (detachArrayBuffer) before freeing the memory.
#include <mutex>
#include <string>

#include "driver.h"

namespace cuda_ipc {
namespace {
using namespace cuabi;

// ---------------------------------------------------------------------------------------------
// Copies and fills.

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
// Bulk copies for tensors.

std::once_flag g_batchOnce;
PFN_cuMemcpyBatchAsync_v12080 g_memcpyBatch = nullptr;

PFN_cuMemcpyBatchAsync_v12080 MemcpyBatchEntry(Napi::Env env) {
  // A throw (no driver: a CudaError) leaves the flag unset, so a later call tries again.
  std::call_once(g_batchOnce, [env] {
    g_memcpyBatch = reinterpret_cast<PFN_cuMemcpyBatchAsync_v12080>(ResolveDriverEntry(env, "cuMemcpyBatchAsync", kMemcpyBatchAbiVersion));
  });
  return g_memcpyBatch;
}

// A BigUint64Array argument: its elements, in place.
uint64_t* ArgU64Array(const Napi::CallbackInfo& info, size_t i, const char* what, size_t* count) {
  if (info.Length() <= i || !info[i].IsTypedArray() || info[i].As<Napi::TypedArray>().TypedArrayType() != napi_biguint64_array) {
    ThrowType(info.Env(), std::string(what) + " must be a BigUint64Array");
  }
  auto a = info[i].As<Napi::TypedArrayOf<uint64_t>>();
  *count = a.ElementLength();
  return a.Data();
}

Napi::Value HasMemcpyBatch(const Napi::CallbackInfo& info) {
  return Napi::Boolean::New(info.Env(), MemcpyBatchEntry(info.Env()) != nullptr);
}

Napi::Value MemcpyBatchAsync(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  size_t nd = 0, ns = 0, nz = 0;
  uint64_t* dsts = ArgU64Array(info, 0, "dsts", &nd);
  uint64_t* srcs = ArgU64Array(info, 1, "srcs", &ns);
  uint64_t* sizes = ArgU64Array(info, 2, "sizes", &nz);
  if (nd != ns || nd != nz) ThrowType(env, "dsts, srcs and sizes must have the same length");
  CUstream stream = reinterpret_cast<CUstream>(static_cast<uintptr_t>(ArgU64(info, 3, "stream")));
  // The driver refuses the legacy default stream for batches; say so here, by name.
  if (stream == nullptr) ThrowType(env, "memcpyBatchAsync needs a stream other than the legacy default stream (0)");
  if (nd == 0) return env.Undefined();
  PFN_cuMemcpyBatchAsync_v12080 fn = MemcpyBatchEntry(env);
  if (!fn) ThrowCuda(env, -2, "cuMemcpyBatchAsync (the driver is older than CUDA 12.8)");
  CUmemcpyAttributes attrs{};
  attrs.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
  attrs.flags = CU_MEMCPY_FLAG_DEFAULT;
  size_t attrsIdx = 0;
  size_t failIdx = SIZE_MAX;
  CUresult r = fn(reinterpret_cast<CUdeviceptr*>(dsts), reinterpret_cast<CUdeviceptr*>(srcs), reinterpret_cast<size_t*>(sizes), nd,
                  &attrs, &attrsIdx, 1, &failIdx, stream);
  if (r != CUDA_SUCCESS) {
    std::string call = failIdx == SIZE_MAX ? "cuMemcpyBatchAsync" : "cuMemcpyBatchAsync (copy #" + std::to_string(failIdx) + ")";
    ThrowCuda(env, r, call.c_str());
  }
  return env.Undefined();
}

Napi::Value HostArrayBuffer(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  uint64_t address = ArgU64(info, 0, "address");
  size_t length = ArgSize(info, 1, "length");
  if (address == 0 || length == 0) ThrowType(env, "hostArrayBuffer needs a non-null address and a positive length");
  return Napi::ArrayBuffer::New(env, reinterpret_cast<void*>(static_cast<uintptr_t>(address)), length);
}

}  // namespace

void InitCopy(Napi::Env env, Napi::Object exports) {
  exports.Set("memcpyHtoD", Napi::Function::New(env, MemcpyHtoD, "memcpyHtoD"));
  exports.Set("memcpyDtoH", Napi::Function::New(env, MemcpyDtoH, "memcpyDtoH"));
  exports.Set("memcpyDtoD", Napi::Function::New(env, MemcpyDtoD, "memcpyDtoD"));
  exports.Set("memcpyHtoDAsync", Napi::Function::New(env, MemcpyHtoDAsync, "memcpyHtoDAsync"));
  exports.Set("memcpyDtoHAsync", Napi::Function::New(env, MemcpyDtoHAsync, "memcpyDtoHAsync"));
  exports.Set("memcpyDtoDAsync", Napi::Function::New(env, MemcpyDtoDAsync, "memcpyDtoDAsync"));
  exports.Set("memsetD8", Napi::Function::New(env, MemsetD8, "memsetD8"));
  exports.Set("memsetD32", Napi::Function::New(env, MemsetD32, "memsetD32"));
  exports.Set("memsetD8Async", Napi::Function::New(env, MemsetD8Async, "memsetD8Async"));
  exports.Set("memsetD32Async", Napi::Function::New(env, MemsetD32Async, "memsetD32Async"));
  exports.Set("memcpyBatchAsync", Napi::Function::New(env, MemcpyBatchAsync, "memcpyBatchAsync"));
  exports.Set("hasMemcpyBatch", Napi::Function::New(env, HasMemcpyBatch, "hasMemcpyBatch"));
  exports.Set("hostArrayBuffer", Napi::Function::New(env, HostArrayBuffer, "hostArrayBuffer"));
}

}  // namespace cuda_ipc
