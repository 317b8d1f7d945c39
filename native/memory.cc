// Device, managed and pinned host memory, pointer attributes, and memory pools (stream-ordered
// allocation, pool export and import): near 1:1 bindings of the driver API (driver.h).
#include "driver.h"

namespace cuda_ipc {
using namespace cuabi;

namespace {

// ---------------------------------------------------------------------------------------------
// Memory.

Napi::Value MemGetInfo(const Napi::CallbackInfo& info) {
  size_t freeBytes = 0, total = 0;
  CU_CALL(info.Env(), cuMemGetInfo, &freeBytes, &total);
  auto out = Napi::Array::New(info.Env(), 2);
  out.Set(0u, Napi::Number::New(info.Env(), static_cast<double>(freeBytes)));
  out.Set(1u, Napi::Number::New(info.Env(), static_cast<double>(total)));
  return out;
}

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

}  // namespace

void InitMemory(Napi::Env env, Napi::Object exports) {
  exports.Set("memGetInfo", Napi::Function::New(env, MemGetInfo, "memGetInfo"));
  exports.Set("memAlloc", Napi::Function::New(env, MemAlloc, "memAlloc"));
  exports.Set("memFree", Napi::Function::New(env, MemFree, "memFree"));
  exports.Set("memAllocManaged", Napi::Function::New(env, MemAllocManaged, "memAllocManaged"));
  exports.Set("memAllocHost", Napi::Function::New(env, MemAllocHost, "memAllocHost"));
  exports.Set("memFreeHost", Napi::Function::New(env, MemFreeHost, "memFreeHost"));
  exports.Set("memHostRegister", Napi::Function::New(env, MemHostRegister, "memHostRegister"));
  exports.Set("memHostUnregister", Napi::Function::New(env, MemHostUnregister, "memHostUnregister"));
  exports.Set("memHostGetDevicePointer", Napi::Function::New(env, MemHostGetDevicePointer, "memHostGetDevicePointer"));
  exports.Set("memGetAddressRange", Napi::Function::New(env, MemGetAddressRange, "memGetAddressRange"));
  exports.Set("pointerGetAttributeInt", Napi::Function::New(env, PointerGetAttributeInt, "pointerGetAttributeInt"));
  exports.Set("pointerGetAttributeU64", Napi::Function::New(env, PointerGetAttributeU64, "pointerGetAttributeU64"));
  exports.Set("memPoolCreate", Napi::Function::New(env, MemPoolCreate, "memPoolCreate"));
  exports.Set("memPoolDestroy", Napi::Function::New(env, MemPoolDestroy, "memPoolDestroy"));
  exports.Set("memPoolSetReleaseThreshold", Napi::Function::New(env, MemPoolSetReleaseThreshold, "memPoolSetReleaseThreshold"));
  exports.Set("memPoolSetAccess", Napi::Function::New(env, MemPoolSetAccess, "memPoolSetAccess"));
  exports.Set("memPoolTrimTo", Napi::Function::New(env, MemPoolTrimTo, "memPoolTrimTo"));
  exports.Set("memPoolExportToFd", Napi::Function::New(env, MemPoolExportToFd, "memPoolExportToFd"));
  exports.Set("memPoolImportFromFd", Napi::Function::New(env, MemPoolImportFromFd, "memPoolImportFromFd"));
  exports.Set("memPoolExportPointer", Napi::Function::New(env, MemPoolExportPointer, "memPoolExportPointer"));
  exports.Set("memPoolImportPointer", Napi::Function::New(env, MemPoolImportPointer, "memPoolImportPointer"));
  exports.Set("memAllocFromPoolAsync", Napi::Function::New(env, MemAllocFromPoolAsync, "memAllocFromPoolAsync"));
  exports.Set("memFreeAsync", Napi::Function::New(env, MemFreeAsync, "memFreeAsync"));
}

}  // namespace cuda_ipc
