/* Launch calls recorded through CUPTI's callback API, with the op they were made in.
 *
 * The activity API's RUNTIME/DRIVER records plus an EXTERNAL_CORRELATION record per call
 * cost ~1.8 us per kernel launch on the H200 (20,000 tiny launches 1.33x -> 1.11x of bare
 * without them; docs/benchmarks.md), more than the launch-call rows and op links are worth
 * to someone who leaves capture on.  Here a callback on the launch/copy/memset/sync cbids
 * only writes one row at the call's exit: its start (kept in CUPTI's per-call
 * correlationData at entry), end, thread, correlation id, and the id of the innermost op
 * of the calling thread -- a thread-local stack that the op observer pushes to and pops
 * from instead of CUPTI's external-correlation stack.  Kernels join through the
 * correlation id as before.
 *
 * Synchronizations come from the same callbacks: a sync call (cudaStreamSynchronize,
 * cudaDeviceSynchronize, cudaEventSynchronize, cudaStreamWaitEvent and their driver twins) also
 * writes a sync row (start, end, stream, correlation, type as CUPTI's SYNCHRONIZATION record),
 * so that kind is not enabled: enabled, it made every kernel launch dearer although it records
 * only these calls (H100: 100,000 empty launches 1.06x of bare with kernel records, 1.56x with
 * SYNCHRONIZATION records on as well; docs/benchmarks.md).
 *
 * The callback API takes CUPTI's single subscriber slot (driver 580).  Before a foreign
 * client (torch.profiler) starts, Python unsubscribes and falls back for the rest of the
 * process to activity records: then pp_tls_push/pop forward to CUPTI as well. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "cupti_drain.h"
#include "pp_spinlock.h"

typedef CUptiResult (*subscribe_fn_t)(CUpti_SubscriberHandle*, CUpti_CallbackFunc, void*);
typedef CUptiResult (*unsubscribe_fn_t)(CUpti_SubscriberHandle);
typedef CUptiResult (*enable_cb_fn_t)(uint32_t, CUpti_SubscriberHandle, CUpti_CallbackDomain, CUpti_CallbackId);
typedef CUptiResult (*stream_id_fn_t)(CUcontext, CUstream, uint8_t, uint32_t*);

static push_fn_t p_push;
static pop_fn_t p_pop;
static subscribe_fn_t p_subscribe;
static unsubscribe_fn_t p_unsubscribe;
static enable_cb_fn_t p_enable_cb;
static stream_id_fn_t p_stream_id;
static CUpti_SubscriberHandle g_sub;
static volatile int g_forward = 1; /* push/pop also go to CUPTI (activity records link ops) */
static int64_t g_pid;
static int64_t g_calls, g_dropped;
/* the cbids enabled on g_sub, so the session's gate can switch exactly those off and on */
#define MAX_CBIDS 1024
static int g_cbid[MAX_CBIDS], g_cbid_driver[MAX_CBIDS], g_ncbid;

/* per (driver, cbid): 0, or the sync call's CUpti_ActivitySynchronizationType (low 4 bits) and
 * SYNC_PER_THREAD for the per-thread-default-stream variants (_ptsz); set by Python */
#define SYNC_CBIDS 4096
#define SYNC_PER_THREAD 16
static unsigned char g_sync_type[2][SYNC_CBIDS];
static volatile int g_sync_on; /* sync rows from the callbacks (the SYNCHRONIZATION kind is off) */

/* the innermost ops of this thread (deeper nesting is counted, not stored) */
#define DEPTH 64
static __thread uint64_t t_ext[DEPTH];
static __thread int t_depth;
static __thread int64_t t_tid;
/* launch calls open on this thread: the runtime makes driver calls inside its own (one row for
 * both; the kernel's correlation id is the outer call's, as in CUPTI's activity records) */
static __thread int t_in_api;

/* rows: [0] external (correlation, external id), [1] api (start, end, pid, tid, correlation,
 * cbid, is_driver), [2] sync (start, end, stream, correlation, type); each has a spare that
 * pp_cb_move swaps in, so a program thread waits only for a pointer swap, and all keep their
 * capacity (no regrowth, no fresh pages per drain) */
#define CB_TABLES 3
static const int CB_COLS[CB_TABLES] = {2, 7, 5};
static Table g_cb[CB_TABLES], g_cb_spare[CB_TABLES];
static volatile int g_lock;

static inline void lock(void) { pp_spin_lock(&g_lock); }
static inline void unlock(void) { pp_spin_unlock(&g_lock); }

CUptiResult CUPTIAPI pp_tls_push(CUpti_ExternalCorrelationKind kind, uint64_t id) {
  if (t_depth < DEPTH) t_ext[t_depth] = id;
  t_depth++;
  return g_forward && p_push ? p_push(kind, id) : CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI pp_tls_pop(CUpti_ExternalCorrelationKind kind, uint64_t* id) {
  if (t_depth > 0) {
    t_depth--;
    if (id && t_depth < DEPTH) *id = t_ext[t_depth];
  }
  return g_forward && p_pop ? p_pop(kind, id) : CUPTI_SUCCESS;
}

/* The stream a sync call names (its first parameter, in every one of these calls' parameter
 * structs), as CUPTI's stream id; -1 for context and event syncs, or when CUPTI cannot say. */
static int64_t sync_stream(const CUpti_CallbackData* d, int sync) {
  int type = sync & (SYNC_PER_THREAD - 1);
  if ((type != 2 && type != 3) || !p_stream_id || !d->functionParams) return -1;
  CUstream stream = *(CUstream const*)d->functionParams;
  uint32_t id = 0;
  if (p_stream_id(d->context, stream, (sync & SYNC_PER_THREAD) ? 1 : 0, &id) != CUPTI_SUCCESS) return -1;
  return (int64_t)id;
}

/* Under the lock: one sync row (the stream was looked up before it was taken). */
static void sync_row(int64_t stream, int sync, int64_t start, int64_t end, int64_t corr) {
  Table* t = &g_cb[2];
  if (pp_table_grow(t, 5) != 0) {
    g_dropped++;
    return;
  }
  int64_t n = t->n++;
  t->col[0][n] = start;
  t->col[1][n] = end;
  t->col[2][n] = stream;
  t->col[3][n] = corr;
  t->col[4][n] = sync & (SYNC_PER_THREAD - 1);
}

static void CUPTIAPI on_api(void* userdata, CUpti_CallbackDomain domain, CUpti_CallbackId cbid, const void* data) {
  (void)userdata;
  const CUpti_CallbackData* d = (const CUpti_CallbackData*)data;
  if (d->callbackSite == CUPTI_API_ENTER) {
    *d->correlationData = t_in_api++ ? 0 : pp_realtime_ns();
    return;
  }
  if (t_in_api > 0) t_in_api--;
  if (*d->correlationData == 0) return; /* nested in a call already recorded */
  int64_t end = (int64_t)pp_realtime_ns();
  if (!t_tid) t_tid = (int64_t)syscall(SYS_gettid);
  uint64_t ext = (t_depth > 0 && t_depth <= DEPTH) ? t_ext[t_depth - 1] : 0;
  int64_t corr = (int64_t)d->correlationId;
  int driver = domain == CUPTI_CB_DOMAIN_DRIVER_API;
  int sync = g_sync_on && cbid < SYNC_CBIDS ? g_sync_type[driver][cbid] : 0;
  int64_t stream = sync ? sync_stream(d, sync) : -1;
  lock();
  g_calls++;
  Table* a = &g_cb[1];
  if (pp_table_grow(a, 7) == 0) {
    int64_t n = a->n++;
    a->col[0][n] = (int64_t)*d->correlationData;
    a->col[1][n] = end;
    a->col[2][n] = g_pid;
    a->col[3][n] = t_tid;
    a->col[4][n] = corr;
    a->col[5][n] = (int64_t)cbid;
    a->col[6][n] = driver;
  } else {
    g_dropped++;
  }
  Table* e = &g_cb[0];
  if (ext && pp_table_grow(e, 2) == 0) {
    int64_t n = e->n++;
    e->col[0][n] = corr;
    e->col[1][n] = (int64_t)ext;
  }
  if (sync) sync_row(stream, sync, (int64_t)*d->correlationData, end, corr);
  unlock();
}

void pp_cb_bind(void* lib, push_fn_t push, pop_fn_t pop) {
  p_push = push;
  p_pop = pop;
  p_subscribe = (subscribe_fn_t)dlsym(lib, "cuptiSubscribe");
  p_unsubscribe = (unsubscribe_fn_t)dlsym(lib, "cuptiUnsubscribe");
  p_enable_cb = (enable_cb_fn_t)dlsym(lib, "cuptiEnableCallback");
  p_stream_id = (stream_id_fn_t)dlsym(lib, "cuptiGetStreamIdEx");
  g_pid = (int64_t)getpid();
}

void pp_cb_move(int k, Table* dst) {
  if (k < 0 || k >= CB_TABLES) return;
  int nc = CB_COLS[k];
  lock();
  Table t = g_cb[k];
  g_cb[k] = g_cb_spare[k];
  g_cb_spare[k] = t;
  unlock();
  Table* s = &g_cb_spare[k];
  for (int64_t i = 0; i < s->n; ++i) {
    if (pp_table_grow(dst, nc) != 0) break;
    for (int c = 0; c < nc; ++c) dst->col[c][dst->n] = s->col[c][i];
    dst->n++;
  }
  s->n = 0;
}

/* ---- called from Python (ctypes) -------------------------------------------------- */

/* Subscribe (0), or the CUPTI error: e.g. CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED
 * (39) when torch.profiler, nsys or ncu already holds the slot. */
int pp_cupti_callbacks_on(void) {
  if (!p_subscribe || !p_enable_cb || !p_unsubscribe) return -1;
  if (g_sub) return 0;
  CUptiResult r = p_subscribe(&g_sub, on_api, NULL);
  if (r != CUPTI_SUCCESS) {
    g_sub = NULL;
    return (int)r;
  }
  g_forward = 0;
  return 0;
}

/* Record calls of one cbid (driver: driver API, else runtime API); 0 or the CUPTI error. */
int pp_cupti_callback_cbid(int driver, int cbid) {
  if (!g_sub) return -1;
  int r = (int)p_enable_cb(1, g_sub, driver ? CUPTI_CB_DOMAIN_DRIVER_API : CUPTI_CB_DOMAIN_RUNTIME_API,
                           (CUpti_CallbackId)cbid);
  if (r == CUPTI_SUCCESS && g_ncbid < MAX_CBIDS) {
    g_cbid[g_ncbid] = cbid;
    g_cbid_driver[g_ncbid++] = driver;
  }
  return r;
}

/* A sync call: its CUpti_ActivitySynchronizationType (1 event, 2 stream wait event, 3 stream,
 * 4 context), per_thread for the per-thread-default-stream variants; type 0 forgets it. */
void pp_cupti_sync_cbid(int driver, int cbid, int type, int per_thread) {
  if (cbid < 0 || cbid >= SYNC_CBIDS || type < 0 || type >= SYNC_PER_THREAD) return;
  g_sync_type[driver ? 1 : 0][cbid] = (unsigned char)(type ? type | (per_thread ? SYNC_PER_THREAD : 0) : 0);
}

/* Sync rows from the callbacks on (1) or off (0: CUPTI's SYNCHRONIZATION records instead). */
void pp_cupti_sync_rows(int on) { g_sync_on = on; }

/* The session's gate at the source: switch the enabled cbids' callbacks off (open=0) or back
 * on, so launches outside the selected steps and ranges pay no callback at all.  0, or the
 * first CUPTI error. */
int pp_cupti_callbacks_gate(int open) {
  if (!g_sub) return 0;
  int first = 0;
  for (int i = 0; i < g_ncbid; ++i) {
    int r = (int)p_enable_cb(open ? 1 : 0, g_sub,
                             g_cbid_driver[i] ? CUPTI_CB_DOMAIN_DRIVER_API : CUPTI_CB_DOMAIN_RUNTIME_API,
                             (CUpti_CallbackId)g_cbid[i]);
    if (r != CUPTI_SUCCESS && !first) first = r;
  }
  return first;
}

/* Give the subscriber slot back (before a foreign client); from now on push/pop forward. */
int pp_cupti_callbacks_off(void) {
  g_forward = 1;
  g_sync_on = 0;
  if (!g_sub) return 0;
  CUptiResult r = p_unsubscribe(g_sub);
  g_sub = NULL;
  g_ncbid = 0;
  return (int)r;
}

/* One call of (driver, cbid) as CUPTI would report it, entry then exit, through the same
 * callback: lets tests on a machine without a GPU check the rows it writes. */
void pp_cupti_callback_replay(int driver, int cbid, uint32_t correlation, void* params) {
  uint64_t data = 0;
  CUpti_CallbackData d = {0};
  d.functionParams = params;
  d.correlationData = &data;
  d.correlationId = correlation;
  CUpti_CallbackDomain domain = driver ? CUPTI_CB_DOMAIN_DRIVER_API : CUPTI_CB_DOMAIN_RUNTIME_API;
  d.callbackSite = CUPTI_API_ENTER;
  on_api(NULL, domain, (CUpti_CallbackId)cbid, &d);
  d.callbackSite = CUPTI_API_EXIT;
  on_api(NULL, domain, (CUpti_CallbackId)cbid, &d);
}

int64_t pp_cupti_callback_stat(int i) {
  lock();
  int64_t v = i == 0 ? g_calls : i == 1 ? g_dropped : (int64_t)(g_sub != NULL);
  unlock();
  return v;
}

/* fork(): rows belong to the parent; the child starts with none, its own pid, and a free lock */
static void fork_prepare(void) { lock(); }
static void fork_parent(void) { unlock(); }
static void fork_child(void) {
  for (int k = 0; k < CB_TABLES; ++k) g_cb[k].n = g_cb_spare[k].n = 0;
  g_pid = (int64_t)getpid();
  unlock();
}
__attribute__((constructor)) static void install_fork_handlers(void) {
  pthread_atfork(fork_prepare, fork_parent, fork_child);
}
