// Streams and events: create, query, wait, record; stream memory operations (wait on and write
// 32/64-bit words); and stream completions reported to JS. Near 1:1 bindings of the driver API
// (driver.h).
#include "driver.h"

namespace cuda_ipc {
using namespace cuabi;

namespace {

// A query's answer: true when the work is done, false while some is pending (NOT_READY).
Napi::Value DoneOrPending(Napi::Env env, CUresult r, const char* call) {
  if (r == CUDA_ERROR_NOT_READY) return Napi::Boolean::New(env, false);
  if (r != CUDA_SUCCESS) ThrowCuda(env, r, call);
  return Napi::Boolean::New(env, true);
}

Napi::Value StreamCreate(const Napi::CallbackInfo& info) {
  CUstream s = nullptr;
  CU_CALL(info.Env(), cuStreamCreate, &s, ArgU32(info, 0, "flags"));
  return HandleValue(info.Env(), s);
}

Napi::Value StreamDestroy(const Napi::CallbackInfo& info) {
  CU_CALL(info.Env(), cuStreamDestroy, ArgHandle<CUstream>(info, 0, "stream"));
  return info.Env().Undefined();
}

// true when all work is done, false while some is pending.
Napi::Value StreamQuery(const Napi::CallbackInfo& info) {
  CUresult r;
  CU_CALL_STATUS(info.Env(), r, cuStreamQuery, ArgHandle<CUstream>(info, 0, "stream"));
  return DoneOrPending(info.Env(), r, "cuStreamQuery");
}

// Blocks the calling thread: for the CLI's synchronous paths only; libraries use onComplete.
Napi::Value StreamSynchronize(const Napi::CallbackInfo& info) {
  CU_CALL(info.Env(), cuStreamSynchronize, ArgHandle<CUstream>(info, 0, "stream"));
  return info.Env().Undefined();
}

Napi::Value StreamWaitEvent(const Napi::CallbackInfo& info) {
  CU_CALL(info.Env(), cuStreamWaitEvent, ArgHandle<CUstream>(info, 0, "stream"), ArgHandle<CUevent>(info, 1, "event"), 0);
  return info.Env().Undefined();
}

// cuStream{Wait,Write}Value{32,64}(stream, address, value, flags): four bindings of one shape,
// apart only in the entry point and the width of `value`.
#define STREAM_MEM_OP(Binding, name, ArgValue)                                                      \
  Napi::Value Binding(const Napi::CallbackInfo& info) {                                             \
    CU_CALL(info.Env(), name, ArgHandle<CUstream>(info, 0, "stream"), ArgU64(info, 1, "address"),    \
            ArgValue(info, 2, "value"), ArgU32(info, 3, "flags"));                                  \
    return info.Env().Undefined();                                                                  \
  }
STREAM_MEM_OP(StreamWaitValue32, cuStreamWaitValue32, ArgU32)
STREAM_MEM_OP(StreamWaitValue64, cuStreamWaitValue64, ArgU64)
STREAM_MEM_OP(StreamWriteValue32, cuStreamWriteValue32, ArgU32)
STREAM_MEM_OP(StreamWriteValue64, cuStreamWriteValue64, ArgU64)
#undef STREAM_MEM_OP

Napi::Value EventCreate(const Napi::CallbackInfo& info) {
  CUevent ev = nullptr;
  CU_CALL(info.Env(), cuEventCreate, &ev, ArgU32(info, 0, "flags"));
  return HandleValue(info.Env(), ev);
}

Napi::Value EventDestroy(const Napi::CallbackInfo& info) {
  CU_CALL(info.Env(), cuEventDestroy, ArgHandle<CUevent>(info, 0, "event"));
  return info.Env().Undefined();
}

Napi::Value EventRecord(const Napi::CallbackInfo& info) {
  CU_CALL(info.Env(), cuEventRecord, ArgHandle<CUevent>(info, 0, "event"), ArgHandle<CUstream>(info, 1, "stream"));
  return info.Env().Undefined();
}

Napi::Value EventQuery(const Napi::CallbackInfo& info) {
  CUresult r;
  CU_CALL_STATUS(info.Env(), r, cuEventQuery, ArgHandle<CUevent>(info, 0, "event"));
  return DoneOrPending(info.Env(), r, "cuEventQuery");
}

// Stream completions: cuLaunchHostFunc runs HostFn on a driver thread when the stream reaches
// it; HostFn posts the id to the JS thread through a thread-safe function, and JS resolves the
// matching promise. No thread of ours or libuv's is ever parked waiting.
struct Completion {
  napi_threadsafe_function tsfn;
  double id;
};

void CompletionHostFn(void* data) {
  auto* c = static_cast<Completion*>(data);
  napi_threadsafe_function tsfn = c->tsfn;
  if (napi_call_threadsafe_function(tsfn, c, napi_tsfn_nonblocking) != napi_ok) delete c;
  // Each pending completion acquired the function, so it stays valid until this release.
  napi_release_threadsafe_function(tsfn, napi_tsfn_release);
}

void CompletionCallJs(napi_env env, napi_value callback, void* context, void* data) {
  auto* c = static_cast<Completion*>(data);
  double id = c->id;
  delete c;
  if (env == nullptr || t_state == nullptr) return;  // torn down: nothing to report to
  if (--t_state->pendingCompletions == 0) napi_unref_threadsafe_function(env, t_state->completions);
  napi_value arg;
  napi_create_double(env, id, &arg);
  napi_value global;
  napi_get_global(env, &global);
  napi_call_function(env, global, callback, 1, &arg, nullptr);
}

Napi::Value SetCompletionHandler(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (!info[0].IsFunction()) ThrowType(env, "setCompletionHandler expects a function");
  if (t_state->completions) ThrowType(env, "the completion handler is already set");
  napi_value name = Napi::String::New(env, "cuda-ipc stream completion");
  napi_status s = napi_create_threadsafe_function(env, info[0], nullptr, name, 0, 1, nullptr, nullptr, nullptr,
                                                  CompletionCallJs, &t_state->completions);
  if (s != napi_ok) throw Napi::Error::New(env, "napi_create_threadsafe_function failed");
  napi_unref_threadsafe_function(env, t_state->completions);  // only pending work keeps the loop alive
  return env.Undefined();
}

// Calls the completion handler with `id` once all work queued on `stream` so far is done.
Napi::Value StreamOnComplete(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  CUstream stream = ArgHandle<CUstream>(info, 0, "stream");
  if (!info[1].IsNumber()) ThrowType(env, "id must be a number");
  if (!t_state->completions) ThrowType(env, "setCompletionHandler must be called first");
  auto* c = new Completion{t_state->completions, info[1].As<Napi::Number>().DoubleValue()};
  if (napi_acquire_threadsafe_function(c->tsfn) != napi_ok) {
    delete c;
    throw Napi::Error::New(env, "the completion channel is closing");
  }
  CUresult r;
  try {
    CU_CALL_STATUS(env, r, cuLaunchHostFunc, stream, CompletionHostFn, c);
  } catch (...) {
    napi_release_threadsafe_function(c->tsfn, napi_tsfn_release);
    delete c;
    throw;
  }
  if (r != CUDA_SUCCESS) {
    napi_release_threadsafe_function(c->tsfn, napi_tsfn_release);
    delete c;
    ThrowCuda(env, r, "cuLaunchHostFunc");
  }
  if (t_state->pendingCompletions++ == 0) napi_ref_threadsafe_function(env, t_state->completions);
  return env.Undefined();
}

}  // namespace

void InitStreams(Napi::Env env, Napi::Object exports) {
  exports.Set("setCompletionHandler", Napi::Function::New(env, SetCompletionHandler, "setCompletionHandler"));
  exports.Set("streamCreate", Napi::Function::New(env, StreamCreate, "streamCreate"));
  exports.Set("streamDestroy", Napi::Function::New(env, StreamDestroy, "streamDestroy"));
  exports.Set("streamQuery", Napi::Function::New(env, StreamQuery, "streamQuery"));
  exports.Set("streamSynchronize", Napi::Function::New(env, StreamSynchronize, "streamSynchronize"));
  exports.Set("streamWaitEvent", Napi::Function::New(env, StreamWaitEvent, "streamWaitEvent"));
  exports.Set("streamOnComplete", Napi::Function::New(env, StreamOnComplete, "streamOnComplete"));
  exports.Set("streamWaitValue32", Napi::Function::New(env, StreamWaitValue32, "streamWaitValue32"));
  exports.Set("streamWaitValue64", Napi::Function::New(env, StreamWaitValue64, "streamWaitValue64"));
  exports.Set("streamWriteValue32", Napi::Function::New(env, StreamWriteValue32, "streamWriteValue32"));
  exports.Set("streamWriteValue64", Napi::Function::New(env, StreamWriteValue64, "streamWriteValue64"));
  exports.Set("eventCreate", Napi::Function::New(env, EventCreate, "eventCreate"));
  exports.Set("eventDestroy", Napi::Function::New(env, EventDestroy, "eventDestroy"));
  exports.Set("eventRecord", Napi::Function::New(env, EventRecord, "eventRecord"));
  exports.Set("eventQuery", Napi::Function::New(env, EventQuery, "eventQuery"));
}

}  // namespace cuda_ipc
