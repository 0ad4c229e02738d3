/* Shared between cupti_drain.c (activity buffers) and cupti_callbacks.c (launch-call
 * callbacks): the column tables both fill and the functions one calls in the other. */
#pragma once
#include <cupti.h>
#include <stdint.h>
#include <time.h>

#define MAXCOLS 14

typedef struct {
  int64_t* col[MAXCOLS];
  int64_t n, cap;
} Table;

/* time.time_ns()'s clock, CUPTI's default: launch-call rows and CUPTI's records on one clock */
static inline uint64_t pp_realtime_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

/* Room for one more row (doubling); 0, or -1 when out of memory. */
int pp_table_grow(Table* t, int ncols);

/* cupti_callbacks.c */
typedef CUptiResult (*push_fn_t)(CUpti_ExternalCorrelationKind, uint64_t);
typedef CUptiResult (*pop_fn_t)(CUpti_ExternalCorrelationKind, uint64_t*);
void pp_cb_bind(void* lib, push_fn_t push, pop_fn_t pop);
/* Append what the callbacks recorded since the last move to `dst`: table 0 the launch calls'
 * op ids (correlation, external id, as K_EXTERNAL), 1 the calls (7 columns as K_API), 2 the
 * sync calls (5 columns as K_SYNC). */
void pp_cb_move(int table, Table* dst);
CUptiResult CUPTIAPI pp_tls_push(CUpti_ExternalCorrelationKind kind, uint64_t id);
CUptiResult CUPTIAPI pp_tls_pop(CUpti_ExternalCorrelationKind kind, uint64_t* id);
