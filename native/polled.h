// uv_poll readiness for native objects that watch an fd on their thread's event loop (Socket
// and Acceptor in socket.cc, Doorbell in channel.cc), and calling back into JS from there.
//
// The uv_poll_t lives in a separate box because it must outlive the JS object until libuv's
// close callback. Explicit close removes the async cleanup hook; on environment teardown the hook
// closes the handle and reports back once libuv is done with it.
#pragma once
#include "common.h"

#include <unistd.h>
#include <uv.h>

#include <initializer_list>

namespace cuda_ipc {

class Polled;
struct PollBox {
  uv_poll_t handle;
  napi_async_cleanup_hook_handle hook = nullptr;
  Polled* owner = nullptr;
};

class Polled {
 public:
  virtual ~Polled() = default;

 protected:
  void StartPolling(Napi::Env env, int fd) {
    uv_loop_t* loop = nullptr;
    if (napi_get_uv_event_loop(env, &loop) != napi_ok || loop == nullptr) throw Napi::Error::New(env, "napi_get_uv_event_loop failed");
    auto* box = new PollBox;
    int r = uv_poll_init(loop, &box->handle, fd);
    if (r < 0) {
      delete box;
      ThrowErrno(env, "uv_poll_init", -r);
    }
    box->handle.data = box;
    box->owner = this;
    if (napi_add_async_cleanup_hook(env, OnEnvCleanup, box, &box->hook) != napi_ok) {
      box->owner = nullptr;
      uv_close(reinterpret_cast<uv_handle_t*>(&box->handle), FreeBox);
      throw Napi::Error::New(env, "napi_add_async_cleanup_hook failed");
    }
    box_ = box;
  }

  // Sets the uv_poll interest; 0 stops polling. Returns uv_poll_start's result (0 or -errno).
  int SetEvents(int events) {
    if (!box_) return 0;
    events_ = events;
    if (events == 0) return uv_poll_stop(&box_->handle);
    return uv_poll_start(&box_->handle, events, OnPoll);
  }

  void SetRef(bool on) {
    if (!box_) return;
    if (on) uv_ref(reinterpret_cast<uv_handle_t*>(&box_->handle));
    else uv_unref(reinterpret_cast<uv_handle_t*>(&box_->handle));
  }

  // The JS methods ref() and unref(): whether the poll keeps the event loop alive.
  Napi::Value RefLoop(const Napi::CallbackInfo& info) {
    SetRef(true);
    return info.Env().Undefined();
  }
  Napi::Value UnrefLoop(const Napi::CallbackInfo& info) {
    SetRef(false);
    return info.Env().Undefined();
  }

  // Stops and closes the poll handle (before the fd is closed, so epoll never sees a reused fd).
  void StopPolling() {
    PollBox* box = box_;
    if (!box) return;
    box_ = nullptr;
    box->owner = nullptr;
    napi_remove_async_cleanup_hook(box->hook);
    box->hook = nullptr;
    uv_close(reinterpret_cast<uv_handle_t*>(&box->handle), FreeBox);
  }

  virtual void OnReady(int status, int events) = 0;
  // Environment teardown: close resources without calling into JS.
  virtual void OnTeardown() = 0;

  PollBox* box_ = nullptr;
  int events_ = 0;

 private:
  static void FreeBox(uv_handle_t* h) { delete static_cast<PollBox*>(h->data); }

  static void OnPoll(uv_poll_t* h, int status, int events) {
    auto* box = static_cast<PollBox*>(h->data);
    if (box->owner) box->owner->OnReady(status, events);
  }

  static void OnEnvCleanup(napi_async_cleanup_hook_handle hook, void* arg) {
    auto* box = static_cast<PollBox*>(arg);
    Polled* owner = box->owner;
    box->owner = nullptr;
    if (owner) {
      owner->box_ = nullptr;
      owner->OnTeardown();
    }
    uv_close(reinterpret_cast<uv_handle_t*>(&box->handle), [](uv_handle_t* h) {
      auto* b = static_cast<PollBox*>(h->data);
      napi_remove_async_cleanup_hook(b->hook);
      delete b;
    });
  }
};

// A Polled that owns its fd (Socket, Acceptor): the fd is closed after the poll stops, so epoll
// never watches a reused fd, by CloseFd() (close()), the destructor (GC backstop), or at
// environment teardown.
class PolledFd : public Polled {
 public:
  ~PolledFd() override { CloseFd(); }

 protected:
  // Stops polling and closes the fd; false when it was closed already.
  bool CloseFd() {
    if (fd_ < 0) return false;
    StopPolling();
    close(fd_);
    fd_ = -1;
    return true;
  }

  void OnTeardown() override {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }

  int fd_ = -1;
};

// Calls a JS callback from a libuv callback: make_callback so that nextTicks and microtasks run
// after it; a JS exception becomes an uncaught exception instead of being lost. Raw N-API calls:
// in a worker being terminated every call may fail, and that must not turn into a C++ throw.
enum class Called { kOk, kThrew, kCannotRun };
inline Called CallBack(Napi::Env env, Napi::FunctionReference& fn, Napi::Object recv, Napi::AsyncContext& ctx,
                       const std::initializer_list<napi_value>& args) {
  napi_value func = nullptr;
  if (fn.IsEmpty() || napi_get_reference_value(env, fn, &func) != napi_ok || func == nullptr) return Called::kCannotRun;
  napi_value result;
  napi_status s = napi_make_callback(env, ctx, recv, func, args.size(), args.begin(), &result);
  if (s == napi_ok) return Called::kOk;
  bool pending = false;
  if (napi_is_exception_pending(env, &pending) == napi_ok && pending) {
    napi_value error;
    if (napi_get_and_clear_last_exception(env, &error) == napi_ok) napi_fatal_exception(env, error);
    return Called::kThrew;
  }
  // The environment is shutting down and runs no more JS.
  return Called::kCannotRun;
}

}  // namespace cuda_ipc
