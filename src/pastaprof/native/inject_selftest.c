/* A test-only entry point of pastaprof's injection library (inject.c): synthetic CUPTI
 * records through the capture's own decode() and writer, for tests on machines without a GPU
 * (tests/test_native_inject.py). */
#define _GNU_SOURCE
#include <cupti.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "inject.h"
#include "inject_state.h"

#define EXPORT __attribute__((visibility("default")))

/* ---- test-only entry point: synthetic CUPTI records through decode() and the writer ----------- */
/* Kernel i's record and its runtime cudaLaunchKernel record (and, with PASTAPROF_NATIVE_CUPTI's
 * names, a cudaGetDevice record, which decode() drops), through decode(). */
static CUpti_ActivityKernel10 launch(int i, int names, int mangled, int64_t t) {
  static char namebuf[256][64];
  CUpti_ActivityKernel10 k;
  memset(&k, 0, sizeof k);
  k.kind = CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL;
  int n = i % (names > 0 && names <= 256 ? names : 1);
  if (mangled) snprintf(namebuf[n], sizeof namebuf[n], "_Z8kernel_%dv", n);
  else snprintf(namebuf[n], sizeof namebuf[n], "kernel_%d", n);
  k.name = namebuf[n];
  k.start = (uint64_t)(t + 1000LL * i);
  k.end = k.start + 500;
  k.deviceId = 0;
  k.streamId = 7;
  k.correlationId = (uint32_t)(2 * i + 1);
  k.gridX = (int32_t)(i + 1); k.gridY = 1; k.gridZ = 1;
  k.blockX = 256; k.blockY = 1; k.blockZ = 1;
  k.registersPerThread = 32;
  k.staticSharedMemory = 1024;
  k.dynamicSharedMemory = (uint32_t)i;
  pp_decode(&k);
  CUpti_ActivityAPI a;
  memset(&a, 0, sizeof a);
  a.kind = CUPTI_ACTIVITY_KIND_RUNTIME;
  a.cbid = CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000;
  a.start = k.start - 300;
  a.end = k.start - 100;
  a.processId = (uint32_t)getpid();
  a.threadId = 42;
  a.correlationId = k.correlationId;
  pp_decode(&a);
  if (pp_test_named()) { /* with CUPTI's names: a call nothing uses, dropped by decode() */
    a.cbid = CUPTI_RUNTIME_TRACE_CBID_cudaGetDevice_v3020;
    a.correlationId = 0;
    pp_decode(&a);
  }
  return k;
}
/* Writes into $PASTAPROF_OUT/native as a capture would: `kernels` kernel records (names
 * "kernel_<i % names>" mangled as _Z..v where `mangled`; mangled == 2 adds one kernel with a
 * hostile 5,000-byte name), one runtime cudaLaunchKernel record per
 * kernel (and, with PASTAPROF_NATIVE_CUPTI's names, one cudaGetDevice record per kernel, which
 * decode() drops), `copies` HtoD memcpy records of 4096*(i+1)
 * bytes, one NVTX range per 10 kernels (domain "pp"), and one alloc + one free.  Installs the
 * exit and signal handlers as a capture does; returns 0, or -1 when the files cannot be made. */
EXPORT int pp_inject_selftest(int kernels, int names, int copies, int mangled) {
  if (pp_test_begin() != 0) return -1;
  int64_t t = 1700000000000000000LL;
  for (int i = 0; i < kernels; ++i) {
    CUpti_ActivityKernel10 k = launch(i, names, mangled, t);
    if (i % 10 == 0) {
      CUpti_ActivityMarker2 m;
      memset(&m, 0, sizeof m);
      m.kind = CUPTI_ACTIVITY_KIND_MARKER;
      m.flags = CUPTI_ACTIVITY_FLAG_MARKER_START;
      m.timestamp = (uint64_t)(k.start - 400);
      m.id = (uint32_t)(i / 10 + 1);
      m.objectKind = CUPTI_ACTIVITY_OBJECT_THREAD;
      m.objectId.pt.processId = (uint32_t)getpid();
      m.objectId.pt.threadId = 42;
      char rn[32];
      snprintf(rn, sizeof rn, "step %d", i / 10);
      m.name = rn;
      m.domain = "pp";
      pp_decode(&m);
      m.flags = CUPTI_ACTIVITY_FLAG_MARKER_END;
      m.timestamp = (uint64_t)(k.end + 50);
      m.name = NULL;
      m.domain = NULL;
      pp_decode(&m);
    }
  }
  if (mangled == 2) { /* a hostile name: escapes, quotes, a newline, invalid UTF-8, 5,000 bytes */
    static char hostile[5001];
    memset(hostile, 'x', 5000);
    memcpy(hostile, "\x1b[31m\"q\\\n\xff\xfe", 11);
    CUpti_ActivityKernel10 k;
    memset(&k, 0, sizeof k);
    k.kind = CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL;
    k.name = hostile;
    k.start = (uint64_t)(t + 1000LL * kernels);
    k.end = k.start + 1;
    pp_decode(&k);
  }
  for (int i = 0; i < copies; ++i) {
    CUpti_ActivityMemcpy6 m;
    memset(&m, 0, sizeof m);
    m.kind = CUPTI_ACTIVITY_KIND_MEMCPY;
    m.copyKind = CUPTI_ACTIVITY_MEMCPY_KIND_HTOD;
    m.bytes = 4096ull * (uint64_t)(i + 1);
    m.start = (uint64_t)(t - 100000 + 1000LL * i);
    m.end = m.start + 700;
    m.streamId = 7;
    m.correlationId = (uint32_t)(1000000 + i);
    pp_decode(&m);
  }
  for (int op = 1; op <= 2; ++op) {
    CUpti_ActivityMemory4 m;
    memset(&m, 0, sizeof m);
    m.kind = CUPTI_ACTIVITY_KIND_MEMORY2;
    m.memoryOperationType = op == 1 ? CUPTI_ACTIVITY_MEMORY_OPERATION_TYPE_ALLOCATION
                                    : CUPTI_ACTIVITY_MEMORY_OPERATION_TYPE_RELEASE;
    m.memoryKind = CUPTI_ACTIVITY_MEMORY_KIND_DEVICE;
    m.address = 0x7f0000000000ull;
    m.bytes = 1 << 20;
    m.timestamp = (uint64_t)(t - 200000 + op * 150000000LL);
    m.processId = (uint32_t)getpid();
    pp_decode(&m);
  }
  pp_test_end();
  return 0;
}

/* Test-only, after pp_inject_selftest(first, ...): `more` kernels (numbered from `first`) and
 * their launch records decoded but held, as records in a CUPTI buffer not yet completed are:
 * only the capture's final flush (an exit, a signal, an exec) writes them. */
EXPORT void pp_inject_selftest_held(int first, int more) {
  pp_test_hold(1);
  for (int i = first; i < first + more; ++i) launch(i, 3, 1, 1700000000000000000LL);
  pp_test_hold(0);
}

/* Test-only: one buffer through the capture's CUPTI buffer callbacks (pp_test_buffers in
 * inject.c); call after pp_inject_selftest.  0: the buffers came as PASTAPROF_NATIVE_ZEROED says. */
EXPORT int pp_inject_buffer_check(void) { return pp_test_buffers(); }

/* Test-only: unified-memory counter records through decode() and the writer, as a capture with
 * --uvm takes them: one managed allocation of `pages` x 64 KiB, `pages` HtoD migrations of
 * 64 KiB (cause coherence), one GPU page-fault record of pages/4 fault groups (write), pages/2
 * CPU page faults (read) and pages/2 DtoH migrations of 4 KiB (cause coherence), on device 0
 * and stream 7.  With PASTAPROF_UVM=1 and PASTAPROF_NATIVE_CUPTI, the counters are configured
 * first through that libcupti, as a capture would (without a driver CUPTI refuses: the refusal
 * is the process's "uvm" status).  0, or -1 when the files cannot be made. */
EXPORT int pp_inject_selftest_uvm(int pages) {
  if (pp_test_begin() != 0) return -1;
  if (g_uvm && g_cupti) pp_start_uvm();
  int64_t t = 1700000000000000000LL;
  CUpti_ActivityMemory4 m; /* the managed allocation the pages are in */
  memset(&m, 0, sizeof m);
  m.kind = CUPTI_ACTIVITY_KIND_MEMORY2;
  m.memoryOperationType = CUPTI_ACTIVITY_MEMORY_OPERATION_TYPE_ALLOCATION;
  m.memoryKind = CUPTI_ACTIVITY_MEMORY_KIND_MANAGED;
  m.address = 0x7f1000000000ull;
  m.bytes = 65536ull * (uint64_t)(pages > 0 ? pages : 1);
  m.timestamp = (uint64_t)(t - 5000);
  m.processId = (uint32_t)getpid();
  pp_decode(&m);
  CUpti_ActivityUnifiedMemoryCounter3 u;
  for (int i = 0; i < pages + 1 + pages / 2 + pages / 2; ++i) {
    memset(&u, 0, sizeof u);
    u.kind = CUPTI_ACTIVITY_KIND_UNIFIED_MEMORY_COUNTER;
    u.start = (uint64_t)(t + 1000LL * i);
    u.end = u.start + 400;
    u.address = 0x7f1000000000ull + 65536ull * (uint64_t)(i % (pages > 0 ? pages : 1));
    u.streamId = 7;
    u.processId = (uint32_t)getpid();
    if (i < pages) { /* host -> device: CPU (-1) to device 0 */
      u.counterKind = CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_BYTES_TRANSFER_HTOD;
      u.value = 65536;
      u.srcId = (uint32_t)-1;
      u.flags = CUPTI_ACTIVITY_UNIFIED_MEMORY_MIGRATION_CAUSE_COHERENCE;
    } else if (i == pages) {
      u.counterKind = CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_GPU_PAGE_FAULT;
      u.value = (uint64_t)(pages / 4);
      u.srcId = u.dstId = 0;
      u.flags = CUPTI_ACTIVITY_UNIFIED_MEMORY_ACCESS_TYPE_WRITE;
    } else if (i <= pages + pages / 2) {
      u.counterKind = CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_CPU_PAGE_FAULT_COUNT;
      u.value = 1;
      u.srcId = u.dstId = (uint32_t)-1;
      u.end = 0; /* CUPTI gives CPU faults an instant */
      u.flags = CUPTI_ACTIVITY_UNIFIED_MEMORY_ACCESS_TYPE_READ;
    } else {
      u.counterKind = CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_BYTES_TRANSFER_DTOH;
      u.value = 4096;
      u.dstId = (uint32_t)-1;
      u.flags = CUPTI_ACTIVITY_UNIFIED_MEMORY_MIGRATION_CAUSE_COHERENCE;
    }
    pp_decode(&u);
  }
  pp_test_end();
  return 0;
}

/* ---- test-only: the callback mechanism (inject_callbacks.c) without a GPU ------------------- */
/* The synchronization type of a call's name, + 256 for a per-thread-stream (_ptsz) variant. */
EXPORT int pp_inject_sync_type(const char* name) {
  int per_thread = 0, type = pp_sync_type(name, &per_thread);
  return type + (per_thread ? 256 : 0);
}

/* A call's PP_CB_* class (inject_state.h), as PASTAPROF_NATIVE_KINDS and PASTAPROF_OFF ask. */
EXPORT int pp_inject_cb_class(const char* name) { return pp_cb_class(name); }

/* After pp_inject_selftest: the mechanism chosen as a capture's start chooses it (1 callbacks,
 * 0 activity; the header's "api_mechanism" says why). */
EXPORT int pp_inject_cb_start(void) { return pp_cb_start(); }

/* After pp_inject_selftest, with PASTAPROF_NATIVE_CUPTI's names: every cbid classified and the
 * callbacks live, as after a capture's start, without a subscriber; stream ids are the handles'
 * values (+1000 per-thread; handle 0xbad: CUPTI fails).  The number of cbids classified, or -1. */
EXPORT int pp_inject_cb_live(void) { return pp_cb_test_live(); }

/* One API call through the callback, as CUPTI makes it: `outer` (and a call `inner` nested in
 * it, or NULL) by CUPTI's names, correlation id `corr`, first parameter `stream`.  0, or -1. */
EXPORT int pp_inject_cb_call(const char* outer, const char* inner, unsigned corr, long long stream) {
  return pp_cb_test_call(outer, inner, corr, stream);
}

/* The callback rows not yet written into the files. */
EXPORT long long pp_inject_cb_pending(void) { return pp_cb_pending(); }
