/* libcupti for native programs: bound at run time (dlopen, never a second copy), the activity
 * kinds and API calls enabled.  Part of the injection library (inject.c). */
#define _GNU_SOURCE
#include <cupti.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "inject.h"
#include "inject_state.h"
#include "uvm_counters.h"

/* ---- libcupti, bound at run time ---------------------------------------------------- */
__typeof__(cuptiActivityRegisterCallbacks)* p_register;
__typeof__(cuptiActivityEnable)* p_enable;
__typeof__(cuptiActivityGetNextRecord)* p_next;
__typeof__(cuptiActivityFlushAll)* p_flush;
__typeof__(cuptiActivityFlushPeriod)* p_flush_period;
__typeof__(cuptiActivityGetNumDroppedRecords)* p_dropped;
__typeof__(cuptiGetCallbackName)* p_cb_name;
__typeof__(cuptiActivityEnableRuntimeApi)* p_enable_rt;
__typeof__(cuptiActivityEnableDriverApi)* p_enable_drv;
__typeof__(cuptiGetResultString)* p_result;
__typeof__(cuptiActivitySetAttribute)* p_set_attr;
void* g_cupti;

int pp_bind_cupti(void) {
  const char* path = getenv("PASTAPROF_NATIVE_CUPTI");
  /* the libcupti named is the only one tried: never a second copy beside a program's own */
  const char* tries[] = {path && *path ? path : "libcupti.so.13", path && *path ? NULL : "libcupti.so.12",
                         path && *path ? NULL : "libcupti.so"};
  for (size_t i = 0; i < sizeof tries / sizeof tries[0] && !g_cupti; ++i)
    if (tries[i]) g_cupti = dlopen(tries[i], RTLD_NOW | RTLD_GLOBAL);
  if (!g_cupti) {
    snprintf(g_status, sizeof g_status, "libcupti not loadable (%s)", path && *path ? path : "libcupti.so");
    return -1;
  }
#define BIND(p, name) p = (__typeof__(p))dlsym(g_cupti, #name)
  BIND(p_register, cuptiActivityRegisterCallbacks);
  BIND(p_enable, cuptiActivityEnable);
  BIND(p_next, cuptiActivityGetNextRecord);
  BIND(p_flush, cuptiActivityFlushAll);
  BIND(p_flush_period, cuptiActivityFlushPeriod);
  BIND(p_dropped, cuptiActivityGetNumDroppedRecords);
  BIND(p_cb_name, cuptiGetCallbackName);
  BIND(p_enable_rt, cuptiActivityEnableRuntimeApi);
  BIND(p_enable_drv, cuptiActivityEnableDriverApi);
  BIND(p_result, cuptiGetResultString);
  BIND(p_set_attr, cuptiActivitySetAttribute);
#undef BIND
  if (!p_register || !p_enable || !p_next || !p_flush) {
    snprintf(g_status, sizeof g_status, "libcupti lacks the activity API");
    return -1;
  }
  return 0;
}

const char* pp_cupti_error(CUptiResult r) {
  const char* s = NULL;
  if (p_result) p_result(r, &s);
  return s ? s : "CUPTI error";
}

/* The API calls kept: what correlation, the timeline and the tools use (as the Python path). */
int pp_api_kept(const char* name) {
  static const char* keep[] = {"Launch", "Memcpy", "Memset", "Synchronize", "Graph", "Malloc", "Free",
                               "StreamWaitEvent", "EventSynchronize", "EventRecord"};
  for (size_t i = 0; i < sizeof keep / sizeof keep[0]; ++i)
    if (strstr(name, keep[i])) return 1;
  return 0;
}

/* Only the kept calls are enabled, one cbid at a time (CUPTI then writes no record for the
 * others: PyTorch-style programs make many calls per launch that nothing here uses).  Where
 * that is not possible (an old libcupti, PASTAPROF_NATIVE_API=all), both kinds are enabled
 * whole and decode() drops the rest. */
static int enable_api(int launches_only) {
  int n = 0;
  const char* all = getenv("PASTAPROF_NATIVE_API");
  if (!launches_only && (!p_enable_rt || !p_enable_drv || !p_cb_name || (all && strcmp(all, "all") == 0))) {
    return (p_enable(CUPTI_ACTIVITY_KIND_RUNTIME) == CUPTI_SUCCESS) + (p_enable(CUPTI_ACTIVITY_KIND_DRIVER) == 0);
  }
  for (int driver = 0; driver < 2; ++driver) {
    int size = driver ? CUPTI_DRIVER_TRACE_CBID_SIZE : CUPTI_RUNTIME_TRACE_CBID_SIZE;
    for (int cbid = 1; cbid < size; ++cbid) {
      const char* name = NULL;
      if (p_cb_name(driver ? CUPTI_CB_DOMAIN_DRIVER_API : CUPTI_CB_DOMAIN_RUNTIME_API, (uint32_t)cbid, &name) !=
              CUPTI_SUCCESS || !name || !pp_api_kept(name) || (launches_only && !strstr(name, "Launch")))
        continue;
      n += (driver ? p_enable_drv : p_enable_rt)((CUpti_CallbackId)cbid, 1) == CUPTI_SUCCESS;
    }
  }
  if (n == 0 && !launches_only) /* refused one by one: the whole kinds, filtered in decode() */
    n = (p_enable(CUPTI_ACTIVITY_KIND_RUNTIME) == CUPTI_SUCCESS) + (p_enable(CUPTI_ACTIVITY_KIND_DRIVER) == 0);
  g_stat[PP_STAT_API_ENABLED] += n;
  return n;
}

/* PASTAPROF_NATIVE_KINDS: the CUPTI kinds to enable (kernel,memcpy,memset,sync,memory,marker,api;
 * default all), to measure what each costs; with the callback mechanism, "api" and "sync" are
 * the callbacks' rows and memcpy, memset, memory and marker the kinds enabled lazily */
int pp_kind_wanted(const char* kind) {
  const char* v = getenv("PASTAPROF_NATIVE_KINDS");
  if (!v || !*v) return 1;
  size_t n = strlen(kind);
  for (const char* s = v; (s = strstr(s, kind)) != NULL; s += n)
    if ((s == v || s[-1] == ',') && (s[n] == ',' || s[n] == 0)) return 1;
  return 0;
}

int pp_start_cupti(CUpti_BuffersCallbackRequestFunc requested, CUpti_BuffersCallbackCompleteFunc completed) {
  pp_apply_knobs(); /* before register and enable: the per-thread attribute must be */
  CUptiResult r = p_register(requested, completed);
  if (r != CUPTI_SUCCESS) {
    snprintf(g_status, sizeof g_status, "cuptiActivityRegisterCallbacks: %s (%d)", pp_cupti_error(r), (int)r);
    return -1;
  }
  static const struct {
    CUpti_ActivityKind kind;
    const char* name;
  } kinds[] = {{CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, "kernel"}, {CUPTI_ACTIVITY_KIND_MEMCPY, "memcpy"},
               {CUPTI_ACTIVITY_KIND_MEMSET, "memset"},           {CUPTI_ACTIVITY_KIND_SYNCHRONIZATION, "sync"},
               {CUPTI_ACTIVITY_KIND_MEMORY2, "memory"},          {CUPTI_ACTIVITY_KIND_MARKER, "marker"}};
  /* After the kernels: the callback API (inject_callbacks.c) takes API calls and
   * synchronizations, and enables the copy, memset, allocation and marker kinds at their first
   * call, so none of those is enabled now.  Without it (another CUPTI client holds the
   * subscriber slot, PASTAPROF_NATIVE_API_MECHANISM=activity) every kind is, as before, and API
   * calls are activity records. */
  int callbacks = 0;
  for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; ++i) {
    if (i == 1) callbacks = pp_cb_start();
    if ((g_off_kernels && i == 0) || (g_off_memory && kinds[i].kind == CUPTI_ACTIVITY_KIND_MEMORY2) ||
        !pp_kind_wanted(kinds[i].name) || (callbacks && i > 0))
      continue;
    r = p_enable(kinds[i].kind);
    if (r != CUPTI_SUCCESS && i == 0) {
      snprintf(g_status, sizeof g_status, "cuptiActivityEnable(kernels): %s (%d)", pp_cupti_error(r), (int)r);
      return -1;
    }
  }
  if (!g_off_api && pp_kind_wanted("api") && (!callbacks || pp_cb_launch_records())) enable_api(callbacks);
  if (g_uvm) pp_start_uvm();
  if (p_flush_period && g_flush_ms > 0) p_flush_period((uint32_t)g_flush_ms);
  return 0;
}

/* ---- knobs: CUPTI's activity attributes, to measure what each costs a launch-bound loop -----
 * Read once, when capture starts (read_settings in inject.c, inside cuInit: InitializeInjection
 * runs before any context exists, so the device-buffer attributes apply to the program's
 * first context); applied by pp_apply_knobs() before cuptiActivityRegisterCallbacks and before
 * any kind is enabled, the order cupti_activity.h asks for.  An unset knob leaves CUPTI's
 * default; a knob CUPTI refuses (or a libcupti without cuptiActivitySetAttribute) is not
 * fatal: the capture goes on with the default.  Each knob set and CUPTI's answer ("ok" or its
 * error) is in the run's status (g_note: one line on stderr, so a measurement shows what took).
 *   PASTAPROF_NATIVE_ZEROED=1      ZEROED_OUT_ACTIVITY_BUFFER=1: buffer_requested hands out
 *                                  zeroed buffers, so CUPTI does not memset them on the
 *                                  program's thread (inject.c zeroes reused ones off it);
 *   PASTAPROF_NATIVE_PINNED=0|1    MEM_ALLOCATION_TYPE_HOST_PINNED: CUPTI's per-context
 *                                  timestamp buffers in pinned host memory (1) or on the device;
 *   PASTAPROF_NATIVE_DEVBUF_MB=N   DEVICE_BUFFER_SIZE = N MiB (1..4096; CUPTI's default ~3 MB);
 *   PASTAPROF_NATIVE_DEVBUF_PRE=N  DEVICE_BUFFER_PRE_ALLOCATE_VALUE = N buffers (0..249; default 3);
 *   PASTAPROF_NATIVE_PERTHREAD=0|1 PER_THREAD_ACTIVITY_BUFFER (default 1).
 * The activity buffer's size stays PASTAPROF_NATIVE_BUFFER, the kinds PASTAPROF_NATIVE_KINDS. */
int g_zeroed;
char g_knobs[512];

enum { KNOB_ZEROED, KNOB_PINNED, KNOB_DEVBUF_MB, KNOB_DEVBUF_PRE, KNOB_PERTHREAD, NKNOBS };
static const struct {
  const char* env;
  CUpti_ActivityAttribute attr;
  int is_size; /* size_t value, else uint8_t */
  long long lo, hi;
} knob_spec[NKNOBS] = {
    {"PASTAPROF_NATIVE_ZEROED", CUPTI_ACTIVITY_ATTR_ZEROED_OUT_ACTIVITY_BUFFER, 0, 1, 1},
    {"PASTAPROF_NATIVE_PINNED", CUPTI_ACTIVITY_ATTR_MEM_ALLOCATION_TYPE_HOST_PINNED, 0, 0, 1},
    {"PASTAPROF_NATIVE_DEVBUF_MB", CUPTI_ACTIVITY_ATTR_DEVICE_BUFFER_SIZE, 1, 1, 4096},
    {"PASTAPROF_NATIVE_DEVBUF_PRE", CUPTI_ACTIVITY_ATTR_DEVICE_BUFFER_PRE_ALLOCATE_VALUE, 1, 0, 249},
    /* CUPTI_ACTIVITY_ATTR_PER_THREAD_ACTIVITY_BUFFER (9 in CUDA 13.0's header), by number: older headers lack the name */
    {"PASTAPROF_NATIVE_PERTHREAD", (CUpti_ActivityAttribute)9, 0, 0, 1},
};
static long long g_knob_value[NKNOBS];
static int g_knob_set[NKNOBS];

/* `line` appended to buf ("; " between lines), cut where buf is full */
static void knob_say(char* buf, size_t cap, const char* line) {
  size_t used = strlen(buf);
  if (used + 3 < cap) snprintf(buf + used, cap - used, "%s%s", used ? "; " : "", line);
}

/* The knobs' values, once; a value out of range is ignored and said in g_note. */
void pp_read_knobs(void) {
  for (int i = 0; i < NKNOBS; ++i) {
    const char* v = getenv(knob_spec[i].env);
    if (!v || !*v) continue;
    char* end = NULL;
    long long x = strtoll(v, &end, 10);
    if (*end || x < knob_spec[i].lo || x > knob_spec[i].hi) {
      char line[160];
      snprintf(line, sizeof line, "%s=%.20s ignored (not %lld..%lld)", knob_spec[i].env, v, knob_spec[i].lo,
               knob_spec[i].hi);
      knob_say(g_note, sizeof g_note, line);
      continue;
    }
    g_knob_set[i] = 1;
    g_knob_value[i] = x;
  }
  g_zeroed = g_knob_set[KNOB_ZEROED] && g_knob_value[KNOB_ZEROED] == 1;
}

/* Each knob set, through cuptiActivitySetAttribute: what was asked and CUPTI's answer, in the
 * process's header ("knobs") and the run's status (g_note). */
void pp_apply_knobs(void) {
  for (int i = 0; i < NKNOBS; ++i) {
    if (!g_knob_set[i]) continue;
    long long x = g_knob_value[i];
    size_t sz = (size_t)(i == KNOB_DEVBUF_MB ? x << 20 : x);
    uint8_t u8 = (uint8_t)x;
    size_t len = knob_spec[i].is_size ? sizeof sz : sizeof u8;
    void* value = knob_spec[i].is_size ? (void*)&sz : (void*)&u8;
    CUptiResult r = p_set_attr ? p_set_attr(knob_spec[i].attr, &len, value) : CUPTI_ERROR_NOT_SUPPORTED;
    const char* why = !p_set_attr ? "cuptiActivitySetAttribute not bound" : r == CUPTI_SUCCESS ? "ok"
                                                                                      : pp_cupti_error(r);
    char line[200];
    snprintf(line, sizeof line, "%s=%lld %s%s", knob_spec[i].env, x, r == CUPTI_SUCCESS ? "" : "not applied: ", why);
    knob_say(g_knobs, sizeof g_knobs, line);
    knob_say(g_note, sizeof g_note, line);
  }
}

/* ---- unified-memory counters (PASTAPROF_UVM=1: `pastaprof run --uvm`) ------------------------
 * CUPTI takes the counters' configuration once the driver is initialized and before the
 * UNIFIED_MEMORY_COUNTER kind is enabled (cupti_activity.h).  InitializeInjection runs inside
 * cuInit, before that point, so the configuration is made on the first context-created resource
 * callback (of the library's one CUPTI subscriber, shared with the API callbacks:
 * inject_callbacks.c): every device's counters (cuDeviceGetCount) at scope
 * PROCESS_SINGLE_DEVICE, as the Python path's pp_cupti_configure_uvm, then the kind is
 * enabled.  Where CUPTI refuses (MIG, some virtualised hosts; a multi-GPU host without P2P is
 * retried with the context's device alone) g_uvm_status says why in one line of the run's
 * status, and the rest of the capture goes on. */
int g_uvm;
char g_uvm_status[300];
typedef CUptiResult (*uvm_cfg_t)(CUpti_ActivityUnifiedMemoryCounterConfig*, uint32_t);
static uvm_cfg_t p_uvm_cfg;
static __typeof__(cuptiGetDeviceId)* p_device_id;
static int g_uvm_tried;

#define UVM_MAX_DEVICES 64

/* The counters of devices device .. device+ndev-1, then the kind enabled: 0, or CUPTI's error. */
int pp_uvm_configure(uint32_t device, uint32_t ndev) {
  static CUpti_ActivityUnifiedMemoryCounterConfig cfg[UVM_MAX_DEVICES * PP_UVM_COUNTER_KINDS];
  if (ndev > UVM_MAX_DEVICES) ndev = UVM_MAX_DEVICES;
  memset(cfg, 0, sizeof cfg);
  uint32_t n = 0;
  for (uint32_t d = 0; d < ndev; ++d)
    for (int k = 0; k < PP_UVM_COUNTER_KINDS; ++k, ++n) {
      cfg[n].scope = CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_SCOPE_PROCESS_SINGLE_DEVICE;
      cfg[n].kind = pp_uvm_counter_kinds[k];
      cfg[n].deviceId = device + d;
      cfg[n].enable = 1;
    }
  CUptiResult r = p_uvm_cfg ? p_uvm_cfg(cfg, n) : CUPTI_ERROR_NOT_SUPPORTED;
  if (r == CUPTI_SUCCESS) r = p_enable(CUPTI_ACTIVITY_KIND_UNIFIED_MEMORY_COUNTER);
  return (int)r;
}

static int device_count(void) {
  void* cuda = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
  int (*count)(int*) = cuda ? (int (*)(int*))dlsym(cuda, "cuDeviceGetCount") : NULL;
  int n = 0;
  if (!count || count(&n) != 0 || n < 1) n = 1; /* inside cuInit (no subscriber): device 0 */
  if (cuda) dlclose(cuda);
  return n;
}

/* Once: configure and enable (ctx: the first context, NULL when called at InitializeInjection). */
static void uvm_once(CUcontext ctx) {
  if (__atomic_exchange_n(&g_uvm_tried, 1, __ATOMIC_ACQ_REL)) return;
  int ndev = device_count();
  uint32_t dev = 0;
  if (ctx && p_device_id) p_device_id(ctx, &dev);
  char line[sizeof g_uvm_status];
  int r = pp_uvm_configure(0, (uint32_t)ndev);
  if (r == 0) snprintf(line, sizeof line, "ok");
  if (r != 0 && ndev > 1) {
    int one = pp_uvm_configure(dev, 1);
    if (one == 0)
      snprintf(line, sizeof line, "unified-memory counters of device %u only (all %d devices: %.120s (%d))", dev,
               ndev, pp_cupti_error((CUptiResult)r), r);
    r = one;
  }
  if (r != 0)
    snprintf(line, sizeof line, "unified-memory counters not supported here (%.160s (%d)); the rest of the capture "
             "goes on", pp_cupti_error((CUptiResult)r), r);
  memcpy(g_uvm_status, line, sizeof line);
}

/* The context-created callback of the process's one subscriber (inject_callbacks.c). */
void pp_uvm_context(CUcontext ctx) {
  if (g_uvm && p_uvm_cfg) uvm_once(ctx);
}

/* After the other kinds are enabled (pp_start_cupti), when PASTAPROF_UVM asks. */
void pp_start_uvm(void) {
  p_uvm_cfg = (uvm_cfg_t)dlsym(g_cupti, "cuptiActivityConfigureUnifiedMemoryCounter");
  p_device_id = (__typeof__(p_device_id))dlsym(g_cupti, "cuptiGetDeviceId");
  if (!p_uvm_cfg) {
    snprintf(g_uvm_status, sizeof g_uvm_status, "unified-memory counters not recorded: this libcupti lacks "
             "cuptiActivityConfigureUnifiedMemoryCounter");
    return;
  }
  snprintf(g_uvm_status, sizeof g_uvm_status, "unified-memory counters not recorded: the program made no CUDA "
           "context");
  /* CUPTI takes one subscriber per process: the one of the API callbacks (inject_callbacks.c) */
  int r = pp_cb_subscribe();
  if (r == CUPTI_SUCCESS) r = pp_cb_enable_resource(CUPTI_CBID_RESOURCE_CONTEXT_CREATED);
  if (r != CUPTI_SUCCESS) uvm_once(NULL); /* no subscriber (another CUPTI client): at once */
}
