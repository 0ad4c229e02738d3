/* pastaprof's injection library for native CUDA programs (no Python in the process).
 *
 * `pastaprof run -- ./app` sets CUDA_INJECTION64_PATH (and NVTX_INJECTION64_PATH) to this
 * library: the CUDA driver calls InitializeInjection() at cuInit, NVTX calls
 * InitializeInjectionNvtx2() at the first NVTX call.  Either starts capture once: the system
 * CUDA's libcupti is dlopen'ed (PASTAPROF_NATIVE_CUPTI, found by pastaprof; no link-time
 * dependency, so the library builds from headers alone), CUPTI's activity API records kernels,
 * copies, memsets, synchronizations, launch/copy/sync/alloc API calls, NVTX markers and
 * cudaMalloc-level allocations (with --uvm, unified-memory counters too: inject_cupti.c), and
 * every completed buffer is written, as fixed 128-byte records (inject.h), to the process's
 * files in $PASTAPROF_OUT/native/.  pastaprof turns them
 * into the run's event tables when the run is stored (handlers/native_program.py).
 * Parts: libcupti and what is enabled (inject_cupti.c), the files (inject_files.c), names and
 * settings (inject_util.c), exits (inject_exits.c), the sanitizer bridge (inject_sanitizer.c).
 *
 * The program is never harmed: in a Python process (pastaprof's own session captures there:
 * never two CUPTI clients) or when anything fails, the library does nothing but say so in one
 * line.  Records reach the files when a CUPTI buffer fills, every PASTAPROF_FLUSH_MS, at exit
 * (atexit) and on SIGTERM/SIGINT/SIGHUP/SIGABRT (abort()): the program's own handler runs
 * after the flush, and a default action is repeated, so exit codes and signals are unchanged.
 */
#define _GNU_SOURCE
#include <cupti.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "inject.h"
#include "inject_state.h"

#define EXPORT __attribute__((visibility("default")))

/* ---- state ---------------------------------------------------------------------------- */
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_state;  /* 0 not started, 1 capturing, 2 off (declined or failed) */
int g_rec_fd = -1, g_str_fd = -1;
char g_dir[4096], g_base[4200];
int g_rank;
int64_t g_started_ns;
int64_t g_stat[PP_NSTATS];
char g_status[512];
char g_ended[32] = "running";
static size_t g_buffer_bytes = 8u << 20;
const char* g_mode = "cuda_injection";
static int g_sanitizer; /* the instruction-level bridge (inject_sanitizer.c) is running */
int g_flush_ms = 2000;
char g_note[512];
char g_san_status[512];

/* kernel selection: PASTAPROF_SAMPLE (every Nth launch), PASTAPROF_KERNELS (POSIX ERE on the
 * readable name; a pattern POSIX cannot compile is left to the reader's Python regex) */
int64_t g_sample = 1;
static int64_t g_launch_seq;
int g_kernel_filter; /* 0 none, 1 posix here, 2 python (reader) */
int g_off_kernels, g_off_api, g_off_memory;

/* staged output, written with write(2) at the end of each buffer */
#define STAGE_RECORDS 4096
static int64_t (*g_stage)[PP_RECORD_WORDS];
static int g_nstage;

static signed char g_api_keep[2][PP_MAX_CBID]; /* 0 unknown, 1 keep, -1 drop (the whole-kind fallback) */

/* CUPTI's name of an API call, or NULL */
static const char* cb_name(int driver, uint32_t cbid) {
  const char* name = NULL;
  if (!p_cb_name || p_cb_name(driver ? CUPTI_CB_DOMAIN_DRIVER_API : CUPTI_CB_DOMAIN_RUNTIME_API, cbid, &name) !=
                        CUPTI_SUCCESS)
    return NULL;
  return name;
}

/* ---- records ---------------------------------------------------------------------------- */
void pp_write_all(int fd, const void* p, size_t n) {
  const char* c = (const char*)p;
  while (n > 0 && fd >= 0) {
    ssize_t w = write(fd, c, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      g_stat[PP_STAT_WRITE_ERRORS]++;
      return;
    }
    c += w;
    n -= (size_t)w;
  }
}

static void stage_flush(void) {
  size_t n = 0;
  const char* strings = pp_names_staged(&n); /* strings before the records naming them */
  if (n) pp_write_all(g_str_fd, strings, n);
  if (g_nstage) pp_write_all(g_rec_fd, g_stage, (size_t)g_nstage * PP_RECORD_BYTES);
  g_stat[PP_STAT_WRITTEN] += g_nstage;
  g_nstage = 0;
}

static int64_t* row(int kind) {
  if (!g_stage) return NULL;
  if (g_nstage == STAGE_RECORDS) stage_flush();
  int64_t* r = g_stage[g_nstage++];
  memset(r, 0, PP_RECORD_BYTES);
  r[0] = kind;
  return r;
}

#define PUT(...)                                                   \
  do {                                                             \
    int64_t v_[] = {__VA_ARGS__};                                  \
    memcpy(r + 1, v_, sizeof v_);                                  \
  } while (0)

static void decode(const CUpti_Activity* a) {
  int64_t* r;
  g_stat[PP_STAT_RECORDS]++;
  switch (a->kind) {
    case CUPTI_ACTIVITY_KIND_KERNEL:
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
      const CUpti_ActivityKernel10* k = (const CUpti_ActivityKernel10*)a;
      g_stat[PP_STAT_KERNELS_SEEN]++;
      int32_t name = pp_kernel_name(k->name);
      ++g_launch_seq;
      if ((g_sample > 1 && g_launch_seq % g_sample) || !pp_kernel_selected(name)) {
        g_stat[PP_STAT_SAMPLED_OUT]++;
        return;
      }
      if (!(r = row(PP_KERNEL))) return;
      PUT((int64_t)k->start, (int64_t)k->end, k->deviceId, k->streamId, k->correlationId, name, k->gridX, k->gridY,
          k->gridZ, k->blockX, k->blockY, k->blockZ, k->registersPerThread,
          (int64_t)k->staticSharedMemory + (int64_t)k->dynamicSharedMemory);
      break;
    }
    case CUPTI_ACTIVITY_KIND_MEMCPY: {
      const CUpti_ActivityMemcpy6* m = (const CUpti_ActivityMemcpy6*)a;
      if (!(r = row(PP_MEMCPY))) return;
      PUT((int64_t)m->start, (int64_t)m->end, m->deviceId, m->streamId, m->correlationId, (int64_t)m->bytes,
          m->copyKind);
      break;
    }
    case CUPTI_ACTIVITY_KIND_MEMSET: {
      const CUpti_ActivityMemset4* m = (const CUpti_ActivityMemset4*)a;
      if (!(r = row(PP_MEMSET))) return;
      PUT((int64_t)m->start, (int64_t)m->end, m->deviceId, m->streamId, m->correlationId, (int64_t)m->bytes);
      break;
    }
    case CUPTI_ACTIVITY_KIND_SYNCHRONIZATION: {
      const CUpti_ActivitySynchronization2* s = (const CUpti_ActivitySynchronization2*)a;
      if (!(r = row(PP_SYNC))) return;
      PUT((int64_t)s->start, (int64_t)s->end, (int64_t)(int32_t)s->streamId, s->correlationId, s->type);
      break;
    }
    case CUPTI_ACTIVITY_KIND_RUNTIME:
    case CUPTI_ACTIVITY_KIND_DRIVER: {
      const CUpti_ActivityAPI* c = (const CUpti_ActivityAPI*)a;
      int driver = a->kind == CUPTI_ACTIVITY_KIND_DRIVER;
      if (c->cbid < PP_MAX_CBID) {
        signed char* keep = &g_api_keep[driver][c->cbid];
        if (*keep == 0) { /* a call whose name CUPTI does not give is kept */
          const char* name = cb_name(driver, c->cbid);
          *keep = !name || pp_api_kept(name) ? 1 : -1;
        }
        if (*keep < 0) return;
      }
      if (!(r = row(PP_API))) return;
      PUT((int64_t)c->start, (int64_t)c->end, c->processId, c->threadId, c->correlationId, c->cbid, driver,
          pp_api_name(driver, c->cbid, cb_name));
      break;
    }
    case CUPTI_ACTIVITY_KIND_MEMORY2: {
      const CUpti_ActivityMemory4* m = (const CUpti_ActivityMemory4*)a;
      if (!(r = row(PP_MEMORY))) return;
      PUT((int64_t)m->timestamp, m->deviceId, m->streamId, m->correlationId, (int64_t)m->address, (int64_t)m->bytes,
          m->memoryKind, m->memoryOperationType, m->processId, m->isAsync);
      break;
    }
    case CUPTI_ACTIVITY_KIND_UNIFIED_MEMORY_COUNTER: {
      const CUpti_ActivityUnifiedMemoryCounter3* u = (const CUpti_ActivityUnifiedMemoryCounter3*)a;
      if (!(r = row(PP_UVM))) return;
      PUT((int64_t)u->start, (int64_t)u->end, u->counterKind, (int64_t)u->value, (int64_t)u->address,
          (int64_t)(int32_t)u->srcId, (int64_t)(int32_t)u->dstId, u->streamId, u->flags, u->processId);
      break;
    }
    case CUPTI_ACTIVITY_KIND_MARKER: {
      const CUpti_ActivityMarker2* m = (const CUpti_ActivityMarker2*)a;
      if (!(r = row(PP_MARKER))) return;
      int thread = m->objectKind == CUPTI_ACTIVITY_OBJECT_THREAD;
      PUT((int64_t)m->timestamp, m->flags, m->id, m->objectKind, thread ? (int64_t)m->objectId.pt.processId : -1,
          thread ? (int64_t)m->objectId.pt.threadId : -1, pp_intern(m->name), pp_intern(m->domain));
      break;
    }
    default:
      break;
  }
}

/* ---- CUPTI buffers ------------------------------------------------------------------------ */
/* Completed buffers are kept for reuse (a few): a fresh 8 MB buffer is new memory whose pages
 * fault in as CUPTI writes records, partly on the program's launching thread.  With
 * PASTAPROF_NATIVE_ZEROED=1 CUPTI is told buffers come zeroed (it then skips its own memset on
 * the program's thread): fresh ones are anonymous mappings, faulted in at once (MAP_POPULATE),
 * reused ones are zeroed in buffer_completed, on CUPTI's thread. */
#define SPARE_SLOTS 4
static void* g_spare[SPARE_SLOTS];
static int g_nspare;
static pthread_mutex_t g_spare_mu = PTHREAD_MUTEX_INITIALIZER;

static void* buffer_new(void) {
  void* p = NULL;
  if (g_zeroed) {
    p = mmap(NULL, g_buffer_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    return p == MAP_FAILED ? NULL : p;
  }
  return posix_memalign(&p, 8, g_buffer_bytes) == 0 ? p : NULL;
}

static void buffer_free(void* p) {
  if (p && g_zeroed) munmap(p, g_buffer_bytes);
  else free(p);
}

static void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  void* p = NULL;
  pthread_mutex_lock(&g_spare_mu);
  if (g_nspare > 0) p = g_spare[--g_nspare];
  pthread_mutex_unlock(&g_spare_mu);
  if (!p) p = buffer_new();
  *buffer = (uint8_t*)p;
  *size = p ? g_buffer_bytes : 0;
  *max_records = 0;
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t* buffer, size_t size, size_t valid) {
  (void)size;
  pthread_mutex_lock(&g_mu);
  if (g_state == 1 && valid > 0) {
    CUpti_Activity* a = NULL;
    while (p_next(buffer, valid, &a) == CUPTI_SUCCESS) decode(a);
  }
  size_t dropped = 0;
  if (p_dropped && p_dropped(ctx, stream, &dropped) == CUPTI_SUCCESS) g_stat[PP_STAT_DROPPED] += (int64_t)dropped;
  g_stat[PP_STAT_BUFFERS]++;
  if (g_state == 1) {
    stage_flush();
    if (g_sanitizer) pp_bridge_drain(); /* the instruction-level tables too, at the same pace */
  }
  pthread_mutex_unlock(&g_mu);
  if (!buffer) return;
  if (g_zeroed) memset(buffer, 0, g_buffer_bytes); /* the whole buffer: what CUPTI wrote past `valid` too */
  pthread_mutex_lock(&g_spare_mu);
  if (g_nspare < SPARE_SLOTS) {
    g_spare[g_nspare++] = buffer;
    buffer = NULL;
  }
  pthread_mutex_unlock(&g_spare_mu);
  buffer_free(buffer);
}

static int alloc_tables(void) {
  g_stage = calloc(STAGE_RECORDS, PP_RECORD_BYTES);
  return (g_stage && pp_names_alloc() == 0) ? 0 : -1;
}

/* ---- settings (the PASTAPROF_* vocabulary of `pastaprof run`; parsing in inject_util.c) --- */
static void read_settings(void) {
  const char* v = getenv("PASTAPROF_SAMPLE");
  if (v && atoll(v) > 1) g_sample = atoll(v);
  v = getenv("PASTAPROF_KERNELS");
  if (v && *v) g_kernel_filter = pp_names_filter(v);
  v = getenv("PASTAPROF_NATIVE_BUFFER");
  if (v && atoll(v) >= 4096) g_buffer_bytes = (size_t)atoll(v);
  v = getenv("PASTAPROF_NATIVE_FLUSH_MS"); /* native programs' own period; 0: none */
  if (!v || !*v) v = getenv("PASTAPROF_FLUSH_MS");
  if (v && *v) g_flush_ms = atoi(v);
  g_off_kernels = pp_off("kernels");
  g_off_api = pp_off("api");
  g_off_memory = pp_off("memory");
  v = getenv("PASTAPROF_UVM"); /* --uvm: unified-memory counters (inject_cupti.c) */
  g_uvm = v && (!strcasecmp(v, "1") || !strcasecmp(v, "true") || !strcasecmp(v, "yes") || !strcasecmp(v, "on"));
  pp_read_knobs();
}

/* ---- exits (signals and the flusher thread: inject_exits.c) ---------------------------------------------------------------------- */
/* Everything recorded so far into the files; `how` says why (exit, signal N). */
static void finish(const char* how, int final) {
  if (g_state != 1) return;
  if (p_flush) p_flush(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED); /* completes the buffers: buffer_completed writes */
  pthread_mutex_lock(&g_mu);
  stage_flush();
  if (g_sanitizer) pp_bridge_drain();
  snprintf(g_ended, sizeof g_ended, "%s", how);
  pp_write_meta(final);
  pthread_mutex_unlock(&g_mu);
}

static void at_exit(void) {
  if (getpid() != g_stat[PP_STAT_PID]) return; /* a forked child's exit: the files are the parent's */
  finish("exit", 1);
  g_state = 2;
}

/* for inject_exits.c (signals and the flusher thread) */
int pp_capturing(void) { return g_state == 1 && getpid() == g_stat[PP_STAT_PID]; }
int pp_poll_ms(void) { return g_sanitizer ? (g_flush_ms > 0 ? g_flush_ms : 2000) : -1; }
void pp_finish(const char* how) { finish(how, 0); }

void pp_drain_sanitizer(void) {
  if (!g_sanitizer) return;
  pthread_mutex_lock(&g_mu);
  pp_bridge_drain();
  pthread_mutex_unlock(&g_mu);
}

/* Without the flusher's answer in time: what is staged, and the header, if the lock is free. */
void pp_last_words(const char* how) {
  if (pthread_mutex_trylock(&g_mu) != 0) return;
  stage_flush();
  snprintf(g_ended, sizeof g_ended, "%s", how);
  pp_write_meta(0);
  pthread_mutex_unlock(&g_mu);
}

static void fork_prepare(void) { pthread_mutex_lock(&g_mu); }
static void fork_parent(void) { pthread_mutex_unlock(&g_mu); }
static void fork_child(void) {
  /* CUDA is unusable in a forked child; a child that execs a CUDA program is injected anew */
  g_state = 2;
  pp_exits_forked(); /* the flusher thread stayed in the parent */
  if (g_rec_fd >= 0) close(g_rec_fd);
  if (g_str_fd >= 0) close(g_str_fd);
  g_rec_fd = g_str_fd = -1;
  g_nstage = 0;
  pp_names_forget_staged();
  pthread_mutex_unlock(&g_mu);
}

/* ---- start ------------------------------------------------------------------------------------ */
/* One line on stderr -- unless `pastaprof run` started the program: the run's status then
 * carries the line, which the launcher prints once the run is stored. */
static void warn(const char* what) {
  const char* parent = getenv("PASTAPROF_RUN_PARENT");
  if (parent && strcmp(parent, "1") == 0) return;
  char line[700];
  int n = snprintf(line, sizeof line, "pastaprof: warning: native capture not started: %s\n", what);
  if (n > 0) pp_write_all(2, line, (size_t)(n < (int)sizeof line ? n : (int)sizeof line - 1));
}

static int start_capture(const char* mode) {
  g_mode = mode;
  g_stat[PP_STAT_PID] = getpid();
  g_started_ns = pp_now_ns();
  g_rank = pp_env_rank();
  const char* env = getenv("PASTAPROF_NATIVE_INJECT");
  if (env && strcmp(env, "0") == 0) return -1; /* switched off: silent */
  if (dlsym(RTLD_DEFAULT, "Py_IsInitialized")) return -1; /* Python: pastaprof's own session captures */
  if (!getenv("PASTAPROF_OUT")) return -1; /* not under `pastaprof run` */
  read_settings();
  if (alloc_tables() != 0) {
    warn("out of memory");
    return -1;
  }
  pp_names_demangler(0);
  if (!pp_rank_selected(g_rank)) {
    snprintf(g_status, sizeof g_status, "rank %d not selected (PASTAPROF_RANKS): nothing recorded", g_rank);
    if (pp_open_files() == 0) pp_write_meta(1);
    return -1;
  }
  if (pp_open_files() != 0) {
    warn(g_status);
    return -1;
  }
  if (strcmp(mode, "preload") == 0 && !dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD) &&
      !dlopen("libcuda.so.1", RTLD_LAZY)) { /* injected by CUDA itself, libcuda is there */
    snprintf(g_status, sizeof g_status, "no CUDA driver (libcuda.so.1 not found): no GPU on this machine?");
    snprintf(g_ended, sizeof g_ended, "not started");
    warn(g_status);
    pp_write_meta(1);
    return -1;
  }
  if (pp_bind_cupti() != 0) {
    snprintf(g_ended, sizeof g_ended, "not started");
    warn(g_status);
    pp_write_meta(1);
    return -1;
  }
  /* the sanitizer first, as in a Python session: it must see every module load */
  int san = pp_bridge_start(g_base, getenv("PASTAPROF_KERNELS"), (long)g_sample, g_san_status, sizeof g_san_status);
  g_sanitizer = san == 0;
  if (san < 0) warn(g_san_status);
  if (pp_start_cupti(buffer_requested, buffer_completed) != 0) {
    if (!g_sanitizer) {
      snprintf(g_ended, sizeof g_ended, "not started");
      warn(g_status);
      pp_write_meta(1);
      return -1;
    }
    /* one CUPTI/sanitizer client at a time on this driver: the instruction-level tables go on */
    snprintf(g_note, sizeof g_note, "CUPTI records not taken beside the sanitizer (%.300s): kernels are in "
             "access_launch", g_status);
    pp_bridge_copies();
  }
  snprintf(g_status, sizeof g_status, "ok");
  pp_start_flusher();
  pthread_atfork(fork_prepare, fork_parent, fork_child);
  g_state = 1;
  atexit(at_exit);
  pp_install_signals();
  pp_write_meta(0);
  return 0;
}

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static const char* g_start_mode = "cuda_injection";
static void start_once(void) {
  if (start_capture(g_start_mode) != 0) g_state = 2;
}

/* The CUDA driver's injection entry point (CUDA_INJECTION64_PATH), called at cuInit. */
EXPORT int InitializeInjection(void) {
  pthread_once(&g_once, start_once);
  return 1; /* never fail the program's cuInit */
}

/* NVTX's (NVTX_INJECTION64_PATH): capture starts (if it has not), then CUPTI's own NVTX
 * injection takes the calls, which become MARKER records.  0 (NVTX stays a no-op) where
 * capture is off, as without pastaprof. */
EXPORT int InitializeInjectionNvtx2(void* get_export_table) {
  g_start_mode = "nvtx_injection";
  pthread_once(&g_once, start_once);
  if (g_state != 1 || !g_cupti) return 0;
  nvtx_init_t init = (nvtx_init_t)dlsym(g_cupti, "InitializeInjectionNvtx2");
  return init ? init(get_export_table) : 0;
}

/* LD_PRELOAD with PASTAPROF_NATIVE_EAGER=1: capture starts when the program loads. */
__attribute__((constructor)) static void preload(void) {
  const char* eager = getenv("PASTAPROF_NATIVE_EAGER");
  if (eager && strcmp(eager, "1") == 0) {
    g_start_mode = "preload";
    pthread_once(&g_once, start_once);
  }
}

/* ---- for inject_selftest.c: the capture's set-up and end without CUPTI's buffers ------------- */
int pp_test_begin(void) {
  pthread_mutex_lock(&g_mu);
  g_stat[PP_STAT_PID] = getpid();
  g_started_ns = pp_now_ns();
  g_rank = pp_env_rank();
  g_mode = "selftest";
  read_settings();
  if (alloc_tables() != 0 || pp_open_files() != 0) {
    pthread_mutex_unlock(&g_mu);
    return -1;
  }
  pp_names_demangler(1);
  if (getenv("PASTAPROF_NATIVE_CUPTI")) pp_bind_cupti(); /* API names through cuptiGetCallbackName, if it loads */
  pp_apply_knobs(); /* through that libcupti's cuptiActivitySetAttribute, as a capture would */
  snprintf(g_status, sizeof g_status, "ok");
  g_state = 1;
  return 0;
}

int pp_test_named(void) { return p_cb_name != NULL; }

void pp_decode(const void* record) { decode((const CUpti_Activity*)record); }

/* One buffer through CUPTI's two callbacks, as CUPTI hands them: 0 when a fresh buffer and a
 * reused one came zeroed (PASTAPROF_NATIVE_ZEROED=1) or, without the knob, when the second
 * request got the first buffer back; -1 otherwise.  After pp_test_end (the lock is free). */
int pp_test_buffers(void) {
  uint8_t *a = NULL, *b = NULL;
  size_t size = 0, max = 0;
  buffer_requested(&a, &size, &max);
  if (!a || size != g_buffer_bytes) return -1;
  for (size_t i = 0; g_zeroed && i < size; ++i)
    if (a[i]) return -1;
  memset(a, 0x5a, size); /* records, as CUPTI would have written them */
  buffer_completed(NULL, 0, a, size, 0);
  buffer_requested(&b, &size, &max);
  if (b != a) return -1;
  for (size_t i = 0; g_zeroed && i < size; ++i)
    if (b[i]) return -1;
  buffer_completed(NULL, 0, b, size, 0);
  return 0;
}

void pp_test_end(void) {
  stage_flush();
  pp_write_meta(0);
  pp_start_flusher();
  pthread_atfork(fork_prepare, fork_parent, fork_child);
  atexit(at_exit);
  pp_install_signals();
  pthread_mutex_unlock(&g_mu);
}
