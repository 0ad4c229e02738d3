/* The records of pastaprof's injection library (inject.c): CUPTI's activity records decoded
 * into fixed 128-byte records (inject.h) and staged, then written with write(2) at the end of
 * each buffer, by the periodic flusher and at exit.  The callback rows of inject_callbacks.c
 * join the same stage.  Everything here runs under inject.c's lock. */
#define _GNU_SOURCE
#include <cupti.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "inject.h"
#include "inject_state.h"

static int64_t g_launch_seq; /* kernel launches seen, for PASTAPROF_SAMPLE */

/* staged output, written with write(2) at the end of each buffer */
#define STAGE_RECORDS 4096
static int64_t (*g_stage)[PP_RECORD_WORDS];
static int g_nstage;

static signed char g_api_keep[2][PP_MAX_CBID]; /* 0 unknown, 1 keep, -1 drop (the whole-kind fallback) */

/* CUPTI's name of an API call, or NULL */
const char* pp_cb_name(int driver, uint32_t cbid) {
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

void pp_stage_flush(void) {
  size_t n = 0;
  const char* strings = pp_names_staged(&n); /* strings before the records naming them */
  if (n) pp_write_all(g_str_fd, strings, n);
  if (g_nstage) pp_write_all(g_rec_fd, g_stage, (size_t)g_nstage * PP_RECORD_BYTES);
  g_stat[PP_STAT_WRITTEN] += g_nstage;
  g_nstage = 0;
}

int64_t* pp_row(int kind) {
  if (!g_stage) return NULL;
  if (g_nstage == STAGE_RECORDS) pp_stage_flush();
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

void pp_decode(const void* record) {
  const CUpti_Activity* a = (const CUpti_Activity*)record;
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
      if (!(r = pp_row(PP_KERNEL))) return;
      PUT((int64_t)k->start, (int64_t)k->end, k->deviceId, k->streamId, k->correlationId, name, k->gridX, k->gridY,
          k->gridZ, k->blockX, k->blockY, k->blockZ, k->registersPerThread,
          (int64_t)k->staticSharedMemory + (int64_t)k->dynamicSharedMemory);
      break;
    }
    case CUPTI_ACTIVITY_KIND_MEMCPY: {
      const CUpti_ActivityMemcpy6* m = (const CUpti_ActivityMemcpy6*)a;
      if (!(r = pp_row(PP_MEMCPY))) return;
      PUT((int64_t)m->start, (int64_t)m->end, m->deviceId, m->streamId, m->correlationId, (int64_t)m->bytes,
          m->copyKind);
      break;
    }
    case CUPTI_ACTIVITY_KIND_MEMSET: {
      const CUpti_ActivityMemset4* m = (const CUpti_ActivityMemset4*)a;
      if (!(r = pp_row(PP_MEMSET))) return;
      PUT((int64_t)m->start, (int64_t)m->end, m->deviceId, m->streamId, m->correlationId, (int64_t)m->bytes);
      break;
    }
    case CUPTI_ACTIVITY_KIND_SYNCHRONIZATION: {
      const CUpti_ActivitySynchronization2* s = (const CUpti_ActivitySynchronization2*)a;
      if (!(r = pp_row(PP_SYNC))) return;
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
          const char* name = pp_cb_name(driver, c->cbid);
          *keep = !name || pp_api_kept(name) ? 1 : -1;
        }
        if (*keep < 0) return;
      }
      if (!(r = pp_row(PP_API))) return;
      PUT((int64_t)c->start, (int64_t)c->end, c->processId, c->threadId, c->correlationId, c->cbid, driver,
          pp_api_name(driver, c->cbid, pp_cb_name));
      break;
    }
    case CUPTI_ACTIVITY_KIND_MEMORY2: {
      const CUpti_ActivityMemory4* m = (const CUpti_ActivityMemory4*)a;
      if (!(r = pp_row(PP_MEMORY))) return;
      PUT((int64_t)m->timestamp, m->deviceId, m->streamId, m->correlationId, (int64_t)m->address, (int64_t)m->bytes,
          m->memoryKind, m->memoryOperationType, m->processId, m->isAsync);
      break;
    }
    case CUPTI_ACTIVITY_KIND_UNIFIED_MEMORY_COUNTER: {
      const CUpti_ActivityUnifiedMemoryCounter3* u = (const CUpti_ActivityUnifiedMemoryCounter3*)a;
      if (!(r = pp_row(PP_UVM))) return;
      PUT((int64_t)u->start, (int64_t)u->end, u->counterKind, (int64_t)u->value, (int64_t)u->address,
          (int64_t)(int32_t)u->srcId, (int64_t)(int32_t)u->dstId, u->streamId, u->flags, u->processId);
      break;
    }
    case CUPTI_ACTIVITY_KIND_MARKER: {
      const CUpti_ActivityMarker2* m = (const CUpti_ActivityMarker2*)a;
      if (!(r = pp_row(PP_MARKER))) return;
      int thread = m->objectKind == CUPTI_ACTIVITY_OBJECT_THREAD;
      PUT((int64_t)m->timestamp, m->flags, m->id, m->objectKind, thread ? (int64_t)m->objectId.pt.processId : -1,
          thread ? (int64_t)m->objectId.pt.threadId : -1, pp_intern(m->name), pp_intern(m->domain));
      break;
    }
    default:
      break;
  }
}


int pp_stage_alloc(void) {
  if (!g_stage) g_stage = calloc(STAGE_RECORDS, PP_RECORD_BYTES);
  return g_stage ? 0 : -1;
}

void pp_stage_forget(void) { g_nstage = 0; }
