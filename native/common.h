// Helpers shared by the native files: argument conversion and error construction.
#pragma once
#include <napi.h>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>

namespace cuda_ipc {

// Throws a JS Error shaped like Node's system errors: code ('EAGAIN'), errno, syscall.
[[noreturn]] inline void ThrowErrno(Napi::Env env, const char* syscall, int err) {
  Napi::Error e = Napi::Error::New(env, std::string(syscall) + " failed: " + std::strerror(err));
  const char* name = nullptr;
  switch (err) {
#define E(x) case x: name = #x; break;
    E(EAGAIN) E(EBADF) E(EINVAL) E(ENOENT) E(EACCES) E(EPERM) E(ECONNREFUSED) E(ECONNRESET)
    E(EPIPE) E(EMSGSIZE) E(ENOMEM) E(EMFILE) E(ENFILE) E(ENOTSOCK) E(EADDRINUSE) E(ENOTCONN)
    E(EEXIST) E(ENOSPC) E(ETIMEDOUT) E(EINTR) E(ENOSYS) E(EOVERFLOW) E(EFAULT) E(ETOOMANYREFS)
    E(ENODEV) E(ESPIPE) E(EISDIR) E(EFBIG) E(ENOTDIR) E(ELOOP) E(ENAMETOOLONG) E(EROFS) E(ENXIO)
    E(EADDRNOTAVAIL) E(ENETUNREACH) E(EHOSTUNREACH) E(ECONNABORTED) E(EOPNOTSUPP) E(EPROTO)
#undef E
    default: break;
  }
  e.Set("code", name ? Napi::String::New(env, name) : Napi::String::New(env, "E" + std::to_string(err)));
  e.Set("errno", Napi::Number::New(env, err));
  e.Set("syscall", Napi::String::New(env, syscall));
  throw e;
}

[[noreturn]] inline void ThrowType(Napi::Env env, const std::string& msg) {
  throw Napi::TypeError::New(env, msg);
}

inline uint64_t ArgU64(const Napi::CallbackInfo& info, size_t i, const char* what) {
  if (info.Length() <= i || !info[i].IsBigInt()) ThrowType(info.Env(), std::string(what) + " must be a bigint");
  bool lossless = true;
  uint64_t v = info[i].As<Napi::BigInt>().Uint64Value(&lossless);
  if (!lossless) ThrowType(info.Env(), std::string(what) + " does not fit in 64 bits");
  return v;
}

inline int64_t ArgI64(const Napi::CallbackInfo& info, size_t i, const char* what) {
  if (info.Length() <= i || !info[i].IsBigInt()) ThrowType(info.Env(), std::string(what) + " must be a bigint");
  bool lossless = true;
  int64_t v = info[i].As<Napi::BigInt>().Int64Value(&lossless);
  if (!lossless) ThrowType(info.Env(), std::string(what) + " does not fit in 64 bits");
  return v;
}

inline int32_t ArgI32(const Napi::CallbackInfo& info, size_t i, const char* what) {
  if (info.Length() <= i || !info[i].IsNumber()) ThrowType(info.Env(), std::string(what) + " must be a number");
  return info[i].As<Napi::Number>().Int32Value();
}

inline uint32_t ArgU32(const Napi::CallbackInfo& info, size_t i, const char* what) {
  if (info.Length() <= i || !info[i].IsNumber()) ThrowType(info.Env(), std::string(what) + " must be a number");
  return info[i].As<Napi::Number>().Uint32Value();
}

inline bool ArgBool(const Napi::CallbackInfo& info, size_t i, const char* what) {
  if (info.Length() <= i || !info[i].IsBoolean()) ThrowType(info.Env(), std::string(what) + " must be a boolean");
  return info[i].As<Napi::Boolean>().Value();
}

inline std::string ArgString(const Napi::CallbackInfo& info, size_t i, const char* what) {
  if (info.Length() <= i || !info[i].IsString()) ThrowType(info.Env(), std::string(what) + " must be a string");
  return info[i].As<Napi::String>().Utf8Value();
}

// A file descriptor: a non-negative integer.
inline int CheckFd(Napi::Env env, const Napi::CallbackInfo& info, size_t i) {
  int fd = ArgI32(info, i, "fd");
  if (fd < 0) ThrowType(env, "fd must be a non-negative integer");
  return fd;
}

// A non-negative integral size given as number or bigint.
inline size_t ArgSize(const Napi::CallbackInfo& info, size_t i, const char* what) {
  if (info.Length() > i && info[i].IsBigInt()) return static_cast<size_t>(ArgU64(info, i, what));
  if (info.Length() <= i || !info[i].IsNumber()) ThrowType(info.Env(), std::string(what) + " must be a number or bigint");
  double d = info[i].As<Napi::Number>().DoubleValue();
  if (!(d >= 0) || d != static_cast<double>(static_cast<uint64_t>(d))) ThrowType(info.Env(), std::string(what) + " must be a non-negative integer");
  return static_cast<size_t>(d);
}

// Bytes of an ArrayBuffer view (TypedArray / DataView / Buffer) or ArrayBuffer.
struct Bytes { uint8_t* data; size_t length; };
inline size_t TypedArrayElementSize(napi_typedarray_type t) {
  switch (t) {
    case napi_int16_array: case napi_uint16_array: return 2;
    case napi_int32_array: case napi_uint32_array: case napi_float32_array: return 4;
    case napi_float64_array: case napi_bigint64_array: case napi_biguint64_array: return 8;
    default: return 1;
  }
}
inline Bytes ArgBytes(const Napi::CallbackInfo& info, size_t i, const char* what) {
  if (info.Length() > i) {
    Napi::Value v = info[i];
    // Typed arrays (the common case, on every send and copy) in one query: the data pointer
    // napi_get_typedarray_info returns already includes the view's offset.
    napi_typedarray_type type;
    size_t count = 0;
    void* data = nullptr;
    if (napi_get_typedarray_info(info.Env(), v, &type, &count, &data, nullptr, nullptr) == napi_ok) {
      return {static_cast<uint8_t*>(data), count * TypedArrayElementSize(type)};
    }
    if (v.IsDataView()) {
      auto dv = v.As<Napi::DataView>();
      return {static_cast<uint8_t*>(dv.ArrayBuffer().Data()) + dv.ByteOffset(), dv.ByteLength()};
    }
    if (v.IsArrayBuffer()) {
      auto ab = v.As<Napi::ArrayBuffer>();
      return {static_cast<uint8_t*>(ab.Data()), ab.ByteLength()};
    }
  }
  ThrowType(info.Env(), std::string(what) + " must be an ArrayBuffer or an ArrayBuffer view");
}

inline Napi::BigInt U64(Napi::Env env, uint64_t v) { return Napi::BigInt::New(env, v); }

// The object of constants `name` on exports that several files add to (posixConstants: fd.cc,
// socket.cc, shared_memory.cc), made by the first of them.
inline Napi::Object ConstantsObject(Napi::Env env, Napi::Object exports, const char* name) {
  Napi::Value v = exports.Get(name);
  if (v.IsObject()) return v.As<Napi::Object>();
  Napi::Object o = Napi::Object::New(env);
  exports.Set(name, o);
  return o;
}

}  // namespace cuda_ipc
