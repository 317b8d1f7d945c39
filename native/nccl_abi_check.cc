// Compiled (never linked) by test/cpu/nccl-abi.test against NCCL's own nccl.h: proves that
// native/nccl_abi.h matches the real NCCL ABI. Not part of the addon.
#include "nccl_abi.h"
#include <nccl.h>
#include <cstddef>
#include <tuple>
#include <type_traits>

namespace {
struct Ptr {};
template <size_t N> struct Int {};
template <size_t N> struct Struct {};
// Two signatures are ABI-compatible when each position has the same class (pointer, integer of
// a size, struct of a size). Signedness and enum-vs-int do not change the calling convention.
template <class T>
using Canon = std::conditional_t<std::is_pointer_v<T>, Ptr,
              std::conditional_t<std::is_class_v<T>, Struct<sizeof(T)>,
              std::conditional_t<std::is_void_v<T>, Int<0>, Int<sizeof(std::conditional_t<std::is_void_v<T>, char, T>)>>>>;
template <class F> struct Sig;
template <class R, class... A> struct Sig<R (*)(A...)> { using type = std::tuple<Canon<R>, Canon<A>...>; };
}  // namespace

#define CHECK_FN(name, ret, params)                                                          \
  static_assert(std::is_same_v<Sig<ncclabi::PFN_##name>::type, Sig<decltype(&::name)>::type>, \
                "signature of " #name " differs from nccl.h");
NCCLABI_FUNCTIONS(CHECK_FN)

#define CHECK_EQ(ours, theirs) \
  static_assert(static_cast<long long>(ncclabi::ours) == static_cast<long long>(theirs), #ours " differs from nccl.h");
CHECK_EQ(ncclSuccess, ::ncclSuccess)
CHECK_EQ(ncclUnhandledCudaError, ::ncclUnhandledCudaError)
CHECK_EQ(ncclSystemError, ::ncclSystemError)
CHECK_EQ(ncclInternalError, ::ncclInternalError)
CHECK_EQ(ncclInvalidArgument, ::ncclInvalidArgument)
CHECK_EQ(ncclInvalidUsage, ::ncclInvalidUsage)
CHECK_EQ(ncclRemoteError, ::ncclRemoteError)
CHECK_EQ(ncclInProgress, ::ncclInProgress)
CHECK_EQ(ncclInt8, ::ncclInt8)
CHECK_EQ(ncclUint8, ::ncclUint8)
CHECK_EQ(kUniqueIdBytes, NCCL_UNIQUE_ID_BYTES)
CHECK_EQ(kConfigUndefInt, NCCL_CONFIG_UNDEF_INT)
CHECK_EQ(kConfigVersion, NCCL_VERSION(2, 17, 0))
CHECK_EQ(kVersionCode2_14, NCCL_VERSION(2, 14, 0))
static_assert(sizeof(ncclabi::ncclUniqueId) == sizeof(::ncclUniqueId), "ncclUniqueId's size differs from nccl.h");
static_assert(sizeof(ncclabi::ncclResult_t) == sizeof(::ncclResult_t), "ncclResult_t's size differs from nccl.h");
static_assert(sizeof(ncclabi::ncclDataType_t) == sizeof(::ncclDataType_t), "ncclDataType_t's size differs from nccl.h");

// Our ncclConfig_t is 2.17's layout: a prefix of every later one, field for field.
static_assert(sizeof(ncclabi::ncclConfig_v21700) <= sizeof(::ncclConfig_t), "ncclConfig_t is shorter than ours");
#define CHECK_FIELD(f)                                                                                         \
  static_assert(offsetof(ncclabi::ncclConfig_v21700, f) == offsetof(::ncclConfig_t, f) &&                      \
                    sizeof(ncclabi::ncclConfig_v21700::f) == sizeof(::ncclConfig_t::f),                         \
                "ncclConfig_t." #f " differs from nccl.h");
CHECK_FIELD(size)
CHECK_FIELD(magic)
CHECK_FIELD(version)
CHECK_FIELD(blocking)
CHECK_FIELD(cgaClusterSize)
CHECK_FIELD(minCTAs)
CHECK_FIELD(maxCTAs)
CHECK_FIELD(netName)
// The magic NCCL_CONFIG_INITIALIZER writes (NCCL_API_MAGIC where nccl.h names it).
constexpr ncclConfig_t kInitializer = NCCL_CONFIG_INITIALIZER;
static_assert(kInitializer.magic == ncclabi::kApiMagic, "the config magic differs from nccl.h's NCCL_CONFIG_INITIALIZER");
