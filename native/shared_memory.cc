// Host shared memory: SharedMemory, an mmap(MAP_SHARED) of an fd that it owns and the external
// ArrayBuffers over it, and detachArrayBuffer.
#include "common.h"

#include <sys/mman.h>
#include <unistd.h>

#include <unordered_set>

namespace cuda_ipc {
namespace {

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
    if (napi_create_external_arraybuffer(env, r->addr + offset, length, OnBufferFinalize, rec, &ab) != napi_ok) {
      delete rec;
      throw Napi::Error::New(env, "napi_create_external_arraybuffer failed");
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

}  // namespace

void InitSharedMemory(Napi::Env env, Napi::Object exports) {
  exports.Set("detachArrayBuffer", Napi::Function::New(env, DetachArrayBuffer, "detachArrayBuffer"));
  exports.Set("SharedMemory", SharedMemory::Define(env));

  Napi::Object c = ConstantsObject(env, exports, "posixConstants");
  c.Set("PAGE_SIZE", Napi::Number::New(env, static_cast<double>(sysconf(_SC_PAGESIZE))));
}

}  // namespace cuda_ipc
