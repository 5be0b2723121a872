/* The physical floor of timing a scope on this machine (benchmarks/profile/floor.py compiles
   and runs it): an empty loop, one rdtsc, clock_gettime, a disabled gate, and a two-timestamp
   scope into a thread-local ring. Usage: floor <empty|rdtsc|clock_gettime|gate|scope> <n>. */
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <x86intrin.h>
typedef struct { uint64_t b, e; uint32_t name; uint8_t phase; } ev_t;  /* 24 bytes */
#define RING 65536
static __thread ev_t ring[RING];
static __thread uint64_t pos;
atomic_bool g_on;
__attribute__((noinline)) void record(uint64_t b, uint64_t e, uint32_t name) {
  ev_t* x = &ring[pos++ & (RING - 1)];
  x->b = b; x->e = e; x->name = name; x->phase = 255;
}
static double now(void) {
  struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e9 + t.tv_nsec;
}
#define BAR() __asm__ __volatile__("" ::: "memory")
int main(int argc, char** argv) {
  long n = atol(argv[2]); const char* w = argv[1]; uint64_t sink = 0;
  for (long i = 0; i < RING; ++i) record(0, 0, 0);  /* the ring is touched before timing */
  double t0 = now();
  if (!strcmp(w, "empty")) { for (long i = 0; i < n; ++i) BAR(); }
  else if (!strcmp(w, "rdtsc")) { for (long i = 0; i < n; ++i) { sink += __rdtsc(); BAR(); } }
  else if (!strcmp(w, "gate")) {
    for (long i = 0; i < n; ++i) {
      if (atomic_load_explicit(&g_on, memory_order_relaxed)) record(__rdtsc(), __rdtsc(), 1);
      BAR();
    }
  } else if (!strcmp(w, "scope")) {
    for (long i = 0; i < n; ++i) { uint64_t b = __rdtsc(); BAR(); record(b, __rdtsc(), 1); }
  } else if (!strcmp(w, "clock_gettime")) {
    for (long i = 0; i < n; ++i) { sink += (uint64_t)now(); BAR(); }
  } else return 2;
  double t1 = now();
  printf("%.4f %llu\n", (t1 - t0) / n, (unsigned long long)(sink & 1));
  return 0;
}
