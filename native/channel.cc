// Channel primitives: atomics and futexes on words of a shared-memory file, and a waiter thread.
//
// Thin on purpose: the ring protocol lives in TypeScript (src/channel/). This file gives it
//  - SharedWords(fd, length): its own mmap(MAP_SHARED) of a memfd (kept alive by shared
//    ownership, so neither a JS close() nor a HostBuffer close can unmap it under a pending wait),
//    with sequentially consistent 32/64-bit atomics at byte offsets that are checked for
//    alignment and bounds on every call (a bad offset throws, never faults);
//  - futex wake on a word (shared futex: the word lives in memory shared between processes);
//  - a bounded spin on the calling thread (spin mode, opt-in);
//  - FutexWaiter: a dedicated native thread that FUTEX_WAITs on one word at a time (with an
//    optional spin first and a timeout) and reports through a thread-safe function. The event loop
//    is never blocked, and no libuv pool thread is parked.
//
// 64-bit values cross as JS numbers: they are positions and counters that stay below 2^53. A
// stored value above 2^53 (only a corrupt or hostile peer writes one) reads as -1.
//
// Per-object state only: no globals, no napi instance data, so worker threads each get their own.
#include "common.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>

namespace cuda_ipc {
namespace {

constexpr double kMaxSafe = 9007199254740992.0;  // 2^53
constexpr int64_t kMaxSpinMicros = 100000;        // a spin never exceeds 100 ms
constexpr int64_t kMaxTimeoutMs = 3600 * 1000;
constexpr int64_t kSliceNs = 100 * 1000000LL;    // a waiter re-checks cancellation this often

// Tags SharedWords objects so that FutexWaiter.wait can check what it was given.
constexpr napi_type_tag kSharedWordsTag = {0x6375646169706331ULL, 0x7368617265647731ULL};

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

inline long FutexWake(uint32_t* addr, int count) {
  return syscall(SYS_futex, addr, FUTEX_WAKE, count, nullptr, nullptr, 0);
}

// FUTEX_WAIT (shared): 0 woken (or spurious), EAGAIN the word already differed, ETIMEDOUT, EINTR.
inline int FutexWait(uint32_t* addr, uint32_t expected, int64_t timeout_ns) {
  timespec ts{static_cast<time_t>(timeout_ns / 1000000000LL), static_cast<long>(timeout_ns % 1000000000LL)};
  long r = syscall(SYS_futex, addr, FUTEX_WAIT, expected, &ts, nullptr, 0);
  return r == 0 ? 0 : errno;
}

// Spins while *addr == expected, up to `ns`. True when the word changed.
bool SpinWhileEqual(const uint32_t* addr, uint32_t expected, int64_t ns, const std::atomic<bool>* cancel = nullptr) {
  if (__atomic_load_n(addr, __ATOMIC_SEQ_CST) != expected) return true;
  if (ns <= 0) return false;
  int64_t deadline = NowNs() + ns;
  for (uint32_t i = 1;; i++) {
    CpuRelax();
    if (__atomic_load_n(addr, __ATOMIC_SEQ_CST) != expected) return true;
    if ((i & 63) == 0) {
      if (NowNs() >= deadline) return false;
      if (cancel && cancel->load(std::memory_order_relaxed)) return false;
    }
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
                        InstanceMethod<&SharedWords::Wake>("wake"),
                        InstanceMethod<&SharedWords::SpinWait32>("spinWait32"),
                        InstanceMethod<&SharedWords::SpinCas32>("spinCas32"),
                        InstanceMethod<&SharedWords::Close>("close"),
                        InstanceAccessor<&SharedWords::ByteLength>("byteLength"),
                        InstanceAccessor<&SharedWords::Address>("address")});
  }

  explicit SharedWords(const Napi::CallbackInfo& info) : Napi::ObjectWrap<SharedWords>(info) {
    Napi::Env env = info.Env();
    int fd = ArgI32(info, 0, "fd");
    if (fd < 0) ThrowType(env, "fd must be a non-negative integer");
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
    map_ = std::make_shared<Mapping>(static_cast<uint8_t*>(p), length);
    napi_type_tag_object(env, info.This(), &kSharedWordsTag);
  }

  // The mapping, for a waiter (shared: it stays mapped while the waiter uses it).
  std::shared_ptr<Mapping> mapping() const { return map_; }

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

  // wake(offset, count) -> waiters woken (FUTEX_WAKE on a shared word; count 0 = all)
  Napi::Value Wake(const Napi::CallbackInfo& info) {
    uint32_t* w = Word<uint32_t>(info, 0);
    int32_t count = ArgI32(info, 1, "count");
    long r = FutexWake(w, count <= 0 ? INT_MAX : count);
    if (r < 0) ThrowErrno(info.Env(), "futex(FUTEX_WAKE)", errno);
    return Napi::Number::New(info.Env(), static_cast<double>(r));
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
    map_.reset();  // unmapped now unless a waiter still holds it (then when the waiter is done)
    return info.Env().Undefined();
  }

  Napi::Value ByteLength(const Napi::CallbackInfo& info) {
    return Napi::Number::New(info.Env(), map_ ? static_cast<double>(map_->length) : 0);
  }
  Napi::Value Address(const Napi::CallbackInfo& info) {
    return U64(info.Env(), map_ ? reinterpret_cast<uint64_t>(map_->addr) : 0);
  }

  std::shared_ptr<Mapping> map_;
};

// ---------------------------------------------------------------------------------------------
// FutexWaiter(callback): one native thread that waits on one word at a time.
//
//   wait(words, offset, expected, timeoutMs, spinMicros): the thread spins for up to spinMicros
//     while the word equals `expected`, then FUTEX_WAITs for up to timeoutMs, then calls
//     callback(status): 0 the word changed or a wake came (spurious wakes included: re-check),
//     1 timed out, 2 cancelled, or -errno. One wait at a time.
//   cancel(): ends the pending wait (callback(2)).
//   close(): cancels, joins the thread. Idempotent; also run on environment teardown and by
//     the finalizer.
//
// The state shared with the thread lives in a Core that the thread-safe function's finalizer
// frees, so a callback still queued when the object goes away never touches freed memory.
struct WaiterCore {
  std::mutex mu;
  std::condition_variable cv;
  std::thread thread;
  bool started = false;
  bool stop = false;       // guarded by mu
  bool has_request = false;
  std::atomic<bool> cancel{false};  // also read by the spinning thread without the lock
  std::shared_ptr<Mapping> map;
  uint32_t* addr = nullptr;
  uint32_t expected = 0;
  int64_t timeout_ns = 0;
  int64_t spin_ns = 0;
  uint32_t* waiting_on = nullptr;  // guarded by mu: the word the thread sleeps on, for cancel()

  // Main thread only.
  napi_env env = nullptr;
  napi_threadsafe_function tsfn = nullptr;
  bool shut = false;
  bool pending = false;
  bool hook_added = false;
  class FutexWaiter* owner = nullptr;
};

void WaiterLoop(WaiterCore* c) {
  for (;;) {
    std::shared_ptr<Mapping> map;
    uint32_t* addr;
    uint32_t expected;
    int64_t timeout_ns, spin_ns;
    {
      std::unique_lock<std::mutex> lock(c->mu);
      c->cv.wait(lock, [c] { return c->stop || c->has_request; });
      if (c->stop) return;
      map = c->map;
      addr = c->addr;
      expected = c->expected;
      timeout_ns = c->timeout_ns;
      spin_ns = c->spin_ns;
    }
    int status = 0;
    if (!SpinWhileEqual(addr, expected, spin_ns, &c->cancel)) {
      {
        std::lock_guard<std::mutex> lock(c->mu);
        if (c->cancel || c->stop) status = 2;
        else c->waiting_on = addr;
      }
      if (status == 0) {
        int64_t deadline = NowNs() + timeout_ns;
        for (;;) {
          int64_t left = deadline - NowNs();
          if (left <= 0) {
            status = 1;
            break;
          }
          // In slices, so that a cancel() whose wake slipped in just before FUTEX_WAIT is still
          // seen within kSliceNs.
          int r = FutexWait(addr, expected, left < kSliceNs ? left : kSliceNs);
          if (c->cancel.load()) break;
          if (r == EINTR || (r == ETIMEDOUT && left > kSliceNs)) continue;
          if (r == ETIMEDOUT) status = 1;
          else if (r == 0 || r == EAGAIN) status = 0;
          else status = -r;
          break;
        }
        std::lock_guard<std::mutex> lock(c->mu);
        c->waiting_on = nullptr;
      }
    }
    {
      std::lock_guard<std::mutex> lock(c->mu);
      if (c->cancel) status = 2;
      c->cancel = false;
      c->has_request = false;
      c->map.reset();
      if (c->stop) return;
    }
    map.reset();
    // Nonblocking: the queue is unbounded. Fails only once the function is being torn down.
    napi_call_threadsafe_function(c->tsfn, reinterpret_cast<void*>(static_cast<intptr_t>(status)), napi_tsfn_nonblocking);
  }
}

void WaiterCallJs(napi_env env, napi_value callback, void* context, void* data) {
  auto* c = static_cast<WaiterCore*>(context);
  if (env == nullptr || c == nullptr || c->shut) return;
  c->pending = false;
  napi_unref_threadsafe_function(env, c->tsfn);
  int status = static_cast<int>(reinterpret_cast<intptr_t>(data));
  napi_value arg, global, result;
  napi_create_int32(env, status, &arg);
  napi_get_global(env, &global);
  // An exception thrown by the callback becomes an uncaught exception (N-API does that here).
  napi_call_function(env, global, callback, 1, &arg, &result);
}

void WaiterFinalize(napi_env env, void* data, void* hint) {
  auto* c = static_cast<WaiterCore*>(data);
  // The thread was joined before the function was released (Shutdown), so this is the last user.
  if (c->thread.joinable()) c->thread.detach();  // never reached; a safety net against terminate()
  delete c;
}

void ShutdownCore(WaiterCore* c, bool from_env_cleanup);

void WaiterEnvCleanup(void* arg) { ShutdownCore(static_cast<WaiterCore*>(arg), true); }

void ShutdownCore(WaiterCore* c, bool from_env_cleanup) {
  if (c->shut) return;
  c->shut = true;
  {
    std::lock_guard<std::mutex> lock(c->mu);
    c->stop = true;
    c->cancel = true;
    if (c->waiting_on) FutexWake(c->waiting_on, INT_MAX);  // the mapping is alive: the thread holds it
  }
  c->cv.notify_all();
  if (c->thread.joinable()) c->thread.join();
  c->map.reset();
  if (c->hook_added && !from_env_cleanup) napi_remove_env_cleanup_hook(c->env, WaiterEnvCleanup, c);
  c->hook_added = false;
  napi_threadsafe_function tsfn = c->tsfn;
  c->tsfn = nullptr;
  // Frees c (WaiterFinalize) once no call is queued any more.
  if (tsfn) napi_release_threadsafe_function(tsfn, napi_tsfn_abort);
}

class FutexWaiter : public Napi::ObjectWrap<FutexWaiter> {
 public:
  static Napi::Function Define(Napi::Env env) {
    return DefineClass(env, "FutexWaiter",
                       {InstanceMethod<&FutexWaiter::Wait>("wait"),
                        InstanceMethod<&FutexWaiter::Cancel>("cancel"),
                        InstanceMethod<&FutexWaiter::Close>("close"),
                        InstanceAccessor<&FutexWaiter::Pending>("pending")});
  }

  explicit FutexWaiter(const Napi::CallbackInfo& info) : Napi::ObjectWrap<FutexWaiter>(info) {
    Napi::Env env = info.Env();
    if (info.Length() < 1 || !info[0].IsFunction()) ThrowType(env, "callback must be a function");
    auto* c = new WaiterCore();
    c->env = env;
    napi_value name = Napi::String::New(env, "cuda-ipc channel waiter");
    if (napi_create_threadsafe_function(env, info[0], nullptr, name, 0, 1, c, WaiterFinalize, c, WaiterCallJs, &c->tsfn) != napi_ok) {
      delete c;
      throw Napi::Error::New(env, "napi_create_threadsafe_function failed");
    }
    napi_unref_threadsafe_function(env, c->tsfn);  // only a pending wait keeps the loop alive
    // Registered after the function, so that it runs first at teardown (hooks run last-in first-out).
    napi_add_env_cleanup_hook(env, WaiterEnvCleanup, c);
    c->hook_added = true;
    c->owner = this;
    core_ = c;
  }

  ~FutexWaiter() override {
    if (core_) {
      core_->owner = nullptr;
      ShutdownCore(core_, false);
      core_ = nullptr;
    }
  }

 private:
  WaiterCore* Open(Napi::Env env) {
    if (!core_ || core_->shut) ThrowErrno(env, "FutexWaiter", EBADF);
    return core_;
  }

  Napi::Value Wait(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    WaiterCore* c = Open(env);
    if (info.Length() < 1 || !info[0].IsObject()) ThrowType(env, "words must be a SharedWords");
    bool is_words = false;
    if (napi_check_object_type_tag(env, info[0], &kSharedWordsTag, &is_words) != napi_ok || !is_words)
      ThrowType(env, "words must be a SharedWords");
    SharedWords* words = Napi::ObjectWrap<SharedWords>::Unwrap(info[0].As<Napi::Object>());
    uint32_t* addr = words->Word<uint32_t>(info, 1);  // the offset is argument 1
    uint32_t expected = ArgU32(info, 2, "expected");
    double timeout_ms = ArgDouble(info, 3, "timeoutMs");
    double spin_us = info.Length() > 4 ? ArgDouble(info, 4, "spinMicros") : 0;
    if (!(timeout_ms >= 0)) throw Napi::RangeError::New(env, "timeoutMs must be >= 0");
    if (timeout_ms > kMaxTimeoutMs) timeout_ms = kMaxTimeoutMs;
    if (!(spin_us >= 0)) spin_us = 0;
    if (spin_us > kMaxSpinMicros) spin_us = kMaxSpinMicros;
    if (c->pending) throw Napi::Error::New(env, "FutexWaiter: a wait is already pending");
    {
      std::lock_guard<std::mutex> lock(c->mu);
      c->map = words->mapping();
      c->addr = addr;
      c->expected = expected;
      c->timeout_ns = static_cast<int64_t>(timeout_ms * 1e6);
      c->spin_ns = static_cast<int64_t>(spin_us * 1e3);
      c->cancel = false;
      c->has_request = true;
    }
    if (!c->started) {
      try {
        c->thread = std::thread(WaiterLoop, c);
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(c->mu);
        c->has_request = false;
        c->map.reset();
        throw Napi::Error::New(env, std::string("could not start the waiter thread: ") + e.what());
      }
      c->started = true;
    }
    c->cv.notify_one();
    c->pending = true;
    napi_ref_threadsafe_function(env, c->tsfn);
    return env.Undefined();
  }

  Napi::Value Cancel(const Napi::CallbackInfo& info) {
    if (core_ && !core_->shut && core_->pending) {
      std::lock_guard<std::mutex> lock(core_->mu);
      core_->cancel = true;
      if (core_->waiting_on) FutexWake(core_->waiting_on, INT_MAX);
    }
    return info.Env().Undefined();
  }

  Napi::Value Close(const Napi::CallbackInfo& info) {
    if (core_) {
      core_->owner = nullptr;
      ShutdownCore(core_, false);
      core_ = nullptr;
    }
    return info.Env().Undefined();
  }

  Napi::Value Pending(const Napi::CallbackInfo& info) {
    return Napi::Boolean::New(info.Env(), core_ && !core_->shut && core_->pending);
  }

  WaiterCore* core_ = nullptr;
};

}  // namespace

void InitChannel(Napi::Env env, Napi::Object exports) {
  exports.Set("SharedWords", SharedWords::Define(env));
  exports.Set("FutexWaiter", FutexWaiter::Define(env));
}

}  // namespace cuda_ipc
