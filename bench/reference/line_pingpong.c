// The round trip of one cache line between two pinned CPUs, line by line (issue 38: why runs of one
// channel row differ). Two processes share an anonymous mapping; for each of `pages` lines (one per
// 4 KiB page, so each is a different physical line) they pass a counter back and forth 20,000
// times; each pass prints the mean nanoseconds per round trip of every line. On the H200 machine
// (a KVM guest of 16 vCPUs): 141-250 ns between CPUs 0 and 1 depending on the line, each line's
// figure stable across passes; 47-51 ns between CPUs 5 and 13 (one host core).
//
//   cc -O2 -o /tmp/line_pingpong bench/reference/line_pingpong.c && /tmp/line_pingpong 0 1 [pages 32] [passes 3]
#define _GNU_SOURCE
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { ROUNDS = 20000 };
// The control word: a line's index (go), IDLE (the child waits), STOP (exit), FAILED (the child could not pin).
static const uint32_t IDLE = 0xffffffffu, STOP = 0xfffffffeu, FAILED = 0xfffffffdu, STARTING = 0xfffffffcu;

static double now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e9 + t.tv_nsec;
}

static int pin(int cpu) {
  cpu_set_t s;
  CPU_ZERO(&s);
  CPU_SET(cpu, &s);
  return sched_setaffinity(0, sizeof s, &s);
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s CPU_A CPU_B [pages 32] [passes 3]\n", argv[0]);
    return 2;
  }
  int a = atoi(argv[1]), b = atoi(argv[2]);
  int pages = argc > 3 ? atoi(argv[3]) : 32, passes = argc > 4 ? atoi(argv[4]) : 3;
  if (pages < 1 || pages > 4096 || passes < 1) {
    fprintf(stderr, "line_pingpong: pages must be 1..4096, passes positive\n");
    return 2;
  }
  size_t len = (size_t)(pages + 1) * 4096;  // the last page holds the control word
  char *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (m == MAP_FAILED) {
    perror("line_pingpong: mmap");
    return 1;
  }
  _Atomic uint32_t *ctl = (_Atomic uint32_t *)(m + (size_t)pages * 4096);
  atomic_store(ctl, STARTING);
  pid_t pid = fork();
  if (pid < 0) {
    perror("line_pingpong: fork");
    return 1;
  }
  if (pid == 0) {
    if (pin(b) != 0) {
      perror("line_pingpong: sched_setaffinity (child)");
      atomic_store(ctl, FAILED);
      _exit(1);
    }
    atomic_store(ctl, IDLE);
    for (;;) {
      uint32_t idx;
      while ((idx = atomic_load(ctl)) == IDLE) {}
      if (idx == STOP) _exit(0);
      _Atomic uint32_t *w = (_Atomic uint32_t *)(m + (size_t)idx * 4096);
      for (uint32_t i = 1; i <= 2 * ROUNDS; i += 2) {
        while (atomic_load_explicit(w, memory_order_acquire) != i) {}
        atomic_store_explicit(w, i + 1, memory_order_release);
      }
      atomic_store(ctl, IDLE);
    }
  }
  int rc = 0;
  uint32_t c;
  while ((c = atomic_load(ctl)) == STARTING) {}  // the child pinned itself (IDLE) or could not (FAILED)
  if (c == FAILED) {
    rc = 1;
  } else if (pin(a) != 0) {
    perror("line_pingpong: sched_setaffinity");
    rc = 1;
  } else {
    printf("CPUs %d and %d, %d lines (one per page), ns per round trip (mean of %d)\n", a, b, pages, ROUNDS);
    for (int pass = 0; pass < passes && rc == 0; pass++) {
      printf("pass %d:", pass + 1);
      for (int p = 0; p < pages; p++) {
        _Atomic uint32_t *w = (_Atomic uint32_t *)(m + (size_t)p * 4096);
        atomic_store(w, 0);
        atomic_store(ctl, (uint32_t)p);
        double t0 = now_ns();
        for (uint32_t i = 1; i <= 2 * ROUNDS; i += 2) {
          atomic_store_explicit(w, i, memory_order_release);
          while (atomic_load_explicit(w, memory_order_acquire) != i + 1) {}
        }
        double t1 = now_ns();
        while (atomic_load(ctl) != IDLE) {}
        printf(" %.0f", (t1 - t0) / ROUNDS);
      }
      printf("\n");
      fflush(stdout);
    }
  }
  if (c != FAILED) atomic_store(ctl, STOP);
  int status = 0;
  waitpid(pid, &status, 0);
  munmap(m, len);
  return rc != 0 ? rc : (WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1);
}
