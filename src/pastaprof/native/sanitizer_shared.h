/* Layout shared by the sanitizer host library (sanitizer_tool.cpp) and its device
 * patches (sanitizer_patch.cu).  All counters are 64-bit; every table is sized by the
 * host, which reads each one back after the launch.  Keep in step with both files. */
#pragma once
#include <stdint.h>

#define PP_MODE_GPU 1u /* reduce on the device: counters, page histograms, per-PC table */
#define PP_MODE_RAW 2u /* copy every warp request into a bounded buffer for the host */

#define PP_READ 1u
#define PP_WRITE 2u
#define PP_ATOMIC 4u

/* misc[] slots: per-launch totals */
enum {
  PP_M_REQUESTS = 0,     /* global warp requests (incl. cp.async) */
  PP_M_LANES,            /* global lane accesses */
  PP_M_UNATTRIBUTED,     /* lane accesses in no live object */
  PP_M_SHARED_LANES,     /* shared-memory lane accesses (counted, not attributed) */
  PP_M_LOCAL_LANES,      /* local-memory lane accesses */
  PP_M_ASYNC_LANES,      /* cp.async lanes (global reads counted with the objects) */
  PP_M_BULK_COPIES,      /* TMA / bulk global->shared copies: uncovered (bytes unknown) */
  PP_M_WGMMA,            /* warpgroup MMAs: operands not seen as memory accesses */
  PP_M_PC_DROPPED,       /* requests whose PC found no slot in the per-PC table */
  PP_M_PAGE_DROPPED,     /* attributed lanes whose object has no page histogram */
  PP_M_RAW_COUNT,        /* raw requests claimed (may exceed the buffer) */
  PP_M_SHARED_BYTES,
  PP_M_LOCAL_BYTES,
  PP_M_UNATTR_ADDR,      /* one address that fell in no live object (diagnosis) */
  PP_M_SLOTS = 16
};

typedef struct {
  unsigned long long base, end; /* [base, end), sorted by base, disjoint within a table */
} PPObj;

typedef struct {
  unsigned long long reads, writes, bytes_read, bytes_written, sectors;
} PPCounters;

typedef struct {
  unsigned long long pc; /* 0 = empty slot */
  unsigned long long requests, lanes, bytes, sectors, reads, writes;
} PPPc;

typedef struct {
  unsigned long long pc;
  unsigned int flags, size, active, cta, warp, pad;
  unsigned long long addr[32];
} PPRaw;

#define PP_NO_PAGES 0xffffffffffffffffull

typedef struct {
  unsigned int mode;
  unsigned int page_shift;
  unsigned int n_tensor, n_alloc;  /* objects: tensors first, then allocations */
  const PPObj *tensors, *allocs;
  PPCounters *counters;            /* n_tensor + n_alloc + 1 (last: unattributed) */
  const unsigned long long *page_base; /* per object: first slot in pages[], or PP_NO_PAGES */
  unsigned long long *pages;
  unsigned long long n_pages;
  PPPc *pcs;
  unsigned int pc_cap;             /* power of two */
  unsigned int pad;
  unsigned long long *misc;        /* PP_M_SLOTS */
  PPRaw *raw;
  unsigned long long raw_cap;
} PPState;
