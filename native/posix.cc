// POSIX primitives: memfd + mmap, Unix sockets with fd passing, uv_poll readiness.
//
// Thin on purpose: every function is close to one system call, checked, and throws a Node-style
// system error (code/errno/syscall) on failure. Framing, handshakes and message types live in
// TypeScript (src/link/). The three classes exist because their resources need native lifetime
// handling: SharedMemory (a mapping that JS views point into), Socket and Acceptor (fds watched
// by uv_poll that must be stopped before the fd is closed).
#include "common.h"
#include "polled.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include <uv.h>

#include <memory>
#include <unordered_set>
#include <vector>

namespace cuda_ipc {
namespace {

// Upper bound on fds in one message; the link protocol enforces the same number.
constexpr int kMaxFds = 64;
// Messages drained per readiness callback before yielding back to the loop.
constexpr int kDrainBudget = 64;

bool ArgBool(const Napi::CallbackInfo& info, size_t i, const char* what) {
  if (info.Length() <= i || !info[i].IsBoolean()) ThrowType(info.Env(), std::string(what) + " must be a boolean");
  return info[i].As<Napi::Boolean>().Value();
}

std::string ArgString(const Napi::CallbackInfo& info, size_t i, const char* what) {
  if (info.Length() <= i || !info[i].IsString()) ThrowType(info.Env(), std::string(what) + " must be a string");
  return info[i].As<Napi::String>().Utf8Value();
}

sockaddr_un UnixAddress(Napi::Env env, const std::string& path, socklen_t* len) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(addr.sun_path) || path.find('\0') != std::string::npos)
    ThrowErrno(env, "sockaddr_un", ENAMETOOLONG);
  std::memcpy(addr.sun_path, path.data(), path.size());
  *len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + path.size() + 1);
  return addr;
}

// Reads an array of fds (numbers) for SCM_RIGHTS; fills `out`, returns the count.
int ArgFdList(Napi::Env env, Napi::Value v, int* out) {
  if (v.IsUndefined() || v.IsNull()) return 0;
  if (!v.IsArray()) ThrowType(env, "fds must be an array of fds");
  auto arr = v.As<Napi::Array>();
  uint32_t n = arr.Length();
  if (n > static_cast<uint32_t>(kMaxFds)) ThrowErrno(env, "sendmsg", ETOOMANYREFS);
  for (uint32_t i = 0; i < n; i++) {
    Napi::Value e = arr.Get(i);
    if (!e.IsNumber()) ThrowType(env, "fds must be an array of fds");
    int fd = e.As<Napi::Number>().Int32Value();
    if (fd < 0) ThrowType(env, "fds must be non-negative");
    out[i] = fd;
  }
  return static_cast<int>(n);
}

// ---------------------------------------------------------------------------------------------
// Free functions: near 1:1 system calls.

// memfdCreate(name, size?, seals?): memfd_create, then (when given) ftruncate to size and
// F_ADD_SEALS, the three calls a new shared buffer always makes; the fd is closed if one fails.
Napi::Value MemfdCreate(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  std::string name = ArgString(info, 0, "name");
  bool sized = info.Length() > 1 && !info[1].IsUndefined();
  size_t size = sized ? ArgSize(info, 1, "size") : 0;
  int seals = info.Length() > 2 && !info[2].IsUndefined() ? ArgI32(info, 2, "seals") : 0;
  int fd = memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) ThrowErrno(env, "memfd_create", errno);
  if (sized) {
    int r;
    do r = ftruncate(fd, static_cast<off_t>(size)); while (r < 0 && errno == EINTR);
    if (r < 0) {
      int err = errno;
      close(fd);
      ThrowErrno(env, "ftruncate", err);
    }
  }
  if (seals != 0 && fcntl(fd, F_ADD_SEALS, seals) < 0) {
    int err = errno;
    close(fd);
    ThrowErrno(env, "fcntl(F_ADD_SEALS)", err);
  }
  return Napi::Number::New(env, fd);
}

Napi::Value Ftruncate(const Napi::CallbackInfo& info) {
  int fd = CheckFd(info.Env(), info, 0);
  size_t size = ArgSize(info, 1, "size");
  int r;
  do r = ftruncate(fd, static_cast<off_t>(size)); while (r < 0 && errno == EINTR);
  if (r < 0) ThrowErrno(info.Env(), "ftruncate", errno);
  return info.Env().Undefined();
}

Napi::Value FstatSize(const Napi::CallbackInfo& info) {
  int fd = CheckFd(info.Env(), info, 0);
  struct stat st;
  if (fstat(fd, &st) < 0) ThrowErrno(info.Env(), "fstat", errno);
  return Napi::Number::New(info.Env(), static_cast<double>(st.st_size));
}

// pread(fd, target, offset) -> bytes read (0 at the end of the file): one pread(2) into a
// typed array. Reading a file never faults, whatever its owner does to it meanwhile.
Napi::Value Pread(const Napi::CallbackInfo& info) {
  int fd = CheckFd(info.Env(), info, 0);
  Bytes dst = ArgBytes(info, 1, "target");
  size_t offset = ArgSize(info, 2, "offset");
  ssize_t r;
  do r = pread(fd, dst.data, dst.length, static_cast<off_t>(offset)); while (r < 0 && errno == EINTR);
  if (r < 0) ThrowErrno(info.Env(), "pread", errno);
  return Napi::Number::New(info.Env(), static_cast<double>(r));
}

// pwrite(fd, source, offset) -> bytes written: one pwrite(2) from a typed array.
Napi::Value Pwrite(const Napi::CallbackInfo& info) {
  int fd = CheckFd(info.Env(), info, 0);
  Bytes src = ArgBytes(info, 1, "source");
  size_t offset = ArgSize(info, 2, "offset");
  ssize_t r;
  do r = pwrite(fd, src.data, src.length, static_cast<off_t>(offset)); while (r < 0 && errno == EINTR);
  if (r < 0) ThrowErrno(info.Env(), "pwrite", errno);
  return Napi::Number::New(info.Env(), static_cast<double>(r));
}

// fileKind(fd) -> 'file' | 'directory' | 'fifo' | 'socket' | 'character' | 'block' | 'link' |
// 'unknown': what fstat says the fd is, for receivers that must refuse what they cannot map.
Napi::Value FileKind(const Napi::CallbackInfo& info) {
  int fd = CheckFd(info.Env(), info, 0);
  struct stat st;
  if (fstat(fd, &st) < 0) ThrowErrno(info.Env(), "fstat", errno);
  const char* kind = S_ISREG(st.st_mode) ? "file" : S_ISDIR(st.st_mode) ? "directory" : S_ISFIFO(st.st_mode) ? "fifo"
                     : S_ISSOCK(st.st_mode) ? "socket" : S_ISCHR(st.st_mode) ? "character" : S_ISBLK(st.st_mode) ? "block"
                     : S_ISLNK(st.st_mode) ? "link" : "unknown";
  return Napi::String::New(info.Env(), kind);
}

Napi::Value GetSeals(const Napi::CallbackInfo& info) {
  int fd = CheckFd(info.Env(), info, 0);
  int r = fcntl(fd, F_GET_SEALS);
  if (r < 0) ThrowErrno(info.Env(), "fcntl(F_GET_SEALS)", errno);
  return Napi::Number::New(info.Env(), r);
}

Napi::Value AddSeals(const Napi::CallbackInfo& info) {
  int fd = CheckFd(info.Env(), info, 0);
  int seals = ArgI32(info, 1, "seals");
  if (fcntl(fd, F_ADD_SEALS, seals) < 0) ThrowErrno(info.Env(), "fcntl(F_ADD_SEALS)", errno);
  return info.Env().Undefined();
}

Napi::Value Dup(const Napi::CallbackInfo& info) {
  int fd = CheckFd(info.Env(), info, 0);
  int r = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (r < 0) ThrowErrno(info.Env(), "fcntl(F_DUPFD_CLOEXEC)", errno);
  return Napi::Number::New(info.Env(), r);
}

Napi::Value Close(const Napi::CallbackInfo& info) {
  int fd = CheckFd(info.Env(), info, 0);
  // Linux releases the fd even when close reports EINTR; retrying could close a reused number.
  if (close(fd) < 0 && errno != EINTR) ThrowErrno(info.Env(), "close", errno);
  return info.Env().Undefined();
}

Napi::Value SetCloexec(const Napi::CallbackInfo& info) {
  int fd = CheckFd(info.Env(), info, 0);
  bool on = ArgBool(info, 1, "on");
  int flags = fcntl(fd, F_GETFD);
  if (flags < 0) ThrowErrno(info.Env(), "fcntl(F_GETFD)", errno);
  flags = on ? (flags | FD_CLOEXEC) : (flags & ~FD_CLOEXEC);
  if (fcntl(fd, F_SETFD, flags) < 0) ThrowErrno(info.Env(), "fcntl(F_SETFD)", errno);
  return info.Env().Undefined();
}

Napi::Value SetNonblocking(const Napi::CallbackInfo& info) {
  int fd = CheckFd(info.Env(), info, 0);
  bool on = ArgBool(info, 1, "on");
  int flags = fcntl(fd, F_GETFL);
  if (flags < 0) ThrowErrno(info.Env(), "fcntl(F_GETFL)", errno);
  flags = on ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK);
  if (fcntl(fd, F_SETFL, flags) < 0) ThrowErrno(info.Env(), "fcntl(F_SETFL)", errno);
  return info.Env().Undefined();
}

Napi::Value Socketpair(const Napi::CallbackInfo& info) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sv) < 0)
    ThrowErrno(info.Env(), "socketpair", errno);
  auto arr = Napi::Array::New(info.Env(), 2);
  arr.Set(0u, Napi::Number::New(info.Env(), sv[0]));
  arr.Set(1u, Napi::Number::New(info.Env(), sv[1]));
  return arr;
}

Napi::Value SocketCreate(const Napi::CallbackInfo& info) {
  int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) ThrowErrno(info.Env(), "socket", errno);
  return Napi::Number::New(info.Env(), fd);
}

Napi::Value Bind(const Napi::CallbackInfo& info) {
  int fd = CheckFd(info.Env(), info, 0);
  socklen_t len;
  sockaddr_un addr = UnixAddress(info.Env(), ArgString(info, 1, "path"), &len);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), len) < 0) ThrowErrno(info.Env(), "bind", errno);
  return info.Env().Undefined();
}

Napi::Value Listen(const Napi::CallbackInfo& info) {
  int fd = CheckFd(info.Env(), info, 0);
  int backlog = ArgI32(info, 1, "backlog");
  if (listen(fd, backlog) < 0) ThrowErrno(info.Env(), "listen", errno);
  return info.Env().Undefined();
}

// Non-blocking connect. A Unix socket connects at once or fails at once (EAGAIN when the
// listener's backlog is full), so there is nothing to wait for here; JS retries EAGAIN.
Napi::Value Connect(const Napi::CallbackInfo& info) {
  int fd = CheckFd(info.Env(), info, 0);
  socklen_t len;
  sockaddr_un addr = UnixAddress(info.Env(), ArgString(info, 1, "path"), &len);
  int r;
  do r = connect(fd, reinterpret_cast<sockaddr*>(&addr), len); while (r < 0 && errno == EINTR);
  if (r < 0) ThrowErrno(info.Env(), "connect", errno);
  return info.Env().Undefined();
}

Napi::Value PeerCred(const Napi::CallbackInfo& info) {
  int fd = CheckFd(info.Env(), info, 0);
  struct ucred cred{};
  socklen_t len = sizeof(cred);
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0) ThrowErrno(info.Env(), "getsockopt(SO_PEERCRED)", errno);
  auto o = Napi::Object::New(info.Env());
  o.Set("pid", Napi::Number::New(info.Env(), cred.pid));
  o.Set("uid", Napi::Number::New(info.Env(), cred.uid));
  o.Set("gid", Napi::Number::New(info.Env(), cred.gid));
  return o;
}

Napi::Value SetPassCred(const Napi::CallbackInfo& info) {
  int fd = CheckFd(info.Env(), info, 0);
  int on = ArgBool(info, 1, "on") ? 1 : 0;
  if (setsockopt(fd, SOL_SOCKET, SO_PASSCRED, &on, sizeof(on)) < 0) ThrowErrno(info.Env(), "setsockopt(SO_PASSCRED)", errno);
  return info.Env().Undefined();
}

Napi::Value SocketType(const Napi::CallbackInfo& info) {
  int fd = CheckFd(info.Env(), info, 0);
  int type = 0;
  socklen_t len = sizeof(type);
  if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) < 0) ThrowErrno(info.Env(), "getsockopt(SO_TYPE)", errno);
  return Napi::Number::New(info.Env(), type);
}

Napi::Value DetachArrayBuffer(const Napi::CallbackInfo& info) {
  if (info.Length() < 1 || !info[0].IsArrayBuffer()) ThrowType(info.Env(), "argument must be an ArrayBuffer");
  napi_status s = napi_detach_arraybuffer(info.Env(), info[0]);
  if (s != napi_ok) throw Napi::Error::New(info.Env(), "napi_detach_arraybuffer failed");
  return info.Env().Undefined();
}

// ---------------------------------------------------------------------------------------------
// SharedMemory: an mmap(MAP_SHARED) of an fd that it owns, and the external ArrayBuffers over it.
//
// Lifetime: the Region (address range) is counted: one count for the open SharedMemory and one
// per live ArrayBuffer. close() detaches every ArrayBuffer it made (JS views then read as empty)
// and unmaps at once. Without close() (GC backstop, worker teardown) the fd is closed but the
// memory stays mapped until the last ArrayBuffer over it is garbage-collected, so no JS view can
// ever point at unmapped memory.
struct Region;
struct BufferRecord {
  Region* region;
  napi_ref weak;  // to the ArrayBuffer, for detaching on close()
  // Node runs the finalizer of an external buffer it refuses (longer than
  // buffer.constants.MAX_LENGTH) before napi_create_external_arraybuffer returns, or, in some
  // versions, later from an immediate. These say which, so the record is freed exactly once.
  bool creating = false;  // inside napi_create_external_arraybuffer
  bool finalized = false;  // the finalizer ran while creating
  bool refused = false;  // creation failed: a finalizer that runs later only frees the record
};
struct Region {
  Region(uint8_t* a, size_t n) : addr(a), length(n) {}
  uint8_t* addr;
  size_t length;
  size_t counts = 1;
  bool unmapped = false;
  std::unordered_set<BufferRecord*> buffers;

  void Unmap() {
    if (!unmapped) munmap(addr, length);
    unmapped = true;
  }
  void Release() {
    if (--counts == 0) {
      Unmap();
      delete this;
    }
  }
};

class SharedMemory : public Napi::ObjectWrap<SharedMemory> {
 public:
  static Napi::Function Define(Napi::Env env) {
    return DefineClass(env, "SharedMemory",
                       {InstanceMethod<&SharedMemory::ArrayBuffer>("arrayBuffer"),
                        InstanceMethod<&SharedMemory::CopyOut>("copyOut"),
                        InstanceMethod<&SharedMemory::CopyIn>("copyIn"),
                        InstanceMethod<&SharedMemory::Close>("close"),
                        InstanceMethod<&SharedMemory::CloseFd>("closeFd"),
                        InstanceAccessor<&SharedMemory::Address>("address"),
                        InstanceAccessor<&SharedMemory::Fd>("fd"),
                        InstanceAccessor<&SharedMemory::ByteLength>("byteLength")});
  }

  // new SharedMemory(fd, length): maps `length` bytes of fd. Takes ownership of fd only on success.
  explicit SharedMemory(const Napi::CallbackInfo& info) : Napi::ObjectWrap<SharedMemory>(info) {
    Napi::Env env = info.Env();
    int fd = CheckFd(env, info, 0);
    size_t length = ArgSize(info, 1, "length");
    if (length == 0) ThrowErrno(env, "mmap", EINVAL);
    void* p = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) ThrowErrno(env, "mmap", errno);
    region_ = new Region(static_cast<uint8_t*>(p), length);
    fd_ = fd;
    env_ = env;
    napi_add_env_cleanup_hook(env, OnEnvCleanup, this);
  }

  ~SharedMemory() override { Release(/*from_cleanup=*/false); }

 private:
  // Drops the fd and this object's count on the region (the backstop path: no detaching).
  void Release(bool from_cleanup) {
    if (fd_ >= 0) {
      close(fd_);
      fd_ = -1;
    }
    if (region_) {
      Region* r = region_;
      region_ = nullptr;
      r->Release();
    }
    if (!from_cleanup && env_) napi_remove_env_cleanup_hook(env_, OnEnvCleanup, this);
    env_ = nullptr;
  }

  static void OnEnvCleanup(void* arg) { static_cast<SharedMemory*>(arg)->Release(/*from_cleanup=*/true); }

  Region* Open(Napi::Env env) {
    if (!region_) ThrowErrno(env, "SharedMemory", EBADF);
    return region_;
  }

  static void OnBufferFinalize(napi_env env, void* data, void* hint) {
    auto* rec = static_cast<BufferRecord*>(hint);
    // A refused buffer never counted on the region: only the record is left to free (by
    // ArrayBuffer() itself when this runs during the creation).
    if (rec->creating) {
      rec->finalized = true;
      return;
    }
    if (rec->refused) {
      delete rec;
      return;
    }
    rec->region->buffers.erase(rec);
    napi_delete_reference(env, rec->weak);
    Region* r = rec->region;
    delete rec;
    r->Release();
  }

  // arrayBuffer(offset, length): an external ArrayBuffer over [offset, offset + length).
  Napi::Value ArrayBuffer(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    Region* r = Open(env);
    size_t offset = ArgSize(info, 0, "offset");
    size_t length = ArgSize(info, 1, "length");
    if (offset > r->length || length > r->length - offset || length == 0)
      throw Napi::RangeError::New(env, "arrayBuffer: range outside the mapping");
    auto* rec = new BufferRecord{r, nullptr};
    napi_value ab;
    rec->creating = true;
    napi_status status = napi_create_external_arraybuffer(env, r->addr + offset, length, OnBufferFinalize, rec, &ab);
    rec->creating = false;
    if (status != napi_ok) {
      // Freed here if its finalizer already ran, else by the finalizer if it runs later (one that
      // never runs leaves this small record behind; callers check the length first, see
      // HostBuffer.bytes). Deleting it here regardless freed it twice: Node's finalizer for a
      // refused buffer (over 4 GiB on Node 20) runs inside the call.
      if (rec->finalized) delete rec;
      else rec->refused = true;
      throw Napi::Error::New(env);  // Node's own error when it set one (ERR_BUFFER_TOO_LARGE)
    }
    // From here the finalizer owns rec; count it before anything else can fail.
    r->counts++;
    r->buffers.insert(rec);
    if (napi_create_reference(env, ab, 0, &rec->weak) != napi_ok) {
      rec->weak = nullptr;
      throw Napi::Error::New(env, "napi_create_reference failed");
    }
    return Napi::Value(env, ab);
  }

  // copyOut(offset, destination) / copyIn(offset, source): copies between the mapping at
  // `offset` and a typed array, as many bytes as it holds, without an ArrayBuffer over the
  // mapping (one costs far more than a small copy, and a wake-up of the event loop when it goes).
  Napi::Value CopyOut(const Napi::CallbackInfo& info) {
    Region* r = Open(info.Env());
    size_t offset = ArgSize(info, 0, "offset");
    Bytes dst = ArgBytes(info, 1, "destination");
    if (offset > r->length || dst.length > r->length - offset) throw Napi::RangeError::New(info.Env(), "copyOut: range outside the mapping");
    std::memmove(dst.data, r->addr + offset, dst.length);  // the destination may be a view of this mapping
    return info.Env().Undefined();
  }
  Napi::Value CopyIn(const Napi::CallbackInfo& info) {
    Region* r = Open(info.Env());
    size_t offset = ArgSize(info, 0, "offset");
    Bytes src = ArgBytes(info, 1, "source");
    if (offset > r->length || src.length > r->length - offset) throw Napi::RangeError::New(info.Env(), "copyIn: range outside the mapping");
    std::memmove(r->addr + offset, src.data, src.length);
    return info.Env().Undefined();
  }

  // close(): detach every ArrayBuffer over the mapping, unmap, close the fd.
  Napi::Value Close(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    if (!region_) return env.Undefined();
    for (BufferRecord* rec : region_->buffers) {
      napi_value ab = nullptr;
      bool reachable = rec->weak && napi_get_reference_value(env, rec->weak, &ab) == napi_ok;
      if (!reachable || ab != nullptr) {
        if (!reachable || napi_detach_arraybuffer(env, ab) != napi_ok) {
          // Never unmap under a view that could not be detached: leave the memory mapped.
          Release(false);
          throw Napi::Error::New(env, "napi_detach_arraybuffer failed; the mapping is left in place");
        }
      }
    }
    region_->Unmap();
    Release(false);
    return env.Undefined();
  }

  // closeFd(): closes the fd now; the mapping stays until close() (a mapping needs no fd, and a
  // link's frame rings would otherwise hold one each for their whole life). Idempotent.
  Napi::Value CloseFd(const Napi::CallbackInfo& info) {
    if (fd_ >= 0) {
      int fd = fd_;
      fd_ = -1;
      // Linux releases the fd even when close reports EINTR.
      if (close(fd) < 0 && errno != EINTR) ThrowErrno(info.Env(), "close", errno);
    }
    return info.Env().Undefined();
  }

  Napi::Value Address(const Napi::CallbackInfo& info) {
    return U64(info.Env(), reinterpret_cast<uint64_t>(Open(info.Env())->addr));
  }
  Napi::Value Fd(const Napi::CallbackInfo& info) { return Napi::Number::New(info.Env(), fd_); }
  Napi::Value ByteLength(const Napi::CallbackInfo& info) {
    return Napi::Number::New(info.Env(), static_cast<double>(region_ ? region_->length : 0));
  }

  napi_env env_ = nullptr;
  Region* region_ = nullptr;
  int fd_ = -1;
};

// ---------------------------------------------------------------------------------------------
// Socket: a connected SOCK_SEQPACKET socket. Owns its fd.
//
// new Socket(fd, bufferSize, onMessage, onState)
//   onMessage(status, length, fds | undefined, cred | undefined): one call per received record;
//     the bytes are in `recvBuffer` [0, length) and are only valid during the call.
//     status bit 1: the record was truncated (MSG_TRUNC); bit 2: fds were dropped (MSG_CTRUNC).
//     When status != 0 every fd that arrived has already been closed and fds is undefined.
//     cred is [pid, uid, gid] when the kernel attached SCM_CREDENTIALS (see setPassCred).
//   onState('writable' | 'eof' | 'error', errno?)
class Socket : public Napi::ObjectWrap<Socket>, public PolledFd {
 public:
  static Napi::Function Define(Napi::Env env) {
    return DefineClass(env, "Socket",
                       {InstanceMethod<&Socket::Send>("send"),
                        InstanceMethod<&Socket::SetInterest>("setInterest"),
                        InstanceMethod("ref", &Socket::RefLoop),
                        InstanceMethod("unref", &Socket::UnrefLoop),
                        InstanceMethod<&Socket::Close>("close"),
                        InstanceAccessor<&Socket::Fd>("fd"),
                        InstanceAccessor<&Socket::RecvBuffer>("recvBuffer")});
  }

  explicit Socket(const Napi::CallbackInfo& info) : Napi::ObjectWrap<Socket>(info) {
    Napi::Env env = info.Env();
    int fd = CheckFd(env, info, 0);
    size_t size = ArgSize(info, 1, "bufferSize");
    if (size == 0 || size > (64u << 20)) ThrowType(env, "bufferSize out of range");
    if (info.Length() < 4 || !info[2].IsFunction() || !info[3].IsFunction()) ThrowType(env, "callbacks must be functions");
    auto buf = Napi::ArrayBuffer::New(env, size);
    StartPolling(env, fd);  // the last step that can fail: from here this object owns fd
    fd_ = fd;
    recv_ = Napi::Persistent(buf);
    recv_data_ = static_cast<uint8_t*>(buf.Data());
    recv_size_ = size;
    on_message_ = Napi::Persistent(info[2].As<Napi::Function>());
    on_state_ = Napi::Persistent(info[3].As<Napi::Function>());
    ctx_ = std::make_unique<Napi::AsyncContext>(env, "cuda-ipc:link");
    Napi::ObjectWrap<Socket>::Ref();  // an open socket stays alive while it is being polled
    SetEvents(UV_READABLE);
  }

 private:
  void CloseNow() {
    if (!CloseFd()) return;
    on_message_.Reset();
    on_state_.Reset();
    ctx_.reset();
    Napi::ObjectWrap<Socket>::Unref();
  }

  Napi::Value Close(const Napi::CallbackInfo& info) {
    CloseNow();
    return info.Env().Undefined();
  }

  void EmitState(const char* what, int err) {
    Napi::Env env = Env();
    Napi::HandleScope scope(env);
    CallBack(env, on_state_, Value(), *ctx_,
             {Napi::String::New(env, what), err ? Napi::Number::New(env, err) : env.Undefined()});
  }

  void OnReady(int status, int events) override {
    if (status < 0) {
      // libuv turns POLLERR into UV_EBADF and stops the poll. On a Unix socket POLLERR usually
      // means a pending ECONNRESET with records still queued behind it: restart the poll and let
      // recvmsg tell what really happened (it reports a truly bad fd as an error).
      if (!(events_ & UV_READABLE)) {
        // Reading is paused (JS has a backlog), so nothing would clear the error: report it.
        SetEvents(0);
        EmitState("error", -status);
        return;
      }
      SetEvents(events_);
      Drain();
      return;
    }
    if (events & UV_WRITABLE) {
      SetEvents(events_ & ~UV_WRITABLE);
      EmitState("writable", 0);
      if (fd_ < 0) return;
    }
    if (events & (UV_READABLE | UV_DISCONNECT)) Drain();
  }

  void Drain() {
    Napi::Env env = Env();
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFds) + CMSG_SPACE(sizeof(ucred))];
    for (int n = 0; n < kDrainBudget && fd_ >= 0 && (events_ & UV_READABLE); n++) {
      iovec iov{recv_data_, recv_size_};
      msghdr msg{};
      msg.msg_iov = &iov;
      msg.msg_iovlen = 1;
      msg.msg_control = control;
      msg.msg_controllen = sizeof(control);
      ssize_t r = recvmsg(fd_, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
      if (r < 0) {
        // ECONNRESET: the peer closed with records of ours unread. The kernel reports that before
        // the records the peer sent us (a GOODBYE or REFUSE among them); reading on returns them,
        // then EOF.
        if (errno == EINTR || errno == ECONNRESET) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return;
        int err = errno;
        SetEvents(0);
        EmitState("error", err);
        return;
      }
      int fds[kMaxFds + 8];
      int nfds = 0;
      bool have_cred = false;
      ucred cred{};
      for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level != SOL_SOCKET) continue;
        if (c->cmsg_type == SCM_RIGHTS) {
          size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
          for (size_t i = 0; i < count; i++) {
            int fd;
            std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
            if (nfds < static_cast<int>(sizeof(fds) / sizeof(fds[0]))) fds[nfds++] = fd;
            else close(fd);
          }
        } else if (c->cmsg_type == SCM_CREDENTIALS && c->cmsg_len >= CMSG_LEN(sizeof(ucred))) {
          std::memcpy(&cred, CMSG_DATA(c), sizeof(ucred));
          have_cred = true;
        }
      }
      int status = 0;
      if (msg.msg_flags & MSG_TRUNC) status |= 1;
      if (msg.msg_flags & MSG_CTRUNC) status |= 2;
      if (r == 0 && nfds == 0 && status == 0) {
        // SEQPACKET reports the peer's close as a zero-length read; frames are never empty.
        SetEvents(0);
        EmitState("eof", 0);
        return;
      }
      if (status != 0) {
        for (int i = 0; i < nfds; i++) close(fds[i]);
        nfds = 0;
      }
      Napi::HandleScope scope(env);
      Napi::Value fd_list = env.Undefined();
      if (nfds > 0) {
        auto arr = Napi::Array::New(env, nfds);
        for (int i = 0; i < nfds; i++) arr.Set(static_cast<uint32_t>(i), Napi::Number::New(env, fds[i]));
        fd_list = arr;
      }
      Napi::Value cred_list = env.Undefined();
      if (have_cred) {
        auto arr = Napi::Array::New(env, 3);
        arr.Set(0u, Napi::Number::New(env, cred.pid));
        arr.Set(1u, Napi::Number::New(env, cred.uid));
        arr.Set(2u, Napi::Number::New(env, cred.gid));
        cred_list = arr;
      }
      // From here the fds belong to JS, unless JS can no longer run at all. (If a worker is
      // terminated while the callback runs, fds it had not yet placed are lost to the process:
      // closing them here could close a number that a HostBuffer already owns.)
      Called c = CallBack(env, on_message_, Value(), *ctx_,
                          {Napi::Number::New(env, status), Napi::Number::New(env, static_cast<double>(r)), fd_list, cred_list});
      if (c == Called::kCannotRun) {
        for (int i = 0; i < nfds; i++) close(fds[i]);
        SetEvents(0);
      }
      if (c != Called::kOk) return;
    }
  }

  // send(head, headLength, body | null, fds | null) -> true when sent, false when the socket is
  // full (EAGAIN: nothing was sent; wait for 'writable'). A SEQPACKET record is all or nothing.
  Napi::Value Send(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    if (fd_ < 0) ThrowErrno(env, "sendmsg", EBADF);
    Bytes head = ArgBytes(info, 0, "head");
    size_t head_len = ArgSize(info, 1, "headLength");
    if (head_len > head.length) ThrowType(env, "headLength exceeds head");
    iovec iov[2];
    iov[0] = {head.data, head_len};
    int niov = 1;
    if (info.Length() > 2 && !info[2].IsNull() && !info[2].IsUndefined()) {
      Bytes body = ArgBytes(info, 2, "body");
      iov[1] = {body.data, body.length};
      niov = 2;
    }
    int fds[kMaxFds];
    int nfds = info.Length() > 3 ? ArgFdList(env, info[3], fds) : 0;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFds)];
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = niov;
    if (nfds > 0) {
      msg.msg_control = control;
      msg.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
      cmsghdr* c = CMSG_FIRSTHDR(&msg);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
      std::memcpy(CMSG_DATA(c), fds, sizeof(int) * nfds);
    }
    ssize_t r;
    do r = sendmsg(fd_, &msg, MSG_DONTWAIT | MSG_NOSIGNAL); while (r < 0 && errno == EINTR);
    if (r < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) return Napi::Boolean::New(env, false);
      ThrowErrno(env, "sendmsg", errno);
    }
    return Napi::Boolean::New(env, true);
  }

  // setInterest(readable, writable)
  Napi::Value SetInterest(const Napi::CallbackInfo& info) {
    bool readable = ArgBool(info, 0, "readable");
    bool writable = ArgBool(info, 1, "writable");
    if (fd_ >= 0) SetEvents((readable ? UV_READABLE : 0) | (writable ? UV_WRITABLE : 0));
    return info.Env().Undefined();
  }


  Napi::Value Fd(const Napi::CallbackInfo& info) { return Napi::Number::New(info.Env(), fd_); }
  Napi::Value RecvBuffer(const Napi::CallbackInfo& info) { return recv_.Value(); }

  Napi::Reference<Napi::ArrayBuffer> recv_;
  uint8_t* recv_data_ = nullptr;
  size_t recv_size_ = 0;
  Napi::FunctionReference on_message_;
  Napi::FunctionReference on_state_;
  std::unique_ptr<Napi::AsyncContext> ctx_;
};

// ---------------------------------------------------------------------------------------------
// Acceptor: a listening socket. Owns its fd. new Acceptor(fd, onAccept) where onAccept(fd) gets
// each accepted connection (non-blocking, close-on-exec) and onAccept(-errno) reports an error
// (polling pauses after an error; resume with setInterest(true)).
class Acceptor : public Napi::ObjectWrap<Acceptor>, public PolledFd {
 public:
  static Napi::Function Define(Napi::Env env) {
    return DefineClass(env, "Acceptor",
                       {InstanceMethod<&Acceptor::Close>("close"),
                        InstanceMethod<&Acceptor::SetInterest>("setInterest"),
                        InstanceMethod("ref", &Acceptor::RefLoop),
                        InstanceMethod("unref", &Acceptor::UnrefLoop),
                        InstanceAccessor<&Acceptor::Fd>("fd")});
  }

  explicit Acceptor(const Napi::CallbackInfo& info) : Napi::ObjectWrap<Acceptor>(info) {
    Napi::Env env = info.Env();
    int fd = CheckFd(env, info, 0);
    if (info.Length() < 2 || !info[1].IsFunction()) ThrowType(env, "onAccept must be a function");
    StartPolling(env, fd);
    fd_ = fd;
    on_accept_ = Napi::Persistent(info[1].As<Napi::Function>());
    ctx_ = std::make_unique<Napi::AsyncContext>(env, "cuda-ipc:listener");
    Napi::ObjectWrap<Acceptor>::Ref();
    SetEvents(UV_READABLE);
  }

 private:
  Napi::Value Close(const Napi::CallbackInfo& info) {
    if (CloseFd()) {
      on_accept_.Reset();
      ctx_.reset();
      Napi::ObjectWrap<Acceptor>::Unref();
    }
    return info.Env().Undefined();
  }

  void OnReady(int status, int events) override {
    Napi::Env env = Env();
    if (status < 0) {
      SetEvents(0);
      Napi::HandleScope scope(env);
      CallBack(env, on_accept_, Value(), *ctx_, {Napi::Number::New(env, status)});
      return;
    }
    for (int n = 0; n < kDrainBudget && fd_ >= 0 && events_; n++) {
      int c = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (c < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return;
        int err = errno;
        SetEvents(0);  // e.g. EMFILE: stop the level-triggered poll from spinning
        Napi::HandleScope scope(env);
        CallBack(env, on_accept_, Value(), *ctx_, {Napi::Number::New(env, -err)});
        return;
      }
      Napi::HandleScope scope(env);
      Called called = CallBack(env, on_accept_, Value(), *ctx_, {Napi::Number::New(env, c)});
      if (called == Called::kCannotRun) {
        close(c);
        SetEvents(0);
      }
      if (called != Called::kOk) return;
    }
  }

  Napi::Value SetInterest(const Napi::CallbackInfo& info) {
    bool readable = ArgBool(info, 0, "readable");
    if (fd_ >= 0) SetEvents(readable ? UV_READABLE : 0);
    return info.Env().Undefined();
  }
  Napi::Value Fd(const Napi::CallbackInfo& info) { return Napi::Number::New(info.Env(), fd_); }

  Napi::FunctionReference on_accept_;
  std::unique_ptr<Napi::AsyncContext> ctx_;
};

// ---------------------------------------------------------------------------------------------
// OwnedFd(fd): owns an fd that no other native object owns (a link's eventfds), so that it is
// closed by close(), by the finalizer, or at environment teardown (a worker that exits with the
// link open). Takes ownership only once constructed.
class OwnedFd : public Napi::ObjectWrap<OwnedFd> {
 public:
  static Napi::Function Define(Napi::Env env) {
    return DefineClass(env, "OwnedFd", {InstanceMethod<&OwnedFd::Close>("close"), InstanceAccessor<&OwnedFd::Fd>("fd")});
  }

  explicit OwnedFd(const Napi::CallbackInfo& info) : Napi::ObjectWrap<OwnedFd>(info) {
    Napi::Env env = info.Env();
    int fd = CheckFd(env, info, 0);
    if (napi_add_env_cleanup_hook(env, OnEnvCleanup, this) != napi_ok) throw Napi::Error::New(env, "napi_add_env_cleanup_hook failed");
    fd_ = fd;
    env_ = env;
  }

  ~OwnedFd() override { Release(/*from_cleanup=*/false); }

 private:
  void Release(bool from_cleanup) {
    if (fd_ >= 0) close(fd_);  // Linux releases the fd even when close reports EINTR
    fd_ = -1;
    if (!from_cleanup && env_) napi_remove_env_cleanup_hook(env_, OnEnvCleanup, this);
    env_ = nullptr;
  }
  static void OnEnvCleanup(void* arg) { static_cast<OwnedFd*>(arg)->Release(/*from_cleanup=*/true); }

  Napi::Value Close(const Napi::CallbackInfo& info) {
    Release(false);
    return info.Env().Undefined();
  }
  Napi::Value Fd(const Napi::CallbackInfo& info) { return Napi::Number::New(info.Env(), fd_); }

  napi_env env_ = nullptr;
  int fd_ = -1;
};

}  // namespace

void InitPosix(Napi::Env env, Napi::Object exports) {
  exports.Set("memfdCreate", Napi::Function::New(env, MemfdCreate, "memfdCreate"));
  exports.Set("ftruncate", Napi::Function::New(env, Ftruncate, "ftruncate"));
  exports.Set("fstatSize", Napi::Function::New(env, FstatSize, "fstatSize"));
  exports.Set("getSeals", Napi::Function::New(env, GetSeals, "getSeals"));
  exports.Set("pread", Napi::Function::New(env, Pread, "pread"));
  exports.Set("pwrite", Napi::Function::New(env, Pwrite, "pwrite"));
  exports.Set("fileKind", Napi::Function::New(env, FileKind, "fileKind"));
  exports.Set("addSeals", Napi::Function::New(env, AddSeals, "addSeals"));
  exports.Set("dup", Napi::Function::New(env, Dup, "dup"));
  exports.Set("close", Napi::Function::New(env, Close, "close"));
  exports.Set("setCloexec", Napi::Function::New(env, SetCloexec, "setCloexec"));
  exports.Set("setNonblocking", Napi::Function::New(env, SetNonblocking, "setNonblocking"));
  exports.Set("socketpair", Napi::Function::New(env, Socketpair, "socketpair"));
  exports.Set("socket", Napi::Function::New(env, SocketCreate, "socket"));
  exports.Set("bind", Napi::Function::New(env, Bind, "bind"));
  exports.Set("listen", Napi::Function::New(env, Listen, "listen"));
  exports.Set("connect", Napi::Function::New(env, Connect, "connect"));
  exports.Set("peerCred", Napi::Function::New(env, PeerCred, "peerCred"));
  exports.Set("setPassCred", Napi::Function::New(env, SetPassCred, "setPassCred"));
  exports.Set("socketType", Napi::Function::New(env, SocketType, "socketType"));
  exports.Set("detachArrayBuffer", Napi::Function::New(env, DetachArrayBuffer, "detachArrayBuffer"));
  exports.Set("SharedMemory", SharedMemory::Define(env));
  exports.Set("Socket", Socket::Define(env));
  exports.Set("Acceptor", Acceptor::Define(env));
  exports.Set("OwnedFd", OwnedFd::Define(env));

  auto c = Napi::Object::New(env);
  c.Set("F_SEAL_SEAL", Napi::Number::New(env, F_SEAL_SEAL));
  c.Set("F_SEAL_SHRINK", Napi::Number::New(env, F_SEAL_SHRINK));
  c.Set("F_SEAL_GROW", Napi::Number::New(env, F_SEAL_GROW));
  c.Set("F_SEAL_WRITE", Napi::Number::New(env, F_SEAL_WRITE));
  c.Set("SOCK_SEQPACKET", Napi::Number::New(env, SOCK_SEQPACKET));
  c.Set("MAX_FDS", Napi::Number::New(env, kMaxFds));
  c.Set("PAGE_SIZE", Napi::Number::New(env, static_cast<double>(sysconf(_SC_PAGESIZE))));
  exports.Set("posixConstants", c);
}

}  // namespace cuda_ipc
