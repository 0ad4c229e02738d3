/* The lock program threads take to append a row from inside a CUPTI callback (cupti_callbacks.c,
 * inject_callbacks.c).  Held for a row's copy or a pointer swap only, so it spins first; past
 * that it yields, then sleeps 50 us a try, so a holder descheduled mid-section (a drain on a
 * starved thread) is waited for without burning the program's core. */
#pragma once
#include <sched.h>
#include <time.h>

static inline void pp_spin_lock(volatile int* l) {
  for (int spins = 0; __atomic_test_and_set(l, __ATOMIC_ACQUIRE); ++spins) {
    if (spins < 64) continue;
    if (spins < 128) sched_yield();
    else {
      struct timespec ts = {0, 50000};
      nanosleep(&ts, NULL);
    }
  }
}
static inline int pp_spin_trylock(volatile int* l) { return !__atomic_test_and_set(l, __ATOMIC_ACQUIRE); }
static inline void pp_spin_unlock(volatile int* l) { __atomic_clear(l, __ATOMIC_RELEASE); }
