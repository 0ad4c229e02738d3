// pastaprof's PyTorch op observer: a global RecordFunction callback (the mechanism
// torch.profiler/Kineto use), so recording an op costs no Python call.
//
// For every ATen op (scope FUNCTION) and autograd node (BACKWARD_FUNCTION) it
//   * pushes the op's id as CUPTI external correlation id (kind CUSTOM2) on enter
//     and pops it on exit, so the kernels the op launches carry the id;
//   * appends one row to column buffers: start/end ns (CLOCK_REALTIME, the clock of
//     time.time_ns() and CUPTI), thread, id, parent id and depth (per-thread stack),
//     autograd sequence number, backward flag, interned name / input shapes / input
//     dtypes / module path / call site.  Shapes, dtypes and input pointers exist for the ops
//     whose inputs RecordFunction boxed: every op's, or a sample (torch_sampling.cpp).
// Module paths come from Python (handlers/module_paths.py, through pp_obs_module_cell); backward
// ops take the module and call site of the forward op with the same sequence number.
// The call site is the innermost Python frame outside torch and pastaprof, read only
// for top-level forward ops on threads that run Python (nested ops inherit it); it, the
// shapes and dtypes and the input pointers come from torch_inputs.cpp.
// The CUDA caching allocator's events are recorded by torch_memory.cpp, built into the
// same library.
//
// Python drains the columns through the extern "C" functions below (ctypes).
#include <ATen/record_function.h>
#include <ATen/core/ivalue.h>
#include <c10/util/ArrayRef.h>

#include "torch_observer.h"

#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <climits>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

// ---- interned strings, shared by every column that holds text -------------------
namespace ppobs {
std::mutex g_str_mu;
std::vector<std::string> g_strings;
std::unordered_map<std::string, int32_t> g_string_ids;

int32_t intern(const std::string& s) {
  std::lock_guard<std::mutex> g(g_str_mu);
  auto it = g_string_ids.find(s);
  if (it != g_string_ids.end()) return it->second;
  int32_t id = int32_t(g_strings.size());
  g_strings.push_back(s);
  g_string_ids.emplace(s, id);
  return id;
}
}  // namespace ppobs
using namespace ppobs;

namespace {

// ---- op columns --------------------------------------------------------------------
enum OpCol { START, END, TID, ID, PARENT, DEPTH, SEQ, BWD, NAME, SHAPES, DTYPES, MODULE, SITE, NPTRS, NCOLS };

// Rows are stored whole (one op = one 112-byte row, written with the op's end) in fixed
// chunks that go back to a pool after each drain.  Per-column vectors regrown from empty
// after every drain faulted their pages in on the program's thread: ~50,000 page faults a
// second on a loop of small ops, ~20% of that thread's time (dev VM, perf), for seconds
// until glibc's heap settled.  Pooled chunks are faulted in once.
constexpr size_t kChunkRows = 8192;      // ~0.9 MB a chunk
constexpr size_t kPtrChunk = 1u << 16;   // input pointers: 0.5 MB a chunk
constexpr size_t kPoolChunks = 256;      // chunks kept for reuse (a drain's worth: up to 2M ops, ~230 MB)
struct OpChunk {
  size_t n = 0;
  int64_t row[kChunkRows][NCOLS];
};
struct PtrChunk {
  size_t n = 0;
  int64_t v[kPtrChunk];
};

template <class T>
struct Pool {
  std::vector<T*> free;
  T* get() {
    if (free.empty()) return new T;  // not value-initialized: rows are written before read
    T* c = free.back();
    free.pop_back();
    c->n = 0;
    return c;
  }
  void put(std::vector<T*>& cs) {
    for (T* c : cs) {
      if (free.size() < kPoolChunks) free.push_back(c); else delete c;
    }
    cs.clear();
  }
};

struct Columns {
  std::vector<OpChunk*> chunks;
  std::vector<PtrChunk*> ptr_chunks;  // input data pointers, NPTRS per op (the memory tool's "uses")
  size_t rows = 0, ptrs = 0;
  size_t size() const { return rows; }
};

// The op columns' lock: taken once per op on the program's thread, held for a few stores
// (and by the drain for a swap).  A test-and-set lock releases with a plain store where a
// pthread mutex pays a second atomic; on a 20,000-launch loop the mutex was ~7% of the
// program thread's time (dev VM, perf).  A waiter yields, then sleeps: the holder may be
// the niced flush thread, which a busy machine would otherwise not schedule while the
// program's thread spins.
class SpinLock {
 public:
  void lock() {
    int waits = 0;
    while (f_.exchange(true, std::memory_order_acquire)) {
      do {
        if (++waits < 64) {
          sched_yield();
        } else {
          timespec ts{0, 50000};
          nanosleep(&ts, nullptr);
        }
      } while (f_.load(std::memory_order_relaxed));
    }
  }
  void unlock() { f_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> f_{false};
};
SpinLock g_mu;
Columns g_ops, g_taken;  // recording / taken by the drain (both guarded by g_mu)
Pool<OpChunk> g_op_pool;
Pool<PtrChunk> g_ptr_pool;

// Under g_mu: a fresh row of g_ops.
int64_t* next_row() {
  if (g_ops.chunks.empty() || g_ops.chunks.back()->n == kChunkRows) g_ops.chunks.push_back(g_op_pool.get());
  OpChunk* c = g_ops.chunks.back();
  ++g_ops.rows;
  return c->row[c->n++];
}

// Under g_mu: append n input pointers to g_ops.
void append_ptrs(const int64_t* p, size_t n) {
  while (n) {
    if (g_ops.ptr_chunks.empty() || g_ops.ptr_chunks.back()->n == kPtrChunk)
      g_ops.ptr_chunks.push_back(g_ptr_pool.get());
    PtrChunk* c = g_ops.ptr_chunks.back();
    size_t k = std::min(n, kPtrChunk - c->n);
    std::memcpy(c->v + c->n, p, k * sizeof(int64_t));
    c->n += k;
    g_ops.ptrs += k;
    p += k;
    n -= k;
  }
}
std::atomic<int64_t> g_next_id{1};
std::atomic<int64_t> g_dropped{0};

// The buffer's bounds (pp_obs_limits; all under g_mu).  Past g_max_rows rows since the last take,
// an op's row is not recorded but counted in g_dropped: the buffer's memory is bounded by
// construction, whatever the load.  Each time the rows since the last take reach a multiple of
// g_wake_rows, the op's thread bumps g_wake_seq and wakes its futex waiters (the session's
// deadline thread, in pp_obs_wait with the GIL released): one syscall per g_wake_rows ops, no
// lock and no wait on the program's thread.
size_t g_max_rows = size_t(1) << 22;  // default ~460 MB of ops
size_t g_wake_rows = 0;               // 0: no wake-ups
size_t g_next_wake = SIZE_MAX;        // g_ops.rows at which the next wake-up is due
size_t g_max_pending = 0;             // most rows g_ops held at a take
std::atomic<uint32_t> g_wake_seq{0};  // a futex word: wake-ups so far
static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t), "g_wake_seq is used as a futex word");

long futex(uint32_t op, uint32_t val, const timespec* timeout) {
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(&g_wake_seq), op, val, timeout, nullptr, 0);
}

void wake_waiters() {
  g_wake_seq.fetch_add(1, std::memory_order_release);
  futex(FUTEX_WAKE_PRIVATE, INT_MAX, nullptr);
}

// Under g_mu: the rows since the last take start from zero.
void rearm() { g_next_wake = g_wake_rows ? g_wake_rows : SIZE_MAX; }

// The bounds from the first op on, before the session's deadline thread sets them
// (pp_obs_limits): PASTAPROF_BUFFER_MB's rows (live/flush.py: ROW_BYTES, CAP_BUFFERS).
constexpr int64_t kRowBytes = 128, kCapBuffers = 16;
bool g_limits_set = false;
void default_limits() {
  std::lock_guard<SpinLock> g(g_mu);
  if (g_limits_set) return;
  const char* env = getenv("PASTAPROF_BUFFER_MB");
  int64_t mb = env ? atoll(env) : 16;
  if (mb < 1) mb = 16;
  g_wake_rows = size_t((mb << 20) / kRowBytes);
  g_max_rows = size_t(kCapBuffers) * g_wake_rows;
  rearm();
}

// forward op (sequence number) -> (module, call site), for backward ops
constexpr size_t SEQ_SLOTS = size_t(1) << 20;
struct SeqSlot {
  int64_t seq = -1;
  int32_t module = -1;
  int32_t site = -1;
};
std::vector<SeqSlot> g_seq(SEQ_SLOTS);
SpinLock g_seq_mu;  // forward ops write, backward ops (other threads) read (held for a 24-byte copy)

typedef int (*push_fn_t)(int kind, uint64_t id);
typedef int (*pop_fn_t)(int kind, uint64_t* id);
push_fn_t g_push = nullptr;
pop_fn_t g_pop = nullptr;
int g_ext_kind = 0;
int g_inputs = 3;  // what of an op's inputs is read: 1 shapes and dtypes, 2 data pointers
bool g_sites = true;
std::atomic<bool> g_on{false};
at::CallbackHandle g_handle = 0;
std::mutex g_handle_mu;  // start, stop and pause (the session's gate) may come from different threads

struct Frame {
  const void* rf;
  int64_t id, start, seq;
  int32_t name, shapes, dtypes, module, site;
  uint32_t ptr_start, ptr_count;
  bool bwd;
};

struct ThreadState {
  std::vector<Frame> stack;
  std::vector<int64_t> ptrs;  // input pointers of the open frames, in stack order
  int32_t module = -1;  // current module path (set by Python's module hooks)
  int64_t tid = 0;
};
thread_local ThreadState t_state;

// An op's name id, found without an allocation or a lock per op.  Most FUNCTION ops are named
// by the dispatcher (a stable address), so their address is the key.  Not every name is stable:
// the autograd engine names each node's evaluation with a temporary string
// ("autograd::engine::evaluate_function: MeanBackward0"), and BACKWARD_FUNCTION ops are named by
// their node.  A temporary's address is a fresh heap address most of the time, so an address
// cache gained an entry (a node and a copy of the text) per backward op: those long-lived small
// blocks landed in the holes the step's freed tensors had left, so the heap could not reuse them
// and grew 2-3 MB a step, the next step's large tensors faulting in fresh pages (dev VM, mlp, 60
// steps: 0 page faults a step bare, 300-550 a step observed, the heap 117-181 MB larger).  So temporaries are
// found by their text's hash (compared with the cached text: no copy on a hit), and the address
// cache takes only names outside the evaluate prefix, compared with their text too (an address
// may still be reused by another name).
struct NameSlot {
  int32_t id;
  std::string text;
};
thread_local std::unordered_map<const char*, NameSlot> t_op_names;   // stable names, by address
thread_local std::unordered_map<uint64_t, NameSlot> t_temp_names;    // temporaries, by text hash
constexpr size_t kMaxNames = size_t(1) << 16;  // per map and thread: a bound, never reached by real names

constexpr char kEvaluate[] = "autograd::engine::evaluate_function: ";
inline bool is_evaluate(const char* name) {
  return name[0] == 'a' && std::strncmp(name, kEvaluate, sizeof(kEvaluate) - 1) == 0;
}

int32_t name_by_text(const char* name) {
  uint64_t h = 1469598103934665603ULL;
  size_t n = 0;
  for (const char* c = name; *c; ++c, ++n) h = (h ^ uint8_t(*c)) * 1099511628211ULL;
  auto& m = t_temp_names;
  auto it = m.find(h);
  if (it != m.end() && it->second.text.size() == n && std::memcmp(it->second.text.data(), name, n) == 0)
    return it->second.id;
  int32_t id = intern(name);
  if (it != m.end()) {
    it->second = NameSlot{id, name};  // a hash collision: the newer name keeps the slot
  } else {
    if (m.size() >= kMaxNames) m.clear();
    m.emplace(h, NameSlot{id, name});
  }
  return id;
}

int32_t name_of(const at::RecordFunction& fn, const char* name) {
  if (fn.scope() != at::RecordScope::FUNCTION || is_evaluate(name)) return name_by_text(name);
  auto& m = t_op_names;
  auto it = m.find(name);
  if (it != m.end() && it->second.text == name) return it->second.id;
  int32_t id = intern(name);
  if (it != m.end()) {
    it->second.id = id;
    it->second.text = name;
  } else {
    if (m.size() >= kMaxNames) m.clear();
    m.emplace(name, NameSlot{id, name});
  }
  return id;
}

std::atomic<int64_t> g_errors{0};

std::unique_ptr<at::ObserverContext> on_enter_impl(const at::RecordFunction& fn);

// RecordFunction prints a warning for every exception a callback throws: never throw.
std::unique_ptr<at::ObserverContext> on_enter(const at::RecordFunction& fn) {
  try {
    return on_enter_impl(fn);
  } catch (...) {
    g_errors.fetch_add(1, std::memory_order_relaxed);
    return nullptr;
  }
}

std::unique_ptr<at::ObserverContext> on_enter_impl(const at::RecordFunction& fn) {
  const bool function = fn.scope() == at::RecordScope::FUNCTION;
  const bool boxed = function && sampler_enter(fn);  // first: it clears the sampler's mark
  if (!g_on.load(std::memory_order_relaxed) || fn.isAsync()) return nullptr;
  ThreadState& ts = t_state;
  if (ts.tid == 0) ts.tid = int64_t(syscall(SYS_gettid));
  Frame fr;
  fr.rf = &fn;
  fr.id = g_next_id.fetch_add(1, std::memory_order_relaxed);
  fr.seq = fn.seqNr();
  const char* name = fn.name();
  fr.name = name_of(fn, name);
  fr.shapes = fr.dtypes = -1;
  fr.ptr_start = uint32_t(ts.ptrs.size());
  if (g_inputs && boxed) {
    if (g_inputs & 1) inputs_of(fn, &fr.shapes, &fr.dtypes);
    if (g_inputs & 2) pointers_of(fn, ts.ptrs);
  }
  fr.ptr_count = uint32_t(ts.ptrs.size()) - fr.ptr_start;
  const Frame* parent = ts.stack.empty() ? nullptr : &ts.stack.back();
  fr.bwd = fn.scope() == at::RecordScope::BACKWARD_FUNCTION || (parent && parent->bwd) ||
           is_evaluate(name);
  if (fn.scope() == at::RecordScope::BACKWARD_FUNCTION) {
    SeqSlot s;
    if (fr.seq >= 0) {
      std::lock_guard<SpinLock> g(g_seq_mu);
      s = g_seq[size_t(fr.seq) % SEQ_SLOTS];
    }
    bool hit = fr.seq >= 0 && s.seq == fr.seq;
    fr.module = hit ? s.module : -1;
    fr.site = hit ? s.site : -1;
  } else if (parent) {
    fr.module = parent->bwd || modules_from_frames() ? parent->module : ts.module;
    fr.site = parent->site;
  } else {
    fr.module = ts.module;
    where_from(g_sites, &fr.site, &fr.module);
  }
  if (g_inputs && function) sampler_signature(fr.name, fr.site, boxed);
  if (!fr.bwd && fr.seq >= 0) {
    std::lock_guard<SpinLock> g(g_seq_mu);
    SeqSlot& s = g_seq[size_t(fr.seq) % SEQ_SLOTS];
    s.seq = fr.seq;
    s.module = fr.module;
    s.site = fr.site;
  }
  if (g_push) g_push(g_ext_kind, uint64_t(fr.id));
  fr.start = now_ns();
  ts.stack.push_back(fr);
  return nullptr;
}

void on_exit_impl(const at::RecordFunction& fn);
bool record_row(const Frame& fr, int64_t end, int64_t parent, const ThreadState& ts, const int64_t* fptrs);

void on_exit(const at::RecordFunction& fn, at::ObserverContext*) {
  try {
    on_exit_impl(fn);
  } catch (...) {
    g_errors.fetch_add(1, std::memory_order_relaxed);
  }
}

void on_exit_impl(const at::RecordFunction& fn) {
  int64_t end = now_ns();
  ThreadState& ts = t_state;
  if (ts.stack.empty() || ts.stack.back().rf != &fn) return;  // began before start(), or async
  Frame fr = ts.stack.back();
  ts.stack.pop_back();
  const int64_t* fptrs = ts.ptrs.data() + fr.ptr_start;
  struct Truncate {  // the frame's pointers leave the thread's buffer however this returns
    std::vector<int64_t>& v;
    size_t n;
    ~Truncate() { v.resize(n); }
  } trunc{ts.ptrs, fr.ptr_start};
  if (g_pop) {
    uint64_t ignored;
    g_pop(g_ext_kind, &ignored);
  }
  int64_t parent = ts.stack.empty() ? -1 : ts.stack.back().id;
  if (record_row(fr, end, parent, ts, fptrs)) wake_waiters();  // after g_mu is released
}

// Under g_mu (taken here): the op's row, or a drop past the cap.  True when the rows since the
// last take just reached a wake-up threshold.
bool record_row(const Frame& fr, int64_t end, int64_t parent, const ThreadState& ts, const int64_t* fptrs) {
  std::lock_guard<SpinLock> g(g_mu);
  if (g_ops.size() >= g_max_rows) {
    g_dropped.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  int64_t* r = next_row();
  r[START] = fr.start;
  r[END] = end;
  r[TID] = ts.tid;
  r[ID] = fr.id;
  r[PARENT] = parent;
  r[DEPTH] = int64_t(ts.stack.size());
  r[SEQ] = fr.seq;
  r[BWD] = fr.bwd;
  r[NAME] = fr.name;
  r[SHAPES] = fr.shapes;
  r[DTYPES] = fr.dtypes;
  r[MODULE] = fr.module;
  r[SITE] = fr.site;
  r[NPTRS] = fr.ptr_count;
  if (fr.ptr_count) append_ptrs(fptrs, fr.ptr_count);
  if (g_ops.rows != g_next_wake) return false;
  g_next_wake += g_wake_rows;
  return true;
}


// fork(): a child (DataLoader worker) inherits the parent's pending rows, which belong to the
// parent's shard, and CUPTI function pointers it must not call.  The locks are held across
// fork so the child never inherits one mid-update.
void fork_prepare() {
  g_handle_mu.lock();
  sampler_lock();
  g_str_mu.lock();
  g_mu.lock();
  g_seq_mu.lock();
}

void fork_parent() {
  g_seq_mu.unlock();
  g_mu.unlock();
  g_str_mu.unlock();
  sampler_unlock();
  g_handle_mu.unlock();
}

void fork_child() {
  for (Columns* c : {&g_ops, &g_taken}) {
    g_op_pool.put(c->chunks);
    g_ptr_pool.put(c->ptr_chunks);
    c->rows = c->ptrs = 0;
  }
  rearm();
  g_max_pending = 0;
  g_dropped.store(0);  // the parent's drops are in the parent's shard
  t_state.ptrs.clear();
  g_push = nullptr;
  g_pop = nullptr;
  t_state.stack.clear();
  fork_parent();
}

__attribute__((constructor)) void install_fork_handlers() { pthread_atfork(fork_prepare, fork_parent, fork_child); }

// The one registration of a global callback on the ops' scopes (forward and backward), shared by
// the observer and the benchmarks' empty callback so the floor they measure is the same hook.
static uint64_t add_op_callback(at::RecordFunctionCallback::StartCallback enter,
                                at::RecordFunctionCallback::EndCallback leave, bool inputs) {
  return at::addGlobalCallback(at::RecordFunctionCallback(enter, leave)
                                   .needsInputs(inputs)
                                   .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION}));
}

void add_callback() {
  std::lock_guard<std::mutex> g(g_handle_mu);
  if (g_handle == 0) {
    sampler_add();  // first: its callback must run before the observer's (torch_sampling.cpp)
    g_handle = add_op_callback(&on_enter, &on_exit, false);
  }
  g_on.store(true);
}

void remove_callback() {
  std::lock_guard<std::mutex> g(g_handle_mu);
  g_on.store(false);
  if (g_handle != 0) {
    at::removeCallback(g_handle);
    g_handle = 0;
    sampler_remove();
  }
}

}  // namespace

extern "C" {

// Start observing.  push/pop: cuptiActivityPush/PopExternalCorrelationId (or null).
// inputs: what of each op's inputs to read, bits: 1 shapes and dtypes, 2 data pointers
// (0: RecordFunction does not box the op's arguments at all); of which ops, pp_obs_sampling
// (torch_sampling.cpp) says, called before (default: every op's).
int pp_obs_start(void* push, void* pop, int ext_kind, int inputs, int sites) {
  default_limits();
  g_push = reinterpret_cast<push_fn_t>(push);
  g_pop = reinterpret_cast<pop_fn_t>(pop);
  g_ext_kind = ext_kind;
  g_inputs = inputs & 3;
  g_sites = sites != 0;
  if (g_inputs == 0) pp_obs_sampling(kShapesNone, 0, 0, 0, 0);  // nothing boxed at all
  add_callback();
  return 0;
}

// Capture gated at the source (PASTAPROF_STEPS / PASTAPROF_RANGES): outside the selected
// steps and ranges the callback is removed, so ops cost what they cost without pastaprof (a
// registered callback, even one returning at once, is ~0.2-0.6 us per op: RecordFunction
// itself).  An op that began before a pause still gets its exit (RecordFunction keeps the
// callbacks it started with); one that began during it is not on the thread's stack and its
// exit is ignored.
void pp_obs_pause(int paused) {
  if (paused) {
    remove_callback();
  } else {
    add_callback();
  }
}

void pp_obs_stop() { remove_callback(); }

// The calling thread's module path id, for Python's module-call wrapper to write through a
// ctypes cell (a ctypes call per module call cost more than the rest of it).  Valid for the
// thread's life.
int32_t* pp_obs_module_cell() { return &t_state.module; }

int64_t pp_obs_dropped() { return g_dropped.load() + g_errors.load(); }

// Rows recorded since the last take: the session's flush deadline thread bounds the buffer by it.
int64_t pp_obs_pending() {
  std::lock_guard<SpinLock> g(g_mu);
  return int64_t(g_ops.size());
}

// The buffer's bounds: a wake-up each time the rows since the last take reach a multiple of
// wake_rows (0: none), and at most cap_rows rows (more are dropped and counted; 0 keeps the cap).
void pp_obs_limits(int64_t wake_rows, int64_t cap_rows) {
  std::lock_guard<SpinLock> g(g_mu);
  g_limits_set = true;
  g_wake_rows = wake_rows > 0 ? size_t(wake_rows) : 0;
  if (cap_rows > 0) g_max_rows = size_t(cap_rows);
  rearm();
  while (g_wake_rows && g_next_wake <= g_ops.rows) g_next_wake += g_wake_rows;
}

// The most rows the buffer held at once so far (exact: rows only grow between takes).
int64_t pp_obs_max_pending() {
  std::lock_guard<SpinLock> g(g_mu);
  return int64_t(std::max(g_max_pending, g_ops.size()));
}

// Blocks until a wake-up after `seen` (a value this returned before) or timeout_ms; returns the
// wake-ups so far.  Called through ctypes, which releases the GIL for the wait.
uint32_t pp_obs_wait(uint32_t seen, int timeout_ms) {
  uint32_t now = g_wake_seq.load(std::memory_order_acquire);
  if (now != seen || timeout_ms <= 0) return now;
  timespec ts{timeout_ms / 1000, long(timeout_ms % 1000) * 1000000L};
  futex(FUTEX_WAIT_PRIVATE, seen, &ts);  // returns at once if the word is no longer `seen`
  return g_wake_seq.load(std::memory_order_acquire);
}

// Wakes pp_obs_wait's waiters now (the session's end).
void pp_obs_notify() { wake_waiters(); }

// Move the rows recorded so far aside; returns how many.  Then pp_obs_copy_all and
// pp_obs_release.
int64_t pp_obs_take() {
  std::lock_guard<SpinLock> g(g_mu);
  g_op_pool.put(g_taken.chunks);  // normally released already; else never taken twice
  g_ptr_pool.put(g_taken.ptr_chunks);
  g_taken.rows = g_taken.ptrs = 0;
  g_max_pending = std::max(g_max_pending, g_ops.size());
  std::swap(g_ops, g_taken);  // g_ops starts empty
  rearm();
  return int64_t(g_taken.size());
}

// Input pointers of the taken rows (sum of their NPTRS), then pp_obs_copy_ptrs.
int64_t pp_obs_ptr_count() { return int64_t(g_taken.ptrs); }

void pp_obs_copy_ptrs(int64_t* dst) {
  for (PtrChunk* c : g_taken.ptr_chunks) {
    std::memcpy(dst, c->v, c->n * sizeof(int64_t));
    dst += c->n;
  }
}

// Every column in one pass over the rows: dst[col] receives column col (NCOLS pointers).
void pp_obs_copy_all(int64_t** dst) {
  int64_t* out[NCOLS];
  for (int k = 0; k < NCOLS; ++k) out[k] = dst[k];
  for (OpChunk* c : g_taken.chunks)
    for (size_t i = 0; i < c->n; ++i)
      for (int k = 0; k < NCOLS; ++k) *out[k]++ = c->row[i][k];
}

void pp_obs_release() {
  std::lock_guard<SpinLock> g(g_mu);  // the pools are shared with the recording side
  g_op_pool.put(g_taken.chunks);
  g_ptr_pool.put(g_taken.ptr_chunks);
  g_taken.rows = g_taken.ptrs = 0;
}

int64_t pp_obs_string_count() {
  std::lock_guard<std::mutex> g(g_str_mu);
  return int64_t(g_strings.size());
}

// Interned string i (stable for the process's lifetime).
const char* pp_obs_string(int64_t i) {
  std::lock_guard<std::mutex> g(g_str_mu);
  if (i < 0 || size_t(i) >= g_strings.size()) return nullptr;
  return g_strings[size_t(i)].c_str();
}

int32_t pp_obs_intern(const char* s) { return intern(std::string(s)); }

// For benchmarks only (bench/capture_inprocess.py, cupti_presence.py, cupti_kinds.py): an empty
// callback on the same scopes, with or without the op's inputs, measures what RecordFunction
// itself costs per op -- the floor under any op observer -- against which the observer's own
// work is read.
uint64_t pp_obs_floor_start(int inputs) {
  auto enter = [](const at::RecordFunction&) -> std::unique_ptr<at::ObserverContext> { return nullptr; };
  auto leave = [](const at::RecordFunction&, at::ObserverContext*) {};
  return add_op_callback(enter, leave, inputs != 0);
}

void pp_obs_floor_stop(uint64_t handle) { at::removeCallback(handle); }

}  // extern "C"
