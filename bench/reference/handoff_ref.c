// The handoff benchmark's flow in plain C, as the floor the Node numbers are compared against:
// hand a fresh buffer to another process over an AF_UNIX SOCK_SEQPACKET socket; the other
// process maps it, reads one 32-bit value, unmaps it and acknowledges with the value; the time
// is from allocating the buffer to having the ack and the buffer freed.
//
//   handoff_ref MODE ITERATIONS WARMUP [BYTES]      prints one line of JSON
//
// MODE:
//   socket  bare ping-pong of 1 byte each way (no buffer)
//   host    memfd + mmap; the fd travels with SCM_RIGHTS with 24 bytes (length, offset, length)
//   pool    CUDA IPC memory pool (POSIX fd): the pool's fd travels once, then each buffer is
//           its 64 bytes of cuMemPoolExportPointer data; cuMemPoolImportPointer, cuMemcpyDtoH,
//           cuMemFree on the other side; cuMemFreeAsync here after the ack
//   legacy  cuMemAlloc + cuIpcGetMemHandle; cuIpcOpenMemHandle, cuMemcpyDtoH,
//           cuIpcCloseMemHandle on the other side; cuMemFree here after the ack
//
// The CUDA modes exist when built with -DHANDOFF_REF_CUDA and cuda.h on the include path. The
// driver is opened with dlopen("libcuda.so.1") and its entry points found with
// cuGetProcAddress, so nothing links against CUDA. The process forks before any CUDA call (CUDA
// does not survive fork once initialised), then each side initialises the driver itself.
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifdef HANDOFF_REF_CUDA
#include <cuda.h>
#include <dlfcn.h>
#endif

static const char *g_side = "parent";

static void fail(const char *what, int err) {
  fprintf(stderr, "handoff_ref (%s): %s: %s\n", g_side, what, strerror(err));
  exit(1);
}

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

// One record, with at most one fd.
static void send_record(int sock, const void *data, size_t len, int fd) {
  struct iovec iov = {(void *)data, len};
  struct msghdr msg = {0};
  union {
    char buf[CMSG_SPACE(sizeof(int))];
    struct cmsghdr align;
  } control;
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  if (fd >= 0) {
    memset(&control, 0, sizeof(control));
    msg.msg_control = control.buf;
    msg.msg_controllen = sizeof(control.buf);
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &fd, sizeof(int));
  }
  ssize_t r;
  do r = sendmsg(sock, &msg, MSG_NOSIGNAL); while (r < 0 && errno == EINTR);
  if (r < 0) fail("sendmsg", errno);
  if ((size_t)r != len) fail("sendmsg (short)", EMSGSIZE);
}

// Receives one record; returns its length (0: the peer closed). *fd is the fd that came with it or -1.
static size_t recv_record(int sock, void *data, size_t cap, int *fd) {
  struct iovec iov = {data, cap};
  struct msghdr msg = {0};
  union {
    char buf[CMSG_SPACE(sizeof(int) * 4)];
    struct cmsghdr align;
  } control;
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control.buf;
  msg.msg_controllen = sizeof(control.buf);
  ssize_t r;
  do r = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC); while (r < 0 && errno == EINTR);
  if (r < 0) fail("recvmsg", errno);
  if (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) fail("recvmsg (truncated)", EMSGSIZE);
  int got = -1;
  for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < n; i++) {
      int f;
      memcpy(&f, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      if (got < 0) got = f;
      else close(f);
    }
  }
  if (fd) *fd = got;
  else if (got >= 0) close(got);
  return (size_t)r;
}

static const char END = 'E';

// ---------------------------------------------------------------------------------------------
// CUDA through dlopen + cuGetProcAddress.

#ifdef HANDOFF_REF_CUDA
// Entry points of the CUDA 12.0 ABI, as the addon asks for (native/cuda_abi.h): asking for
// CUDA_VERSION would hand a CUDA 13 header's build the 13.0 variants, some of which take other
// arguments than the prototypes below (cuCtxSynchronize gained a context: seen failing with
// CUDA_ERROR_CONTEXT_IS_DESTROYED on the GPU machine).
#define CU_REF_ABI 12000
#define CU_FUNCTIONS(X)                                                                        \
  X(cuInit) X(cuGetErrorName) X(cuDeviceGet) X(cuDevicePrimaryCtxRetain) X(cuCtxSetCurrent)  \
  X(cuCtxSynchronize) X(cuMemAlloc) X(cuMemFree) X(cuMemFreeAsync) X(cuMemcpyDtoH)            \
  X(cuMemsetD32) X(cuIpcGetMemHandle) X(cuIpcOpenMemHandle) X(cuIpcCloseMemHandle)            \
  X(cuMemPoolCreate) X(cuMemPoolDestroy) X(cuMemPoolSetAttribute)                             \
  X(cuMemPoolExportToShareableHandle) X(cuMemPoolImportFromShareableHandle)                   \
  X(cuMemPoolSetAccess) X(cuMemAllocFromPoolAsync) X(cuMemPoolExportPointer)                  \
  X(cuMemPoolImportPointer)

// p_cuMemAlloc has the type of cuda.h's prototype (cuMemAlloc is a macro for cuMemAlloc_v2).
#define CU_DECLARE(name) static __typeof__(&name) p_##name;
CU_FUNCTIONS(CU_DECLARE)

static void cu_check(CUresult r, const char *call) {
  if (r == CUDA_SUCCESS) return;
  const char *name = NULL;
  if (!p_cuGetErrorName || p_cuGetErrorName(r, &name) != CUDA_SUCCESS) name = NULL;
  fprintf(stderr, "handoff_ref (%s): %s failed: %s (%d)\n", g_side, call, name ? name : "unknown error", (int)r);
  exit(1);
}
#define CU(call) cu_check((call), #call)

static void cuda_load(void) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    fprintf(stderr, "handoff_ref (%s): dlopen(libcuda.so.1): %s\n", g_side, dlerror());
    exit(1);
  }
  __typeof__(&cuGetProcAddress) get = (__typeof__(&cuGetProcAddress))dlsym(lib, "cuGetProcAddress_v2");
  if (!get) {
    fprintf(stderr, "handoff_ref (%s): libcuda.so.1 has no cuGetProcAddress_v2 (driver older than CUDA 12)\n", g_side);
    exit(1);
  }
#define CU_RESOLVE(name)                                                                          \
  {                                                                                               \
    void *fn = NULL;                                                                              \
    CUdriverProcAddressQueryResult status;                                                        \
    if (get(#name, &fn, CU_REF_ABI, CU_GET_PROC_ADDRESS_DEFAULT, &status) != CUDA_SUCCESS || !fn) { \
      fprintf(stderr, "handoff_ref (%s): the driver has no %s\n", g_side, #name);               \
      exit(1);                                                                                    \
    }                                                                                             \
    p_##name = (__typeof__(p_##name))fn;                                                          \
  }
  CU_FUNCTIONS(CU_RESOLVE)
  CU(p_cuInit(0));
  CUdevice dev;
  CU(p_cuDeviceGet(&dev, 0));
  CUcontext ctx;
  CU(p_cuDevicePrimaryCtxRetain(&ctx, dev));
  CU(p_cuCtxSetCurrent(ctx));
}
#endif

// ---------------------------------------------------------------------------------------------
// The receiving side: one loop per mode, until END.

static void child_socket(int sock) {
  char b;
  for (;;) {
    if (recv_record(sock, &b, 1, NULL) == 0 || b == END) return;
    send_record(sock, &b, 1, -1);
  }
}

static void child_host(int sock) {
  uint64_t d[3];
  for (;;) {
    int fd;
    size_t n = recv_record(sock, d, sizeof(d), &fd);
    if (n != sizeof(d)) {
      if (fd >= 0) close(fd);
      return;  // END or the parent went away
    }
    if (fd < 0) fail("host buffer without an fd", EINVAL);
    // As the Node side does: never map a file that could shrink under the mapping (SIGBUS).
    int seals = fcntl(fd, F_GET_SEALS);
    if (seals < 0 || !(seals & F_SEAL_SHRINK)) fail("F_GET_SEALS (not sealed against shrinking)", seals < 0 ? errno : EINVAL);
    void *p = mmap(NULL, d[0], PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) fail("mmap", errno);
    uint32_t v = *(volatile uint32_t *)((char *)p + d[1]);
    if (munmap(p, d[0]) < 0) fail("munmap", errno);
    close(fd);
    send_record(sock, &v, sizeof(v), -1);
  }
}

#ifdef HANDOFF_REF_CUDA
static void child_pool(int sock) {
  char b;
  int fd;
  if (recv_record(sock, &b, 1, &fd) != 1 || fd < 0) fail("the pool's fd did not arrive", EINVAL);
  CUmemoryPool pool;
  CU(p_cuMemPoolImportFromShareableHandle(&pool, (void *)(intptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  close(fd);
  CUmemAccessDesc access;
  memset(&access, 0, sizeof(access));
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = 0;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CU(p_cuMemPoolSetAccess(pool, &access, 1));
  send_record(sock, &b, 1, -1);
  CUmemPoolPtrExportData data;
  for (;;) {
    if (recv_record(sock, &data, sizeof(data), NULL) != sizeof(data)) break;
    CUdeviceptr p;
    CU(p_cuMemPoolImportPointer(&p, pool, &data));
    uint32_t v;
    CU(p_cuMemcpyDtoH(&v, p, sizeof(v)));
    CU(p_cuMemFree(p));
    send_record(sock, &v, sizeof(v), -1);
  }
  CU(p_cuMemPoolDestroy(pool));
}

static void child_legacy(int sock) {
  CUipcMemHandle h;
  for (;;) {
    if (recv_record(sock, &h, sizeof(h), NULL) != sizeof(h)) return;
    CUdeviceptr p;
    CU(p_cuIpcOpenMemHandle(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
    uint32_t v;
    CU(p_cuMemcpyDtoH(&v, p, sizeof(v)));
    CU(p_cuIpcCloseMemHandle(p));
    send_record(sock, &v, sizeof(v), -1);
  }
}
#endif

// ---------------------------------------------------------------------------------------------
// The sending side: one handoff per call; `mark` != 0 writes it into the buffer first (the
// correctness check) and returns what the child read.

static size_t g_bytes = 1 << 20;

static uint32_t handoff_socket(int sock, uint32_t mark) {
  char b = 'P', r;
  (void)mark;
  send_record(sock, &b, 1, -1);
  if (recv_record(sock, &r, 1, NULL) != 1) fail("the child went away", EPIPE);
  if (r != b) fail("the child echoed another byte", EPROTO);
  return 0;
}

static uint32_t recv_ack(int sock) {
  uint32_t v;
  if (recv_record(sock, &v, sizeof(v), NULL) != sizeof(v)) fail("the child went away", EPIPE);
  return v;
}

static uint32_t handoff_host(int sock, uint32_t mark) {
  int fd = memfd_create("handoff-ref", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) fail("memfd_create", errno);
  if (ftruncate(fd, (off_t)g_bytes) < 0) fail("ftruncate", errno);
  if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0) fail("F_ADD_SEALS", errno);
  void *p = mmap(NULL, g_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) fail("mmap", errno);
  if (mark) *(uint32_t *)p = mark;
  uint64_t d[3] = {g_bytes, 0, g_bytes};
  send_record(sock, d, sizeof(d), fd);
  uint32_t v = recv_ack(sock);
  if (munmap(p, g_bytes) < 0) fail("munmap", errno);
  close(fd);
  return v;
}

#ifdef HANDOFF_REF_CUDA
static CUmemoryPool g_pool;

static void parent_pool_setup(int sock) {
  CUmemPoolProps props;
  memset(&props, 0, sizeof(props));
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.handleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  props.location.id = 0;
  CU(p_cuMemPoolCreate(&g_pool, &props));
  // As the Node pools do: keep freed memory reserved instead of returning it on every sync.
  cuuint64_t threshold = UINT64_MAX;
  CU(p_cuMemPoolSetAttribute(g_pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold));
  int fd = -1;
  CU(p_cuMemPoolExportToShareableHandle(&fd, g_pool, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  char b = 'F';
  send_record(sock, &b, 1, fd);
  close(fd);
  if (recv_record(sock, &b, 1, NULL) != 1) fail("the child could not import the pool", EPIPE);
}

static uint32_t handoff_pool(int sock, uint32_t mark) {
  CUdeviceptr p;
  CU(p_cuMemAllocFromPoolAsync(&p, g_bytes, g_pool, NULL));
  if (mark) {
    CU(p_cuMemsetD32(p, mark, 1));
    CU(p_cuCtxSynchronize());
  }
  CUmemPoolPtrExportData data;
  CU(p_cuMemPoolExportPointer(&data, p));
  send_record(sock, &data, sizeof(data), -1);
  uint32_t v = recv_ack(sock);
  CU(p_cuMemFreeAsync(p, NULL));
  return v;
}

static uint32_t handoff_legacy(int sock, uint32_t mark) {
  CUdeviceptr p;
  CU(p_cuMemAlloc(&p, g_bytes));
  if (mark) {
    CU(p_cuMemsetD32(p, mark, 1));
    CU(p_cuCtxSynchronize());
  }
  CUipcMemHandle h;
  CU(p_cuIpcGetMemHandle(&h, p));
  send_record(sock, &h, sizeof(h), -1);
  uint32_t v = recv_ack(sock);
  CU(p_cuMemFree(p));
  return v;
}
#endif

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: %s socket|host|pool|legacy ITERATIONS WARMUP [BYTES]\n", argv[0]);
    return 2;
  }
  const char *mode = argv[1];
  long iterations = atol(argv[2]), warmup = atol(argv[3]);
  if (argc > 4) g_bytes = (size_t)atoll(argv[4]);
  if (iterations < 1 || warmup < 0 || g_bytes < 4) {
    fprintf(stderr, "handoff_ref: ITERATIONS must be >= 1, WARMUP >= 0, BYTES >= 4\n");
    return 2;
  }
  void (*child)(int) = NULL;
  uint32_t (*handoff)(int, uint32_t) = NULL;
  if (!strcmp(mode, "socket")) child = child_socket, handoff = handoff_socket;
  else if (!strcmp(mode, "host")) child = child_host, handoff = handoff_host;
#ifdef HANDOFF_REF_CUDA
  else if (!strcmp(mode, "pool")) child = child_pool, handoff = handoff_pool;
  else if (!strcmp(mode, "legacy")) child = child_legacy, handoff = handoff_legacy;
#else
  else if (!strcmp(mode, "pool") || !strcmp(mode, "legacy")) {
    fprintf(stderr, "handoff_ref: built without cuda.h; the %s mode needs -DHANDOFF_REF_CUDA\n", mode);
    return 3;
  }
#endif
  else {
    fprintf(stderr, "handoff_ref: unknown mode %s\n", mode);
    return 2;
  }

  int sv[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0) fail("socketpair", errno);
  pid_t pid = fork();
  if (pid < 0) fail("fork", errno);
  if (pid == 0) {
    g_side = "child";
    close(sv[0]);
#ifdef HANDOFF_REF_CUDA
    if (child == child_pool || child == child_legacy) cuda_load();
#endif
    child(sv[1]);
    _exit(0);
  }
  close(sv[1]);
  int sock = sv[0];
#ifdef HANDOFF_REF_CUDA
  if (handoff == handoff_pool || handoff == handoff_legacy) cuda_load();
  if (handoff == handoff_pool) parent_pool_setup(sock);
#endif

  // Correctness first: the child must read what was written.
  const uint32_t MARK = 0xC0FFEEu;
  uint32_t got = handoff(sock, MARK);
  if (handoff != handoff_socket && got != MARK) {
    fprintf(stderr, "handoff_ref: the child read 0x%x, not the marker 0x%x\n", got, MARK);
    return 1;
  }

  double *t = malloc(sizeof(double) * (size_t)iterations);
  if (!t) fail("malloc", ENOMEM);
  for (long i = 0; i < warmup + iterations; i++) {
    double t0 = now_us();
    handoff(sock, 0);
    double dt = now_us() - t0;
    if (i >= warmup) t[i - warmup] = dt;
  }
  send_record(sock, &END, 1, -1);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    fprintf(stderr, "handoff_ref: the child failed (status 0x%x)\n", status);
    return 1;
  }

  // The same statistics as bench/stats.ts summarize().
  size_t n = (size_t)iterations;
  double sum = 0;
  for (size_t i = 0; i < n; i++) sum += t[i];
  qsort(t, n, sizeof(double), cmp_double);
  double median = n % 2 ? t[n / 2] : (t[n / 2 - 1] + t[n / 2]) / 2;
  size_t k = (size_t)ceil((double)n * 0.99);  // >= 1 for n >= 1
  double p99 = t[k - 1 < n - 1 ? k - 1 : n - 1];
  printf("{\"mode\":\"%s\",\"bytes\":%zu,\"n\":%zu,\"median_us\":%.3f,\"p99_us\":%.3f,\"mean_us\":%.3f}\n", mode, g_bytes, n, median,
         p99, sum / n);
  free(t);
  return 0;
}
