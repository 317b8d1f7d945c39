// Unix SOCK_SEQPACKET sockets with fd passing: the calls that make, bind and connect them (near
// 1:1 system calls, each checked, throwing a Node-style system error), and the two classes whose
// fds are watched by uv_poll (polled.h), which must be stopped before the fd is closed: Socket (a
// connection) and Acceptor (a listener). Framing, handshakes and message types live in TypeScript
// (src/link/).
#include "common.h"
#include "polled.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
#include <uv.h>

#include <cstddef>
#include <memory>

namespace cuda_ipc {
namespace {

// Upper bound on fds in one message; the link protocol enforces the same number.
constexpr int kMaxFds = 64;
// Messages drained per readiness callback before yielding back to the loop.
constexpr int kDrainBudget = 64;

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
                        InstanceMethod<&Socket::SendPair>("sendPair"),
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

  // One record of send() / sendPair(): head[0, headLength) and body (info[2], null or absent for
  // none) with the fds of info[3] (SCM_RIGHTS). `iov` and `control` must outlive `msg`.
  struct Record {
    iovec iov[2];
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFds)];
  };
  static void FillRecord(const Napi::CallbackInfo& info, Record* rec, msghdr* msg) {
    Napi::Env env = info.Env();
    Bytes head = ArgBytes(info, 0, "head");
    size_t head_len = ArgSize(info, 1, "headLength");
    if (head_len > head.length) ThrowType(env, "headLength exceeds head");
    rec->iov[0] = {head.data, head_len};
    int niov = 1;
    if (info.Length() > 2 && !info[2].IsNull() && !info[2].IsUndefined()) {
      Bytes body = ArgBytes(info, 2, "body");
      rec->iov[1] = {body.data, body.length};
      niov = 2;
    }
    int fds[kMaxFds];
    int nfds = info.Length() > 3 ? ArgFdList(env, info[3], fds) : 0;
    *msg = msghdr{};
    msg->msg_iov = rec->iov;
    msg->msg_iovlen = niov;
    if (nfds > 0) {
      msg->msg_control = rec->control;
      msg->msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
      cmsghdr* c = CMSG_FIRSTHDR(msg);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
      std::memcpy(CMSG_DATA(c), fds, sizeof(int) * nfds);
    }
  }

  // send(head, headLength, body | null, fds | null) -> true when sent, false when the socket is
  // full (EAGAIN: nothing was sent; wait for 'writable'). A SEQPACKET record is all or nothing.
  Napi::Value Send(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    if (fd_ < 0) ThrowErrno(env, "sendmsg", EBADF);
    Record rec;
    msghdr msg;
    FillRecord(info, &rec, &msg);
    ssize_t r;
    do r = sendmsg(fd_, &msg, MSG_DONTWAIT | MSG_NOSIGNAL); while (r < 0 && errno == EINTR);
    if (r < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) return Napi::Boolean::New(env, false);
      ThrowErrno(env, "sendmsg", errno);
    }
    return Napi::Boolean::New(env, true);
  }

  // sendPair(head, headLength, body | null, fds | null, second) -> the records sent, in one
  // sendmmsg: 2; 1 (the first only: the socket filled, send `second` yourself); 0 (full: nothing
  // was sent). `second` is a record of its own without fds (a frame and the RELEASE behind it).
  // An error on the first throws; one on the second reads as 1 (the kernel reports it no more).
  Napi::Value SendPair(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    if (fd_ < 0) ThrowErrno(env, "sendmmsg", EBADF);
    Record rec;
    mmsghdr msgs[2]{};
    FillRecord(info, &rec, &msgs[0].msg_hdr);
    Bytes second = ArgBytes(info, 4, "second");
    iovec second_iov = {second.data, second.length};
    msgs[1].msg_hdr.msg_iov = &second_iov;
    msgs[1].msg_hdr.msg_iovlen = 1;
    int r;
    do r = sendmmsg(fd_, msgs, 2, MSG_DONTWAIT | MSG_NOSIGNAL); while (r < 0 && errno == EINTR);
    if (r < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) return Napi::Number::New(env, 0);
      ThrowErrno(env, "sendmmsg", errno);
    }
    return Napi::Number::New(env, r);
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

}  // namespace

void InitSockets(Napi::Env env, Napi::Object exports) {
  exports.Set("socketpair", Napi::Function::New(env, Socketpair, "socketpair"));
  exports.Set("socket", Napi::Function::New(env, SocketCreate, "socket"));
  exports.Set("bind", Napi::Function::New(env, Bind, "bind"));
  exports.Set("listen", Napi::Function::New(env, Listen, "listen"));
  exports.Set("connect", Napi::Function::New(env, Connect, "connect"));
  exports.Set("peerCred", Napi::Function::New(env, PeerCred, "peerCred"));
  exports.Set("setPassCred", Napi::Function::New(env, SetPassCred, "setPassCred"));
  exports.Set("socketType", Napi::Function::New(env, SocketType, "socketType"));
  exports.Set("Socket", Socket::Define(env));
  exports.Set("Acceptor", Acceptor::Define(env));

  Napi::Object c = ConstantsObject(env, exports, "posixConstants");
  c.Set("SOCK_SEQPACKET", Napi::Number::New(env, SOCK_SEQPACKET));
  c.Set("MAX_FDS", Napi::Number::New(env, kMaxFds));
}

}  // namespace cuda_ipc
