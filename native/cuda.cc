#include "common.h"
namespace cuda_ipc {
void InitCuda(Napi::Env env, Napi::Object exports) {}
}
