/* The native capture's state, shared by the files of the injection library (inject.c,
 * inject_cupti.c, inject_files.c): one capture per process, so plain globals, hidden from the
 * program by -fvisibility=hidden. */
#ifndef PASTAPROF_INJECT_STATE_H
#define PASTAPROF_INJECT_STATE_H

#include <cupti.h>
#include <stdint.h>
#include <stdio.h>

#include "inject.h"

/* libcupti's functions, bound at run time (inject_cupti.c) */
extern __typeof__(cuptiActivityRegisterCallbacks)* p_register;
extern __typeof__(cuptiActivityEnable)* p_enable;
extern __typeof__(cuptiActivityGetNextRecord)* p_next;
extern __typeof__(cuptiActivityFlushAll)* p_flush;
extern __typeof__(cuptiActivityFlushPeriod)* p_flush_period;
extern __typeof__(cuptiActivityGetNumDroppedRecords)* p_dropped;
extern __typeof__(cuptiGetCallbackName)* p_cb_name;
extern __typeof__(cuptiActivityEnableRuntimeApi)* p_enable_rt;
extern __typeof__(cuptiActivityEnableDriverApi)* p_enable_drv;
extern __typeof__(cuptiGetResultString)* p_result;
extern __typeof__(cuptiActivitySetAttribute)* p_set_attr;
extern void* g_cupti;
typedef int (*nvtx_init_t)(void*);

/* the capture (inject.c) */
extern int g_rec_fd, g_str_fd;
extern char g_dir[4096], g_base[4200];
extern int g_rank;
extern int64_t g_started_ns;
extern int64_t g_stat[PP_NSTATS];
extern char g_status[512];
extern char g_ended[32];
extern const char* g_mode;
extern int g_flush_ms;
extern char g_note[512];
extern char g_san_status[512];
extern int64_t g_sample;
extern int g_kernel_filter; /* 0 none, 1 posix here, 2 python (reader) */
extern int g_off_kernels, g_off_api, g_off_memory;

void pp_write_all(int fd, const void* p, size_t n);

/* inject_records.c: the stage of records for the .rec file (under inject.c's lock) */
int pp_stage_alloc(void);
void pp_stage_flush(void); /* the staged strings, then the staged records, written */
void pp_stage_forget(void);
int64_t* pp_row(int kind); /* a zeroed record of `kind` in the stage (word 0 set), or NULL */
const char* pp_cb_name(int driver, uint32_t cbid); /* CUPTI's name of an API call, or NULL */

/* inject_files.c */
int64_t pp_now_ns(void);
void pp_json_string(FILE* f, const char* s, size_t n);
void pp_write_meta(int complete);
int pp_open_files(void);

/* inject_cupti.c */
int pp_bind_cupti(void);
int pp_api_kept(const char* name);
int pp_start_cupti(CUpti_BuffersCallbackRequestFunc requested, CUpti_BuffersCallbackCompleteFunc completed);
/* the PASTAPROF_NATIVE_* knobs of CUPTI's activity attributes (inject_cupti.c) */
extern int g_zeroed;     /* PASTAPROF_NATIVE_ZEROED=1: buffers handed to CUPTI are zeroed */
extern char g_knobs[512]; /* each knob set and CUPTI's answer, for the run's header */
void pp_read_knobs(void);
void pp_apply_knobs(void);
/* unified-memory counters (PASTAPROF_UVM=1, `pastaprof run --uvm`; inject_cupti.c) */
extern int g_uvm;             /* wanted */
extern char g_uvm_status[300]; /* "ok", or why they are not recorded; "" when not wanted */
void pp_start_uvm(void);
int pp_uvm_configure(uint32_t device, uint32_t ndev);
void pp_uvm_context(CUcontext ctx); /* the first context: counters configured (inject_callbacks.c calls it) */
int pp_kind_wanted(const char* kind); /* PASTAPROF_NATIVE_KINDS lists it (or is unset) */
const char* pp_cupti_error(CUptiResult r);

/* API calls, synchronizations and the lazily enabled kinds through CUPTI's callback API
 * (inject_callbacks.c).  A cbid's class: */
enum {
  PP_CB_API = 1,        /* a kept call (pp_api_kept): a PP_API row at its exit */
  PP_CB_SYNC = 7 << 1,  /* the synchronization type (CUpti_ActivitySynchronizationType) << 1: a PP_SYNC row */
  PP_CB_PT = 1 << 4,    /* a per-thread-default-stream variant (_ptsz): the stream handle is per thread */
  PP_CB_MEMCPY = 1 << 5, /* its first call enables the MEMCPY kind */
  PP_CB_MEMSET = 1 << 6, /* ... MEMSET */
  PP_CB_MEMORY = 1 << 7, /* ... MEMORY2 */
};
extern char g_api_mechanism[300]; /* "callbacks" or "activity (why)", for the header */
int pp_sync_type(const char* name, int* per_thread);
int pp_cb_class(const char* name);
int pp_cb_start(void); /* 1: the callbacks take API calls, syncs, memcpy/memset/memory/marker; 0: activity records */
int pp_cb_subscribe(void); /* the process's one CUPTI subscriber (also UVM's): 0 or CUPTI's error */
int pp_cb_enable_resource(CUpti_CallbackId cbid);
int pp_cb_live(void);
int pp_cb_launch_records(void); /* 1: launch calls are per-cbid activity records (the hybrid mechanism) */
void pp_cb_nvtx(void); /* the first NVTX call: MARKER enabled (callbacks mechanism) */
void pp_cb_drain(int wait); /* callback rows into the stage (under inject.c's lock); wait 0: only if free */
void pp_cb_fork(int phase); /* 0 prepare, 1 parent, 2 child (inside inject.c's fork handlers) */
void pp_cb_meta(FILE* f);   /* the header's "api_mechanism" and "lazy_kinds" */
/* for inject_selftest.c */
int pp_cb_test_live(void);
int pp_cb_test_call(const char* outer, const char* inner, uint32_t corr, int64_t stream);
int64_t pp_cb_pending(void);

#endif
