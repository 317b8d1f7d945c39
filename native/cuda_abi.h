// The subset of the CUDA driver ABI that cuda-ipc uses, declared here so that the addon builds on
// machines with no CUDA toolkit. Everything lives in namespace cuabi; test/cpu/abi-header.test
// compiles native/abi_check.cc against the toolkit's cuda.h (where installed) to prove that every
// constant, struct layout and function signature below matches the real header.
//
// Functions are resolved at run time with cuGetProcAddress for ABI version kCudaAbiVersion, so each
// PFN_ type below is the signature of that version of the entry point (e.g. cuMemAlloc_v2).
#pragma once
#include <cstddef>
#include <cstdint>

namespace cuabi {

constexpr int kCudaAbiVersion = 12000;  // the driver API version whose entry points we ask for

typedef int CUresult;
typedef int CUdevice;
typedef uint64_t CUdeviceptr;
typedef struct CUctx_st* CUcontext;
typedef struct CUstream_st* CUstream;
typedef struct CUevent_st* CUevent;
typedef struct CUmod_st* CUmodule;
typedef struct CUfunc_st* CUfunction;
typedef struct CUmemPoolHandle_st* CUmemoryPool;
typedef uint64_t cuuint64_t;
typedef void (*CUhostFn)(void* userData);

struct CUuuid { char bytes[16]; };
constexpr int kIpcHandleSize = 64;
struct CUipcMemHandle { char reserved[kIpcHandleSize]; };
struct CUipcEventHandle { char reserved[kIpcHandleSize]; };
struct CUmemPoolPtrExportData { unsigned char reserved[64]; };

struct CUmemLocation { int type; int id; };
struct CUmemAccessDesc { CUmemLocation location; int flags; };
struct CUmemPoolProps {
  int allocType;
  int handleTypes;
  CUmemLocation location;
  void* win32SecurityAttributes;
  size_t maxSize;
  unsigned short usage;
  unsigned char reserved[54];
};

// CUresult values that the code names explicitly.
constexpr CUresult CUDA_SUCCESS = 0;
constexpr CUresult CUDA_ERROR_NOT_READY = 600;
constexpr CUresult CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED = 704;
constexpr CUresult CUDA_ERROR_OUT_OF_MEMORY = 2;

// CUdevice_attribute values.
enum : int {
  CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16,
  CU_DEVICE_ATTRIBUTE_INTEGRATED = 18,
  CU_DEVICE_ATTRIBUTE_PCI_BUS_ID = 33,
  CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID = 34,
  CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING = 41,
  CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID = 50,
  CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75,
  CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76,
  CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY = 83,
  CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 102,
  CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED = 103,
  CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED = 115,
  CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES = 119,
  CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS = 122,
  CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR = 123,
  CU_DEVICE_ATTRIBUTE_IPC_EVENT_SUPPORTED = 125,
  CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED = 128,
};

// CUdevice_P2PAttribute values (cuDeviceGetP2PAttribute).
enum : int {
  CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK = 1,
  CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED = 2,
  CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED = 3,
};

// CUpointer_attribute values.
enum : int {
  CU_POINTER_ATTRIBUTE_CONTEXT = 1,
  CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2,
  CU_POINTER_ATTRIBUTE_IS_MANAGED = 8,
  CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9,
  CU_POINTER_ATTRIBUTE_RANGE_START_ADDR = 11,
  CU_POINTER_ATTRIBUTE_RANGE_SIZE = 12,
  CU_POINTER_ATTRIBUTE_MAPPED = 13,
  CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE = 17,
};

// CUmemorytype values.
enum : int {
  CU_MEMORYTYPE_HOST = 1,
  CU_MEMORYTYPE_DEVICE = 2,
  CU_MEMORYTYPE_ARRAY = 3,
  CU_MEMORYTYPE_UNIFIED = 4,
};

// Flags.
enum : unsigned {
  CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS = 1,
  CU_MEM_ATTACH_GLOBAL = 1,
  CU_STREAM_NON_BLOCKING = 1,
  CU_MEMHOSTREGISTER_PORTABLE = 1,
  CU_MEMHOSTREGISTER_DEVICEMAP = 2,
  CU_EVENT_DEFAULT = 0,
  CU_EVENT_BLOCKING_SYNC = 1,
  CU_EVENT_DISABLE_TIMING = 2,
  CU_EVENT_INTERPROCESS = 4,
  CU_STREAM_WAIT_VALUE_GEQ = 0,
  CU_STREAM_WAIT_VALUE_EQ = 1,
  CU_STREAM_WAIT_VALUE_AND = 2,
  CU_STREAM_WAIT_VALUE_NOR = 3,
  CU_STREAM_WAIT_VALUE_FLUSH = 1u << 30,
  CU_STREAM_WRITE_VALUE_DEFAULT = 0,
  CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER = 1,
  CU_MEM_HANDLE_TYPE_NONE = 0,
  CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 1,
  CU_MEM_HANDLE_TYPE_FABRIC = 8,
  CU_MEM_LOCATION_TYPE_DEVICE = 1,
  CU_MEM_ALLOCATION_TYPE_PINNED = 1,
  CU_MEM_ACCESS_FLAGS_PROT_NONE = 0,
  CU_MEM_ACCESS_FLAGS_PROT_READ = 1,
  CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3,
  CU_MEMPOOL_ATTR_RELEASE_THRESHOLD = 4,
  CU_GET_PROC_ADDRESS_DEFAULT = 0,
};

// Entry points: X(name, return, parameter list). The names are the unversioned ones given to
// cuGetProcAddress; the signature is that of the version selected by kCudaAbiVersion.
#define CUABI_FUNCTIONS(X)                                                                          \
  X(cuGetErrorName, (CUresult error, const char** pStr))                                            \
  X(cuGetErrorString, (CUresult error, const char** pStr))                                          \
  X(cuInit, (unsigned int Flags))                                                                   \
  X(cuDriverGetVersion, (int* driverVersion))                                                       \
  X(cuDeviceGetCount, (int* count))                                                                 \
  X(cuDeviceGet, (CUdevice* device, int ordinal))                                                   \
  X(cuDeviceGetName, (char* name, int len, CUdevice dev))                                           \
  X(cuDeviceGetUuid, (CUuuid* uuid, CUdevice dev))                                                  \
  X(cuDeviceGetAttribute, (int* pi, int attrib, CUdevice dev))                                      \
  X(cuDeviceTotalMem, (size_t* bytes, CUdevice dev))                                                \
  X(cuDeviceGetPCIBusId, (char* pciBusId, int len, CUdevice dev))                                   \
  X(cuDeviceCanAccessPeer, (int* canAccessPeer, CUdevice dev, CUdevice peerDev))                    \
  X(cuDeviceGetP2PAttribute, (int* value, int attrib, CUdevice srcDevice, CUdevice dstDevice))       \
  X(cuDevicePrimaryCtxRetain, (CUcontext* pctx, CUdevice dev))                                      \
  X(cuDevicePrimaryCtxRelease, (CUdevice dev))                                                      \
  X(cuCtxSetCurrent, (CUcontext ctx))                                                               \
  X(cuCtxGetCurrent, (CUcontext* pctx))                                                             \
  X(cuCtxSynchronize, ())                                                                           \
  X(cuCtxEnablePeerAccess, (CUcontext peerContext, unsigned int Flags))                             \
  X(cuMemGetInfo, (size_t* free, size_t* total))                                                    \
  X(cuMemAlloc, (CUdeviceptr* dptr, size_t bytesize))                                               \
  X(cuMemFree, (CUdeviceptr dptr))                                                                  \
  X(cuMemAllocManaged, (CUdeviceptr* dptr, size_t bytesize, unsigned int flags))                    \
  X(cuMemAllocHost, (void** pp, size_t bytesize))                                                   \
  X(cuMemFreeHost, (void* p))                                                                       \
  X(cuMemHostRegister, (void* p, size_t bytesize, unsigned int Flags))                              \
  X(cuMemHostUnregister, (void* p))                                                                 \
  X(cuMemHostGetDevicePointer, (CUdeviceptr* pdptr, void* p, unsigned int Flags))                   \
  X(cuMemGetAddressRange, (CUdeviceptr* pbase, size_t* psize, CUdeviceptr dptr))                    \
  X(cuPointerGetAttribute, (void* data, int attribute, CUdeviceptr ptr))                            \
  X(cuMemcpyHtoD, (CUdeviceptr dstDevice, const void* srcHost, size_t ByteCount))                   \
  X(cuMemcpyDtoH, (void* dstHost, CUdeviceptr srcDevice, size_t ByteCount))                         \
  X(cuMemcpyDtoD, (CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount))                 \
  X(cuMemcpyHtoDAsync, (CUdeviceptr dstDevice, const void* srcHost, size_t ByteCount, CUstream hStream)) \
  X(cuMemcpyDtoHAsync, (void* dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream))  \
  X(cuMemcpyDtoDAsync, (CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream)) \
  X(cuMemsetD8, (CUdeviceptr dstDevice, unsigned char uc, size_t N))                                \
  X(cuMemsetD32, (CUdeviceptr dstDevice, unsigned int ui, size_t N))                                \
  X(cuMemsetD8Async, (CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream))         \
  X(cuMemsetD32Async, (CUdeviceptr dstDevice, unsigned int ui, size_t N, CUstream hStream))         \
  X(cuIpcGetMemHandle, (CUipcMemHandle* pHandle, CUdeviceptr dptr))                                 \
  X(cuIpcOpenMemHandle, (CUdeviceptr* pdptr, CUipcMemHandle handle, unsigned int Flags))            \
  X(cuIpcCloseMemHandle, (CUdeviceptr dptr))                                                        \
  X(cuIpcGetEventHandle, (CUipcEventHandle* pHandle, CUevent event))                                \
  X(cuIpcOpenEventHandle, (CUevent* phEvent, CUipcEventHandle handle))                              \
  X(cuStreamCreate, (CUstream* phStream, unsigned int Flags))                                       \
  X(cuStreamDestroy, (CUstream hStream))                                                            \
  X(cuStreamQuery, (CUstream hStream))                                                              \
  X(cuStreamSynchronize, (CUstream hStream))                                                        \
  X(cuStreamWaitEvent, (CUstream hStream, CUevent hEvent, unsigned int Flags))                      \
  X(cuLaunchHostFunc, (CUstream hStream, CUhostFn fn, void* userData))                              \
  X(cuStreamWaitValue32, (CUstream stream, CUdeviceptr addr, uint32_t value, unsigned int flags))   \
  X(cuStreamWaitValue64, (CUstream stream, CUdeviceptr addr, cuuint64_t value, unsigned int flags)) \
  X(cuStreamWriteValue32, (CUstream stream, CUdeviceptr addr, uint32_t value, unsigned int flags))  \
  X(cuStreamWriteValue64, (CUstream stream, CUdeviceptr addr, cuuint64_t value, unsigned int flags)) \
  X(cuEventCreate, (CUevent* phEvent, unsigned int Flags))                                          \
  X(cuEventDestroy, (CUevent hEvent))                                                               \
  X(cuEventRecord, (CUevent hEvent, CUstream hStream))                                              \
  X(cuEventQuery, (CUevent hEvent))                                                                 \
  X(cuEventSynchronize, (CUevent hEvent))                                                           \
  X(cuMemPoolCreate, (CUmemoryPool* pool, const CUmemPoolProps* poolProps))                         \
  X(cuMemPoolDestroy, (CUmemoryPool pool))                                                          \
  X(cuMemPoolSetAttribute, (CUmemoryPool pool, int attr, void* value))                              \
  X(cuMemPoolSetAccess, (CUmemoryPool pool, const CUmemAccessDesc* map, size_t count))              \
  X(cuMemPoolTrimTo, (CUmemoryPool pool, size_t minBytesToKeep))                                    \
  X(cuMemPoolExportToShareableHandle, (void* handle_out, CUmemoryPool pool, int handleType, unsigned long long flags)) \
  X(cuMemPoolImportFromShareableHandle, (CUmemoryPool* pool_out, void* handle, int handleType, unsigned long long flags)) \
  X(cuMemPoolExportPointer, (CUmemPoolPtrExportData* shareData_out, CUdeviceptr ptr))              \
  X(cuMemPoolImportPointer, (CUdeviceptr* ptr_out, CUmemoryPool pool, CUmemPoolPtrExportData* shareData)) \
  X(cuMemAllocFromPoolAsync, (CUdeviceptr* dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream)) \
  X(cuMemFreeAsync, (CUdeviceptr dptr, CUstream hStream))                                           \
  X(cuModuleLoadData, (CUmodule* module, const void* image))                                        \
  X(cuModuleUnload, (CUmodule hmod))                                                                \
  X(cuModuleGetFunction, (CUfunction* hfunc, CUmodule hmod, const char* name))                      \
  X(cuLaunchKernel, (CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ, \
                     unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,        \
                     unsigned int sharedMemBytes, CUstream hStream, void** kernelParams, void** extra))

#define CUABI_DECLARE_PFN(name, params) typedef CUresult (*PFN_##name) params;
CUABI_FUNCTIONS(CUABI_DECLARE_PFN)
#undef CUABI_DECLARE_PFN

// Entry points newer than kCudaAbiVersion, each resolved at the version of its signature here
// (native/copy.cc). cuMemcpyBatchAsync came with CUDA 12.8; the 12.8 form (with failIdx) is also
// served by CUDA 13 drivers, whose default form dropped failIdx.
constexpr int kMemcpyBatchAbiVersion = 12080;
enum : int {
  CU_MEMCPY_SRC_ACCESS_ORDER_STREAM = 1,
  CU_MEMCPY_FLAG_DEFAULT = 0,
};
struct CUmemcpyAttributes {
  int srcAccessOrder;
  CUmemLocation srcLocHint;
  CUmemLocation dstLocHint;
  unsigned int flags;
};
typedef CUresult (*PFN_cuMemcpyBatchAsync_v12080)(CUdeviceptr* dsts, CUdeviceptr* srcs, size_t* sizes, size_t count,
                                                   CUmemcpyAttributes* attrs, size_t* attrsIdxs, size_t numAttrs,
                                                   size_t* failIdx, CUstream hStream);

// cuGetProcAddress itself is found with dlsym: the _v2 form (CUDA >= 12.0) takes a status out-param.
typedef CUresult (*PFN_cuGetProcAddress_v2)(const char* symbol, void** pfn, int cudaVersion,
                                            cuuint64_t flags, int* symbolStatus);

}  // namespace cuabi
