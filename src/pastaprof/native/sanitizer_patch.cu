// Device patches of pastaprof's sanitizer tool (issue D): called by the Compute
// Sanitizer before each patched instruction, once per active lane, converged per warp.
//
// GPU mode reduces right here: each lane finds its object by binary search over the
// sorted live tables (both ends checked: an address in a gap is "unattributed", never
// credited to a neighbour), then the warp aggregates with __match_any_sync so that one
// lane per (object) adds reads/writes/bytes, one lane per distinct (object, 32-byte
// sector) adds a sector, one lane per page adds to the page histogram, and the warp's
// first lane updates the per-PC table.  Counters are per SM shard (the SM id picks one of
// n_shards copies): without that every warp of the grid serialized its atomics on the
// same few addresses (the counting cost 52x / 41x bare on the H200, fourth session).
// Objects and PCs get dense blocks in the order of first access, so the host copies back
// only what the launch used.  Raw mode stores each warp request (PC, flags, size, mask, CTA, warp, 32
// addresses) into a bounded buffer instead; requests beyond it are counted, not stored.
//
// Registers (seventh session).  A tools patch has R0 and R3-R15 to itself; it saves R2 and
// R16-R19 at entry and restores them at exit when it uses them, and what still does not
// fit goes to local memory -- per lane, on every call.  Each warp-synchronous call also
// pins R11-R15 (WARPSYNC.COLLECTIVE), so about nine registers carry what lives across one.
// As built in the sixth session pp_global had an 88 B stack frame with 156 B of spill
// stores and 300 B of spill loads.  What keeps it small now: every pointer is declared
// global (G: a generic atomic compiles to a shared-memory fallback with its own branches
// and registers); size and flags share a word (sf); the leader finds its PC's block first,
// after which the 64-bit PC is dead, and keeps its slot and its leadership in one word
// (lw); the PC table's key is 32 bits, so its probe and claim need no 64-bit compare and
// swap (see pc_lead); the lane masks are reduced to their counts in one word (cnt) before
// the counters are added; pointers are read again from the state (an L1 hit) rather than
// kept.  ptxas: only the five saved registers (20 B stores, 20 B loads, at entry and exit).
//
// Built with: nvcc -cubin -arch=sm_90 --keep-device-functions -Xptxas --compile-as-tools-patch
#include <sanitizer_patching.h>

#include "sanitizer_shared.h"

typedef unsigned long long u64;

// Everything the patches touch is device memory from sanitizerAlloc.
template <class T>
static __device__ __forceinline__ T* G(T* p) {
  __builtin_assume(__isGlobal(p));
  return p;
}

// Pins a value where it is computed: the compiler may not re-derive it at its uses from
// the values it was made of (which would keep those alive instead).
static __device__ __forceinline__ void opaque(unsigned& v) { asm("" : "+r"(v)); }

static __device__ __forceinline__ unsigned lane_id() {
  unsigned r;
  asm volatile("mov.u32 %0, %%laneid;" : "=r"(r));
  return r;
}

// Whether this lane is the first of `group` (a set of lanes that holds it).  Each group is
// tested with a different special register: ptxas keeps one it reads twice in a register
// from the first read to the last, and there are not many to spare.
static __device__ __forceinline__ bool first_lt(unsigned group) {
  unsigned m;
  asm volatile("mov.u32 %0, %%lanemask_lt;" : "=r"(m));
  return (group & m) == 0u;
}
static __device__ __forceinline__ bool first_le(unsigned group) {
  unsigned m;
  asm volatile("mov.u32 %0, %%lanemask_le;" : "=r"(m));
  m &= group;
  return (m & (m - 1u)) == 0u;  // the only lane of the group at or below this one
}
static __device__ __forceinline__ bool first_eq(unsigned group) {
  unsigned m;
  asm volatile("mov.u32 %0, %%lanemask_eq;" : "=r"(m));
  return (group & (0u - group)) == m;  // the group's lowest lane is this one
}
static __device__ __forceinline__ bool first_gt(unsigned group) {
  unsigned m;
  asm volatile("mov.u32 %0, %%lanemask_gt;" : "=r"(m));
  m = group & ~m;
  return (m & (m - 1u)) == 0u;
}

static __device__ __forceinline__ unsigned shard_of(const PPState* s) {
  unsigned r;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(r));
  return r & (s->n_shards - 1);
}

// This launch's misc row for this SM's shard (row 0 also holds the launch-wide words).
static __device__ __forceinline__ u64* misc_row(PPState* s) {
  return G(s->arena) + (size_t)shard_of(s) * PP_M_SLOTS;
}

static __device__ __forceinline__ void add(u64* p, u64 v) { atomicAdd(G(p), v); }

// The block area of the arena (after the misc rows).
static __device__ __forceinline__ u64* blocks(PPState* s) {
  return G(s->arena) + (size_t)s->n_shards * PP_M_SLOTS;
}
// This shard's counter row (`row` words, after a head of `row` words) in the block at slot.
static __device__ __forceinline__ u64* counters(PPState* s, unsigned slot, unsigned row) {
  return G(s->arena) + ((size_t)(slot - 1u) * 4u + (s->n_shards * PP_M_SLOTS + (1u + shard_of(s)) * row));
}

// A fresh block of `words` (zeroed by the host before the launch): its word offset.  The host
// sizes the area for every object and every PC table entry, so it cannot run out.
static __device__ __forceinline__ u64 claim_block(PPState* s, unsigned words) {
  return atomicAdd(G(&s->arena[PP_M_BUMP]), (u64)words);
}

// ---- objects ----

// Entry i of the object tables: tensors, then allocations (contiguous in the upload).
static __device__ __forceinline__ const PPObj* obj(const PPState* s, unsigned i) { return G(s->tensors) + i; }

// The entry of [lo, hi) holding a, or -1 (the entries are sorted and disjoint): the entry
// below the first base > a, both ends checked.  When there is none in [lo, hi) the entry
// checked is lo - 1, the last tensor when the allocations are searched -- and those are
// searched only when a lies in no tensor -- so the check fails as it should.
static __device__ __forceinline__ int find(const PPState* s, unsigned lo, unsigned hi, u64 a) {
  while (lo < hi) {  // first entry with base > a
    unsigned mid = (lo + hi) >> 1;
    if (obj(s, mid)->base <= a) lo = mid + 1; else hi = mid;
  }
  if (lo == 0) return -1;
  const PPObj* e = obj(s, lo - 1);
  return a >= e->base && a < e->end ? (int)(lo - 1) : -1;
}

// The object holding address a: index into tensors-then-allocations (contiguous in the
// upload), tensors first since they are the finer objects; -1 when none holds it.
static __device__ __forceinline__ int lookup(const PPState* s, u64 a) {
  int o = find(s, 0, s->n_tensor, a);
  if (o >= 0) return o;
  // the two counts in one load, after the first search rather than kept through it
  u64 n = *(const u64*)&s->n_tensor;
  return find(s, (unsigned)n, (unsigned)n + (unsigned)(n >> 32), a);
}

// The unattributed index (n_tensor + n_alloc) for o = -1.
static __device__ __forceinline__ unsigned oid_of(const PPState* s, int o) {
  return o < 0 ? s->n_tensor + s->n_alloc : (unsigned)o;
}

// The slot word of object o's block (o = -1: "no live object"): in its table entry
// (uploaded as 0), in the line the search has just read.
static __device__ __forceinline__ unsigned* slot_word(PPState* s, int o) {
  return G(o >= 0 ? (unsigned*)&obj(s, o)->slot : (unsigned*)&s->arena[PP_M_UNATTR_SLOT]);
}

// The slot of object o's block, claimed at its first access in this launch.  The claimer
// writes the block head before it publishes the slot; a lane that finds the slot being
// claimed waits the few instructions that takes (the claimer is another warp, or a lane of
// this warp at another call site: never one this lane's own warp-synchronous calls wait for).
static __device__ __forceinline__ unsigned obj_slot(PPState* s, int o) {
  unsigned v = __ldca(slot_word(s, o));  // L1: once published, a slot never changes in a launch
  if (v != 0u && v != PP_CLAIMING) return v;
  v = *(volatile unsigned*)slot_word(s, o);
  if (v == 0u) {
    v = atomicCAS(slot_word(s, o), 0u, PP_CLAIMING);
    if (v == 0u) {
      u64 w = claim_block(s, (1u + s->n_shards) * 8u);
      blocks(s)[w] = (u64)oid_of(s, o) + 1ull;  // the head: PPObjHead
      blocks(s)[w + 3] = PP_KIND_OBJ;
      v = (unsigned)(w >> 2) + 1u;
      __threadfence();
      atomicExch(slot_word(s, o), v);
    }
  }
  while (v == PP_CLAIMING) v = *(volatile unsigned*)slot_word(s, o);
  return v;
}

// ---- PCs ----

// Entry j (mod pc_cap) of the PC hash table, and the hash of a PC.
static __device__ __forceinline__ PPPcKey* pc_key(PPState* s, unsigned j) {
  return &G(s->pc_keys)[j & (s->pc_cap - 1)];
}

static __device__ __forceinline__ unsigned pc_hash(u64 pc) { return (unsigned)((pc >> 4) * 2654435761u); }

// The group leader's word lw for this PC: 1 | slot << 1, with the slot of the PC's block
// (claimed at its first request; slots stay below 2^31), slot 0 when the hash table has no
// room for it (or there is none).
//
// An entry's key is the PC's low 32 bits | 1: the PCs of one launch lie in one module's code
// (under 4 GiB) and are even, so no two share it, and it is never 0 (empty).  A 32-bit key
// is compared and swapped in 32-bit registers; key and slot are read with one 8-byte load.
// The probes are those of a 64-bit key: hash + 0..31, with one word of loop state, x =
// (hash + probe) << 5 | probe (the hash keeps its low 27 bits: all a table of up to 2^27
// entries uses).
static __device__ __forceinline__ unsigned pc_lead(PPState* s, u64 pc, unsigned sf) {
  if (!s->pc_cap) return 1u;
#pragma unroll 1
  for (unsigned x = pc_hash(pc) << 5;; x += 33u) {
    // L1 first: a published entry never changes within a launch (L1 starts empty at each
    // launch); an empty or half-published one is read again from L2
    u64 kv = __ldca((const u64*)pc_key(s, x >> 5));
    if ((unsigned)kv == ((unsigned)pc | 1u) && (kv >> 32)) return 1u | (unsigned)(kv >> 32) << 1;
    unsigned k = (unsigned)kv;
    if (k == 0u) k = *(volatile unsigned*)&pc_key(s, x >> 5)->key;
    if (k == 0u) {
      k = atomicCAS(&pc_key(s, x >> 5)->key, 0u, (unsigned)pc | 1u);
      if (k == 0u) {  // ours: claim a block, write its head, publish it
        u64 w = claim_block(s, (1u + s->n_shards) * 4u);
        PPPcHead* head = (PPPcHead*)(blocks(s) + w);
        head->pc = pc;
        head->size = sf >> 3;
        head->flags = sf & 7u;
        head->kind = PP_KIND_PC;
        unsigned slot = (unsigned)(w >> 2) + 1u;
        __threadfence();
        atomicExch(&pc_key(s, x >> 5)->slot, slot);
        return 1u | slot << 1;
      }
    }
    if (k == ((unsigned)pc | 1u)) {  // claimed by another warp (one lane per group probes)
      unsigned v;
      while ((v = *(volatile unsigned*)&pc_key(s, x >> 5)->slot) == 0u) {
      }
      return 1u | v << 1;
    }
    if ((x & 31u) == 31u) return 1u;
  }
}

// The lanes of this warp at this very instruction (lanes of two call sites may converge in
// one call of the patch).
static __device__ __forceinline__ unsigned request_mask(u64 pc) {
  unsigned mask = __activemask();
  int all;
  __match_all_sync(mask, pc, &all);
  return all ? mask : __match_any_sync(mask, pc);
}

static __device__ __forceinline__ void raw_store(PPState* s, u64 pc, u64 a, unsigned sf) {
  unsigned mask = request_mask(pc);
  // the leader claims a record: its index, or ~0u when the buffer is full (raw_cap < 2^32)
  unsigned slot = 0;
  if (first_lt(mask)) {
    u64 n = atomicAdd(G(&s->arena[PP_M_RAW_COUNT]), 1ull);
    slot = n < s->raw_cap ? (unsigned)n : ~0u;
  }
  slot = __shfl_sync(mask, slot, __ffs(mask) - 1);
  if (slot == ~0u) return;
  PPRaw* r = G(&s->raw[slot]);
  r->addr[lane_id()] = a;
  if (first_eq(mask)) {
    r->pc = pc;
    r->flags = sf & 7u;
    r->size = sf >> 3;
    r->active = mask;
    r->cta = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    r->warp = (threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z)) >> 5;
    r->pad = 0;
  }
}

// One global access of this lane, with the warp's active lanes at the same PC.  sf = size
// << 3 | PP_READ/WRITE/ATOMIC.
//
// The common request -- every lane of a contiguous mask in one object, addresses rising
// with the lane -- takes a fast path: one binary search (the leader's) instead of 32, and
// shuffles and ballots instead of __match_any_sync for objects, sectors and pages.  Anything
// else (lanes in several objects, scattered or falling addresses, lanes from two call sites
// in one converged call) takes the general path; both give the same counts.  Every
// warp-synchronous call is made by all the lanes of `mask` together, with `mask`.
static __device__ __forceinline__ void account(PPState* s, u64 pc, u64 a, unsigned sf) {
  unsigned mask = request_mask(pc);
  // lw: 0 on every lane but the group's first, which holds 1 | slot << 1 with its PC's
  // block (slot 0: none) -- one register says who leads and where the PC's counters go.
  // The others' 0 is set after the leader's probe, not held in a register through it.
  bool first = first_lt(mask);
  unsigned lw;
  asm("" : "=r"(lw));
  if (first) lw = pc_lead(s, pc, sf);
  lw = first ? lw : 0u;
  const bool lead = lw & 1u;

  // The leader's object serves every lane inside it.  Tensors do not overlap each other, so a
  // lane inside the leader's tensor would find that tensor itself; a lane inside the leader's
  // allocation might lie in a tensor, so an allocation serves only when there are no tensors.
  // Only an object under 64 GiB serves (its sectors differ by less than 2^31: see below); a
  // larger one takes the general path, which gives the same counts.
  int lo = lead ? lookup(s, a) : 0;
  lo = __shfl_sync(mask, lo, __ffs(mask) - 1);
  bool mine = lo >= 0 && ((unsigned)lo < s->n_tensor || s->n_tensor == 0) && a >= obj(s, lo)->base &&
              a < obj(s, lo)->end && obj(s, lo)->end - obj(s, lo)->base < (1ull << 36);
  int o = (mine || lead) ? lo : lookup(s, a);
  bool uniform = __ballot_sync(mask, mine) == mask;

  unsigned sector_leaders;
  bool ordered = false;
  if (uniform) {
    // distinct 32-byte sectors: over a contiguous mask with non-decreasing sectors, a lane
    // starts a sector iff the lane below it is in another one
    unsigned run = mask >> (__ffs(mask) - 1);
    if ((run & (run + 1)) == 0) {
      // one object under 64 GiB: the sectors of two lanes differ by less than 2^31, so the
      // low 32 bits of their difference, signed, compare them exactly
      int d = (int)((unsigned)(a >> 5) - __shfl_up_sync(mask, (unsigned)(a >> 5), 1));
      ordered = __ballot_sync(mask, lead || d >= 0) == mask;
      sector_leaders = __ballot_sync(mask, lead || d != 0);
    }
  }
  if (!ordered) {
    // distinct (object, sector) in this request: the same packing as the CPU path
    u64 key = ((u64)(oid_of(s, o) + 1) << 44) | ((a >> 5) & ((1ull << 44) - 1));
    sector_leaders = __ballot_sync(mask, first_le(__match_any_sync(mask, key)));
  }
  unsigned same_obj = uniform ? mask : __match_any_sync(mask, o);  // o: the same groups as oid's
  // what the counters need of the masks, in one word (each count is at most 32): the lanes of
  // this lane's object (bits 0-7), its sectors (8-15), the request's sectors (16-23), and
  // whether this lane leads its object (24)
  unsigned cnt = __popc(same_obj) | __popc(sector_leaders & same_obj) << 8 | __popc(sector_leaders) << 16 |
                 (unsigned)first_eq(same_obj) << 24;
  opaque(cnt);  // made here, where the masks die, rather than at each use
  if (lead) {
    // requests, lanes and sectors go to the PC's block; the launch totals get only what has
    // none (the host adds the PC blocks to them)
    if (lw > 1u) {
      u64* b = counters(s, lw >> 1, 4u);  // this shard's PPPcCounters
      add(&b[0], 1ull);
      add(&b[1], __popc(mask));
      add(&b[2], (cnt >> 16) & 0xffu);
    } else {
      u64* misc = misc_row(s);
      add(&misc[PP_M_REQUESTS], 1ull);
      add(&misc[PP_M_LANES], __popc(mask));
      if (s->pc_cap) add(&misc[PP_M_PC_DROPPED], 1ull);
    }
  }
  if (cnt >> 24) {
    u64* c = counters(s, obj_slot(s, o), 8u);  // this shard's PPCounters
    add(&c[4], (cnt >> 8) & 0xffu);
    if (sf & (PP_READ | PP_ATOMIC)) { add(&c[0], cnt & 0xffu); add(&c[2], (u64)(cnt & 0xffu) * (sf >> 3)); }
    if (sf & (PP_WRITE | PP_ATOMIC)) { add(&c[1], cnt & 0xffu); add(&c[3], (u64)(cnt & 0xffu) * (sf >> 3)); }
    if (o < 0) {
      add(&misc_row(s)[PP_M_UNATTRIBUTED], cnt & 0xffu);
      u64* ua = G(&s->arena[PP_M_UNATTR_ADDR]);
      if (*ua == 0ull) atomicCAS(ua, 0ull, a);
    }
  }
  // page histogram: one add per distinct page of the warp
  u64 slot = PP_NO_PAGES;
  if (o >= 0) {
    const PPObj* to = obj(s, o);
    if (to->page_base != PP_NO_PAGES) {
      slot = to->page_base + ((a - to->base) >> s->page_shift);
      if (slot >= s->n_pages) slot = PP_NO_PAGES;
    }
  }
  int one;  // one page for the whole group: the usual case
  __match_all_sync(mask, slot, &one);
  unsigned same_page = one ? mask : __match_any_sync(mask, slot);
  if (first_gt(same_page)) {
    if (slot != PP_NO_PAGES) add(&G(s->pages)[slot], __popc(same_page));
    else if (o >= 0) add(&misc_row(s)[PP_M_PAGE_DROPPED], __popc(same_page));
  }
}

static __device__ __forceinline__ unsigned to_flags(uint32_t f) {
  return ((f & SANITIZER_MEMORY_DEVICE_FLAG_READ) ? PP_READ : 0u) |
         ((f & SANITIZER_MEMORY_DEVICE_FLAG_WRITE) ? PP_WRITE : 0u) |
         ((f & SANITIZER_MEMORY_DEVICE_FLAG_ATOMSYS) ? PP_ATOMIC : 0u);
}

extern "C" __device__ __noinline__ SanitizerPatchResult pp_global(void* ud, uint64_t pc, void* ptr, uint32_t size,
                                                                   uint32_t flags, const void* data) {
  PPState* s = (PPState*)ud;
  if (!s || (flags & SANITIZER_MEMORY_DEVICE_FLAG_PREFETCH)) return SANITIZER_PATCH_SUCCESS;
  s = G(s);
  unsigned sf = size << 3 | to_flags(flags);
  asm("" : "+r"(sf));  // one word from here on (not size and flags, re-packed at each use)
  if (s->mode == PP_MODE_RAW) raw_store(s, pc, (u64)ptr, sf);
  else account(s, pc, (u64)ptr, sf);
  return SANITIZER_PATCH_SUCCESS;
}

// Shared / local accesses: counted per launch (they belong to no allocation).
static __device__ __forceinline__ void count_space(PPState* s, unsigned lanes_slot, unsigned bytes_slot,
                                                   uint64_t pc, uint32_t size) {
  unsigned mask = __match_any_sync(__activemask(), pc);
  if ((__ffs(mask) - 1) == lane_id()) {
    u64* misc = misc_row(s);
    add(&misc[lanes_slot], __popc(mask));
    add(&misc[bytes_slot], (u64)__popc(mask) * size);
  }
}

extern "C" __device__ __noinline__ SanitizerPatchResult pp_shared(void* ud, uint64_t pc, void* ptr, uint32_t size,
                                                                   uint32_t flags, const void* data) {
  PPState* s = (PPState*)ud;
  if (s && G(s)->mode == PP_MODE_GPU) count_space(s, PP_M_SHARED_LANES, PP_M_SHARED_BYTES, pc, size);
  return SANITIZER_PATCH_SUCCESS;
}

extern "C" __device__ __noinline__ SanitizerPatchResult pp_local(void* ud, uint64_t pc, void* ptr, uint32_t size,
                                                                  uint32_t flags, const void* data) {
  PPState* s = (PPState*)ud;
  if (s && G(s)->mode == PP_MODE_GPU) count_space(s, PP_M_LOCAL_LANES, PP_M_LOCAL_BYTES, pc, size);
  return SANITIZER_PATCH_SUCCESS;
}

// cp.async global -> shared: a global read of `src` by this lane.
extern "C" __device__ __noinline__ SanitizerPatchResult pp_memcpy_async(void* ud, uint64_t pc, void* src, uint32_t dst,
                                                                        uint32_t size) {
  PPState* s = (PPState*)ud;
  if (s) {
    s = G(s);
    if (s->mode == PP_MODE_GPU) {
      unsigned mask = __match_any_sync(__activemask(), pc);
      if ((__ffs(mask) - 1) == lane_id()) add(&misc_row(s)[PP_M_ASYNC_LANES], __popc(mask));
    }
    if (s->mode == PP_MODE_RAW) raw_store(s, pc, (u64)src, size << 3 | PP_READ);
    else account(s, pc, (u64)src, size << 3 | PP_READ);
  }
  return SANITIZER_PATCH_SUCCESS;
}

// TMA / bulk copies and warpgroup MMAs: global traffic this tool does not see lane by
// lane; counted per launch and reported as uncovered.
extern "C" __device__ __noinline__ SanitizerPatchResult pp_bulk_copy(void* ud, uint64_t pc, uint64_t src, uint32_t dst,
                                                                     uint32_t barrier, uint32_t data,
                                                                     uint32_t multicast) {
  PPState* s = (PPState*)ud;
  if (s) add(&misc_row(s)[PP_M_BULK_COPIES], 1ull);
  return SANITIZER_PATCH_SUCCESS;
}

extern "C" __device__ __noinline__ SanitizerPatchResult pp_wgmma(void* ud, uint64_t pc, uint32_t a, uint32_t sa,
                                                                 uint32_t b, uint32_t sb, uint32_t flags,
                                                                 uint32_t warp_mask) {
  PPState* s = (PPState*)ud;
  if (s) {
    s = G(s);
    unsigned mask = __activemask();
    if ((__ffs(mask) - 1) == lane_id()) add(&misc_row(s)[PP_M_WGMMA], 1ull);
  }
  return SANITIZER_PATCH_SUCCESS;
}
