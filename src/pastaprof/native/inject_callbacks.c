/* API calls and synchronizations of native programs through CUPTI's callback API.  Part of the
 * injection library (inject.c).
 *
 * An enabled activity kind costs every kernel launch, even one that never makes a record of
 * that kind: on the H100's launch-bound loop (100,000 empty kernels) kernel records alone cost
 * 1.06x of bare, kernels + RUNTIME/DRIVER activity records 1.31x, + SYNCHRONIZATION 1.56x, +
 * MEMCPY 1.22x, everything 1.66x.  So by default (the "callbacks" mechanism):
 *   - the kept API calls (pp_api_kept) are CUPTI callbacks on their cbids, not activity
 *     records: at the outermost call's ENTER its start goes into CUPTI's per-call
 *     correlationData (a thread-local nesting count: the runtime calls the driver inside, and
 *     the kernel's correlation id is the outer call's, as in activity records); at its EXIT a
 *     row (start, end, thread, correlation id, cbid) goes into an in-memory table;
 *   - synchronizations come from the same callbacks (pp_sync_type: the SYNCHRONIZATION kind's
 *     types), with the stream from cuptiGetStreamIdEx for stream syncs and stream waits;
 *   - MEMCPY, MEMSET and MEMORY2 are enabled at the ENTER of the first call that can make one
 *     (its own record is still taken: the kind is on before the work is issued), MARKER at the
 *     first NVTX call (InitializeInjectionNvtx2, inject.c).
 * Times are CLOCK_REALTIME ns (pp_now_ns), the clock of CUPTI's activity timestamps.  Program
 * threads only take a spinlock for a row's copy; the rows become PP_API / PP_SYNC records
 * (pp_cb_drain, under inject.c's lock) where activity records are written: each completed
 * buffer, the flusher thread every PASTAPROF_FLUSH_MS, exit, and SIGTERM/SIGINT/SIGHUP/SIGABRT.
 *
 * CUPTI takes one subscriber per process: this one, whose callback also serves the resource
 * domain (--uvm's context-created: inject_cupti.c).  Where the subscriber cannot be had
 * (nsys or ncu holds the slot) or PASTAPROF_NATIVE_API_MECHANISM=activity, everything is as
 * before (the "activity" mechanism): per-cbid RUNTIME/DRIVER activity records and every kind
 * enabled at start.  The header's "api_mechanism" says which, and why. */
#define _GNU_SOURCE
#include <cupti.h>
#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "inject.h"
#include "inject_state.h"
#include "pp_spinlock.h"

char g_api_mechanism[300];
static int g_mech; /* 1 callbacks, 0 activity (or not decided) */
static int g_launch_records; /* hybrid: launch calls as per-cbid activity records, not callbacks */
static volatile int g_live; /* callbacks write rows (0 before the start and in a forked child) */
static unsigned char g_class[2][PP_MAX_CBID]; /* [driver][cbid]: PP_CB_* bits */
static CUpti_SubscriberHandle g_sub;
static int g_sub_result = -1; /* cuptiSubscribe's answer, once */
static int g_tid_system;      /* CUPTI's thread ids are gettid()'s, else pthread_self()'s */

static __typeof__(cuptiSubscribe)* p_subscribe;
static __typeof__(cuptiEnableCallback)* p_enable_cb;
static __typeof__(cuptiGetStreamIdEx)* p_stream_id;
static __typeof__(cuptiGetThreadIdType)* p_tid_type;

/* ---- what a call is ------------------------------------------------------------------------- */
/* The CUpti_ActivitySynchronizationType of a call's name (0: not a synchronization); *per_thread:
 * a _ptsz variant, whose stream handle is the per-thread default stream's. */
int pp_sync_type(const char* name, int* per_thread) {
  if (per_thread) *per_thread = name && strstr(name, "_pt") != NULL;
  if (!name) return 0;
  if (strstr(name, "StreamWaitEvent")) return CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_WAIT_EVENT;
  if (strstr(name, "EventSynchronize")) return CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_EVENT_SYNCHRONIZE;
  if (strstr(name, "StreamSynchronize")) return CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_SYNCHRONIZE;
  if (strstr(name, "DeviceSynchronize") || strstr(name, "CtxSynchronize") || strstr(name, "ThreadSynchronize"))
    return CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_CONTEXT_SYNCHRONIZE;
  return 0;
}

/* calls that can make a MEMORY2 record (allocations and frees, the driver's too: cuMemAlloc) */
static int memory_call(const char* name) {
  static const char* words[] = {"Malloc", "Free", "MemAlloc", "HostAlloc", "HostRegister", "MemCreate"};
  for (size_t i = 0; i < sizeof words / sizeof words[0]; ++i)
    if (strstr(name, words[i])) return 1;
  return 0;
}

/* The PP_CB_* class of a call, as PASTAPROF_NATIVE_KINDS and PASTAPROF_OFF ask. */
int pp_cb_class(const char* name) {
  if (!name) return 0;
  int c = 0, pt = 0, sync = pp_sync_type(name, &pt);
  if (!g_off_api && pp_kind_wanted("api") && pp_api_kept(name) && !(g_launch_records && strstr(name, "Launch")))
    c |= PP_CB_API;
  if (sync && pp_kind_wanted("sync")) c |= sync << 1 | (pt ? PP_CB_PT : 0);
  if (strstr(name, "Memcpy") && pp_kind_wanted("memcpy")) c |= PP_CB_MEMCPY;
  if (strstr(name, "Memset") && pp_kind_wanted("memset")) c |= PP_CB_MEMSET;
  if (memory_call(name) && !g_off_memory && pp_kind_wanted("memory")) c |= PP_CB_MEMORY;
  return c;
}

#define CB_SIZE(driver) ((driver) ? CUPTI_DRIVER_TRACE_CBID_SIZE : CUPTI_RUNTIME_TRACE_CBID_SIZE)
#define CB_DOMAIN(driver) ((driver) ? CUPTI_CB_DOMAIN_DRIVER_API : CUPTI_CB_DOMAIN_RUNTIME_API)

/* Every cbid's class, by CUPTI's names: how many have one. */
static int classify_all(void) {
  int n = 0;
  memset(g_class, 0, sizeof g_class);
  for (int driver = 0; driver < 2; ++driver)
    for (int cbid = 1; cbid < CB_SIZE(driver) && cbid < PP_MAX_CBID; ++cbid)
      n += (g_class[driver][cbid] = (unsigned char)pp_cb_class(pp_cb_name(driver, (uint32_t)cbid))) != 0;
  return n;
}

/* ---- the kinds enabled at their first call ---------------------------------------------------- */
enum { LAZY_MEMCPY, LAZY_MEMSET, LAZY_MEMORY, LAZY_MARKER, NLAZY };
static const CUpti_ActivityKind LAZY_KIND[NLAZY] = {CUPTI_ACTIVITY_KIND_MEMCPY, CUPTI_ACTIVITY_KIND_MEMSET,
                                                    CUPTI_ACTIVITY_KIND_MEMORY2, CUPTI_ACTIVITY_KIND_MARKER};
static const char* LAZY_NAME[NLAZY] = {"memcpy", "memset", "memory", "marker"};
static int g_lazy[NLAZY];        /* 0 not yet, 1 being enabled, 2 done */
static int g_lazy_result[NLAZY]; /* cuptiActivityEnable's answer */
static __thread int t_enabling;  /* this thread is inside cuptiActivityEnable */

/* Once per kind; a second thread waits until it is on, so its own call's record is taken. */
static void lazy_enable(int k) {
  if (__atomic_load_n(&g_lazy[k], __ATOMIC_ACQUIRE) == 2 || t_enabling) return;
  int expected = 0;
  if (__atomic_compare_exchange_n(&g_lazy[k], &expected, 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
    t_enabling = 1;
    g_lazy_result[k] = p_enable ? (int)p_enable(LAZY_KIND[k]) : (int)CUPTI_ERROR_NOT_INITIALIZED;
    t_enabling = 0;
    __atomic_store_n(&g_lazy[k], 2, __ATOMIC_RELEASE);
    return;
  }
  while (__atomic_load_n(&g_lazy[k], __ATOMIC_ACQUIRE) != 2) sched_yield();
}

void pp_cb_nvtx(void) {
  if (g_mech == 1 && pp_kind_wanted("marker")) lazy_enable(LAZY_MARKER);
}

/* ---- the rows: chunks under a spinlock, swapped out by the drain ------------------------------ */
typedef struct {
  int64_t start, end, tid, stream;
  uint32_t corr;
  uint16_t cbid;
  uint8_t driver, cls;
} CbRow;
#define CB_CHUNK 8192
#define CB_MAX_CHUNKS 512 /* 4M rows (160 MB) not yet drained: later rows are counted as dropped */
#define CB_KEEP_FREE 16
typedef struct CbChunk {
  struct CbChunk* next;
  int n;
  CbRow row[CB_CHUNK];
} CbChunk;
static CbChunk *g_head, *g_tail, *g_free;
static int g_nchunks, g_nfree;
static int64_t g_dropped;
static volatile int g_lock;

static inline void lock(void) { pp_spin_lock(&g_lock); }
static inline int trylock(void) { return pp_spin_trylock(&g_lock); }
static inline void unlock(void) { pp_spin_unlock(&g_lock); }

static void put(const CbRow* r) {
  lock();
  CbChunk* c = g_tail;
  if (!c || c->n == CB_CHUNK) {
    c = g_free;
    if (c) {
      g_free = c->next;
      g_nfree--;
    } else if (g_nchunks < CB_MAX_CHUNKS && (c = (CbChunk*)malloc(sizeof *c)) != NULL) {
      g_nchunks++;
    }
    if (!c) {
      g_dropped++;
      unlock();
      return;
    }
    c->next = NULL;
    c->n = 0;
    if (g_tail) g_tail->next = c;
    else g_head = c;
    g_tail = c;
  }
  c->row[c->n++] = *r;
  unlock();
}

/* chunks back to the free list (a few kept: no fresh pages for every drain); under the lock */
static void recycle(CbChunk* list) {
  while (list) {
    CbChunk* next = list->next;
    if (g_nfree < CB_KEEP_FREE) {
      list->next = g_free;
      g_free = list;
      g_nfree++;
    } else {
      free(list);
      g_nchunks--;
    }
    list = next;
  }
}

static void write_row(const CbRow* c) {
  int64_t* r;
  int sync = (c->cls & PP_CB_SYNC) >> 1;
  if ((c->cls & PP_CB_API) && (r = pp_row(PP_API)) != NULL) {
    int64_t v[] = {c->start, c->end, g_stat[PP_STAT_PID], c->tid, c->corr, c->cbid, c->driver,
                   pp_api_name(c->driver, c->cbid, pp_cb_name)};
    memcpy(r + 1, v, sizeof v);
  }
  if (sync && (r = pp_row(PP_SYNC)) != NULL) {
    int64_t v[] = {c->start, c->end, c->stream, c->corr, sync};
    memcpy(r + 1, v, sizeof v);
  }
  g_stat[PP_STAT_CB_ROWS]++;
}

void pp_cb_drain(int wait) {
  if (wait) lock();
  else if (!trylock()) return;
  CbChunk* list = g_head;
  g_head = g_tail = NULL;
  int64_t dropped = g_dropped;
  g_dropped = 0;
  unlock();
  g_stat[PP_STAT_CB_DROPPED] += dropped;
  g_stat[PP_STAT_DROPPED] += dropped;
  for (CbChunk* c = list; c; c = c->next)
    for (int i = 0; i < c->n; ++i) write_row(&c->row[i]);
  if (!list) return;
  if (wait) lock();
  else if (!trylock()) return; /* a dying process's last words: the chunks are left */
  recycle(list);
  unlock();
}

int64_t pp_cb_pending(void) {
  int64_t n = 0;
  lock();
  for (CbChunk* c = g_head; c; c = c->next) n += c->n;
  unlock();
  return n;
}

void pp_cb_fork(int phase) {
  if (phase == 0) {
    lock();
    return;
  }
  if (phase == 2) { /* the child: no rows, none recorded (CUDA is unusable there) */
    g_live = 0;
    recycle(g_head);
    g_head = g_tail = NULL;
    g_dropped = 0;
  }
  unlock();
}

/* ---- the callback ----------------------------------------------------------------------------- */
static __thread int t_depth;   /* calls with rows open on this thread */
static __thread int64_t t_tid;

static void CUPTIAPI on_callback(void* user, CUpti_CallbackDomain domain, CUpti_CallbackId cbid, const void* data) {
  (void)user;
  if (domain == CUPTI_CB_DOMAIN_RESOURCE) {
    if (cbid == CUPTI_CBID_RESOURCE_CONTEXT_CREATED && data) pp_uvm_context(((const CUpti_ResourceData*)data)->context);
    return;
  }
  if ((domain != CUPTI_CB_DOMAIN_RUNTIME_API && domain != CUPTI_CB_DOMAIN_DRIVER_API) || cbid >= PP_MAX_CBID) return;
  int driver = domain == CUPTI_CB_DOMAIN_DRIVER_API;
  unsigned cls = g_class[driver][cbid];
  const CUpti_CallbackData* d = (const CUpti_CallbackData*)data;
  int rows = cls & (PP_CB_API | PP_CB_SYNC);
  if (d->callbackSite == CUPTI_API_ENTER) {
    if (cls & PP_CB_MEMCPY) lazy_enable(LAZY_MEMCPY);
    if (cls & PP_CB_MEMSET) lazy_enable(LAZY_MEMSET);
    if (cls & PP_CB_MEMORY) lazy_enable(LAZY_MEMORY);
    if (rows) *d->correlationData = t_depth++ ? 0 : (uint64_t)pp_now_ns();
    return;
  }
  if (!rows) return;
  if (t_depth > 0) t_depth--;
  if (*d->correlationData == 0 || !g_live) return; /* nested in a call already recorded */
  CbRow r;
  r.start = (int64_t)*d->correlationData;
  r.end = pp_now_ns();
  if (!t_tid) t_tid = g_tid_system ? (int64_t)syscall(SYS_gettid) : (int64_t)(uint32_t)(uintptr_t)pthread_self();
  r.tid = t_tid;
  r.corr = d->correlationId;
  r.cbid = (uint16_t)cbid;
  r.driver = (uint8_t)driver;
  r.cls = (uint8_t)cls;
  r.stream = -1;
  int sync = (cls & PP_CB_SYNC) >> 1;
  if ((sync == CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_WAIT_EVENT ||
       sync == CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_SYNCHRONIZE) && p_stream_id && d->functionParams) {
    uint32_t id = 0;
    CUstream s = (CUstream) * (void* const*)d->functionParams;
    if (p_stream_id(d->context, s, (cls & PP_CB_PT) ? 1 : 0, &id) == CUPTI_SUCCESS) r.stream = (int64_t)(int32_t)id;
  }
  put(&r);
}

/* ---- start ------------------------------------------------------------------------------------ */
static void bind(void) {
  if (p_subscribe || !g_cupti) return;
  p_subscribe = (__typeof__(p_subscribe))dlsym(g_cupti, "cuptiSubscribe");
  p_enable_cb = (__typeof__(p_enable_cb))dlsym(g_cupti, "cuptiEnableCallback");
  p_stream_id = (__typeof__(p_stream_id))dlsym(g_cupti, "cuptiGetStreamIdEx");
  p_tid_type = (__typeof__(p_tid_type))dlsym(g_cupti, "cuptiGetThreadIdType");
}

int pp_cb_subscribe(void) {
  bind();
  if (g_sub_result < 0)
    g_sub_result = p_subscribe ? (int)p_subscribe(&g_sub, on_callback, NULL) : (int)CUPTI_ERROR_NOT_SUPPORTED;
  return g_sub_result;
}

int pp_cb_enable_resource(CUpti_CallbackId cbid) {
  return g_sub_result == 0 && p_enable_cb ? (int)p_enable_cb(1, g_sub, CUPTI_CB_DOMAIN_RESOURCE, cbid)
                                          : (int)CUPTI_ERROR_NOT_SUPPORTED;
}

int pp_cb_live(void) { return g_live; }

/* PASTAPROF_NATIVE_API_MECHANISM=hybrid, and this libcupti enables API records one call at a time */
static int hybrid_asked(void) {
  const char* m = getenv("PASTAPROF_NATIVE_API_MECHANISM");
  return m && strcmp(m, "hybrid") == 0 && p_enable_rt && p_enable_drv;
}

/* API calls as activity records, and why (in the run's status too: it costs more) */
static int use_activity(const char* why) {
  memset(g_class, 0, sizeof g_class);
  g_mech = 0;
  snprintf(g_api_mechanism, sizeof g_api_mechanism, "activity (%.250s)", why);
  size_t used = strlen(g_note);
  if (used + 3 < sizeof g_note)
    snprintf(g_note + used, sizeof g_note - used, "%sAPI calls and syncs as CUPTI activity records: %.250s",
             used ? "; " : "", why);
  return 0;
}

static void go_live(const char* mechanism) {
  g_mech = 1;
  snprintf(g_api_mechanism, sizeof g_api_mechanism, "%s", mechanism);
  __atomic_store_n(&g_live, 1, __ATOMIC_RELEASE);
}

/* After the kernel kind is enabled (pp_start_cupti): 1 when the callbacks take API calls,
 * synchronizations and the lazily enabled kinds, 0 when activity records must (everything
 * enabled now, as before). */
int pp_cb_start(void) {
  bind();
  const char* m = getenv("PASTAPROF_NATIVE_API_MECHANISM");
  if (m && strcmp(m, "activity") == 0) return use_activity("PASTAPROF_NATIVE_API_MECHANISM=activity");
  if (!p_subscribe || !p_enable_cb || !p_cb_name) return use_activity("this libcupti lacks the callback API");
  g_launch_records = hybrid_asked();
  int want = classify_all();
  if (want == 0) { /* PASTAPROF_NATIVE_KINDS=kernel: no callback at all */
    g_launch_records = 0;
    go_live("callbacks (none needed: no API, sync, memcpy, memset or memory kind asked for)");
    return 1;
  }
  int r = pp_cb_subscribe();
  if (r != CUPTI_SUCCESS) {
    char why[250];
    snprintf(why, sizeof why, "cuptiSubscribe: %.120s (%d): another CUPTI client (nsys, ncu) holds the slot?",
             pp_cupti_error((CUptiResult)r), r);
    return use_activity(why);
  }
  int n = 0, napi = 0, refused = 0, first = 0;
  for (int driver = 0; driver < 2; ++driver)
    for (int cbid = 1; cbid < CB_SIZE(driver) && cbid < PP_MAX_CBID; ++cbid) {
      if (!g_class[driver][cbid]) continue;
      r = (int)p_enable_cb(1, g_sub, CB_DOMAIN(driver), (CUpti_CallbackId)cbid);
      if (r == CUPTI_SUCCESS) {
        n++;
        napi += g_class[driver][cbid] & PP_CB_API;
        continue;
      }
      g_class[driver][cbid] = 0; /* never called back */
      if (!refused++) first = r;
    }
  if (n == 0) {
    char why[250];
    snprintf(why, sizeof why, "cuptiEnableCallback: %.120s (%d)", pp_cupti_error((CUptiResult)first), first);
    return use_activity(why);
  }
  CUpti_ActivityThreadIdType type = CUPTI_ACTIVITY_THREAD_ID_TYPE_DEFAULT; /* the activity records' thread ids */
  g_tid_system = p_tid_type && p_tid_type(&type) == CUPTI_SUCCESS && type == CUPTI_ACTIVITY_THREAD_ID_TYPE_SYSTEM;
  g_stat[PP_STAT_API_ENABLED] = napi;
  char line[200];
  if (refused)
    snprintf(line, sizeof line, "callbacks (%d of %d cbids refused: %.80s (%d))", refused, want,
             pp_cupti_error((CUptiResult)first), first);
  go_live(refused ? line : g_launch_records ? "hybrid" : "callbacks");
  return 1;
}

int pp_cb_launch_records(void) { return g_mech == 1 && g_launch_records; }

void pp_cb_meta(FILE* f) {
  if (!g_api_mechanism[0]) return;
  fputs(", \"api_mechanism\": ", f);
  pp_json_string(f, g_api_mechanism, strlen(g_api_mechanism));
  char lazy[300] = "";
  for (int k = 0; k < NLAZY; ++k) {
    if (__atomic_load_n(&g_lazy[k], __ATOMIC_ACQUIRE) != 2) continue;
    size_t used = strlen(lazy);
    snprintf(lazy + used, sizeof lazy - used, "%s%s %s", used ? "; " : "", LAZY_NAME[k],
             g_lazy_result[k] == CUPTI_SUCCESS ? "ok" : pp_cupti_error((CUptiResult)g_lazy_result[k]));
  }
  fputs(", \"lazy_kinds\": ", f);
  pp_json_string(f, lazy, strlen(lazy));
}

/* ---- for inject_selftest.c: the callbacks without CUPTI calling them ------------------------ */
/* a stream's id as the tests expect it: the handle's value (+1000 per-thread); 0xbad fails */
static CUptiResult CUPTIAPI test_stream_id(CUcontext ctx, CUstream s, uint8_t per_thread, uint32_t* id) {
  (void)ctx;
  if ((uintptr_t)s == 0xbad) return CUPTI_ERROR_INVALID_PARAMETER;
  *id = (uint32_t)(uintptr_t)s + (per_thread ? 1000u : 0u);
  return CUPTI_SUCCESS;
}

/* Classes by the bound libcupti's names, callbacks live: how many cbids have a class, -1 without names. */
int pp_cb_test_live(void) {
  if (!p_cb_name) return -1;
  g_launch_records = hybrid_asked();
  int n = classify_all();
  p_stream_id = test_stream_id;
  go_live(g_launch_records ? "hybrid" : "callbacks");
  return n;
}

static int find_cbid(const char* name, int* driver) {
  for (*driver = 0; *driver < 2; ++*driver)
    for (int cbid = 1; cbid < CB_SIZE(*driver) && cbid < PP_MAX_CBID; ++cbid) {
      const char* n = pp_cb_name(*driver, (uint32_t)cbid);
      if (n && strcmp(n, name) == 0) return cbid;
    }
  return -1;
}

/* One call as CUPTI calls back: ENTER outer, [ENTER and EXIT inner], EXIT outer; stream: the
 * first parameter's handle.  0, or -1 when a name is not CUPTI's. */
int pp_cb_test_call(const char* outer, const char* inner, uint32_t corr, int64_t stream) {
  int od, id = 0, ocb = find_cbid(outer, &od), icb = inner ? find_cbid(inner, &id) : 0;
  if (ocb < 0 || icb < 0) return -1;
  void* params[4] = {(void*)(intptr_t)stream, NULL, NULL, NULL};
  uint64_t odata = 0, idata = 0;
  CUpti_CallbackData o, in;
  memset(&o, 0, sizeof o);
  o.functionParams = params;
  o.correlationId = corr;
  o.correlationData = &odata;
  o.callbackSite = CUPTI_API_ENTER;
  in = o;
  in.correlationData = &idata;
  in.correlationId = corr + 1;
  on_callback(NULL, CB_DOMAIN(od), (CUpti_CallbackId)ocb, &o);
  if (inner) {
    on_callback(NULL, CB_DOMAIN(id), (CUpti_CallbackId)icb, &in);
    in.callbackSite = CUPTI_API_EXIT;
    on_callback(NULL, CB_DOMAIN(id), (CUpti_CallbackId)icb, &in);
  }
  o.callbackSite = CUPTI_API_EXIT;
  on_callback(NULL, CB_DOMAIN(od), (CUpti_CallbackId)ocb, &o);
  return 0;
}
