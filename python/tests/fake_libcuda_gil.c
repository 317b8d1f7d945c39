// A stand-in libcuda.so.1 for test_gil.py: cuGetProcAddress_v2 hands out entry points that answer
// CUDA_SUCCESS and count whether Python's GIL was held when they were called (PyGILState_Check,
// looked up in the loading process). fake_gil(name, &held, &released) reads the counts.
#include <dlfcn.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

// Every entry point the test calls; the rest are "not provided" (cuda_ipc then raises when asked).
#define ENTRY_POINTS(X)                                                                               \
  X(cuInit) X(cuGetErrorName) X(cuGetErrorString) X(cuDeviceGet) X(cuDeviceGetAttribute) X(cuCtxGetCurrent) \
  X(cuCtxPushCurrent) X(cuCtxPopCurrent) X(cuCtxSetCurrent) X(cuPointerGetAttribute) X(cuPointerGetAttributes) \
  X(cuMemGetAddressRange) X(cuEventQuery) X(cuStreamQuery) X(cuStreamWaitEvent) X(cuStreamWaitValue32)     \
  X(cuStreamWriteValue32) X(cuEventRecord) X(cuLaunchKernel) X(cuMemcpyDtoDAsync) X(cuStreamSynchronize)     \
  X(cuCtxSynchronize) X(cuEventSynchronize) X(cuMemAlloc) X(cuIpcOpenMemHandle) X(cuMemcpyHtoDAsync)

#define NAME(n) #n,
static const char* names[] = {ENTRY_POINTS(NAME)};
#define COUNT ((int)(sizeof names / sizeof names[0]))
static int held[COUNT], released[COUNT];

static void note(int i) {
  static int (*check)(void) = 0;
  if (!check) *(void**)&check = dlsym(RTLD_DEFAULT, "PyGILState_Check");
  if (check && check()) held[i]++; else released[i]++;
}

// Each stub ignores its arguments (the x86-64 and AArch64 calling conventions allow it).
#define STUB(n) static int stub_##n(void) { note(index_of(#n)); return 0; }
static int index_of(const char* name) {
  for (int i = 0; i < COUNT; i++)
    if (strcmp(names[i], name) == 0) return i;
  return 0;
}
ENTRY_POINTS(STUB)

#define ADDRESS(n) (void*)stub_##n,
static void* stubs[] = {ENTRY_POINTS(ADDRESS)};

EXPORT int cuGetProcAddress_v2(const char* symbol, void** pfn, int version, unsigned long long flags, int* status) {
  (void)version; (void)flags;
  *pfn = 0;
  for (int i = 0; i < COUNT; i++)
    if (strcmp(names[i], symbol) == 0) *pfn = stubs[i];
  if (status) *status = *pfn ? 0 : 1;  // CU_GET_PROC_ADDRESS_SUCCESS / SYMBOL_NOT_FOUND
  return *pfn ? 0 : 500;               // CUDA_ERROR_NOT_FOUND
}

EXPORT int fake_gil(const char* name, int* h, int* r) {
  for (int i = 0; i < COUNT; i++) {
    if (strcmp(names[i], name) == 0) {
      *h = held[i];
      *r = released[i];
      return 0;
    }
  }
  return -1;
}
