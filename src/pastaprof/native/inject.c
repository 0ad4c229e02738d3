/* pastaprof's injection library for native CUDA programs (no Python in the process).
 *
 * `pastaprof run -- ./app` sets CUDA_INJECTION64_PATH (and NVTX_INJECTION64_PATH) to this
 * library: the CUDA driver calls InitializeInjection() at cuInit, NVTX calls
 * InitializeInjectionNvtx2() at the first NVTX call.  Either starts capture once: the system
 * CUDA's libcupti is dlopen'ed (PASTAPROF_NATIVE_CUPTI, found by pastaprof; no link-time
 * dependency, so the library builds from headers alone).  CUPTI's activity API records kernels,
 * copies, memsets, NVTX markers and cudaMalloc-level allocations (with --uvm, unified-memory
 * counters too: inject_cupti.c); CUPTI's callback API records launch/copy/sync/alloc API calls
 * and synchronizations, and enables the copy, memset, allocation and marker kinds at their first
 * call, since an enabled kind costs every launch (inject_callbacks.c; where another CUPTI client
 * holds the callback API, all of it is activity records, as before).  Every completed buffer is
 * written, as fixed 128-byte records (inject.h), to the process's files in
 * $PASTAPROF_OUT/native/.  pastaprof turns them into the run's event tables when the run is
 * stored (handlers/native_program.py).
 * Parts: libcupti and what is enabled (inject_cupti.c), the callbacks (inject_callbacks.c), the
 * records (inject_records.c), the files (inject_files.c), names and settings (inject_util.c),
 * exits (inject_exits.c), the sanitizer bridge (inject_sanitizer.c).
 *
 * The program is never harmed: in a Python process (pastaprof's own session captures there:
 * never two CUPTI clients) or when anything fails, the library does nothing but say so in one
 * line.  Records (and the callbacks' rows) reach the files when a CUPTI buffer fills, every
 * PASTAPROF_FLUSH_MS, at exit (atexit) and on SIGTERM/SIGINT/SIGHUP/SIGABRT (abort()): the
 * program's own handler runs after the flush, and a default action is repeated, so exit codes
 * and signals are unchanged.
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
int g_kernel_filter; /* 0 none, 1 posix here, 2 python (reader) */
int g_off_kernels, g_off_api, g_off_memory;

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
    while (p_next(buffer, valid, &a) == CUPTI_SUCCESS) pp_decode(a);
  }
  size_t dropped = 0;
  if (p_dropped && p_dropped(ctx, stream, &dropped) == CUPTI_SUCCESS) g_stat[PP_STAT_DROPPED] += (int64_t)dropped;
  g_stat[PP_STAT_BUFFERS]++;
  if (g_state == 1) {
    pp_cb_drain(1); /* the API calls' callback rows (inject_callbacks.c) at the same pace */
    pp_stage_flush();
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
  return (pp_stage_alloc() == 0 && pp_names_alloc() == 0) ? 0 : -1;
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
  pp_cb_drain(1); /* callback rows made after the last buffer completed */
  pp_stage_flush();
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
int pp_poll_ms(void) { return g_sanitizer || pp_cb_live() ? (g_flush_ms > 0 ? g_flush_ms : 2000) : -1; }
void pp_finish(const char* how) { finish(how, 0); }

/* for inject_exec.c: before the process's image is replaced, everything written and the files
 * complete; 1 where this process was capturing (and its exec, if it returns, failed). */
int pp_before_exec(void) {
  if (!pp_capturing()) return 0;
  finish("exec", 1);
  return 1;
}

void pp_exec_failed(int was_capturing) {
  if (!was_capturing) return;
  pthread_mutex_lock(&g_mu);
  snprintf(g_ended, sizeof g_ended, "running"); /* the program goes on, and so does its capture */
  pp_write_meta(0);
  pthread_mutex_unlock(&g_mu);
}

/* Every PASTAPROF_FLUSH_MS, on the flusher thread: the callback rows (a program that completes
 * no CUPTI buffer still has its calls written) and the sanitizer's tables. */
void pp_drain_periodic(void) {
  if (!g_sanitizer && !pp_cb_live()) return;
  pthread_mutex_lock(&g_mu);
  if (pp_cb_live()) {
    pp_cb_drain(1);
    pp_stage_flush();
  }
  if (g_sanitizer) pp_bridge_drain();
  pthread_mutex_unlock(&g_mu);
}

/* Without the flusher's answer in time: what is staged, and the header, if the lock is free. */
void pp_last_words(const char* how) {
  if (pthread_mutex_trylock(&g_mu) != 0) return;
  pp_cb_drain(0); /* not if a program thread holds the rows' lock: it may be the interrupted one */
  pp_stage_flush();
  snprintf(g_ended, sizeof g_ended, "%s", how);
  pp_write_meta(0);
  pthread_mutex_unlock(&g_mu);
}

/* g_mu before the callback rows' lock, the order pp_cb_drain takes them in */
static void fork_prepare(void) {
  pthread_mutex_lock(&g_mu);
  pp_cb_fork(0);
}
static void fork_parent(void) {
  pp_cb_fork(1);
  pthread_mutex_unlock(&g_mu);
}
static void fork_child(void) {
  /* CUDA is unusable in a forked child; a child that execs a CUDA program is injected anew */
  g_state = 2;
  pp_cb_fork(2); /* the parent's callback rows are the parent's: the child starts with none */
  pp_exits_forked(); /* the flusher thread stayed in the parent */
  if (g_rec_fd >= 0) close(g_rec_fd);
  if (g_str_fd >= 0) close(g_str_fd);
  g_rec_fd = g_str_fd = -1;
  pp_stage_forget();
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
 * capture is off, as without pastaprof.  With the callback mechanism the MARKER kind is enabled
 * here, at the first NVTX call, before CUPTI's injection sees it (that call's range is kept):
 * an enabled MARKER kind costs every launch, even in a program that never calls NVTX. */
EXPORT int InitializeInjectionNvtx2(void* get_export_table) {
  g_start_mode = "nvtx_injection";
  pthread_once(&g_once, start_once);
  if (g_state != 1 || !g_cupti) return 0;
  pp_cb_nvtx();
  nvtx_init_t init = (nvtx_init_t)dlsym(g_cupti, "InitializeInjectionNvtx2");
  return init ? init(get_export_table) : 0;
}

/* At load.  LD_PRELOAD with PASTAPROF_NATIVE_EAGER=1: capture starts when the program loads. */
__attribute__((constructor)) static void preload(void) {
  pp_exec_resolve(); /* inject_exec.c: the C library's exec calls, while no fork can interrupt */
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

/* Records decoded after pp_test_end, held (as in a CUPTI buffer not yet completed) until a flush. */
void pp_test_hold(int begin) {
  if (begin) pthread_mutex_lock(&g_mu);
  else pthread_mutex_unlock(&g_mu);
}

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
  pp_stage_flush();
  pp_write_meta(0);
  pp_start_flusher();
  pthread_atfork(fork_prepare, fork_parent, fork_child);
  atexit(at_exit);
  pp_install_signals();
  pthread_mutex_unlock(&g_mu);
}
