/* pastaprof's CUPTI activity-buffer drain: records decoded in C into columns.
 *
 * cupti-python hands each completed buffer to Python as a list of record objects,
 * ~1-2 us per record on CUPTI's worker thread, which competes with the profiled
 * program for the GIL.  Here the buffer callbacks are C: records are appended to
 * int64 column arrays under a mutex, and Python takes whole columns at each flush.
 *
 * The functions come from the libcupti already loaded in the process (torch's,
 * found by pastaprof through /proc/self/maps and opened with RTLD_NOLOAD), so no
 * second copy is ever loaded.  cupti-python still enables kinds, filters API cbids
 * and flushes; this file only registers the buffer callbacks and decodes.
 */
#include <cupti_activity.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cupti_drain.h"
#include "uvm_counters.h"

enum { K_KERNEL, K_MEMCPY, K_MEMSET, K_SYNC, K_API, K_EXTERNAL, K_MEMORY, K_POOL, K_UVM, K_COUNT };
static const int NCOLS[K_COUNT] = {14, 7, 6, 5, 7, 2, 10, 10, 9};

static Table g_rows[K_COUNT], g_taken[K_COUNT];
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static size_t g_buffer_bytes = 8u << 20;
static char g_error[256];

/* statistics: 0 records, 1 kernels seen, 2 dropped, 3 buffers completed, 4 decode ns, 5 buffers requested */
static int64_t g_stat[8];

/* API records kept per domain (0 runtime, 1 driver) and cbid; default: keep */
#define MAX_CBID 4096
static unsigned char g_drop_api[2][MAX_CBID];

/* correlation id -> external id (CUSTOM2), a ring indexed by correlation id */
#define EXT_SLOTS (1u << 20)
static uint32_t* g_ext_corr;
static uint64_t* g_ext_id;
static int g_ext_kind = CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM2;

/* interned kernel names: CUPTI shares one name pointer per kernel */
static char** g_names;
static int64_t g_nnames, g_capnames;
static const char** g_name_ptr; /* open-addressing table of pointers -> id */
static int32_t* g_name_id;
#define NAME_SLOTS (1u << 16)

typedef CUptiResult (*next_fn_t)(uint8_t*, size_t, CUpti_Activity**);
typedef CUptiResult (*reg_fn_t)(CUpti_BuffersCallbackRequestFunc, CUpti_BuffersCallbackCompleteFunc);
typedef CUptiResult (*dropped_fn_t)(CUcontext, uint32_t, size_t*);
typedef CUptiResult (*uvm_cfg_fn_t)(CUpti_ActivityUnifiedMemoryCounterConfig*, uint32_t);
typedef CUptiResult (*result_str_fn_t)(CUptiResult, const char**);
typedef CUptiResult (*set_attr_fn_t)(CUpti_ActivityAttribute, size_t*, void*);
typedef CUptiResult (*ts_cb_fn_t)(CUpti_TimestampCallbackFunc);
static next_fn_t p_get_next;
static reg_fn_t p_register;
static dropped_fn_t p_dropped;
static push_fn_t p_push;
static pop_fn_t p_pop;
static uvm_cfg_fn_t p_uvm_cfg;
static result_str_fn_t p_result_str;
static set_attr_fn_t p_set_attr;
static ts_cb_fn_t p_ts_cb;

/* The buffers we handed to CUPTI.  After a foreign client (Kineto) CUPTI may complete, through
 * our callback, buffers that client allocated: their records are decoded, but only ours are
 * freed (freeing the client's would be a double free when it cleans up). */
#define OWN_SLOTS 4096
static uint8_t* g_own[OWN_SLOTS];
static pthread_mutex_t g_own_mu = PTHREAD_MUTEX_INITIALIZER;

static int own_add(uint8_t* p) {
  pthread_mutex_lock(&g_own_mu);
  for (int i = 0; i < OWN_SLOTS; ++i)
    if (!g_own[i]) {
      g_own[i] = p;
      pthread_mutex_unlock(&g_own_mu);
      return 1;
    }
  pthread_mutex_unlock(&g_own_mu);
  return 0;
}

static int own_take(uint8_t* p) {
  pthread_mutex_lock(&g_own_mu);
  for (int i = 0; i < OWN_SLOTS; ++i)
    if (g_own[i] == p) {
      g_own[i] = NULL;
      pthread_mutex_unlock(&g_own_mu);
      return 1;
    }
  pthread_mutex_unlock(&g_own_mu);
  return 0;
}

int pp_table_grow(Table* t, int ncols) {
  if (t->n < t->cap) return 0;
  int64_t cap = t->cap ? t->cap * 2 : 4096;
  for (int c = 0; c < ncols; ++c) {
    int64_t* p = (int64_t*)realloc(t->col[c], (size_t)cap * sizeof(int64_t));
    if (!p) return -1;
    t->col[c] = p;
  }
  t->cap = cap;
  return 0;
}

/* Kernel names as people read them (CUPTI gives the mangled symbol; Kineto and torch.profiler
 * show it demangled): g_names keeps the mangled string for the table's lookups, g_display
 * the readable one for the events. */
extern char* __cxa_demangle(const char* mangled, char* buf, size_t* len, int* status);
static char** g_display;

static char* readable(const char* name) {
  int status = 0;
  char* d = (name[0] == '_' && name[1] == 'Z') ? __cxa_demangle(name, NULL, NULL, &status) : NULL;
  return (status == 0 && d) ? d : strdup(name);
}

static int32_t name_id(const char* name) {
  if (!name) return -1;
  uint64_t h = (uint64_t)(uintptr_t)name;
  h ^= h >> 17;
  h *= 0x9e3779b97f4a7c15ULL;
  for (uint32_t i = 0; i < NAME_SLOTS; ++i) {
    uint32_t s = (uint32_t)((h + i) & (NAME_SLOTS - 1));
    if (g_name_ptr[s] == name && strcmp(g_names[g_name_id[s]], name) == 0) return g_name_id[s];
    if (g_name_ptr[s] == NULL) {
      if (g_nnames == g_capnames) {
        int64_t cap = g_capnames ? g_capnames * 2 : 1024;
        char** p = (char**)realloc(g_names, (size_t)cap * sizeof(char*));
        if (!p) return -1;
        g_names = p;
        char** q = (char**)realloc(g_display, (size_t)cap * sizeof(char*));
        if (!q) return -1;
        g_display = q;
        g_capnames = cap;
      }
      g_names[g_nnames] = strdup(name);
      g_display[g_nnames] = readable(name);
      g_name_ptr[s] = name;
      g_name_id[s] = (int32_t)g_nnames;
      return (int32_t)g_nnames++;
    }
  }
  return -1; /* table full: 65k distinct kernel name pointers */
}

#define ROW(kind, ...)                                                   \
  do {                                                                   \
    Table* t = &g_rows[kind];                                            \
    if (pp_table_grow(t, NCOLS[kind]) == 0) {                                     \
      int64_t v[] = {__VA_ARGS__};                                       \
      for (int c = 0; c < NCOLS[kind]; ++c) t->col[c][t->n] = v[c];      \
      t->n++;                                                            \
    } else {                                                             \
      g_stat[2]++;                                                       \
    }                                                                    \
  } while (0)

static void decode(CUpti_Activity* r) {
  g_stat[0]++;
  switch (r->kind) {
    case CUPTI_ACTIVITY_KIND_KERNEL:
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
      CUpti_ActivityKernel10* k = (CUpti_ActivityKernel10*)r;
      g_stat[1]++;
      ROW(K_KERNEL, (int64_t)k->start, (int64_t)k->end, k->deviceId, k->streamId, k->correlationId,
          name_id(k->name), k->gridX, k->gridY, k->gridZ, k->blockX, k->blockY, k->blockZ, k->registersPerThread,
          (int64_t)k->staticSharedMemory + (int64_t)k->dynamicSharedMemory);
      break;
    }
    case CUPTI_ACTIVITY_KIND_MEMCPY: {
      CUpti_ActivityMemcpy6* m = (CUpti_ActivityMemcpy6*)r;
      ROW(K_MEMCPY, (int64_t)m->start, (int64_t)m->end, m->deviceId, m->streamId, m->correlationId,
          (int64_t)m->bytes, m->copyKind);
      break;
    }
    case CUPTI_ACTIVITY_KIND_MEMSET: {
      CUpti_ActivityMemset4* m = (CUpti_ActivityMemset4*)r;
      ROW(K_MEMSET, (int64_t)m->start, (int64_t)m->end, m->deviceId, m->streamId, m->correlationId,
          (int64_t)m->bytes);
      break;
    }
    case CUPTI_ACTIVITY_KIND_SYNCHRONIZATION: {
      CUpti_ActivitySynchronization2* s = (CUpti_ActivitySynchronization2*)r;
      /* CUPTI_SYNCHRONIZATION_INVALID_VALUE (context and event syncs) as -1, as the callbacks write it */
      ROW(K_SYNC, (int64_t)s->start, (int64_t)s->end, (int64_t)(int32_t)s->streamId, s->correlationId, s->type);
      break;
    }
    case CUPTI_ACTIVITY_KIND_RUNTIME:
    case CUPTI_ACTIVITY_KIND_DRIVER: {
      CUpti_ActivityAPI* a = (CUpti_ActivityAPI*)r;
      int driver = r->kind == CUPTI_ACTIVITY_KIND_DRIVER;
      if (a->cbid < MAX_CBID && g_drop_api[driver][a->cbid]) break;
      ROW(K_API, (int64_t)a->start, (int64_t)a->end, a->processId, a->threadId, a->correlationId, a->cbid, driver);
      break;
    }
    case CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION: {
      CUpti_ActivityExternalCorrelation* e = (CUpti_ActivityExternalCorrelation*)r;
      if ((int)e->externalKind != g_ext_kind) break;
      uint32_t slot = e->correlationId & (EXT_SLOTS - 1);
      g_ext_corr[slot] = e->correlationId;
      g_ext_id[slot] = e->externalId;
      ROW(K_EXTERNAL, e->correlationId, (int64_t)e->externalId);
      break;
    }
    case CUPTI_ACTIVITY_KIND_MEMORY2: {
      /* cudaMalloc/cudaFree and friends (segments, managed, pinned), not individual tensors */
      CUpti_ActivityMemory4* m = (CUpti_ActivityMemory4*)r;
      ROW(K_MEMORY, (int64_t)m->timestamp, m->deviceId, m->streamId, m->correlationId, (int64_t)m->address,
          (int64_t)m->bytes, m->memoryKind, m->memoryOperationType, m->processId, m->isAsync);
      break;
    }
    case CUPTI_ACTIVITY_KIND_MEMORY_POOL: {
      CUpti_ActivityMemoryPool3* m = (CUpti_ActivityMemoryPool3*)r;
      ROW(K_POOL, (int64_t)m->timestamp, m->deviceId, m->correlationId, (int64_t)m->address, (int64_t)m->size,
          (int64_t)m->utilizedSize, (int64_t)m->releaseThreshold, m->memoryPoolType, m->memoryPoolOperationType,
          m->isManagedPool);
      break;
    }
    case CUPTI_ACTIVITY_KIND_UNIFIED_MEMORY_COUNTER: {
      CUpti_ActivityUnifiedMemoryCounter3* u = (CUpti_ActivityUnifiedMemoryCounter3*)r;
      ROW(K_UVM, (int64_t)u->start, (int64_t)u->end, u->counterKind, (int64_t)u->value, (int64_t)u->address,
          (int64_t)(int32_t)u->srcId, (int64_t)(int32_t)u->dstId, u->streamId, u->flags);
      break;
    }
    default:
      break;
  }
}

/* Completed buffers are kept for reuse (a few): a fresh 8 MB buffer is new memory whose
 * pages fault in as CUPTI writes records -- some of them on the program's thread, which
 * writes its API records. */
#define SPARE_SLOTS 4
static uint8_t* g_spare[SPARE_SLOTS];
static int g_nspare;

static void* spare_get(void) {
  void* p = NULL;
  pthread_mutex_lock(&g_own_mu);
  if (g_nspare > 0) p = g_spare[--g_nspare];
  pthread_mutex_unlock(&g_own_mu);
  return p;
}

static void spare_put(uint8_t* p) {
  pthread_mutex_lock(&g_own_mu);
  if (g_nspare < SPARE_SLOTS) {
    g_spare[g_nspare++] = p;
    p = NULL;
  }
  pthread_mutex_unlock(&g_own_mu);
  free(p);
}

static void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  void* p = spare_get();
  if (!p && posix_memalign(&p, 8, g_buffer_bytes) != 0) p = NULL;
  if (p && !own_add((uint8_t*)p)) {  /* more outstanding buffers than we track: refuse */
    free(p);
    p = NULL;
  }
  __atomic_fetch_add(&g_stat[5], 1, __ATOMIC_RELAXED);
  *buffer = (uint8_t*)p;
  *size = p ? g_buffer_bytes : 0;
  *max_records = 0;
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t* buffer, size_t size, size_t valid) {
  (void)size;
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  pthread_mutex_lock(&g_mu);
  CUpti_Activity* r = NULL;
  if (valid > 0) {
    while (p_get_next(buffer, valid, &r) == CUPTI_SUCCESS) decode(r);
  }
  size_t dropped = 0;
  if (p_dropped && p_dropped(ctx, stream, &dropped) == CUPTI_SUCCESS) g_stat[2] += (int64_t)dropped;
  g_stat[3]++;
  clock_gettime(CLOCK_MONOTONIC, &t1);
  g_stat[4] += (int64_t)(t1.tv_sec - t0.tv_sec) * 1000000000LL + (t1.tv_nsec - t0.tv_nsec);
  int mine = own_take(buffer);
  if (!mine) g_stat[6]++; /* a foreign client's buffer: decoded, but its owner frees it */
  pthread_mutex_unlock(&g_mu);
  if (mine) spare_put(buffer);
}

/* fork(): the child's copy of pending records belongs to the parent (the child, which has no
 * usable CUDA, never drains them); the lock is held across fork so the child is not left with
 * a locked mutex. */
static void fork_prepare(void) { pthread_mutex_lock(&g_mu); }
static void fork_parent(void) { pthread_mutex_unlock(&g_mu); }
static void fork_child(void) {
  for (int k = 0; k < K_COUNT; ++k) {
    g_rows[k].n = 0;
    g_taken[k].n = 0;
  }
  pthread_mutex_unlock(&g_mu);
}
__attribute__((constructor)) static void install_fork_handlers(void) {
  pthread_atfork(fork_prepare, fork_parent, fork_child);
}

/* ---- called from Python (ctypes) -------------------------------------------------- */

const char* pp_cupti_error(void) { return g_error; }

/* Bind to the libcupti at `path`, which must already be loaded. */
int pp_cupti_init(const char* path, size_t buffer_bytes) {
  void* h = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
  if (!h) {
    snprintf(g_error, sizeof g_error, "libcupti not loaded in this process (%s)", path);
    return -1;
  }
  p_get_next = (next_fn_t)dlsym(h, "cuptiActivityGetNextRecord");
  p_register = (reg_fn_t)dlsym(h, "cuptiActivityRegisterCallbacks");
  p_dropped = (dropped_fn_t)dlsym(h, "cuptiActivityGetNumDroppedRecords");
  p_push = (push_fn_t)dlsym(h, "cuptiActivityPushExternalCorrelationId");
  p_pop = (pop_fn_t)dlsym(h, "cuptiActivityPopExternalCorrelationId");
  p_uvm_cfg = (uvm_cfg_fn_t)dlsym(h, "cuptiActivityConfigureUnifiedMemoryCounter");
  p_result_str = (result_str_fn_t)dlsym(h, "cuptiGetResultString");
  p_set_attr = (set_attr_fn_t)dlsym(h, "cuptiActivitySetAttribute");
  p_ts_cb = (ts_cb_fn_t)dlsym(h, "cuptiActivityRegisterTimestampCallback");
  if (!p_get_next || !p_register || !p_push || !p_pop) {
    snprintf(g_error, sizeof g_error, "libcupti at %s lacks the activity API", path);
    return -1;
  }
  pp_cb_bind(h, p_push, p_pop);
  if (buffer_bytes) g_buffer_bytes = buffer_bytes;
  if (!g_ext_corr) {
    g_ext_corr = (uint32_t*)calloc(EXT_SLOTS, sizeof(uint32_t));
    g_ext_id = (uint64_t*)calloc(EXT_SLOTS, sizeof(uint64_t));
    g_name_ptr = (const char**)calloc(NAME_SLOTS, sizeof(char*));
    g_name_id = (int32_t*)calloc(NAME_SLOTS, sizeof(int32_t));
    if (!g_ext_corr || !g_ext_id || !g_name_ptr || !g_name_id) {
      snprintf(g_error, sizeof g_error, "out of memory");
      return -1;
    }
  }
  return 0;
}

/* (Re-)register our buffer callbacks: CUPTI keeps one pair per process, last wins. */
int pp_cupti_register(void) {
  CUptiResult r = p_register(buffer_requested, buffer_completed);
  if (r != CUPTI_SUCCESS) {
    snprintf(g_error, sizeof g_error, "cuptiActivityRegisterCallbacks failed (%d)", (int)r);
    return -1;
  }
  return 0;
}

/* After a foreign session: Kineto turns on per-thread activity buffers, a process-wide
 * attribute it leaves set; put back the shared buffers pastaprof started with.  0 on
 * success (or when this libcupti has no such attribute). */
int pp_cupti_shared_buffers(void) {
  if (!p_set_attr) return 0;
  uint8_t value = 0;
  size_t n = sizeof value;
  CUptiResult r = p_set_attr(CUPTI_ACTIVITY_ATTR_PER_THREAD_ACTIVITY_BUFFER, &n, &value);
  if (r != CUPTI_SUCCESS) {
    snprintf(g_error, sizeof g_error, "cuptiActivitySetAttribute(PER_THREAD_ACTIVITY_BUFFER, 0) failed (%d)", (int)r);
    return -1;
  }
  return 0;
}

/* CUPTI's timestamps on time.time_ns()'s clock (CLOCK_REALTIME), whoever used CUPTI before:
 * Kineto (torch.profiler) configures its own (TSC) timestamp source and leaves it behind
 * after its session, so records taken after one were stamped on another clock and landed
 * before the session (measured on the H200).  Call before enabling kinds. */
static uint64_t CUPTIAPI realtime_ns(void) { return pp_realtime_ns(); }

int pp_cupti_own_clock(void) {
  if (!p_ts_cb) return 1; /* older libcupti: its default clock is CLOCK_REALTIME already */
  CUptiResult r = p_ts_cb(realtime_ns);
  if (r != CUPTI_SUCCESS) {
    snprintf(g_error, sizeof g_error, "cuptiActivityRegisterTimestampCallback failed (%d)", (int)r);
    return -1;
  }
  return 0;
}

void pp_cupti_keep_api(int driver, int cbid, int keep) {
  if (driver >= 0 && driver < 2 && cbid >= 0 && cbid < MAX_CBID) g_drop_api[driver][cbid] = keep ? 0 : 1;
}

/* Unified-memory counters for `device`: HtoD/DtoH/DtoD bytes, CPU and GPU page faults,
 * thrashing, throttling, remote map.  CUPTI wants this after the CUDA context exists and
 * before UNIFIED_MEMORY_COUNTER is enabled.  0 on success, else the CUPTI error (text in
 * pp_cupti_error), e.g. UM profiling not supported on MIG or some virtualised hosts. */
int pp_cupti_configure_uvm(int device) {
  if (!p_uvm_cfg) {
    snprintf(g_error, sizeof g_error, "libcupti lacks cuptiActivityConfigureUnifiedMemoryCounter");
    return -1;
  }
  const CUpti_ActivityUnifiedMemoryCounterKind* kinds = pp_uvm_counter_kinds;
  enum { N = PP_UVM_COUNTER_KINDS };
  CUpti_ActivityUnifiedMemoryCounterConfig cfg[N];
  memset(cfg, 0, sizeof cfg);
  for (int i = 0; i < N; ++i) {
    cfg[i].scope = CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_SCOPE_PROCESS_SINGLE_DEVICE;
    cfg[i].kind = kinds[i];
    cfg[i].deviceId = (uint32_t)device;
    cfg[i].enable = 1;
  }
  CUptiResult r = p_uvm_cfg(cfg, N);
  if (r != CUPTI_SUCCESS) {
    const char* text = NULL;
    if (p_result_str) p_result_str(r, &text);
    snprintf(g_error, sizeof g_error, "%s (%d)", text ? text : "CUPTI error", (int)r);
    return (int)r;
  }
  return 0;
}

/* The op observer's push/pop: a thread-local stack read by the launch callbacks, forwarded to
 * CUPTI's external correlation while launch calls come as activity records instead. */
void* pp_cupti_push_fn(void) { return (void*)pp_tls_push; }
void* pp_cupti_pop_fn(void) { return (void*)pp_tls_pop; }

int64_t pp_cupti_stat(int i) {
  if (i < 0 || i >= 8) return -1;
  pthread_mutex_lock(&g_mu);
  int64_t v = g_stat[i];
  pthread_mutex_unlock(&g_mu);
  return v;
}

/* Move `kind`'s rows aside; returns their number.  Then pp_cupti_copy, pp_cupti_release. */
int64_t pp_cupti_take(int kind) {
  if (kind < 0 || kind >= K_COUNT) return -1;
  pthread_mutex_lock(&g_mu);
  Table t = g_taken[kind];
  g_taken[kind] = g_rows[kind];
  g_rows[kind] = t;
  g_rows[kind].n = 0;
  pthread_mutex_unlock(&g_mu);
  if (kind == K_API || kind == K_EXTERNAL || kind == K_SYNC)  /* callback rows */
    pp_cb_move(kind == K_API ? 1 : kind == K_SYNC ? 2 : 0, &g_taken[kind]);
  return g_taken[kind].n;
}

int pp_cupti_copy(int kind, int col, int64_t* dst) {
  if (kind < 0 || kind >= K_COUNT || col < 0 || col >= NCOLS[kind]) return -1;
  if (g_taken[kind].n) memcpy(dst, g_taken[kind].col[col], (size_t)g_taken[kind].n * sizeof(int64_t));
  return 0;
}

void pp_cupti_release(void) {
  for (int k = 0; k < K_COUNT; ++k) g_taken[k].n = 0;
}

int64_t pp_cupti_string_count(void) {
  pthread_mutex_lock(&g_mu);
  int64_t n = g_nnames;
  pthread_mutex_unlock(&g_mu);
  return n;
}

const char* pp_cupti_string(int64_t i) {
  pthread_mutex_lock(&g_mu);
  const char* s = (i >= 0 && i < g_nnames) ? g_display[i] : NULL;
  pthread_mutex_unlock(&g_mu);
  return s;
}

/* out[i] = external id of correlation corr[i] (from the ring), or -1. */
void pp_cupti_lookup_ext(const int64_t* corr, int64_t* out, int64_t n) {
  pthread_mutex_lock(&g_mu);
  for (int64_t i = 0; i < n; ++i) {
    uint32_t c = (uint32_t)corr[i];
    uint32_t slot = c & (EXT_SLOTS - 1);
    out[i] = (corr[i] >= 0 && g_ext_corr[slot] == c && c != 0) ? (int64_t)g_ext_id[slot] : -1;
  }
  pthread_mutex_unlock(&g_mu);
}
