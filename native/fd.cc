// File descriptors and memfd files: near 1:1 system calls (memfd_create, ftruncate, fstat,
// pread/pwrite, seals, dup, close, fd flags), and OwnedFd, which owns an fd for JS.
//
// Thin on purpose: every function is close to one system call, checked, and throws a Node-style
// system error (code/errno/syscall) on failure.
#include "common.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace cuda_ipc {
namespace {

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

void InitFds(Napi::Env env, Napi::Object exports) {
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
  exports.Set("OwnedFd", OwnedFd::Define(env));

  // The other constants of this object come from socket.cc and shared_memory.cc.
  Napi::Object c = ConstantsObject(env, exports, "posixConstants");
  c.Set("F_SEAL_SEAL", Napi::Number::New(env, F_SEAL_SEAL));
  c.Set("F_SEAL_SHRINK", Napi::Number::New(env, F_SEAL_SHRINK));
  c.Set("F_SEAL_GROW", Napi::Number::New(env, F_SEAL_GROW));
  c.Set("F_SEAL_WRITE", Napi::Number::New(env, F_SEAL_WRITE));
}

}  // namespace cuda_ipc
