// The subset of the NCCL ABI that cuda-ipc uses, declared here so that the addon builds and loads
// where NCCL is not installed: libnccl.so.2 is found and dlopened at run time (native/nccl.cc),
// never linked. Everything lives in namespace ncclabi; test/cpu/nccl-abi.test compiles
// native/nccl_abi_check.cc against NCCL's own nccl.h (where one is installed) to prove that the
// constants, struct layouts and signatures below match it.
#pragma once
#include <climits>
#include <cstddef>

namespace ncclabi {

typedef struct ncclComm* ncclComm_t;
// cudaStream_t is the driver's CUstream: the addon passes a Stream's handle as is.
typedef struct CUstream_st* cudaStream_t;

constexpr size_t kUniqueIdBytes = 128;
// Passed by value to ncclCommInitRankConfig: a 128-byte struct goes on the stack (SysV x86-64 and
// AArch64 pass it in memory), so its type must be this struct, not a pointer.
struct ncclUniqueId { char internal[kUniqueIdBytes]; };

// ncclResult_t and ncclDataType_t are C enums: int-sized.
typedef int ncclResult_t;
constexpr ncclResult_t ncclSuccess = 0;
constexpr ncclResult_t ncclUnhandledCudaError = 1;
constexpr ncclResult_t ncclSystemError = 2;
constexpr ncclResult_t ncclInternalError = 3;
constexpr ncclResult_t ncclInvalidArgument = 4;
constexpr ncclResult_t ncclInvalidUsage = 5;
constexpr ncclResult_t ncclRemoteError = 6;
constexpr ncclResult_t ncclInProgress = 7;

typedef int ncclDataType_t;
constexpr ncclDataType_t ncclInt8 = 0;
constexpr ncclDataType_t ncclUint8 = 1;

// ncclConfig_t is versioned: NCCL reads `size` bytes of it (no more than its own struct), checks
// `magic`, and resets to its defaults every field added after `version` (parseCommConfig in
// src/init.cc: blocking from 2.14, cgaClusterSize..netName from 2.17). Fields beyond our `size`
// keep NCCL's defaults. So this older, shorter layout, declared as 2.17's, stays valid on 2.28 and
// later (members are only ever appended), and on 2.17 itself.
constexpr unsigned int kApiMagic = 0xcafebeef;
constexpr int kConfigUndefInt = INT_MIN;
constexpr unsigned int kConfigVersion = 21700;  // NCCL_VERSION(2, 17, 0)
struct ncclConfig_v21700 {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int blocking;
  int cgaClusterSize;
  int minCTAs;
  int maxCTAs;
  const char* netName;
};

// NCCL_VERSION(X, Y, Z) of ncclGetVersion: X*1000 + Y*100 + Z up to 2.8, X*10000 + Y*100 + Z after.
constexpr int kVersionCode2_14 = 21400;  // ncclCommInitRankConfig, ncclCommFinalize, non-blocking comms

// X(name, result type, parameters): every entry point the addon resolves with dlsym. All of them
// exist from NCCL 2.14 on.
#define NCCLABI_FUNCTIONS(X)                                                                        \
  X(ncclGetVersion, ncclResult_t, (int* version))                                                   \
  X(ncclGetUniqueId, ncclResult_t, (ncclUniqueId* uniqueId))                                        \
  X(ncclCommInitRankConfig, ncclResult_t,                                                           \
    (ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank, ncclConfig_v21700* config))       \
  X(ncclCommGetAsyncError, ncclResult_t, (ncclComm_t comm, ncclResult_t* asyncError))               \
  X(ncclCommAbort, ncclResult_t, (ncclComm_t comm))                                                 \
  X(ncclCommFinalize, ncclResult_t, (ncclComm_t comm))                                              \
  X(ncclCommDestroy, ncclResult_t, (ncclComm_t comm))                                               \
  X(ncclGetErrorString, const char*, (ncclResult_t result))                                         \
  X(ncclGetLastError, const char*, (ncclComm_t comm))                                               \
  X(ncclCommCount, ncclResult_t, (ncclComm_t comm, int* count))                                     \
  X(ncclCommCuDevice, ncclResult_t, (ncclComm_t comm, int* device))                                 \
  X(ncclCommUserRank, ncclResult_t, (ncclComm_t comm, int* rank))                                   \
  X(ncclSend, ncclResult_t,                                                                         \
    (const void* sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,        \
     cudaStream_t stream))                                                                          \
  X(ncclRecv, ncclResult_t,                                                                         \
    (void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,              \
     cudaStream_t stream))                                                                          \
  X(ncclBroadcast, ncclResult_t,                                                                    \
    (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,         \
     ncclComm_t comm, cudaStream_t stream))                                                         \
  X(ncclGroupStart, ncclResult_t, ())                                                               \
  X(ncclGroupEnd, ncclResult_t, ())

#define NCCLABI_DECLARE_PFN(name, ret, params) typedef ret(*PFN_##name) params;
NCCLABI_FUNCTIONS(NCCLABI_DECLARE_PFN)
#undef NCCLABI_DECLARE_PFN

}  // namespace ncclabi
