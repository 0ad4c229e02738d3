// pastaprof's Compute Sanitizer tool (issue D): patches CUDA modules for memory-access
// callbacks and reduces the accesses of selected launches on the GPU (or, in raw mode,
// hands every warp request to the host's CPU processor).
//
// Loaded by Python with ctypes (RTLD_GLOBAL) and started with InitializeInjection()
// before the program initializes CUDA (capture.md section 5: the sanitizer has one
// subscriber and must see the context and module loads).  Flow:
//   RESOURCE  device allocations and frees -> the live allocation table (tensors come
//             from PyTorch's allocator through pp_san_tensor, called by torch_observer);
//   MODULE_LOADED  add the patch fatbin once per context, patch global / shared /
//             local / cp.async / bulk-copy / wgmma instructions, patch the module;
//   LAUNCH_BEGIN  if this launch is selected (enabled gate from Python's ranges and
//             steps, kernel regex, every-Nth): upload the state and the sorted object
//             tables in one copy, zero what the previous launch used, set this launch's
//             callback data; otherwise the patches see a null pointer and return at once;
//   LAUNCH_END  synchronize the stream, copy the misc rows and the counter blocks the
//             launch claimed back in one piece (plus the touched page counters), and
//             append rows to host columns that Python drains (pp_san_take / pp_san_copy).
// Instrumented launches never block: if one is in flight on another thread, the
// launch is left uninstrumented and counted as skipped.
#include <cuda.h>
#include <cxxabi.h>
#include <regex.h>
#include <stdlib.h>
#include <sanitizer.h>
#include <string.h>
#include <time.h>

#include <stdio.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "sanitizer_shared.h"

namespace {

enum Table { T_LAUNCH = 0, T_OBJ, T_PAGE, T_PC, T_RAW, T_SNAP, T_COPY, T_N };
const int NCOLS[T_N] = {32, 11, 1, 8, 8, 4, 7};

struct Config {
  unsigned mode = PP_MODE_GPU;
  std::string patch;
  regex_t re;
  bool has_re = false;
  long every = 1;
  unsigned page_shift = 12;
  unsigned pc_cap = 4096;
  unsigned n_shards = 16;       // counter copies (SM id mod n_shards), summed here
  size_t page_cap = 1u << 22;   // page counters (8 B each)
  size_t raw_cap = 1u << 20;    // raw requests (288 B each)
  bool shared = true, local = true, async = true, bulk = true, wgmma = true;
  bool unpatch = true;          // run modules unpatched while the gate (ranges, steps) is off
} cfg;

static_assert(sizeof(PPObj) == 32 && sizeof(PPCounters) == 64 && sizeof(PPObjHead) == 64 &&
                  sizeof(PPPcCounters) == 32 && sizeof(PPPcHead) == 32 && sizeof(PPPcKey) == 16,
              "block layout shared with sanitizer_patch.cu");
const size_t STATE_WORDS = (sizeof(PPState) + 63) / 64 * 8;  // PPState, padded to 64 B, then the tables

// One context's device buffers.  Per instrumented launch the host makes one upload (state
// and object tables), zeroes what the previous launch used, and reads the arena back in
// one copy (misc rows and the blocks this launch claimed) plus one for the page counters.
struct Dev {
  bool patches = false, init = false;
  unsigned long long* tables = nullptr;  // STATE_WORDS of PPState, then cap_obj PPObj
  unsigned long long* arena = nullptr;   // misc rows, then block_cap words of blocks
  PPPcKey* pc_keys = nullptr;
  unsigned long long* pages = nullptr;
  PPRaw* raw = nullptr;
  size_t cap_obj = 0, cap_pages = 0, cap_raw = 0, block_cap = 0, table_words = 0, arena_words = 0;
  size_t dirty = 0;      // block words that may be non-zero (all of them until a read-back says less)
  size_t last_used = 0;  // block words the last launch used: the size of the next read-back's guess
  std::vector<unsigned char> stage;  // the upload's host copy, kept until the next launch
  // Pinned host memory for the read-backs (arena, then up to kPinnedPages page counters): a
  // copy into pageable memory goes through the driver's staging buffer.  Copied out into
  // the launch's own vectors before the device is released (busy), so never shared.
  unsigned long long* pinned = nullptr;
  size_t pinned_words = 0;
  std::atomic<bool> busy{false};
  size_t bytes = 0;
};

struct Pending {
  bool active = false;
  Dev* dev = nullptr;
  CUcontext ctx = nullptr;
  int64_t seq = 0, start_ns = 0, name = 0, func_pc = 0, func_size = 0;
  uint32_t grid[3] = {0, 0, 0}, block[3] = {0, 0, 0};
  int64_t device = 0, stream = 0, live_bytes = 0, module_hash = 0;
  std::vector<PPObj> objs;       // tensors then allocations, as uploaded (with their page bases)
  unsigned n_t = 0, n_a = 0;
  size_t n_pages = 0;
};

Sanitizer_SubscriberHandle sub = nullptr;
std::atomic<int> enabled{1};
std::atomic<int64_t> gate_closed_ns{0};             // when the gate last closed; 0 while open
const int64_t UNPATCH_AFTER_NS = 1000000000;        // closed this long: unpatch at the next launch
std::atomic<long> matched{0}, launches{0}, instrumented{0}, skipped_busy{0}, repatches{0}, unpatches{0};
// host time of instrumented launches (ns): setup before, waiting for the kernel, reading back
std::atomic<int64_t> t_setup{0}, t_wait{0}, t_readback{0}, t_pages{0}, t_arena{0};  // t_pages, t_arena: parts of t_readback
std::mutex mu;  // tables, devices, output
std::map<uint64_t, uint64_t> tensors, allocs;  // base -> end
uint64_t version = 1;
std::map<CUcontext, Dev*> devs;
std::vector<std::vector<int64_t>> out[T_N], taken[T_N];
std::vector<uint64_t> addrs, taken_addrs;
std::vector<std::string> names;
std::unordered_map<std::string, int64_t> name_ids;
std::string error;
std::vector<std::string> notes;
std::string cubin_dir;                              // where images with line info are kept
std::unordered_map<CUmodule, int64_t> module_hash;  // module -> hash of its saved image
std::mutex patch_mu;                              // patch state; never taken under mu
std::unordered_map<CUmodule, bool> patched;         // module -> instrumented now
thread_local Pending pend;
thread_local bool own_alloc = false;

int64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

void fail(const char* what, SanitizerResult r) {
  std::lock_guard<std::mutex> g(mu);
  if (error.empty()) error = std::string(what) + " failed (SanitizerResult " + std::to_string(int(r)) + ")";
}

void note(const std::string& s) {
  std::lock_guard<std::mutex> g(mu);
  if (notes.size() < 32 && std::find(notes.begin(), notes.end(), s) == notes.end()) notes.push_back(s);
}

int64_t intern(const char* s) {  // under mu
  std::string k(s ? s : "");
  auto it = name_ids.find(k);
  if (it != name_ids.end()) return it->second;
  int64_t id = int64_t(names.size());
  names.push_back(k);
  name_ids.emplace(k, id);
  return id;
}

void push(Table t, std::initializer_list<int64_t> v) {  // under mu
  auto& cols = out[t];
  if (cols.empty()) cols.resize(NCOLS[t]);
  size_t i = 0;
  for (int64_t x : v) cols[i++].push_back(x);
}

template <class T>
bool dalloc(CUcontext ctx, T*& p, size_t n, size_t& bytes) {
  void* q = nullptr;
  own_alloc = true;
  SanitizerResult r = sanitizerAlloc(ctx, &q, n * sizeof(T));
  own_alloc = false;
  if (r != SANITIZER_SUCCESS) { fail("sanitizerAlloc", r); return false; }
  p = (T*)q;
  bytes += n * sizeof(T);
  return true;
}

template <class T>
void dfree(CUcontext ctx, T*& p, size_t n, size_t& bytes) {
  if (p) { sanitizerFree(ctx, (void*)p); bytes -= n * sizeof(T); }
  p = nullptr;
}

constexpr size_t kPinnedPages = size_t(1) << 16;  // page counters read back through pinned memory (512 KiB)

// The pinned read-back buffer for an arena of `arena_words` (plus the page counters' part);
// without one (allocation refused), read-backs go to pageable memory as before.
void ensure_pinned(CUcontext ctx, Dev* d, size_t arena_words) {
  size_t want = arena_words + (cfg.mode == PP_MODE_GPU ? std::min(kPinnedPages, cfg.page_cap) : 0);
  if (d->pinned && d->pinned_words >= want) return;
  if (d->pinned) sanitizerFreeHost(ctx, d->pinned);
  d->pinned = nullptr;
  d->pinned_words = 0;
  void* q = nullptr;
  own_alloc = true;
  SanitizerResult r = sanitizerAllocHost(ctx, &q, want * 8);
  own_alloc = false;
  if (r == SANITIZER_SUCCESS && q) {
    d->pinned = (unsigned long long*)q;
    d->pinned_words = want;
  }
}

// u64 words of one object / PC block: a head and one counter row per shard.
size_t obj_words() { return size_t(1 + cfg.n_shards) * 8; }
size_t pc_words() { return size_t(1 + cfg.n_shards) * 4; }
size_t misc_words() { return size_t(PP_M_SLOTS) * cfg.n_shards; }
// Page-histogram counters of one object at the configured page size.
size_t pages_of(const PPObj& o) {
  return size_t(((o.end - o.base) + (1ull << cfg.page_shift) - 1) >> cfg.page_shift);
}

// Device buffers big enough for n objects (grown, never silently short).  The block area
// holds a block for every object and every PC table entry, so the patches never run out.
bool ensure(CUcontext ctx, Dev* d, size_t n_obj) {
  bool gpu = cfg.mode == PP_MODE_GPU;
  if (!d->init) {
    if (gpu && cfg.pc_cap && !dalloc(ctx, d->pc_keys, cfg.pc_cap, d->bytes)) return false;
    if (gpu && !dalloc(ctx, d->pages, cfg.page_cap, d->bytes)) return false;
    d->cap_pages = gpu ? cfg.page_cap : 0;
    if (!gpu && !dalloc(ctx, d->raw, cfg.raw_cap, d->bytes)) return false;
    d->cap_raw = gpu ? 0 : cfg.raw_cap;
    d->init = true;
  }
  if (n_obj + 1 > d->cap_obj) {
    size_t cap = std::max<size_t>(n_obj + 1, std::max<size_t>(1024, d->cap_obj * 2));
    size_t block_cap = gpu ? cap * obj_words() + size_t(cfg.pc_cap) * pc_words() : 0;
    dfree(ctx, d->tables, d->table_words, d->bytes);
    dfree(ctx, d->arena, d->arena_words, d->bytes);
    d->cap_obj = d->table_words = d->arena_words = d->block_cap = 0;
    size_t table_words = STATE_WORDS + cap * (sizeof(PPObj) / 8), arena_words = misc_words() + block_cap;
    if (!dalloc(ctx, d->tables, table_words, d->bytes)) return false;
    d->table_words = table_words;
    if (!dalloc(ctx, d->arena, arena_words, d->bytes)) return false;
    d->arena_words = arena_words;
    d->cap_obj = cap;
    d->block_cap = block_cap;
    d->dirty = block_cap;  // zeroed in full before the first launch
    if (gpu) ensure_pinned(ctx, d, arena_words);
  }
  return true;
}

// Register the instruction patches of a module and instrument it (under patch_mu).
bool patch_module(CUmodule module) {
  struct { Sanitizer_InstructionId id; const char* fn; bool on; const char* what; } ins[] = {
      {SANITIZER_INSTRUCTION_GLOBAL_MEMORY_ACCESS, "pp_global", true, "global"},
      {SANITIZER_INSTRUCTION_SHARED_MEMORY_ACCESS, "pp_shared", cfg.shared, "shared"},
      {SANITIZER_INSTRUCTION_LOCAL_MEMORY_ACCESS, "pp_local", cfg.local, "local"},
      {SANITIZER_INSTRUCTION_MEMCPY_ASYNC, "pp_memcpy_async", cfg.async, "cp.async"},
      {SANITIZER_INSTRUCTION_BULK_COPY_GLOBAL_TO_SHARED, "pp_bulk_copy", cfg.bulk, "bulk copy (TMA)"},
      {SANITIZER_INSTRUCTION_WARPGROUP_MMA_ASYNC, "pp_wgmma", cfg.wgmma, "wgmma"},
  };
  for (auto& i : ins) {
    if (!i.on) continue;
    SanitizerResult r = sanitizerPatchInstructions(i.id, module, i.fn);
    if (r != SANITIZER_SUCCESS) {
      if (i.id == SANITIZER_INSTRUCTION_GLOBAL_MEMORY_ACCESS) { fail("sanitizerPatchInstructions(global)", r); return false; }
      note(std::string("cannot patch ") + i.what + " instructions (SanitizerResult " + std::to_string(int(r)) + ")");
    }
  }
  SanitizerResult r = sanitizerPatchModule(module);
  if (r != SANITIZER_SUCCESS) { fail("sanitizerPatchModule", r); return false; }
  return true;
}

// Bring a module to the wanted state before its launch (lazy: only on a change).
void set_patched(CUcontext ctx, CUmodule module, bool want) {
  std::lock_guard<std::mutex> g(patch_mu);
  auto it = patched.find(module);
  if (it == patched.end() || it->second == want) return;  // unknown modules stay as loaded
  if (want) {
    Dev* d;
    {
      std::lock_guard<std::mutex> g2(mu);
      d = devs[ctx];
    }
    if (!d || !d->patches) return;
    if (patch_module(module)) { it->second = true; repatches++; }
  } else if (sanitizerUnpatchModule(module) == SANITIZER_SUCCESS) {
    it->second = false;
    unpatches++;
  }
}

bool selected(const char* name) {
  launches++;
  if (!enabled.load(std::memory_order_relaxed)) return false;
  if (cfg.has_re && regexec(&cfg.re, name ? name : "", 0, nullptr, 0) != 0) return false;
  long k = matched++;
  return k % cfg.every == 0;
}

void launch_begin(const Sanitizer_LaunchData* ld) {
  if (pend.active && pend.dev) pend.dev->busy = false;  // an END that never came
  pend.active = false;
  bool sel = selected(ld->functionName);
  // Outside the ranges / steps modules run unpatched, at full speed: a module loaded while
  // the gate is closed is patched at its first launch inside a window; a patched module is
  // unpatched at a launch once the gate has been closed for UNPATCH_AFTER_NS (a step window
  // has ended), not at every close (a range entered each step would re-patch every step:
  // ~0.1-0.3 s per window on the H200).  Kernel regex and sampling keep the patches (a launch
  // that is not selected sees a null pointer and returns at once).
  if (cfg.unpatch && ld->module) {
    if (enabled.load(std::memory_order_relaxed)) {
      set_patched(ld->context, ld->module, true);
    } else {
      int64_t closed = gate_closed_ns.load(std::memory_order_relaxed);
      if (closed && now_ns() - closed >= UNPATCH_AFTER_NS) set_patched(ld->context, ld->module, false);
    }
  }
  if (!sel) return;
  Dev* d;
  {
    std::lock_guard<std::mutex> g(mu);
    Dev*& slot = devs[ld->context];
    if (!slot) slot = new Dev();
    d = slot;
  }
  bool expect = false;
  if (!d->busy.compare_exchange_strong(expect, true)) { skipped_busy++; return; }
  Pending& p = pend;
  p.dev = d;
  p.ctx = ld->context;
  p.start_ns = now_ns();
  {
    std::lock_guard<std::mutex> g(mu);
    p.name = intern(ld->functionName);
    p.seq = instrumented++;
    p.objs.clear();
    for (auto& kv : tensors) p.objs.push_back({kv.first, kv.second, PP_NO_PAGES, 0, 0});
    p.n_t = unsigned(tensors.size());
    p.live_bytes = 0;
    for (auto& kv : allocs) {
      p.objs.push_back({kv.first, kv.second, PP_NO_PAGES, 0, 0});
      p.live_bytes += int64_t(kv.second - kv.first);
    }
    p.n_a = unsigned(allocs.size());
    auto mh = module_hash.find(ld->module);
    p.module_hash = mh == module_hash.end() ? 0 : mh->second;
  }
  // Not under mu: sanitizerAlloc may wait for a driver lock that a thread inside a memory
  // callback (which takes mu) holds.  The device's buffers are this launch's alone (busy).
  if (!ensure(ld->context, d, p.objs.size())) { d->busy = false; return; }
  p.grid[0] = ld->gridDim_x; p.grid[1] = ld->gridDim_y; p.grid[2] = ld->gridDim_z;
  p.block[0] = ld->blockDim_x; p.block[1] = ld->blockDim_y; p.block[2] = ld->blockDim_z;
  p.device = int64_t(ld->device);
  p.stream = int64_t(uintptr_t(ld->stream));
  uint64_t fpc = 0, fsize = 0;
  if (ld->module && ld->functionName &&
      sanitizerGetFunctionPcAndSize(ld->module, ld->functionName, &fpc, &fsize) == SANITIZER_SUCCESS) {
    p.func_pc = int64_t(fpc); p.func_size = int64_t(fsize);
  } else {
    p.func_pc = p.func_size = 0;
  }
  size_t n_obj = p.objs.size();
  // page histogram slots, in object order, while they last (objects past them keep PP_NO_PAGES)
  p.n_pages = 0;
  if (cfg.mode == PP_MODE_GPU) {
    for (auto& o : p.objs) {
      size_t np = pages_of(o);
      if (p.n_pages + np <= d->cap_pages) { o.page_base = p.n_pages; p.n_pages += np; }
    }
  }
  bool gpu = cfg.mode == PP_MODE_GPU;
  PPState st;
  memset(&st, 0, sizeof st);
  st.mode = cfg.mode; st.page_shift = cfg.page_shift; st.n_tensor = p.n_t; st.n_alloc = p.n_a;
  st.tensors = (PPObj*)(d->tables + STATE_WORDS); st.allocs = st.tensors + p.n_t;
  st.pages = d->pages; st.n_pages = p.n_pages; st.pc_keys = d->pc_keys; st.pc_cap = gpu ? cfg.pc_cap : 0;
  st.n_shards = cfg.n_shards; st.arena = d->arena; st.block_cap = d->block_cap; st.raw = d->raw;
  st.raw_cap = d->cap_raw;
  d->stage.resize(STATE_WORDS * 8 + n_obj * sizeof(PPObj));
  memcpy(d->stage.data(), &st, sizeof st);
  if (n_obj) memcpy(d->stage.data() + STATE_WORDS * 8, p.objs.data(), n_obj * sizeof(PPObj));
  Sanitizer_StreamHandle hs = ld->hStream;
  // in the launch's stream, no host wait: the state and tables (object slots 0), then zero
  // the misc rows and the blocks the previous launch used, the PC table, the used pages
  SanitizerResult r = sanitizerMemcpyHostToDeviceAsync(d->tables, d->stage.data(), d->stage.size(), hs);
  if (r == SANITIZER_SUCCESS)
    r = sanitizerMemset(d->arena, 0, (misc_words() + std::min(d->dirty, d->block_cap)) * 8, hs);
  if (r == SANITIZER_SUCCESS && gpu && cfg.pc_cap) r = sanitizerMemset(d->pc_keys, 0, cfg.pc_cap * sizeof(PPPcKey), hs);
  if (r == SANITIZER_SUCCESS && p.n_pages) r = sanitizerMemset(d->pages, 0, p.n_pages * 8, hs);
  d->dirty = d->block_cap;  // until this launch's read-back says how much it used
  if (r == SANITIZER_SUCCESS) r = sanitizerSetLaunchCallbackData(ld->hLaunch, ld->function, hs, d->tables);
  if (r != SANITIZER_SUCCESS) {
    fail("launch setup", r);
    d->busy = false;
    return;
  }
  p.active = true;
  t_setup += now_ns() - p.start_ns;
}

// One object's or PC's counters, summed over the shards.
struct ObjSum { size_t obj; PPCounters c; };
struct PcSum { uint64_t pc; unsigned size, flags; unsigned long long requests, lanes, sectors; };

void launch_end(const Sanitizer_LaunchData* ld) {
  Pending& p = pend;
  if (!p.active) return;
  p.active = false;
  Dev* d = p.dev;
  Sanitizer_StreamHandle hs = ld->hStream;
  int64_t t0 = now_ns();
  SanitizerResult r = sanitizerStreamSynchronize(hs);
  int64_t end_ns = now_ns();
  t_wait += end_ns - t0;
  size_t n_obj = p.objs.size();
  const unsigned NS = cfg.n_shards;
  const size_t M = misc_words();
  // one copy: the misc rows and as many block words as the last launch used (at least
  // 32 KiB); a second one only if this launch used more
  size_t guess = std::min(d->block_cap, std::max<size_t>(4096, d->last_used));
  std::vector<unsigned long long> ar;
  size_t used = 0;
  if (d->pinned && d->pinned_words >= M + d->block_cap) {
    unsigned long long* b = d->pinned;
    if (r == SANITIZER_SUCCESS) r = sanitizerMemcpyDeviceToHost(b, d->arena, (M + guess) * 8, hs);
    used = r == SANITIZER_SUCCESS ? std::min<size_t>(b[PP_M_BUMP], d->block_cap) : 0;
    if (r == SANITIZER_SUCCESS && used > guess)
      r = sanitizerMemcpyDeviceToHost(b + M + guess, d->arena + M + guess, (used - guess) * 8, hs);
    ar.assign(b, b + M + std::max(guess, used));
  } else {
    ar.resize(M + guess);
    if (r == SANITIZER_SUCCESS) r = sanitizerMemcpyDeviceToHost(ar.data(), d->arena, ar.size() * 8, hs);
    used = r == SANITIZER_SUCCESS ? std::min<size_t>(ar[PP_M_BUMP], d->block_cap) : 0;
    if (r == SANITIZER_SUCCESS && used > guess) {
      ar.resize(M + used);
      r = sanitizerMemcpyDeviceToHost(ar.data() + M + guess, d->arena + M + guess, (used - guess) * 8, hs);
    }
  }
  if (r == SANITIZER_SUCCESS) d->dirty = d->last_used = used;
  t_arena += now_ns() - end_ns;
  unsigned long long misc[PP_M_SLOTS] = {0};
  for (unsigned sh = 0; sh < NS; ++sh)
    for (int i = 0; i < PP_M_SLOTS; ++i) misc[i] += ar[size_t(sh) * PP_M_SLOTS + i];
  for (int i : {PP_M_RAW_COUNT, PP_M_UNATTR_ADDR, PP_M_BUMP, PP_M_UNATTR_SLOT}) misc[i] = ar[i];  // row 0 only
  std::vector<ObjSum> objs;
  std::vector<PcSum> pcs;
  for (size_t w = 0; r == SANITIZER_SUCCESS && w < used;) {  // the blocks, in the order they were claimed
    const unsigned long long* b = ar.data() + M + w;
    if (b[3] == PP_KIND_OBJ) {
      if (b[0] >= 1 && b[0] <= n_obj + 1) {
        ObjSum o{size_t(b[0] - 1), {}};
        for (unsigned sh = 0; sh < NS; ++sh) {
          const unsigned long long* c = b + (1 + sh) * 8;
          o.c.reads += c[0]; o.c.writes += c[1]; o.c.bytes_read += c[2]; o.c.bytes_written += c[3];
          o.c.sectors += c[4];
        }
        objs.push_back(o);
      }
      w += obj_words();
    } else if (b[3] == PP_KIND_PC) {
      const PPPcHead* h = (const PPPcHead*)b;
      PcSum q{h->pc, h->size, h->flags, 0, 0, 0};
      for (unsigned sh = 0; sh < NS; ++sh) {
        const unsigned long long* c = b + (1 + sh) * 4;
        q.requests += c[0]; q.lanes += c[1]; q.sectors += c[2];
      }
      pcs.push_back(q);
      misc[PP_M_REQUESTS] += q.requests;  // the launch totals: requests with a PC block too
      misc[PP_M_LANES] += q.lanes;
      w += pc_words();
    } else {  // a claimed block without its head: cannot happen; say so rather than guess
      note("sanitizer: a counter block without its head; the rest of this launch's blocks were skipped");
      break;
    }
  }
  std::sort(objs.begin(), objs.end(), [](const ObjSum& x, const ObjSum& y) { return x.obj < y.obj; });
  std::vector<PPRaw> raw;
  if (r == SANITIZER_SUCCESS && cfg.mode == PP_MODE_RAW) {
    raw.resize(std::min<unsigned long long>(misc[PP_M_RAW_COUNT], d->cap_raw));
    if (!raw.empty()) r = sanitizerMemcpyDeviceToHost(raw.data(), d->raw, raw.size() * sizeof(PPRaw), hs);
  }
  if (r != SANITIZER_SUCCESS) {
    fail("launch read-back", r);
    d->busy = false;
    return;
  }
  // page slices of the objects this launch touched: one copy of the span they cover when
  // it is small, else one per object; per touched object, its counters (a slice of
  // `span`, or a copy of its own)
  std::vector<std::pair<const unsigned long long*, size_t>> page_rows(objs.size(), {nullptr, 0});
  std::vector<std::vector<unsigned long long>> own_pages;
  own_pages.reserve(objs.size());
  std::vector<unsigned long long> span;  // the touched objects' pages in one copy, when close
  int64_t tp = now_ns();
  if (cfg.mode == PP_MODE_GPU) {
    size_t lo = SIZE_MAX, hi = 0, touched = 0;
    for (auto& o : objs)
      if (o.obj < n_obj && p.objs[o.obj].page_base != PP_NO_PAGES) {
        const PPObj& t = p.objs[o.obj];
        lo = std::min<size_t>(lo, t.page_base);
        hi = std::max<size_t>(hi, t.page_base + pages_of(t));
        touched += pages_of(t);
      }
    bool one = false;
    if (touched && (hi - lo) <= std::max<size_t>(2 * touched, 1u << 16)) {
      size_t room = d->pinned ? d->pinned_words - (misc_words() + d->block_cap) : 0;  // after the arena's part
      if (d->pinned && d->pinned_words >= misc_words() + d->block_cap && hi - lo <= room) {
        unsigned long long* b = d->pinned + misc_words() + d->block_cap;
        one = sanitizerMemcpyDeviceToHost(b, d->pages + lo, (hi - lo) * 8, hs) == SANITIZER_SUCCESS;
        if (one) span.assign(b, b + (hi - lo));
      } else {
        one = sanitizerMemcpyDeviceToHost((span.resize(hi - lo), span.data()), d->pages + lo, (hi - lo) * 8, hs) ==
              SANITIZER_SUCCESS;
      }
    }
    for (size_t j = 0; j < objs.size(); ++j) {
      size_t i = objs[j].obj;
      if (i >= n_obj || p.objs[i].page_base == PP_NO_PAGES) continue;
      size_t base = p.objs[i].page_base, np = pages_of(p.objs[i]);
      if (one) {
        page_rows[j] = {span.data() + (base - lo), np};
      } else {
        own_pages.emplace_back(np);
        if (sanitizerMemcpyDeviceToHost(own_pages.back().data(), d->pages + base, np * 8, hs) ==
            SANITIZER_SUCCESS)
          page_rows[j] = {own_pages.back().data(), np};
      }
    }
  }
  t_pages += now_ns() - tp;
  d->busy = false;
  std::lock_guard<std::mutex> g(mu);
  auto rel = [&](unsigned long long pc) -> int64_t {
    return (p.func_pc && pc >= (unsigned long long)p.func_pc && pc < (unsigned long long)(p.func_pc + p.func_size))
               ? int64_t(pc - p.func_pc) : int64_t(pc);
  };
  unsigned long long raw_n = misc[PP_M_RAW_COUNT];
  push(T_LAUNCH, {p.seq, p.start_ns, end_ns, p.device, p.stream, p.name, p.grid[0], p.grid[1], p.grid[2],
                  p.block[0], p.block[1], p.block[2], int64_t(cfg.mode), int64_t(misc[PP_M_REQUESTS]),
                  int64_t(misc[PP_M_LANES]), int64_t(misc[PP_M_UNATTRIBUTED]), int64_t(misc[PP_M_SHARED_LANES]),
                  int64_t(misc[PP_M_LOCAL_LANES]), int64_t(misc[PP_M_ASYNC_LANES]), int64_t(misc[PP_M_BULK_COPIES]),
                  int64_t(misc[PP_M_WGMMA]), int64_t(misc[PP_M_PC_DROPPED]), int64_t(misc[PP_M_PAGE_DROPPED]),
                  int64_t(raw_n), int64_t(raw.size()), int64_t(n_obj), p.live_bytes, p.func_pc,
                  int64_t(d->bytes), int64_t(misc[PP_M_SHARED_BYTES] + misc[PP_M_LOCAL_BYTES]),
                  int64_t(misc[PP_M_UNATTR_ADDR]), p.module_hash});
  if (cfg.mode == PP_MODE_GPU) {
    for (size_t j = 0; j < objs.size(); ++j) {
      const PPCounters& c = objs[j].c;
      size_t i = objs[j].obj;
      if ((c.reads | c.writes) == 0) continue;
      int64_t page_start = -1, page_len = 0;
      if (page_rows[j].second) {
        auto& col = out[T_PAGE];
        if (col.empty()) col.resize(NCOLS[T_PAGE]);
        page_start = int64_t(col[0].size());
        page_len = int64_t(page_rows[j].second);
        col[0].resize(col[0].size() + page_rows[j].second);  // counts fit int64 (< 2^63 accesses)
        memcpy(col[0].data() + page_start, page_rows[j].first, page_rows[j].second * 8);
      }
      bool none = i == n_obj;
      push(T_OBJ, {p.seq, none ? 0 : int64_t(p.objs[i].base), none ? 0 : int64_t(p.objs[i].end - p.objs[i].base),
                   none ? -1 : (i < p.n_t ? 0 : 1), int64_t(c.reads), int64_t(c.writes), int64_t(c.bytes_read),
                   int64_t(c.bytes_written), int64_t(c.sectors), page_start, page_len});
    }
    for (auto& e : pcs) {
      int64_t lanes = int64_t(e.lanes);
      push(T_PC, {p.seq, rel(e.pc), int64_t(e.requests), lanes, lanes * int64_t(e.size), int64_t(e.sectors),
                  (e.flags & (PP_READ | PP_ATOMIC)) ? lanes : 0, (e.flags & (PP_WRITE | PP_ATOMIC)) ? lanes : 0});
    }
  } else {
    for (auto& q : raw) {
      push(T_RAW, {p.seq, rel(q.pc), q.flags, q.size, q.active, q.cta, q.warp, 0});
      addrs.insert(addrs.end(), q.addr, q.addr + 32);
    }
    for (size_t i = 0; i < n_obj; ++i)
      push(T_SNAP, {p.seq, int64_t(p.objs[i].base), int64_t(p.objs[i].end - p.objs[i].base), i < p.n_t ? 0 : 1});
  }
  t_readback += now_ns() - end_ns;
}

// A module image with line info (.debug_line) is kept as <cubin_dir>/<hash>.cubin, so
// that PCs can be given their source line after the run (processor/lines.py).
void save_image(const Sanitizer_ResourceModuleData* md) {
  if (cubin_dir.empty() || !md->pCubin || md->cubinSize < 64 ||
      !memmem(md->pCubin, md->cubinSize, ".debug_line", 11))
    return;
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (size_t i = 0; i < md->cubinSize; ++i) h = (h ^ (unsigned char)md->pCubin[i]) * 1099511628211ull;
  int64_t id = int64_t(h & 0x7fffffffffffffffull);
  char name[40];
  snprintf(name, sizeof name, "%016llx.cubin", (unsigned long long)id);
  std::string path = cubin_dir + "/" + name;
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    std::string tmp = path + ".tmp";
    FILE* f = fopen(tmp.c_str(), "wb");
    if (!f) return;
    bool ok = fwrite(md->pCubin, 1, md->cubinSize, f) == md->cubinSize;
    ok = fclose(f) == 0 && ok;
    if (!ok || rename(tmp.c_str(), path.c_str()) != 0) { remove(tmp.c_str()); return; }
  }
  std::lock_guard<std::mutex> g(mu);
  module_hash[md->module] = id;
}

void module_loaded(const Sanitizer_ResourceModuleData* md) {
  save_image(md);
  Dev* d;
  {
    std::lock_guard<std::mutex> g(mu);
    Dev*& slot = devs[md->context];
    if (!slot) slot = new Dev();
    d = slot;
  }
  if (!d->patches) {
    SanitizerResult r = sanitizerAddPatchesFromFile(cfg.patch.c_str(), md->context);
    if (r != SANITIZER_SUCCESS) { fail("sanitizerAddPatchesFromFile", r); return; }
    d->patches = true;
  }
  if (cfg.unpatch && !enabled.load()) {
    std::lock_guard<std::mutex> g(patch_mu);
    patched[md->module] = false;  // patched at its first launch inside a range
    return;
  }
  std::lock_guard<std::mutex> g(patch_mu);
  if (patch_module(md->module)) patched[md->module] = true;
}

// Insert [address, address + size) into a table, dropping entries it overlaps (stale ones
// whose free was not seen, or a reservation now mapped in pieces): the device's binary
// search relies on the entries of a table being disjoint.  A free removes its entry.
void put(std::map<uint64_t, uint64_t>& t, bool alive, uint64_t address, uint64_t size) {
  if (!(alive && size)) {
    t.erase(address);
    return;
  }
  uint64_t end = address + size;
  auto it = t.upper_bound(address);
  if (it != t.begin() && std::prev(it)->second > address) --it;  // an entry starting before, reaching in
  while (it != t.end() && it->first < end) it = t.erase(it);
  t[address] = end;
}

void set_alloc(bool alive, uint64_t address, uint64_t size) {
  std::lock_guard<std::mutex> g(mu);
  put(allocs, alive, address, size);
  version++;
}

// Driver allocations, async (pool) allocations, pinned host memory (kernels reach it
// through unified addressing) and virtual reservations (cuMemAddressReserve: PyTorch's
// expandable segments map their memory inside one).
void memory_event(Sanitizer_CallbackId cbid, const void* data) {
  if (own_alloc) return;
  switch (cbid) {
    case SANITIZER_CBID_RESOURCE_VIRTUAL_RESERVE:
    case SANITIZER_CBID_RESOURCE_VIRTUAL_RELEASE: {
      auto* v = (const Sanitizer_ResourceVirtualRange*)data;
      set_alloc(cbid == SANITIZER_CBID_RESOURCE_VIRTUAL_RESERVE, v->address, v->size);
      break;
    }
    default: {
      auto* m = (const Sanitizer_ResourceMemoryData*)data;
      bool alive = cbid == SANITIZER_CBID_RESOURCE_DEVICE_MEMORY_ALLOC ||
                   cbid == SANITIZER_CBID_RESOURCE_MEMORY_ALLOC_ASYNC || cbid == SANITIZER_CBID_RESOURCE_HOST_MEMORY_ALLOC;
      set_alloc(alive, m->address, m->size);
    }
  }
}

// Copies and memsets as the API issues them (host time, no GPU duration): the rows CUPTI
// would give, which it cannot while the sanitizer is subscribed.  T_COPY columns: time,
// kind (0 memcpy, 1 memset, 2 stream sync, 3 context sync), bytes, direction
// (Sanitizer_MemcpyDirection), stream, destination, source.
std::atomic<int> copies_on{0};

void copy_event(Sanitizer_CallbackDomain dom, const void* data) {
  if (!copies_on.load(std::memory_order_relaxed) || !enabled.load(std::memory_order_relaxed)) return;
  int64_t t = now_ns();
  std::lock_guard<std::mutex> g(mu);
  if (dom == SANITIZER_CB_DOMAIN_MEMCPY) {
    auto* m = (const Sanitizer_MemcpyData*)data;
    uint64_t bytes = m->size ? m->size : m->width * (m->height ? m->height : 1) * (m->depth ? m->depth : 1);
    push(T_COPY, {t, 0, int64_t(bytes), int64_t(m->direction), int64_t(uintptr_t(m->apiStream)),
                  int64_t(m->dstAddress), int64_t(m->srcAddress)});
  } else {
    auto* m = (const Sanitizer_MemsetData*)data;
    uint64_t bytes = m->width * (m->elementSize ? m->elementSize : 1) * (m->height ? m->height : 1);
    push(T_COPY, {t, 1, int64_t(bytes), 0, int64_t(uintptr_t(m->stream)), int64_t(m->address), 0});
  }
}

// Stream / context synchronizations, as they complete (kind 2 stream, 3 context).
void sync_event(Sanitizer_CallbackId cbid, const void* data) {
  if (!copies_on.load(std::memory_order_relaxed) || !enabled.load(std::memory_order_relaxed)) return;
  if (cbid != SANITIZER_CBID_SYNCHRONIZE_STREAM_SYNCHRONIZED && cbid != SANITIZER_CBID_SYNCHRONIZE_CONTEXT_SYNCHRONIZED)
    return;
  auto* s = (const Sanitizer_SynchronizeData*)data;
  int64_t t = now_ns();
  bool stream = cbid == SANITIZER_CBID_SYNCHRONIZE_STREAM_SYNCHRONIZED;
  std::lock_guard<std::mutex> g(mu);
  push(T_COPY, {t, stream ? 2 : 3, 0, 0, stream ? int64_t(uintptr_t(s->stream)) : 0, 0, 0});
}

void SANITIZERAPI callback(void* ud, Sanitizer_CallbackDomain dom, Sanitizer_CallbackId cbid, const void* data) {
  if ((dom == SANITIZER_CB_DOMAIN_MEMCPY && cbid == SANITIZER_CBID_MEMCPY_STARTING) ||
      (dom == SANITIZER_CB_DOMAIN_MEMSET && cbid == SANITIZER_CBID_MEMSET_STARTING)) {
    copy_event(dom, data);
    return;
  }
  if (dom == SANITIZER_CB_DOMAIN_SYNCHRONIZE) {
    sync_event(cbid, data);
    return;
  }
  if (dom == SANITIZER_CB_DOMAIN_LAUNCH) {
    if (cbid == SANITIZER_CBID_LAUNCH_BEGIN) launch_begin((const Sanitizer_LaunchData*)data);
    else if (cbid == SANITIZER_CBID_LAUNCH_END) launch_end((const Sanitizer_LaunchData*)data);
  } else if (dom == SANITIZER_CB_DOMAIN_RESOURCE) {
    switch (cbid) {
      case SANITIZER_CBID_RESOURCE_MODULE_LOADED:
        module_loaded((const Sanitizer_ResourceModuleData*)data);
        break;
      case SANITIZER_CBID_RESOURCE_MODULE_UNLOAD_STARTING: {
        std::lock_guard<std::mutex> g(patch_mu);
        patched.erase(((const Sanitizer_ResourceModuleData*)data)->module);
        break;
      }
      case SANITIZER_CBID_RESOURCE_DEVICE_MEMORY_ALLOC:
      case SANITIZER_CBID_RESOURCE_DEVICE_MEMORY_FREE:
      case SANITIZER_CBID_RESOURCE_MEMORY_ALLOC_ASYNC:
      case SANITIZER_CBID_RESOURCE_MEMORY_FREE_ASYNC:
      case SANITIZER_CBID_RESOURCE_HOST_MEMORY_ALLOC:
      case SANITIZER_CBID_RESOURCE_HOST_MEMORY_FREE:
      case SANITIZER_CBID_RESOURCE_VIRTUAL_RESERVE:
      case SANITIZER_CBID_RESOURCE_VIRTUAL_RELEASE:
        memory_event(cbid, data);
        break;
      default:
        break;
    }
  }
}

}  // namespace

extern "C" {

// mode 1 = gpu, 2 = raw; regex may be empty; sizes in entries.
int pp_san_configure(int mode, const char* patch, const char* regex, long every, int page_shift, long pc_cap,
                     long page_cap, long raw_cap, int flags) {
  cfg.mode = mode == 2 ? PP_MODE_RAW : PP_MODE_GPU;
  cfg.patch = patch ? patch : "";
  if (cfg.has_re) { regfree(&cfg.re); cfg.has_re = false; }
  if (regex && *regex) {
    if (regcomp(&cfg.re, regex, REG_EXTENDED | REG_NOSUB) != 0) {
      error = std::string("PASTAPROF_KERNELS=") + regex +
              ": not a POSIX extended regular expression (the sanitizer selects launches in C)";
      return 1;
    }
    cfg.has_re = true;
  }
  cfg.every = every > 0 ? every : 1;
  cfg.page_shift = unsigned(page_shift);
  unsigned cap = 1;  // a power of two; 0 = no per-PC table (the patches skip it)
  while (cap < unsigned(pc_cap)) cap <<= 1;
  cfg.pc_cap = pc_cap > 0 ? cap : 0;
  cfg.page_cap = size_t(page_cap);
  cfg.raw_cap = size_t(raw_cap);
  cfg.shared = flags & 1; cfg.local = flags & 2; cfg.async = flags & 4; cfg.bulk = flags & 8; cfg.wgmma = flags & 16;
  cfg.unpatch = !(flags & 32);
  return 0;
}

// Counter copies per SM shard (a power of two, 1..64): fewer = less to zero and read back
// per launch, more = less atomic contention.
void pp_san_set_shards(int n) {
  unsigned v = 1;
  while (v < unsigned(n > 0 ? n : 1) && v < 64) v <<= 1;
  cfg.n_shards = v;
}

int InitializeInjection() {
  if (sub) return 0;
  SanitizerResult r = sanitizerSubscribe(&sub, callback, nullptr);
  if (r != SANITIZER_SUCCESS) { error = "sanitizerSubscribe failed (" + std::to_string(int(r)) + "): another sanitizer tool?"; return 1; }
  if ((r = sanitizerEnableDomain(1, sub, SANITIZER_CB_DOMAIN_RESOURCE)) != SANITIZER_SUCCESS ||
      (r = sanitizerEnableDomain(1, sub, SANITIZER_CB_DOMAIN_LAUNCH)) != SANITIZER_SUCCESS) {
    error = "sanitizerEnableDomain failed (" + std::to_string(int(r)) + ")";
    return 1;
  }
  return 0;
}

void pp_san_set_enabled(int on) {
  if (on) gate_closed_ns = 0;
  else if (enabled.load() || !gate_closed_ns.load()) gate_closed_ns = now_ns();
  enabled = on;
}

// Record memcpy / memset calls (when CUPTI, which would give them with GPU times, is off).
int pp_san_record_copies(int on) {
  copies_on = on;
  if (!sub || !on) return 0;
  SanitizerResult r;
  if ((r = sanitizerEnableDomain(1, sub, SANITIZER_CB_DOMAIN_MEMCPY)) != SANITIZER_SUCCESS ||
      (r = sanitizerEnableDomain(1, sub, SANITIZER_CB_DOMAIN_MEMSET)) != SANITIZER_SUCCESS) {
    note("memcpy/memset callbacks not available (SanitizerResult " + std::to_string(int(r)) + ")");
    return 1;
  }
  if ((r = sanitizerEnableDomain(1, sub, SANITIZER_CB_DOMAIN_SYNCHRONIZE)) != SANITIZER_SUCCESS)
    note("synchronize callbacks not available (SanitizerResult " + std::to_string(int(r)) + ")");
  return 0;
}

// Keep module images that carry line info under `dir` (created by the caller); "" = none.
void pp_san_set_cubin_dir(const char* dir) { cubin_dir = dir ? dir : ""; }

// Tensors (PyTorch caching-allocator blocks): finer objects searched before allocations.
void pp_san_tensor(uint64_t address, uint64_t size, int alive) {
  std::lock_guard<std::mutex> g(mu);
  put(tensors, alive != 0, address, size);
  version++;
}

// The live tables as (base, end) pairs, tensors then allocations (for tests and diagnosis).
int64_t pp_san_objects(uint64_t* out, int64_t cap) {
  std::lock_guard<std::mutex> g(mu);
  int64_t n = 0;
  for (auto* t : {&tensors, &allocs})
    for (auto& kv : *t) {
      if (n < cap) { out[2 * n] = kv.first; out[2 * n + 1] = kv.second; }
      ++n;
    }
  return n;
}

const char* pp_san_error() { return error.c_str(); }

int64_t pp_san_notes() { return int64_t(notes.size()); }
const char* pp_san_note(int64_t i) { return i >= 0 && size_t(i) < notes.size() ? notes[i].c_str() : ""; }

int64_t pp_san_stat(int i) {
  switch (i) {
    case 0: return launches.load();
    case 1: return instrumented.load();
    case 2: return skipped_busy.load();
    case 3: { std::lock_guard<std::mutex> g(mu); int64_t b = 0; for (auto& kv : devs) b += int64_t(kv.second->bytes); return b; }
    case 4: { std::lock_guard<std::mutex> g(mu); return int64_t(tensors.size()); }
    case 5: { std::lock_guard<std::mutex> g(mu); return int64_t(allocs.size()); }
    case 6: return repatches.load();
    case 7: return unpatches.load();
    case 8: return t_setup.load();
    case 9: return t_wait.load();
    case 10: return t_readback.load();
    case 11: return t_pages.load();
    case 12: return t_arena.load();
    default: return -1;
  }
}

// Move the collected rows aside; returns rows per table through n[T_N] and the raw address count.
void pp_san_take(int64_t* n) {
  std::lock_guard<std::mutex> g(mu);
  for (int t = 0; t < T_N; ++t) {
    taken[t].swap(out[t]);
    out[t].clear();
    n[t] = taken[t].empty() ? 0 : int64_t(taken[t][0].size());
  }
  taken_addrs.swap(addrs);
  addrs.clear();
}

void pp_san_copy(int table, int col, int64_t* dst) {
  auto& c = taken[table];
  if (c.empty()) return;
  memcpy(dst, c[col].data(), c[col].size() * sizeof(int64_t));
}

void pp_san_copy_addresses(uint64_t* dst) { memcpy(dst, taken_addrs.data(), taken_addrs.size() * 8); }

int64_t pp_san_name_count() { std::lock_guard<std::mutex> g(mu); return int64_t(names.size()); }

// The readable name of a mangled kernel name, into buf (the name itself if it is not mangled).
int64_t pp_san_demangle(const char* mangled, char* buf, int64_t cap) {
  int status = 0;
  char* d = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  const char* s = (status == 0 && d) ? d : mangled;
  int64_t n = int64_t(strlen(s));
  if (cap > 0) {
    int64_t k = n < cap - 1 ? n : cap - 1;
    memcpy(buf, s, size_t(k));
    buf[k] = 0;
  }
  free(d);
  return n;
}
const char* pp_san_name(int64_t i) { return i >= 0 && size_t(i) < names.size() ? names[i].c_str() : ""; }

}  // extern "C"
