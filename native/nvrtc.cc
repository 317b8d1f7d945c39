// NVRTC (run-time compilation of CUDA C to PTX), loaded on first use from a path TypeScript
// chooses. One call compiles one program; every NVRTC object is destroyed on every path.
#include <dlfcn.h>

#include <mutex>
#include <string>
#include <vector>

#include "common.h"

namespace cuda_ipc {
namespace {

typedef int nvrtcResult;
typedef struct _nvrtcProgram* nvrtcProgram;

struct Nvrtc {
  const char* (*getErrorString)(nvrtcResult) = nullptr;
  nvrtcResult (*version)(int*, int*) = nullptr;
  nvrtcResult (*createProgram)(nvrtcProgram*, const char*, const char*, int, const char* const*, const char* const*) = nullptr;
  nvrtcResult (*compileProgram)(nvrtcProgram, int, const char* const*) = nullptr;
  nvrtcResult (*getPTXSize)(nvrtcProgram, size_t*) = nullptr;
  nvrtcResult (*getPTX)(nvrtcProgram, char*) = nullptr;
  nvrtcResult (*getProgramLogSize)(nvrtcProgram, size_t*) = nullptr;
  nvrtcResult (*getProgramLog)(nvrtcProgram, char*) = nullptr;
  nvrtcResult (*destroyProgram)(nvrtcProgram*) = nullptr;
};

std::mutex g_nvrtcMutex;
Nvrtc g_nvrtc;
std::string g_nvrtcPath;  // the library loaded, empty until then

template <class F> bool Resolve(void* lib, const char* name, F& out) {
  out = reinterpret_cast<F>(dlsym(lib, name));
  return out != nullptr;
}

// Loads the first candidate path that opens and exports every function; returns its path.
Napi::Value NvrtcLoad(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (!info[0].IsArray()) ThrowType(env, "nvrtcLoad expects an array of library paths");
  std::lock_guard<std::mutex> lock(g_nvrtcMutex);
  if (!g_nvrtcPath.empty()) return Napi::String::New(env, g_nvrtcPath);
  auto paths = info[0].As<Napi::Array>();
  std::string tried;
  for (uint32_t i = 0; i < paths.Length(); i++) {
    std::string path = paths.Get(i).As<Napi::String>().Utf8Value();
    void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      const char* e = dlerror();
      tried += "\n  " + path + ": " + (e ? e : "not loadable");
      continue;
    }
    Nvrtc n;
    bool ok = Resolve(lib, "nvrtcGetErrorString", n.getErrorString) && Resolve(lib, "nvrtcVersion", n.version) &&
              Resolve(lib, "nvrtcCreateProgram", n.createProgram) && Resolve(lib, "nvrtcCompileProgram", n.compileProgram) &&
              Resolve(lib, "nvrtcGetPTXSize", n.getPTXSize) && Resolve(lib, "nvrtcGetPTX", n.getPTX) &&
              Resolve(lib, "nvrtcGetProgramLogSize", n.getProgramLogSize) && Resolve(lib, "nvrtcGetProgramLog", n.getProgramLog) &&
              Resolve(lib, "nvrtcDestroyProgram", n.destroyProgram);
    if (!ok) {
      dlclose(lib);
      tried += "\n  " + path + ": not an NVRTC library (symbols missing)";
      continue;
    }
    g_nvrtc = n;
    g_nvrtcPath = path;
    return Napi::String::New(env, path);
  }
  Napi::Error e = Napi::Error::New(env, "NVRTC could not be loaded; tried:" + tried);
  e.Set("code", Napi::String::New(env, "NVRTC_NOT_FOUND"));
  throw e;
}

Napi::Value NvrtcVersion(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (g_nvrtcPath.empty()) ThrowType(env, "call nvrtcLoad first");
  int major = 0, minor = 0;
  nvrtcResult r = g_nvrtc.version(&major, &minor);
  if (r != 0) throw Napi::Error::New(env, std::string("nvrtcVersion failed: ") + g_nvrtc.getErrorString(r));
  auto out = Napi::Array::New(env, 2);
  out.Set(0u, Napi::Number::New(env, major));
  out.Set(1u, Napi::Number::New(env, minor));
  return out;
}

// nvrtcCompile(source, name, options[]) -> { ok, ptx?, log, error? }
Napi::Value NvrtcCompile(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (g_nvrtcPath.empty()) ThrowType(env, "call nvrtcLoad first");
  if (!info[0].IsString() || !info[1].IsString() || !info[2].IsArray()) ThrowType(env, "nvrtcCompile(source, name, options[])");
  std::string source = info[0].As<Napi::String>().Utf8Value();
  std::string name = info[1].As<Napi::String>().Utf8Value();
  auto optArray = info[2].As<Napi::Array>();
  std::vector<std::string> opts;
  for (uint32_t i = 0; i < optArray.Length(); i++) opts.push_back(optArray.Get(i).As<Napi::String>().Utf8Value());
  std::vector<const char*> optPtrs;
  for (auto& o : opts) optPtrs.push_back(o.c_str());

  nvrtcProgram prog = nullptr;
  nvrtcResult r = g_nvrtc.createProgram(&prog, source.c_str(), name.c_str(), 0, nullptr, nullptr);
  auto out = Napi::Object::New(env);
  if (r != 0) {
    out.Set("ok", false);
    out.Set("error", g_nvrtc.getErrorString(r));
    out.Set("log", "");
    return out;
  }
  nvrtcResult compiled = g_nvrtc.compileProgram(prog, static_cast<int>(optPtrs.size()), optPtrs.data());
  std::string log;
  size_t logSize = 0;
  if (g_nvrtc.getProgramLogSize(prog, &logSize) == 0 && logSize > 1) {
    log.resize(logSize);
    if (g_nvrtc.getProgramLog(prog, &log[0]) != 0) log.clear();
    else log.resize(logSize - 1);
  }
  std::string ptx;
  nvrtcResult ptxResult = 0;
  if (compiled == 0) {
    size_t ptxSize = 0;
    ptxResult = g_nvrtc.getPTXSize(prog, &ptxSize);
    if (ptxResult == 0) {
      ptx.resize(ptxSize);
      ptxResult = g_nvrtc.getPTX(prog, &ptx[0]);
      if (ptxSize > 0) ptx.resize(ptxSize - 1);  // drop the terminating NUL
    }
  }
  g_nvrtc.destroyProgram(&prog);
  out.Set("log", log);
  if (compiled != 0 || ptxResult != 0) {
    out.Set("ok", false);
    out.Set("error", g_nvrtc.getErrorString(compiled != 0 ? compiled : ptxResult));
    return out;
  }
  out.Set("ok", true);
  out.Set("ptx", ptx);
  return out;
}

}  // namespace

void InitNvrtc(Napi::Env env, Napi::Object exports) {
  exports.Set("nvrtcLoad", Napi::Function::New(env, NvrtcLoad, "nvrtcLoad"));
  exports.Set("nvrtcVersion", Napi::Function::New(env, NvrtcVersion, "nvrtcVersion"));
  exports.Set("nvrtcCompile", Napi::Function::New(env, NvrtcCompile, "nvrtcCompile"));
}

}  // namespace cuda_ipc
