// Channel primitives: atomics on words of a shared-memory file, bounded spins, and eventfd doorbells.
//
// Thin on purpose: the ring protocol lives in TypeScript (src/channel/). This file gives it
//  - SharedWords(fd, length): its own mmap(MAP_SHARED) of a memfd, with sequentially consistent
//    32/64-bit atomics at byte offsets that are checked for alignment and bounds on every call (a
//    bad offset throws, never faults);
//  - bounded spins on the calling thread (the short spin before sleeping, and spin mode);
//  - eventfd doorbells: create, ring (write 1), and Doorbell(fd, callback), a uv_poll on the
//    event loop that drains the eventfd and calls back when it is rung. A sleeping end is woken by
//    that one hop: no thread in between, no libuv pool thread parked.
//
// 64-bit values cross as JS numbers: they are positions and counters that stay below 2^53. A
// stored value above 2^53 (only a corrupt or hostile peer writes one) reads as -1.
//
// Per-object state only: no globals, no napi instance data, so worker threads each get their own.
#include "common.h"
#include "polled.h"

#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#include <memory>

namespace cuda_ipc {
namespace {

constexpr double kMaxSafe = 9007199254740992.0;  // 2^53
constexpr int64_t kMaxSpinMicros = 100000;        // a spin never exceeds 100 ms

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#else
  asm volatile("" ::: "memory");
#endif
}

inline int64_t NowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

// Loads between two pauses of a spin. A hypervisor may take a run of closely spaced pauses for a
// vCPU spinning on a lock whose holder is descheduled and exit to the host (KVM's pause-loop
// exiting, AMD's pause filter: pauses less than ~128 cycles apart): each exit costs microseconds
// during which the spinner sees nothing. Loads in between keep the pauses far enough apart.
constexpr int kLoadsPerPause = 256;
// Pauses between two looks at the clock (a microsecond or two of spinning): a clock read is a
// vDSO call at best, a system call on a VM whose clock source has no vDSO.
constexpr uint32_t kPausesPerClock = 8;

// Spins while *addr == expected, up to `ns` (overshooting by a clock interval at most). True when
// the word changed.
bool SpinWhileEqual(const uint32_t* addr, uint32_t expected, int64_t ns) {
  if (__atomic_load_n(addr, __ATOMIC_SEQ_CST) != expected) return true;
  if (ns <= 0) return false;
  int64_t deadline = NowNs() + ns;
  for (uint32_t round = 1;; round++) {
    for (int i = 0; i < kLoadsPerPause; i++) {
      if (__atomic_load_n(addr, __ATOMIC_SEQ_CST) != expected) return true;
    }
    CpuRelax();
    if (round % kPausesPerClock == 0 && NowNs() >= deadline) return false;
  }
}

struct Mapping {
  Mapping(uint8_t* a, size_t n) : addr(a), length(n) {}
  ~Mapping() { munmap(addr, length); }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  uint8_t* addr;
  size_t length;
};

double ArgDouble(const Napi::CallbackInfo& info, size_t i, const char* what) {
  if (info.Length() <= i || !info[i].IsNumber()) ThrowType(info.Env(), std::string(what) + " must be a number");
  return info[i].As<Napi::Number>().DoubleValue();
}

// A non-negative integer below 2^53, for 64-bit stores.
uint64_t ArgU53(const Napi::CallbackInfo& info, size_t i, const char* what) {
  double d = ArgDouble(info, i, what);
  if (!(d >= 0) || d > kMaxSafe || d != static_cast<double>(static_cast<uint64_t>(d)))
    throw Napi::RangeError::New(info.Env(), std::string(what) + " must be an integer in 0..2^53");
  return static_cast<uint64_t>(d);
}

Napi::Value U53(Napi::Env env, uint64_t v) {
  return Napi::Number::New(env, v > static_cast<uint64_t>(kMaxSafe) ? -1.0 : static_cast<double>(v));
}

// ---------------------------------------------------------------------------------------------
// SharedWords(fd, length): maps `length` bytes of fd (which stays the caller's). The fd must be a
// regular file at least that long and sealed against shrinking (F_SEAL_SHRINK).
class SharedWords : public Napi::ObjectWrap<SharedWords> {
 public:
  static Napi::Function Define(Napi::Env env) {
    return DefineClass(env, "SharedWords",
                       {InstanceMethod<&SharedWords::Load32>("load32"),
                        InstanceMethod<&SharedWords::Store32>("store32"),
                        InstanceMethod<&SharedWords::Cas32>("cas32"),
                        InstanceMethod<&SharedWords::Add32>("add32"),
                        InstanceMethod<&SharedWords::And32>("and32"),
                        InstanceMethod<&SharedWords::Or32>("or32"),
                        InstanceMethod<&SharedWords::Load64>("load64"),
                        InstanceMethod<&SharedWords::Store64>("store64"),
                        InstanceMethod<&SharedWords::Cas64>("cas64"),
                        InstanceMethod<&SharedWords::Add64>("add64"),
                        InstanceMethod<&SharedWords::ClaimFirst32>("claimFirst32"),
                        InstanceMethod<&SharedWords::SpinWait32>("spinWait32"),
                        InstanceMethod<&SharedWords::SpinCas32>("spinCas32"),
                        InstanceMethod<&SharedWords::Close>("close"),
                        InstanceAccessor<&SharedWords::ByteLength>("byteLength"),
                        InstanceAccessor<&SharedWords::Address>("address")});
  }

  explicit SharedWords(const Napi::CallbackInfo& info) : Napi::ObjectWrap<SharedWords>(info) {
    Napi::Env env = info.Env();
    int fd = CheckFd(env, info, 0);
    size_t length = ArgSize(info, 1, "length");
    if (length < 8 || length > (size_t{1} << 40)) throw Napi::RangeError::New(env, "length out of range");
    struct stat st;
    if (fstat(fd, &st) < 0) ThrowErrno(env, "fstat", errno);
    // Touching a page past the end of the file raises SIGBUS: refuse a file shorter than asked,
    // and one that another process could still shrink (not sealed against it, as memfds made by
    // HostBuffer.allocate are).
    if (!S_ISREG(st.st_mode) || static_cast<uint64_t>(st.st_size) < length) ThrowErrno(env, "SharedWords", EINVAL);
    int seals = fcntl(fd, F_GET_SEALS);
    if (seals < 0 || !(seals & F_SEAL_SHRINK)) ThrowErrno(env, "SharedWords (file not sealed against shrinking)", EPERM);
    void* p = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) ThrowErrno(env, "mmap", errno);
    map_ = std::make_unique<Mapping>(static_cast<uint8_t*>(p), length);
  }

  // Checked pointer to a 4- or 8-byte word at the offset given as argument i.
  template <typename T>
  T* Word(const Napi::CallbackInfo& info, size_t i) {
    if (!map_) ThrowErrno(info.Env(), "SharedWords", EBADF);
    double d = ArgDouble(info, i, "offset");
    if (!(d >= 0) || d != static_cast<double>(static_cast<uint64_t>(d)) || d + sizeof(T) > static_cast<double>(map_->length))
      throw Napi::RangeError::New(info.Env(), "offset outside the shared words");
    uint64_t off = static_cast<uint64_t>(d);
    if (off % sizeof(T) != 0) throw Napi::RangeError::New(info.Env(), "offset is not aligned to the word size");
    return reinterpret_cast<T*>(map_->addr + off);
  }

 private:
  Napi::Value Load32(const Napi::CallbackInfo& info) {
    return Napi::Number::New(info.Env(), __atomic_load_n(Word<uint32_t>(info, 0), __ATOMIC_SEQ_CST));
  }
  Napi::Value Store32(const Napi::CallbackInfo& info) {
    uint32_t* w = Word<uint32_t>(info, 0);
    __atomic_store_n(w, ArgU32(info, 1, "value"), __ATOMIC_SEQ_CST);
    return info.Env().Undefined();
  }
  // cas32(offset, expected, desired) -> the value seen (== expected when it was swapped)
  Napi::Value Cas32(const Napi::CallbackInfo& info) {
    uint32_t* w = Word<uint32_t>(info, 0);
    uint32_t expected = ArgU32(info, 1, "expected");
    uint32_t desired = ArgU32(info, 2, "desired");
    __atomic_compare_exchange_n(w, &expected, desired, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    return Napi::Number::New(info.Env(), expected);
  }
  // add32(offset, delta) -> the previous value (wrapping)
  Napi::Value Add32(const Napi::CallbackInfo& info) {
    uint32_t* w = Word<uint32_t>(info, 0);
    int32_t delta = ArgI32(info, 1, "delta");
    return Napi::Number::New(info.Env(), __atomic_fetch_add(w, static_cast<uint32_t>(delta), __ATOMIC_SEQ_CST));
  }
  Napi::Value And32(const Napi::CallbackInfo& info) {
    uint32_t* w = Word<uint32_t>(info, 0);
    return Napi::Number::New(info.Env(), __atomic_fetch_and(w, ArgU32(info, 1, "mask"), __ATOMIC_SEQ_CST));
  }
  Napi::Value Or32(const Napi::CallbackInfo& info) {
    uint32_t* w = Word<uint32_t>(info, 0);
    return Napi::Number::New(info.Env(), __atomic_fetch_or(w, ArgU32(info, 1, "mask"), __ATOMIC_SEQ_CST));
  }
  // The 64-bit twins: one binding per width, as JS numbers cross as u32 here and as u53 there.
  Napi::Value Load64(const Napi::CallbackInfo& info) {
    return U53(info.Env(), __atomic_load_n(Word<uint64_t>(info, 0), __ATOMIC_SEQ_CST));
  }
  Napi::Value Store64(const Napi::CallbackInfo& info) {
    uint64_t* w = Word<uint64_t>(info, 0);
    __atomic_store_n(w, ArgU53(info, 1, "value"), __ATOMIC_SEQ_CST);
    return info.Env().Undefined();
  }
  Napi::Value Cas64(const Napi::CallbackInfo& info) {
    uint64_t* w = Word<uint64_t>(info, 0);
    uint64_t expected = ArgU53(info, 1, "expected");
    uint64_t desired = ArgU53(info, 2, "desired");
    __atomic_compare_exchange_n(w, &expected, desired, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    return U53(info.Env(), expected);
  }
  Napi::Value Add64(const Napi::CallbackInfo& info) {
    uint64_t* w = Word<uint64_t>(info, 0);
    uint64_t delta = ArgU53(info, 1, "delta");
    return U53(info.Env(), __atomic_fetch_add(w, delta, __ATOMIC_SEQ_CST));
  }

  // claimFirst32(offset, stride, count, start, mask, expect, desired) -> index or -1.
  // Looks at the words offset + ((start + i) % count) * stride for i = 0..count-1 and swaps the
  // first whose (value & mask) == expect for `desired`. The scan of slot states in one call.
  Napi::Value ClaimFirst32(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    uint32_t* first = Word<uint32_t>(info, 0);
    double stride = ArgDouble(info, 1, "stride");
    double count = ArgDouble(info, 2, "count");
    double start = ArgDouble(info, 3, "start");
    uint32_t mask = ArgU32(info, 4, "mask");
    uint32_t expect = ArgU32(info, 5, "expect");
    uint32_t desired = ArgU32(info, 6, "desired");
    if (!(stride >= 4) || stride > (1 << 24) || static_cast<uint64_t>(stride) % 4 != 0 || stride != static_cast<double>(static_cast<uint64_t>(stride)))
      throw Napi::RangeError::New(env, "stride must be a positive multiple of 4");
    if (!(count >= 1) || count > (1 << 20) || count != static_cast<double>(static_cast<uint64_t>(count)))
      throw Napi::RangeError::New(env, "count out of range");
    if (!(start >= 0) || start != static_cast<double>(static_cast<uint64_t>(start)))
      throw Napi::RangeError::New(env, "start must be a non-negative integer");
    uint64_t n = static_cast<uint64_t>(count), st = static_cast<uint64_t>(stride);
    uint64_t off = reinterpret_cast<uint8_t*>(first) - map_->addr;
    if (off + (n - 1) * st + 4 > map_->length) throw Napi::RangeError::New(env, "words outside the shared words");
    uint64_t s = static_cast<uint64_t>(start) % n;
    for (uint64_t i = 0; i < n; i++) {
      uint64_t idx = (s + i) % n;
      uint32_t* w = reinterpret_cast<uint32_t*>(map_->addr + off + idx * st);
      uint32_t v = __atomic_load_n(w, __ATOMIC_SEQ_CST);
      if ((v & mask) != expect) continue;
      if (__atomic_compare_exchange_n(w, &v, desired, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
        return Napi::Number::New(env, static_cast<double>(idx));
    }
    return Napi::Number::New(env, -1);
  }

  // spinWait32(offset, expected, micros) -> true when the word differs from expected. Blocks the
  // calling thread for at most `micros` (capped at 100 ms): spin mode only.
  Napi::Value SpinWait32(const Napi::CallbackInfo& info) {
    uint32_t* w = Word<uint32_t>(info, 0);
    uint32_t expected = ArgU32(info, 1, "expected");
    double micros = ArgDouble(info, 2, "micros");
    int64_t us = micros > 0 ? static_cast<int64_t>(micros < kMaxSpinMicros ? micros : kMaxSpinMicros) : 0;
    return Napi::Boolean::New(info.Env(), SpinWhileEqual(w, expected, us * 1000));
  }

  // spinCas32(offset, expected, desired, micros) -> true once swapped; false after `micros`.
  Napi::Value SpinCas32(const Napi::CallbackInfo& info) {
    uint32_t* w = Word<uint32_t>(info, 0);
    uint32_t expected = ArgU32(info, 1, "expected");
    uint32_t desired = ArgU32(info, 2, "desired");
    double micros = ArgDouble(info, 3, "micros");
    int64_t us = micros > 0 ? static_cast<int64_t>(micros < kMaxSpinMicros ? micros : kMaxSpinMicros) : 0;
    int64_t deadline = NowNs() + us * 1000;
    for (uint32_t i = 0;; i++) {
      uint32_t e = expected;
      if (__atomic_load_n(w, __ATOMIC_RELAXED) == expected &&
          __atomic_compare_exchange_n(w, &e, desired, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
        return Napi::Boolean::New(info.Env(), true);
      CpuRelax();
      if ((i & 63) == 63 && NowNs() >= deadline) return Napi::Boolean::New(info.Env(), false);
    }
  }

  Napi::Value Close(const Napi::CallbackInfo& info) {
    map_.reset();
    return info.Env().Undefined();
  }

  Napi::Value ByteLength(const Napi::CallbackInfo& info) {
    return Napi::Number::New(info.Env(), map_ ? static_cast<double>(map_->length) : 0);
  }
  Napi::Value Address(const Napi::CallbackInfo& info) {
    return U64(info.Env(), map_ ? reinterpret_cast<uint64_t>(map_->addr) : 0);
  }

  std::unique_ptr<Mapping> map_;
};

// ---------------------------------------------------------------------------------------------
// Eventfd doorbells. A channel gives every participant entry an eventfd; an end that goes to
// sleep polls its own (Doorbell), and whoever changes what it waits for rings it (eventfdRing)
// when the control block says it is asleep. The fds are the caller's: these functions borrow them.

// eventfdCreate() -> fd: count 0, non-blocking, close-on-exec.
Napi::Value EventfdCreate(const Napi::CallbackInfo& info) {
  int fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (fd < 0) ThrowErrno(info.Env(), "eventfd", errno);
  return Napi::Number::New(info.Env(), fd);
}

// eventfdRing(fd): adds 1 to the count, which makes the eventfd readable for its poller. A count
// already at its maximum (EAGAIN) is readable already: nothing to do.
Napi::Value EventfdRing(const Napi::CallbackInfo& info) {
  int fd = CheckFd(info.Env(), info, 0);
  uint64_t one = 1;
  for (;;) {
    ssize_t n = write(fd, &one, sizeof one);
    if (n == static_cast<ssize_t>(sizeof one)) break;
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) break;
    ThrowErrno(info.Env(), "write(eventfd)", n < 0 ? errno : EIO);
  }
  return info.Env().Undefined();
}

// eventfdDrain(fd) -> the count it held (reset to 0); 0 when it was 0.
Napi::Value EventfdDrain(const Napi::CallbackInfo& info) {
  int fd = CheckFd(info.Env(), info, 0);
  uint64_t count = 0;
  for (;;) {
    ssize_t n = read(fd, &count, sizeof count);
    if (n == static_cast<ssize_t>(sizeof count)) break;
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return Napi::Number::New(info.Env(), 0);
    ThrowErrno(info.Env(), "read(eventfd)", n < 0 ? errno : EIO);
  }
  return Napi::Number::New(info.Env(), static_cast<double>(count));
}

// isEventfd(fd) -> whether fd is an eventfd (what /proc/self/fd says it is). Received fds are
// checked with this before anything writes to or polls them.
Napi::Value IsEventfd(const Napi::CallbackInfo& info) {
  int fd = CheckFd(info.Env(), info, 0);
  char path[64];
  char target[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  ssize_t n = readlink(path, target, sizeof target - 1);
  if (n < 0) ThrowErrno(info.Env(), "readlink(/proc/self/fd)", errno);
  target[n] = 0;
  return Napi::Boolean::New(info.Env(), strcmp(target, "anon_inode:[eventfd]") == 0);
}

// Doorbell(fd, callback): polls fd (an eventfd, borrowed: close the Doorbell before the fd) for
// readability on this thread's event loop (Polled, polled.h). Each time it is rung, drains it and
// calls callback(0) (callback(-errno) if polling failed; polling then stops). The poll is unref'd:
// it keeps the loop alive only between ref() and unref() (while someone waits on it). close()
// stops it; idempotent; also done by the finalizer and at environment teardown.
class Doorbell : public Napi::ObjectWrap<Doorbell>, public Polled {
 public:
  static Napi::Function Define(Napi::Env env) {
    return DefineClass(env, "Doorbell",
                       {InstanceMethod("ref", &Doorbell::RefLoop),
                        InstanceMethod("unref", &Doorbell::UnrefLoop),
                        InstanceMethod<&Doorbell::Close>("close"),
                        InstanceAccessor<&Doorbell::Closed>("closed")});
  }

  explicit Doorbell(const Napi::CallbackInfo& info) : Napi::ObjectWrap<Doorbell>(info) {
    Napi::Env env = info.Env();
    int fd = CheckFd(env, info, 0);
    if (info.Length() < 2 || !info[1].IsFunction()) ThrowType(env, "callback must be a function");
    callback_ = Napi::Persistent(info[1].As<Napi::Function>());
    ctx_ = std::make_unique<Napi::AsyncContext>(env, "cuda-ipc:channel-doorbell");
    // Polling starts last: a constructor that throws after it would leave the poll running.
    StartPolling(env, fd);
    int r = SetEvents(UV_READABLE);
    if (r < 0) {
      StopPolling();
      ThrowErrno(env, "uv_poll_start", -r);
    }
    SetRef(false);
    fd_ = fd;
  }

  ~Doorbell() override { StopPolling(); }

 private:
  // Environment teardown: the fd is the caller's, and there is nothing else to release.
  void OnTeardown() override {}

  void OnReady(int status, int events) override {
    if (status >= 0) {
      uint64_t count;
      ssize_t n;
      do n = read(fd_, &count, sizeof count);
      while (n < 0 && errno == EINTR);
      // EAGAIN: another reader drained it first (a spurious wake-up: the JS side re-checks).
      if (n < 0 && errno != EAGAIN) status = -errno;
    }
    if (status < 0) SetEvents(0);  // level-triggered: do not spin on an error
    Napi::Env env = Env();
    Napi::HandleScope scope(env);
    // make_callback: microtasks (the resolved wait's continuations) run right after.
    CallBack(env, callback_, Value(), *ctx_, {Napi::Number::New(env, status)});
  }

  Napi::Value Close(const Napi::CallbackInfo& info) {
    StopPolling();
    callback_.Reset();
    ctx_.reset();
    return info.Env().Undefined();
  }
  Napi::Value Closed(const Napi::CallbackInfo& info) { return Napi::Boolean::New(info.Env(), box_ == nullptr); }

  int fd_ = -1;
  Napi::FunctionReference callback_;
  std::unique_ptr<Napi::AsyncContext> ctx_;
};

}  // namespace

void InitChannel(Napi::Env env, Napi::Object exports) {
  exports.Set("SharedWords", SharedWords::Define(env));
  exports.Set("Doorbell", Doorbell::Define(env));
  exports.Set("eventfdCreate", Napi::Function::New(env, EventfdCreate, "eventfdCreate"));
  exports.Set("eventfdRing", Napi::Function::New(env, EventfdRing, "eventfdRing"));
  exports.Set("eventfdDrain", Napi::Function::New(env, EventfdDrain, "eventfdDrain"));
  exports.Set("isEventfd", Napi::Function::New(env, IsEventfd, "isEventfd"));
}

}  // namespace cuda_ipc
