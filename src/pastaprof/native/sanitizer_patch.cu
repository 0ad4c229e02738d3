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
// Built with: nvcc -cubin -arch=sm_90 --keep-device-functions -Xptxas --compile-as-tools-patch
#include <sanitizer_patching.h>

#include "sanitizer_shared.h"

static __device__ __forceinline__ unsigned lane_id() {
  unsigned r;
  asm volatile("mov.u32 %0, %%laneid;" : "=r"(r));
  return r;
}

static __device__ __forceinline__ int find(const PPObj* t, unsigned n, unsigned long long a) {
  unsigned lo = 0, hi = n;
  while (lo < hi) {  // first entry with base > a
    unsigned mid = (lo + hi) >> 1;
    if (t[mid].base <= a) lo = mid + 1; else hi = mid;
  }
  if (lo == 0) return -1;
  return a < t[lo - 1].end ? (int)(lo - 1) : -1;
}

static __device__ __forceinline__ unsigned shard_of(const PPState* s) {
  unsigned r;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(r));
  return r & (s->n_shards - 1);
}

// This launch's misc row for this SM's shard (row 0 also holds the launch-wide words).
static __device__ __forceinline__ unsigned long long* misc_row(PPState* s, unsigned shard) {
  return s->arena + (size_t)shard * PP_M_SLOTS;
}

// `words` fresh words of the block area (zeroed by the host before the launch).  The host
// sizes the area for every object and every PC table entry, so it cannot run out.
static __device__ __forceinline__ unsigned long long* claim_words(PPState* s, unsigned long long words,
                                                                  unsigned long long* slot_out) {
  unsigned long long w = atomicAdd(&s->arena[PP_M_BUMP], words);
  *slot_out = w / 4u + 1u;
  return s->arena + (size_t)s->n_shards * PP_M_SLOTS + w;
}

static __device__ __forceinline__ unsigned long long* block_at(PPState* s, unsigned long long slot) {
  return s->arena + (size_t)s->n_shards * PP_M_SLOTS + (slot - 1u) * 4u;
}

// The block of object `sw`'s owner, claimed at its first access in this launch.  The
// slot word sits in the object's table entry (uploaded as 0), in the line the search has
// just read.  The claimer writes the block head before it publishes the slot; a warp that
// finds the slot being claimed waits the few instructions that takes (another warp: it
// always progresses).
static __device__ __forceinline__ unsigned long long* obj_block(PPState* s, unsigned* sw, unsigned oid) {
  unsigned v = __ldca(sw);  // L1: once published, a slot never changes in a launch
  if (v == 0u || v == PP_CLAIMING) v = *(volatile unsigned*)sw;
  if (v == 0u) {
    unsigned old = atomicCAS(sw, 0u, PP_CLAIMING);
    if (old == 0u) {
      unsigned long long slot;
      unsigned long long* head = claim_words(s, (1u + s->n_shards) * 8u, &slot);
      head[0] = (unsigned long long)oid + 1ull;
      head[3] = PP_KIND_OBJ;
      __threadfence();
      atomicExch(sw, (unsigned)slot);
      return head;
    }
    v = old;
  }
  while (v == PP_CLAIMING) v = *(volatile unsigned*)sw;
  return block_at(s, v);
}

// The block of this PC, or null when the hash table has no room for it.
static __device__ __forceinline__ unsigned long long* pc_block(PPState* s, unsigned long long pc, unsigned size,
                                                              unsigned flags) {
  unsigned cap = s->pc_cap;
  unsigned h = (unsigned)((pc >> 4) * 2654435761u) & (cap - 1);
  for (unsigned probe = 0; probe < 32; ++probe) {
    PPPcKey* e = &s->pc_keys[(h + probe) & (cap - 1)];
    // one vector load from L1 first: a published entry never changes within a launch (L1
    // starts empty at each launch); an empty or half-published one is read again from L2
    ulonglong2 kv = __ldca((const ulonglong2*)e);
    if (kv.x == pc && kv.y) return block_at(s, kv.y);
    unsigned long long k = kv.x;
    if (k == 0ull) k = *(volatile unsigned long long*)&e->pc;
    if (k == 0ull) {
      k = atomicCAS(&e->pc, 0ull, pc);
      if (k == 0ull) {  // ours: claim a block, write its head, publish it
        unsigned long long slot;
        unsigned long long* b = claim_words(s, (1u + s->n_shards) * 4u, &slot);
        PPPcHead* head = (PPPcHead*)b;
        head->pc = pc;
        head->size = size;
        head->flags = flags;
        head->kind = PP_KIND_PC;
        __threadfence();
        atomicExch(&e->slot, slot);
        return b;
      }
    }
    if (k == pc) {
      unsigned long long v;
      while ((v = *(volatile unsigned long long*)&e->slot) == 0ull) {
      }
      return block_at(s, v);
    }
  }
  return nullptr;
}

static __device__ __forceinline__ void raw_store(PPState* s, unsigned mask, unsigned lane, unsigned long long pc,
                                                 unsigned long long a, unsigned size, unsigned flags) {
  unsigned leader = __ffs(mask) - 1;
  unsigned long long slot = 0;
  if (lane == leader) slot = atomicAdd(&s->arena[PP_M_RAW_COUNT], 1ull);
  slot = __shfl_sync(mask, slot, leader);
  if (slot >= s->raw_cap) return;
  PPRaw* r = &s->raw[slot];
  r->addr[lane] = a;
  if (lane == leader) {
    r->pc = pc;
    r->flags = flags;
    r->size = size;
    r->active = mask;
    r->cta = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    r->warp = (threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z)) >> 5;
    r->pad = 0;
  }
}

// The object holding address a: index into tensors-then-allocations (contiguous in the
// upload), tensors first since they are the finer objects; -1 when none holds it.
static __device__ __forceinline__ int lookup(const PPState* s, unsigned long long a) {
  int o = find(s->tensors, s->n_tensor, a);
  if (o >= 0) return o;
  o = find(s->allocs, s->n_alloc, a);
  return o < 0 ? -1 : o + (int)s->n_tensor;
}

// One global access of this lane, with the warp's active lanes at the same PC.
//
// The common request -- every lane of a contiguous mask in one object, addresses rising
// with the lane -- takes a fast path: one binary search (the leader's) instead of 32, and
// shuffles and ballots instead of __match_any_sync for objects, sectors and pages.  Anything
// else (lanes in several objects, scattered or falling addresses, lanes from two call sites
// in one converged call) takes the general path; both give the same counts.
static __device__ __forceinline__ void account(PPState* s, unsigned long long pc, unsigned long long a,
                                               unsigned size, unsigned flags) {
  unsigned mask = __activemask();
  unsigned lane = lane_id();
  unsigned leader = __ffs(mask) - 1;
  if (__ballot_sync(mask, __shfl_sync(mask, pc, leader) == pc) != mask) {
    mask = __match_any_sync(mask, pc);  // lanes at this very instruction
    leader = __ffs(mask) - 1;
  }
  if (s->mode == PP_MODE_RAW) {
    raw_store(s, mask, lane, pc, a, size, flags);
    return;
  }
  unsigned shard = shard_of(s);
  unsigned long long* misc = misc_row(s, shard);
  // The leader's object serves every lane inside it.  Tensors do not overlap each other, so a
  // lane inside the leader's tensor would find that tensor itself; a lane inside the leader's
  // allocation might lie in a tensor, so an allocation serves only when there are no tensors.
  int lo = lane == leader ? lookup(s, a) : 0;
  lo = __shfl_sync(mask, lo, leader);
  bool mine = lo >= 0 && ((unsigned)lo < s->n_tensor || s->n_tensor == 0) && a >= s->tensors[lo].base &&
              a < s->tensors[lo].end;
  int o = (mine || lane == leader) ? lo : lookup(s, a);
  bool uniform = __ballot_sync(mask, mine) == mask;
  PPObj* t = o >= 0 ? &s->tensors[o] : nullptr;
  unsigned n_obj = s->n_tensor + s->n_alloc;
  unsigned oid = o < 0 ? n_obj : (unsigned)o;
  bool rd = flags & (PP_READ | PP_ATOMIC), wr = flags & (PP_WRITE | PP_ATOMIC);
  unsigned same_obj, sector_leaders;
  bool ordered = false;
  if (uniform) {
    same_obj = mask;
    // distinct 32-byte sectors: over a contiguous mask with non-decreasing sectors, a lane
    // starts a sector iff the lane below it is in another one
    unsigned run = mask >> leader;
    unsigned long long sec = a >> 5;
    unsigned long long below = __shfl_up_sync(mask, sec, 1);
    bool first = lane == leader;
    if ((run & (run + 1)) == 0) {
      ordered = __ballot_sync(mask, first || sec >= below) == mask;
      if (ordered) sector_leaders = __ballot_sync(mask, first || sec != below);
    }
  } else {
    same_obj = __match_any_sync(mask, oid);
  }
  if (!ordered) {
    // distinct (object, sector) in this request: the same packing as the CPU path
    unsigned long long key = ((unsigned long long)(oid + 1) << 44) | ((a >> 5) & ((1ull << 44) - 1));
    unsigned same_sector = __match_any_sync(mask, key);
    sector_leaders = __ballot_sync(mask, (__ffs(same_sector) - 1) == lane);
  }
  if ((__ffs(same_obj) - 1) == lane) {
    unsigned long long n = __popc(same_obj);
    unsigned* sw = t ? &t->slot : (unsigned*)&s->arena[PP_M_UNATTR_SLOT];
    unsigned long long* c = obj_block(s, sw, oid) + (1u + shard) * 8u;  // this shard's PPCounters
    if (rd) { atomicAdd(&c[0], n); atomicAdd(&c[2], n * size); }
    if (wr) { atomicAdd(&c[1], n); atomicAdd(&c[3], n * size); }
    atomicAdd(&c[4], (unsigned long long)__popc(sector_leaders & same_obj));
    if (!t) {
      atomicAdd(&misc[PP_M_UNATTRIBUTED], n);
      if (s->arena[PP_M_UNATTR_ADDR] == 0ull) atomicCAS(&s->arena[PP_M_UNATTR_ADDR], 0ull, a);
    }
  }
  // page histogram: one add per distinct page of the warp
  unsigned long long slot = PP_NO_PAGES;
  if (t && t->page_base != PP_NO_PAGES) {
    slot = t->page_base + ((a - t->base) >> s->page_shift);
    if (slot >= s->n_pages) slot = PP_NO_PAGES;
  }
  unsigned same_page;
  if (uniform && __ballot_sync(mask, __shfl_sync(mask, slot, leader) == slot) == mask)
    same_page = mask;  // one object, one page: the usual case
  else
    same_page = __match_any_sync(mask, slot);
  if ((__ffs(same_page) - 1) == lane) {
    if (slot != PP_NO_PAGES) atomicAdd(&s->pages[slot], (unsigned long long)__popc(same_page));
    else if (t) atomicAdd(&misc[PP_M_PAGE_DROPPED], (unsigned long long)__popc(same_page));
  }
  if (lane == leader) {
    // requests and lanes go to the PC's block; the launch totals get only what has none
    // (the host adds the PC blocks to them)
    unsigned long long lanes = __popc(mask);
    unsigned long long* b = s->pc_cap ? pc_block(s, pc, size, flags) : nullptr;
    if (b) {
      b += (1u + shard) * 4u;  // this shard's PPPcCounters
      atomicAdd(&b[0], 1ull);
      atomicAdd(&b[1], lanes);
      atomicAdd(&b[2], (unsigned long long)__popc(sector_leaders));
    } else {
      atomicAdd(&misc[PP_M_REQUESTS], 1ull);
      atomicAdd(&misc[PP_M_LANES], lanes);
      if (s->pc_cap) atomicAdd(&misc[PP_M_PC_DROPPED], 1ull);
    }
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
  if (s && !(flags & SANITIZER_MEMORY_DEVICE_FLAG_PREFETCH)) account(s, pc, (unsigned long long)ptr, size, to_flags(flags));
  return SANITIZER_PATCH_SUCCESS;
}

// Shared / local accesses: counted per launch (they belong to no allocation).
static __device__ __forceinline__ void count_space(PPState* s, unsigned lanes_slot, unsigned bytes_slot,
                                                   uint64_t pc, uint32_t size) {
  unsigned mask = __match_any_sync(__activemask(), pc);
  if ((__ffs(mask) - 1) == lane_id()) {
    unsigned long long* misc = misc_row(s, shard_of(s));
    atomicAdd(&misc[lanes_slot], (unsigned long long)__popc(mask));
    atomicAdd(&misc[bytes_slot], (unsigned long long)__popc(mask) * size);
  }
}

extern "C" __device__ __noinline__ SanitizerPatchResult pp_shared(void* ud, uint64_t pc, void* ptr, uint32_t size,
                                                                   uint32_t flags, const void* data) {
  PPState* s = (PPState*)ud;
  if (s && s->mode == PP_MODE_GPU) count_space(s, PP_M_SHARED_LANES, PP_M_SHARED_BYTES, pc, size);
  return SANITIZER_PATCH_SUCCESS;
}

extern "C" __device__ __noinline__ SanitizerPatchResult pp_local(void* ud, uint64_t pc, void* ptr, uint32_t size,
                                                                  uint32_t flags, const void* data) {
  PPState* s = (PPState*)ud;
  if (s && s->mode == PP_MODE_GPU) count_space(s, PP_M_LOCAL_LANES, PP_M_LOCAL_BYTES, pc, size);
  return SANITIZER_PATCH_SUCCESS;
}

// cp.async global -> shared: a global read of `src` by this lane.
extern "C" __device__ __noinline__ SanitizerPatchResult pp_memcpy_async(void* ud, uint64_t pc, void* src, uint32_t dst,
                                                                        uint32_t size) {
  PPState* s = (PPState*)ud;
  if (s) {
    if (s->mode == PP_MODE_GPU) {
      unsigned mask = __match_any_sync(__activemask(), pc);
      if ((__ffs(mask) - 1) == lane_id())
        atomicAdd(&misc_row(s, shard_of(s))[PP_M_ASYNC_LANES], (unsigned long long)__popc(mask));
    }
    account(s, pc, (unsigned long long)src, size, PP_READ);
  }
  return SANITIZER_PATCH_SUCCESS;
}

// TMA / bulk copies and warpgroup MMAs: global traffic this tool does not see lane by
// lane; counted per launch and reported as uncovered.
extern "C" __device__ __noinline__ SanitizerPatchResult pp_bulk_copy(void* ud, uint64_t pc, uint64_t src, uint32_t dst,
                                                                     uint32_t barrier, uint32_t data,
                                                                     uint32_t multicast) {
  PPState* s = (PPState*)ud;
  if (s) atomicAdd(&misc_row(s, shard_of(s))[PP_M_BULK_COPIES], 1ull);
  return SANITIZER_PATCH_SUCCESS;
}

extern "C" __device__ __noinline__ SanitizerPatchResult pp_wgmma(void* ud, uint64_t pc, uint32_t a, uint32_t sa,
                                                                 uint32_t b, uint32_t sb, uint32_t flags,
                                                                 uint32_t warp_mask) {
  PPState* s = (PPState*)ud;
  if (s) {
    unsigned mask = __activemask();
    if ((__ffs(mask) - 1) == lane_id()) atomicAdd(&misc_row(s, shard_of(s))[PP_M_WGMMA], 1ull);
  }
  return SANITIZER_PATCH_SUCCESS;
}
