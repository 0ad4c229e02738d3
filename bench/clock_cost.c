/* What one clock read costs on this host: clock_gettime(CLOCK_REALTIME / MONOTONIC) (the
 * op observer and the CUPTI callbacks read CLOCK_REALTIME twice per op or launch) against the
 * TSC (rdtsc, what torch.profiler's approximate clock reads).  In a VM whose clocksource has no
 * vDSO path, clock_gettime is a system call.
 *     gcc -O2 bench/clock_cost.c -o /tmp/clock_cost && /tmp/clock_cost */
#include <stdint.h>
#include <stdio.h>
#include <time.h>
#include <x86intrin.h>

static double ns_per(clockid_t id, long n) {
  struct timespec a, b, t;
  clock_gettime(CLOCK_MONOTONIC, &a);
  for (long i = 0; i < n; ++i) clock_gettime(id, &t);
  clock_gettime(CLOCK_MONOTONIC, &b);
  return ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / n;
}

int main(void) {
  const long n = 2000000;
  struct timespec a, b;
  volatile uint64_t sink = 0;
  clock_gettime(CLOCK_MONOTONIC, &a);
  for (long i = 0; i < n; ++i) sink += __rdtsc();
  clock_gettime(CLOCK_MONOTONIC, &b);
  double tsc = ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / n;
  printf("clock_gettime REALTIME %.1f ns, MONOTONIC %.1f ns, rdtsc %.1f ns\n", ns_per(CLOCK_REALTIME, n),
         ns_per(CLOCK_MONOTONIC, n), tsc);
  return (int)(sink & 0);
}
