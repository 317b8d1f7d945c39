// Compiled (never linked) by test/cpu/abi-header.test against the toolkit's cuda.h: proves that
// native/cuda_abi.h matches the real driver ABI. Not part of the addon.
#include "cuda_abi.h"
// Flags that cuda.h defines as macros: read ours before those macros exist.
constexpr long long kHostRegisterPortable = cuabi::CU_MEMHOSTREGISTER_PORTABLE;
constexpr long long kHostRegisterDeviceMap = cuabi::CU_MEMHOSTREGISTER_DEVICEMAP;
#include <cuda.h>
#include <cudaTypedefs.h>  // PFN_ types of versioned entry points
#include <cstddef>
#include <tuple>
#include <type_traits>

namespace {
struct Ptr {};
template <size_t N> struct Int {};
template <size_t N> struct Struct {};
template <> struct Int<0> {};
// Two signatures are ABI-compatible when each position has the same class (pointer, integer of
// a size, struct of a size). Signedness and enum-vs-int do not change the calling convention.
template <class T>
using Canon = std::conditional_t<std::is_pointer_v<T>, Ptr,
              std::conditional_t<std::is_class_v<T>, Struct<sizeof(T)>,
              std::conditional_t<std::is_void_v<T>, Int<0>, Int<sizeof(std::conditional_t<std::is_void_v<T>, char, T>)>>>>;
template <class F> struct Sig;
template <class R, class... A> struct Sig<R (*)(A...)> { using type = std::tuple<Canon<R>, Canon<A>...>; };
}  // namespace

#define CHECK_FN(name, params)                                                              \
  static_assert(std::is_same_v<Sig<cuabi::PFN_##name>::type, Sig<decltype(&::name)>::type>, \
                "signature of " #name " differs from cuda.h");
CUABI_FUNCTIONS(CHECK_FN)
// Entry points resolved at their own ABI version, against the toolkit's typedef of that version.
static_assert(std::is_same_v<Sig<cuabi::PFN_cuMemcpyBatchAsync_v12080>::type, Sig<::PFN_cuMemcpyBatchAsync_v12080>::type>,
              "signature of cuMemcpyBatchAsync (12.8) differs from cudaTypedefs.h");

#define CHECK_EQ(name) static_assert(static_cast<long long>(cuabi::name) == static_cast<long long>(::name), #name " differs from cuda.h");
CHECK_EQ(CUDA_SUCCESS)
CHECK_EQ(CUDA_ERROR_NOT_READY)
CHECK_EQ(CUDA_ERROR_OUT_OF_MEMORY)
CHECK_EQ(CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED)
CHECK_EQ(CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK)
CHECK_EQ(CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED)
CHECK_EQ(CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED)
CHECK_EQ(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
CHECK_EQ(CU_DEVICE_ATTRIBUTE_INTEGRATED)
CHECK_EQ(CU_DEVICE_ATTRIBUTE_PCI_BUS_ID)
CHECK_EQ(CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID)
CHECK_EQ(CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING)
CHECK_EQ(CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID)
CHECK_EQ(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)
CHECK_EQ(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)
CHECK_EQ(CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY)
CHECK_EQ(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)
CHECK_EQ(CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED)
CHECK_EQ(CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED)
CHECK_EQ(CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES)
CHECK_EQ(CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS)
CHECK_EQ(CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR)
CHECK_EQ(CU_DEVICE_ATTRIBUTE_IPC_EVENT_SUPPORTED)
CHECK_EQ(CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED)
CHECK_EQ(CU_POINTER_ATTRIBUTE_CONTEXT)
CHECK_EQ(CU_POINTER_ATTRIBUTE_MEMORY_TYPE)
CHECK_EQ(CU_POINTER_ATTRIBUTE_IS_MANAGED)
CHECK_EQ(CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL)
CHECK_EQ(CU_POINTER_ATTRIBUTE_RANGE_START_ADDR)
CHECK_EQ(CU_POINTER_ATTRIBUTE_RANGE_SIZE)
CHECK_EQ(CU_POINTER_ATTRIBUTE_MAPPED)
CHECK_EQ(CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE)
CHECK_EQ(CU_MEMORYTYPE_HOST)
CHECK_EQ(CU_MEMORYTYPE_DEVICE)
CHECK_EQ(CU_MEMORYTYPE_ARRAY)
CHECK_EQ(CU_MEMORYTYPE_UNIFIED)
CHECK_EQ(CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)
CHECK_EQ(CU_MEM_ATTACH_GLOBAL)
CHECK_EQ(CU_STREAM_NON_BLOCKING)
CHECK_EQ(CU_EVENT_DEFAULT)
CHECK_EQ(CU_EVENT_BLOCKING_SYNC)
CHECK_EQ(CU_EVENT_DISABLE_TIMING)
CHECK_EQ(CU_EVENT_INTERPROCESS)
CHECK_EQ(CU_STREAM_WAIT_VALUE_GEQ)
CHECK_EQ(CU_STREAM_WAIT_VALUE_EQ)
CHECK_EQ(CU_STREAM_WAIT_VALUE_AND)
CHECK_EQ(CU_STREAM_WAIT_VALUE_NOR)
CHECK_EQ(CU_STREAM_WAIT_VALUE_FLUSH)
CHECK_EQ(CU_STREAM_WRITE_VALUE_DEFAULT)
CHECK_EQ(CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER)
CHECK_EQ(CU_MEM_HANDLE_TYPE_NONE)
CHECK_EQ(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
CHECK_EQ(CU_MEM_HANDLE_TYPE_FABRIC)
CHECK_EQ(CU_MEM_LOCATION_TYPE_DEVICE)
CHECK_EQ(CU_MEM_ALLOCATION_TYPE_PINNED)
CHECK_EQ(CU_MEM_ACCESS_FLAGS_PROT_NONE)
CHECK_EQ(CU_MEM_ACCESS_FLAGS_PROT_READ)
CHECK_EQ(CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
CHECK_EQ(CU_MEMPOOL_ATTR_RELEASE_THRESHOLD)
CHECK_EQ(CU_GET_PROC_ADDRESS_DEFAULT)
CHECK_EQ(CU_MEMCPY_SRC_ACCESS_ORDER_STREAM)
CHECK_EQ(CU_MEMCPY_FLAG_DEFAULT)
static_assert(cuabi::kIpcHandleSize == CU_IPC_HANDLE_SIZE, "IPC handle size");

#define CHECK_LAYOUT(ours, theirs)                                                      \
  static_assert(sizeof(cuabi::ours) == sizeof(::theirs), #ours " size");               \
  static_assert(alignof(cuabi::ours) == alignof(::theirs), #ours " alignment");
#define CHECK_FIELD(ours, theirs, field) \
  static_assert(offsetof(cuabi::ours, field) == offsetof(::theirs, field), #ours "." #field " offset");
CHECK_LAYOUT(CUuuid, CUuuid)
CHECK_LAYOUT(CUipcMemHandle, CUipcMemHandle)
CHECK_LAYOUT(CUipcEventHandle, CUipcEventHandle)
CHECK_LAYOUT(CUmemPoolPtrExportData, CUmemPoolPtrExportData)
CHECK_LAYOUT(CUmemLocation, CUmemLocation)
CHECK_FIELD(CUmemLocation, CUmemLocation, type)
CHECK_FIELD(CUmemLocation, CUmemLocation, id)
CHECK_LAYOUT(CUmemAccessDesc, CUmemAccessDesc)
CHECK_FIELD(CUmemAccessDesc, CUmemAccessDesc, location)
CHECK_FIELD(CUmemAccessDesc, CUmemAccessDesc, flags)
CHECK_LAYOUT(CUmemPoolProps, CUmemPoolProps)
CHECK_FIELD(CUmemPoolProps, CUmemPoolProps, allocType)
CHECK_FIELD(CUmemPoolProps, CUmemPoolProps, handleTypes)
CHECK_FIELD(CUmemPoolProps, CUmemPoolProps, location)
CHECK_FIELD(CUmemPoolProps, CUmemPoolProps, win32SecurityAttributes)
CHECK_FIELD(CUmemPoolProps, CUmemPoolProps, maxSize)
CHECK_FIELD(CUmemPoolProps, CUmemPoolProps, usage)
CHECK_FIELD(CUmemPoolProps, CUmemPoolProps, reserved)
CHECK_LAYOUT(CUmemcpyAttributes, CUmemcpyAttributes)
CHECK_FIELD(CUmemcpyAttributes, CUmemcpyAttributes, srcAccessOrder)
CHECK_FIELD(CUmemcpyAttributes, CUmemcpyAttributes, srcLocHint)
CHECK_FIELD(CUmemcpyAttributes, CUmemcpyAttributes, dstLocHint)
CHECK_FIELD(CUmemcpyAttributes, CUmemcpyAttributes, flags)
static_assert(sizeof(cuabi::CUdeviceptr) == sizeof(::CUdeviceptr), "CUdeviceptr");
static_assert(sizeof(cuabi::CUdevice) == sizeof(::CUdevice), "CUdevice");

int main() { return 0; }
static_assert(kHostRegisterPortable == CU_MEMHOSTREGISTER_PORTABLE, "CU_MEMHOSTREGISTER_PORTABLE differs from cuda.h");
static_assert(kHostRegisterDeviceMap == CU_MEMHOSTREGISTER_DEVICEMAP, "CU_MEMHOSTREGISTER_DEVICEMAP differs from cuda.h");
