// CRing: the C ring of the Python helper (native/py/channel_ring.c, compiled into this addon too)
// for a Node channel end: one native call per acquire, publish, take and release, each the C
// function of that name, instead of the several SharedWords calls of src/channel/slot-ring.ts.
// The ring protocol is the same (docs/channel-protocol.md): a Node end on this ring and one on the
// JavaScript ring, or a Python end, share one channel.
//
// Thin: the constructor fills a struct cip_ring and checks it (cip_ring_init); each method passes
// its checked arguments to one C function and returns its result code, which the TypeScript side
// (src/channel/c-ring.ts) turns into its typed errors. The control block is mapped here, as
// SharedWords maps it (its own mmap of the memfd, sealed against shrinking), so that the ring's
// address stays valid for as long as this object is attached; detach() (also the finalizer) stops
// every later call (CIP_CLOSED) and unmaps. The doorbell fds and the taken words (a Uint32Array
// the JavaScript side reads too) are borrowed: detach() before the fds close.
#include "common.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "py/channel_ring.h"

namespace cuda_ipc {
namespace {

uint32_t PropU32(Napi::Env env, Napi::Object o, const char* name) {
  Napi::Value v = o.Get(name);
  if (!v.IsNumber()) ThrowType(env, std::string("layout.") + name + " must be a number");
  double d = v.As<Napi::Number>().DoubleValue();
  if (!(d >= 0) || d > 4294967295.0 || d != static_cast<double>(static_cast<uint32_t>(d)))
    throw Napi::RangeError::New(env, std::string("layout.") + name + " must be an integer in 0..2^32-1");
  return static_cast<uint32_t>(d);
}

// CRing(fd, length, layout, me, bells, taken, out):
//  fd, length: the control block's memfd (borrowed) and the bytes to map;
//  layout: { slotCount, maxParticipants, broadcast (0/1), participantsOffset, ringOffset,
//            slotRecordsOffset, slotRecordBytes, metaBytes, slotBytesLo, slotBytesHi, expectConsumers };
//  me: this participant's index; bells: Int32Array of each participant's eventfd (-1: none);
//  taken: Uint32Array(slotCount), the state word of each slot this end took (shared with JS);
//  out: Float64Array(1), where take() puts the position of the message it took.
class CRing : public Napi::ObjectWrap<CRing> {
 public:
  static Napi::Function Define(Napi::Env env) {
    return DefineClass(env, "CRing",
                       {InstanceMethod<&CRing::Acquire>("acquire"),
                        InstanceMethod<&CRing::Claim>("claim"),
                        InstanceMethod<&CRing::HasFree>("hasFree"),
                        InstanceMethod<&CRing::PublishWritten>("publishWritten"),
                        InstanceMethod<&CRing::Discard>("discard"),
                        InstanceMethod<&CRing::Take>("take"),
                        InstanceMethod<&CRing::Release>("release"),
                        InstanceMethod<&CRing::Peek>("peek"),
                        InstanceMethod<&CRing::ReleaseHeld>("releaseHeld"),
                        InstanceMethod<&CRing::Error>("error"),
                        InstanceMethod<&CRing::Detach>("detach"),
                        StaticValue("abiVersion", Napi::Number::New(env, cip_abi_version()))});
  }

  explicit CRing(const Napi::CallbackInfo& info) : Napi::ObjectWrap<CRing>(info) {
    Napi::Env env = info.Env();
    memset(&r_, 0, sizeof r_);
    int fd = CheckFd(env, info, 0);
    size_t length = ArgSize(info, 1, "length");
    if (length < 320 || length > (size_t{1} << 40)) throw Napi::RangeError::New(env, "length out of range");
    if (info.Length() < 7 || !info[2].IsObject() || !info[4].IsTypedArray() || !info[5].IsTypedArray() || !info[6].IsTypedArray())
      ThrowType(env, "CRing(fd, length, layout, me, bells: Int32Array, taken: Uint32Array, out: Float64Array)");
    Napi::Object layout = info[2].As<Napi::Object>();
    r_.slot_count = PropU32(env, layout, "slotCount");
    r_.max_participants = PropU32(env, layout, "maxParticipants");
    r_.broadcast = PropU32(env, layout, "broadcast");
    r_.participants_offset = PropU32(env, layout, "participantsOffset");
    r_.ring_offset = PropU32(env, layout, "ringOffset");
    r_.slot_records_offset = PropU32(env, layout, "slotRecordsOffset");
    r_.slot_record_bytes = PropU32(env, layout, "slotRecordBytes");
    r_.meta_bytes = PropU32(env, layout, "metaBytes");
    r_.slot_bytes_lo = PropU32(env, layout, "slotBytesLo");
    r_.slot_bytes_hi = PropU32(env, layout, "slotBytesHi");
    r_.expect_consumers = PropU32(env, layout, "expectConsumers");
    r_.me = ArgU32(info, 3, "me");

    Napi::TypedArray bells = info[4].As<Napi::TypedArray>();
    Napi::TypedArray taken = info[5].As<Napi::TypedArray>();
    Napi::TypedArray out = info[6].As<Napi::TypedArray>();
    if (bells.TypedArrayType() != napi_int32_array || bells.ElementLength() > 32) ThrowType(env, "bells must be an Int32Array of at most 32 fds");
    if (taken.TypedArrayType() != napi_uint32_array || taken.ElementLength() != r_.slot_count) ThrowType(env, "taken must be a Uint32Array of slotCount words");
    if (out.TypedArrayType() != napi_float64_array || out.ElementLength() < 1) ThrowType(env, "out must be a Float64Array of at least 1");
    const int32_t* fds = reinterpret_cast<const int32_t*>(static_cast<uint8_t*>(bells.ArrayBuffer().Data()) + bells.ByteOffset());
    r_.nbells = static_cast<uint32_t>(bells.ElementLength());
    for (uint32_t k = 0; k < r_.nbells; k++) r_.bells[k] = fds[k];
    // The arrays stay referenced, so their memory stays put (a fixed-length ArrayBuffer never moves).
    taken_ = Napi::Persistent(taken.As<Napi::Object>());
    out_ = Napi::Persistent(out.As<Napi::Object>());
    r_.taken = reinterpret_cast<uint64_t>(static_cast<uint8_t*>(taken.ArrayBuffer().Data()) + taken.ByteOffset());
    outPtr_ = reinterpret_cast<double*>(static_cast<uint8_t*>(out.ArrayBuffer().Data()) + out.ByteOffset());

    struct stat st;
    if (fstat(fd, &st) < 0) ThrowErrno(env, "fstat", errno);
    if (!S_ISREG(st.st_mode) || static_cast<uint64_t>(st.st_size) < length) ThrowErrno(env, "CRing", EINVAL);
    int seals = fcntl(fd, F_GET_SEALS);
    if (seals < 0 || !(seals & F_SEAL_SHRINK)) ThrowErrno(env, "CRing (file not sealed against shrinking)", EPERM);
    void* p = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) ThrowErrno(env, "mmap", errno);
    map_ = p;
    mapLength_ = length;
    r_.base = reinterpret_cast<uint64_t>(p);
    r_.length = length;
    if (cip_ring_init(&r_) != 0) {
      Unmap();
      throw Napi::RangeError::New(env, "CRing: the layout does not fit the mapping (cip_ring_init)");
    }
  }

  ~CRing() override { Unmap(); }

 private:
  void Unmap() {
    cip_ring_detach(&r_);
    if (map_) munmap(map_, mapLength_);
    map_ = nullptr;
  }

  Napi::Value Int(const Napi::CallbackInfo& info, int v) { return Napi::Number::New(info.Env(), v); }

  // acquire() -> a slot claimed for writing, or CIP_NONE / CIP_NOT_ALIVE / CIP_CONSUMERS_GONE / CIP_CLOSED.
  Napi::Value Acquire(const Napi::CallbackInfo& info) { return Int(info, cip_acquire(&r_)); }

  // claim() -> a slot claimed for writing without acquire()'s checks, CIP_NONE, or CIP_CLOSED.
  Napi::Value Claim(const Napi::CallbackInfo& info) {
    uint32_t s = 0;
    int n = cip_claim_slots(&r_, &s, 1);
    return Int(info, n < 0 ? n : n == 0 ? CIP_NONE : static_cast<int>(s));
  }

  // hasFree() -> 1 / 0, or CIP_CLOSED.
  Napi::Value HasFree(const Napi::CallbackInfo& info) { return Int(info, cip_has_free(&r_)); }

  // publishWritten(s) -> 0 ok, 1 busy, 2 dropped, 3 detached; CIP_CORRUPT / CIP_INVALID / CIP_CLOSED.
  Napi::Value PublishWritten(const Napi::CallbackInfo& info) { return Int(info, cip_publish_written(&r_, ArgU32(info, 0, "slot"))); }

  // discard(s) -> 0; CIP_INVALID / CIP_CLOSED.
  Napi::Value Discard(const Napi::CallbackInfo& info) { return Int(info, cip_discard(&r_, ArgU32(info, 0, "slot"))); }

  // take() -> the slot taken (with CIP_TAKEN_DETACHED / CIP_TAKEN_BAD set when so), its position
  // in out[0] (-1 at or above 2^53); CIP_NONE / CIP_CORRUPT / CIP_CLOSED.
  Napi::Value Take(const Napi::CallbackInfo& info) {
    struct cip_message m;
    int s = cip_take_message(&r_, &m);
    if (s >= 0) outPtr_[0] = static_cast<double>(m.position);
    return Int(info, s);
  }

  // release(s) -> 1 freed, 0 no longer held; CIP_INVALID / CIP_CLOSED.
  Napi::Value Release(const Napi::CallbackInfo& info) { return Int(info, cip_release(&r_, ArgU32(info, 0, "slot"))); }

  // peek(cursor) -> broadcast: the slot published at cursor (an integer below 2^53); CIP_NONE
  // nothing there yet, CIP_SKIP not held for this end; CIP_CORRUPT / CIP_CLOSED.
  Napi::Value Peek(const Napi::CallbackInfo& info) {
    double d = info.Length() > 0 && info[0].IsNumber() ? info[0].As<Napi::Number>().DoubleValue() : -1;
    if (!(d >= 0) || d > 9007199254740992.0 || d != static_cast<double>(static_cast<uint64_t>(d)))
      throw Napi::RangeError::New(info.Env(), "cursor must be an integer in 0..2^53");
    uint64_t c = static_cast<uint64_t>(d);
    return Int(info, cip_peek(&r_, static_cast<uint32_t>(c), static_cast<uint32_t>(c >> 32)));
  }

  // releaseHeld(s, k) -> broadcast: 1 dropped participant k's hold on slot s (the last holder frees
  // it), 0 k held none; CIP_INVALID / CIP_CLOSED.
  Napi::Value ReleaseHeld(const Napi::CallbackInfo& info) {
    return Int(info, cip_release_held(&r_, ArgU32(info, 0, "slot"), ArgU32(info, 1, "participant")));
  }

  // error() -> [what (ERR_*), a, b]: what the last CIP_CORRUPT found.
  Napi::Value Error(const Napi::CallbackInfo& info) {
    Napi::Array a = Napi::Array::New(info.Env(), 3);
    a.Set(0u, Napi::Number::New(info.Env(), r_.error));
    a.Set(1u, Napi::Number::New(info.Env(), static_cast<double>(r_.error_a)));
    a.Set(2u, Napi::Number::New(info.Env(), static_cast<double>(r_.error_b)));
    return a;
  }

  // detach(): every later call returns CIP_CLOSED and rings nothing; unmaps. Idempotent.
  Napi::Value Detach(const Napi::CallbackInfo& info) {
    Unmap();
    taken_.Reset();
    out_.Reset();
    return info.Env().Undefined();
  }

  struct cip_ring r_;
  void* map_ = nullptr;
  size_t mapLength_ = 0;
  double* outPtr_ = nullptr;
  Napi::ObjectReference taken_;
  Napi::ObjectReference out_;
};

}  // namespace

void InitCRing(Napi::Env env, Napi::Object exports) {
  exports.Set("CRing", CRing::Define(env));
}

}  // namespace cuda_ipc
