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

/* misc[] slots: per-launch totals.  misc holds one row of PP_M_SLOTS per shard (see
 * PPState.n_shards); the additive counters are summed over the rows by the host, the
 * others (marked "row 0") live in row 0 only. */
enum {
  PP_M_REQUESTS = 0,     /* global warp requests (incl. cp.async) without a PC block (the host adds those) */
  PP_M_LANES,            /* their lane accesses */
  PP_M_UNATTRIBUTED,     /* lane accesses in no live object */
  PP_M_SHARED_LANES,     /* shared-memory lane accesses (counted, not attributed) */
  PP_M_LOCAL_LANES,      /* local-memory lane accesses */
  PP_M_ASYNC_LANES,      /* cp.async lanes (global reads counted with the objects) */
  PP_M_BULK_COPIES,      /* TMA / bulk global->shared copies: uncovered (bytes unknown) */
  PP_M_WGMMA,            /* warpgroup MMAs: operands not seen as memory accesses */
  PP_M_PC_DROPPED,       /* requests whose PC found no slot in the per-PC table */
  PP_M_PAGE_DROPPED,     /* attributed lanes whose object has no page histogram */
  PP_M_RAW_COUNT,        /* row 0: raw requests claimed (may exceed the buffer) */
  PP_M_SHARED_BYTES,
  PP_M_LOCAL_BYTES,
  PP_M_UNATTR_ADDR,      /* row 0: one address that fell in no live object (diagnosis) */
  PP_M_BUMP,             /* row 0: words of the block area claimed by this launch */
  PP_M_UNATTR_SLOT,      /* row 0: the slot word (low 32 bits) of "no live object" */
  PP_M_SLOTS = 16
};

typedef struct {
  unsigned long long base, end;  /* [base, end), sorted by base, disjoint within a table */
  unsigned long long page_base;  /* first slot in pages[], or PP_NO_PAGES */
  unsigned int slot;             /* this launch: 0, PP_CLAIMING, or (word offset of its block) / 4 + 1 */
  unsigned int pad;
} PPObj;                         /* 32 B; uploaded with slot = 0 at every instrumented launch */

/* Counters are spread over n_shards copies (shard = SM id mod n_shards) so that the warps
 * of different SMs do not serialize on the same addresses; the host sums the copies.
 * Objects and PCs claim a block in the arena at their first access in a launch (a bump
 * allocator: PP_M_BUMP), so the host copies back the misc rows and the used blocks in one
 * piece.  Block = head (kind in word 3), then one counter row per shard:
 *   object: PPObjHead (8 words), n_shards x PPCounters (8 words)
 *   PC:     PPPcHead (4 words),  n_shards x PPPcCounters (4 words) */
#define PP_KIND_OBJ 1ull
#define PP_KIND_PC 2ull

typedef struct {
  unsigned long long reads, writes, bytes_read, bytes_written, sectors, pad[3]; /* 64 B */
} PPCounters;

typedef struct {
  unsigned long long object; /* object index + 1 (n_tensor + n_alloc + 1 = unattributed) */
  unsigned long long pad[2];
  unsigned long long kind;   /* PP_KIND_OBJ */
  unsigned long long pad2[4];
} PPObjHead;

typedef struct {
  unsigned long long requests, lanes, sectors, pad; /* 32 B; bytes, reads and writes follow from the head */
} PPPcCounters;

typedef struct {
  unsigned long long pc;
  unsigned int size, flags; /* an instruction's access size and PP_READ/WRITE/ATOMIC never change */
  unsigned long long pad;
  unsigned long long kind;  /* PP_KIND_PC */
} PPPcHead;

typedef struct {
  unsigned int key;         /* the PC's low 32 bits | 1 (unique within a launch: see pc_lead); 0 = empty */
  unsigned int slot;        /* (word offset of its block) / 4 + 1; 0 while its claimer writes the head */
  unsigned long long pad;
} PPPcKey;                  /* 16 B; key and slot are read with one 8-byte load */

typedef struct {
  unsigned long long pc;
  unsigned int flags, size, active, cta, warp, pad;
  unsigned long long addr[32];
} PPRaw;

#define PP_NO_PAGES 0xffffffffffffffffull
#define PP_CLAIMING 0xffffffffu

typedef struct {
  unsigned int mode;
  unsigned int page_shift;
  unsigned int n_tensor, n_alloc;  /* objects: tensors first, then allocations */
  PPObj *tensors, *allocs;
  unsigned long long *pages;
  unsigned long long n_pages;
  PPPcKey *pc_keys;                /* pc_cap hash entries */
  unsigned int pc_cap;             /* power of two; 0 = no per-PC table */
  unsigned int n_shards;           /* power of two */
  unsigned long long *arena;       /* n_shards x PP_M_SLOTS misc rows, then block_cap words of blocks */
  unsigned long long block_cap;
  PPRaw *raw;
  unsigned long long raw_cap;
} PPState;
