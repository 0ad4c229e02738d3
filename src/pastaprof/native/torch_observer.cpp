// pastaprof's PyTorch op observer: a global RecordFunction callback (the mechanism
// torch.profiler/Kineto use), so recording an op costs no Python call.
//
// For every ATen op (scope FUNCTION) and autograd node (BACKWARD_FUNCTION) it
//   * pushes the op's id as CUPTI external correlation id (kind CUSTOM2) on enter
//     and pops it on exit, so the kernels the op launches carry the id;
//   * appends one row to column buffers: start/end ns (CLOCK_REALTIME, the clock of
//     time.time_ns() and CUPTI), thread, id, parent id and depth (per-thread stack),
//     autograd sequence number, backward flag, interned name / input shapes / input
//     dtypes / module path / call site.
// Module paths come from Python's global module hooks (pp_obs_set_module); backward
// ops take the module and call site of the forward op with the same sequence number.
// The call site is the innermost Python frame outside torch and pastaprof, read only
// for top-level forward ops on threads that run Python (nested ops inherit it).
// With -DPP_CUDA it also attaches a CUDA caching-allocator trace tracker: alloc and
// free events land in columns without Python and without the GIL.
//
// Python drains the columns through the extern "C" functions below (ctypes).
#include <Python.h>
#include <frameobject.h>
#include <ATen/record_function.h>
#include <ATen/core/ivalue.h>
#include <c10/util/ArrayRef.h>
#ifdef PP_CUDA
#include <dlfcn.h>
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include <pthread.h>
#include <sched.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

inline int64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return int64_t(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

// ---- interned strings, shared by every column that holds text -------------------
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
size_t g_max_rows = size_t(1) << 22;  // rows kept between drains (1 s apart): ~430 MB of ops; more are counted as dropped

// forward op (sequence number) -> (module, call site), for backward ops
constexpr size_t SEQ_SLOTS = size_t(1) << 20;
struct SeqSlot {
  int64_t seq = -1;
  int32_t module = -1;
  int32_t site = -1;
};
std::vector<SeqSlot> g_seq(SEQ_SLOTS);
std::mutex g_seq_mu;  // forward ops write, backward ops (other threads) read

typedef int (*push_fn_t)(int kind, uint64_t id);
typedef int (*pop_fn_t)(int kind, uint64_t* id);
push_fn_t g_push = nullptr;
pop_fn_t g_pop = nullptr;
int g_ext_kind = 0;
bool g_shapes = true;
bool g_sites = true;
std::atomic<bool> g_on{false};
at::CallbackHandle g_handle = 0;

constexpr char kEvaluate[] = "autograd::engine::evaluate_function: ";

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

// ---- call site -------------------------------------------------------------------
std::unordered_map<const void*, bool> g_lib_code;  // code object -> is library code (guarded by GIL)
struct SiteKey {
  const void* code;
  int64_t at;  // instruction offset (line number before Python 3.11)
  bool operator==(const SiteKey& o) const { return code == o.code && at == o.at; }
};
struct SiteHash {
  size_t operator()(const SiteKey& k) const {
    return std::hash<const void*>()(k.code) ^ (std::hash<int64_t>()(k.at) * 0x9E3779B97F4A7C15ull);
  }
};
std::unordered_map<SiteKey, int32_t, SiteHash> g_site_ids;  // (code, offset) -> string id (guarded by GIL)

bool is_library(PyCodeObject* code) {
  auto it = g_lib_code.find(code);
  if (it != g_lib_code.end()) return it->second;
  const char* fn = PyUnicode_AsUTF8(code->co_filename);
  bool lib = true;
  if (fn) {
    std::string f(fn);
    lib = f.find("/torch/") != std::string::npos || f.find("/pastaprof/") != std::string::npos ||
          f.rfind("<frozen", 0) == 0 || f.find("/contextlib.py") != std::string::npos ||
          f.find("/functools.py") != std::string::npos;
  } else {
    PyErr_Clear();
  }
  Py_INCREF(code);  // keeps the address from being reused by another code object
  g_lib_code.emplace(code, lib);
  return lib;
}

int32_t call_site() {
  if (!Py_IsInitialized() || PyGILState_GetThisThreadState() == nullptr) return -1;
#if PY_VERSION_HEX >= 0x030D0000
  if (Py_IsFinalizing()) return -1;
#else
  if (_Py_IsFinalizing()) return -1;
#endif
  PyGILState_STATE g = PyGILState_Ensure();
  int32_t out = -1;
  PyFrameObject* f = PyEval_GetFrame();  // borrowed
  Py_XINCREF(f);
  while (f != nullptr) {
    PyCodeObject* code = PyFrame_GetCode(f);  // new reference
    if (!is_library(code)) {
      // Keyed by the frame's instruction offset, not its line: the line number is a scan
      // of the code's line table (~3% of a small op's time on the program's thread),
      // needed only on a miss.  is_library() holds a reference to the code object, so
      // its address is not reused.
#if PY_VERSION_HEX >= 0x030B0000
      SiteKey key{code, int64_t(PyFrame_GetLasti(f))};
#else
      SiteKey key{code, int64_t(PyFrame_GetLineNumber(f))};
#endif
      auto it = g_site_ids.find(key);
      if (it != g_site_ids.end()) {
        out = it->second;
      } else {
        int line = PyFrame_GetLineNumber(f);
        const char* fn = PyUnicode_AsUTF8(code->co_filename);
        const char* name = PyUnicode_AsUTF8(code->co_name);
        if (fn && name) {
          out = intern(std::string(fn) + "(" + std::to_string(line) + "): " + name);
          g_site_ids.emplace(key, out);
        } else {
          PyErr_Clear();
        }
      }
      Py_DECREF(code);
      break;
    }
    Py_DECREF(code);
    PyFrameObject* back = PyFrame_GetBack(f);  // new reference
    Py_DECREF(f);
    f = back;
  }
  Py_XDECREF(f);
  PyGILState_Release(g);
  return out;
}

// ---- shapes and dtypes, as Kineto writes them ------------------------------------
// Sizes are read only from plain tensors: a tensor subclass (FakeTensor, functional tensors
// under torch.compile), a symbolic-shape or a nested tensor would dispatch back into Python
// or throw, which inside a RecordFunction callback prints a warning per op.
inline bool plain(const at::Tensor& t) {
  const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  return !impl->is_python_dispatch() && !impl->has_symbolic_sizes_strides() && !impl->is_nested();
}

inline uint64_t mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  return h;
}

// A 64-bit key of the inputs' shapes and dtypes, so the strings are built and
// interned once per distinct signature (per thread), not once per op.
uint64_t signature(const at::RecordFunction& fn) {
  uint64_t h = 1469598103934665603ULL;
  for (const c10::IValue& v : fn.inputs()) {
    if (v.isTensor()) {
      const at::Tensor& t = v.toTensor();
      if (!t.defined()) {
        h = mix(h, 2);
        continue;
      }
      if (!plain(t)) {
        h = mix(h, 0xabcd);
        continue;
      }
      h = mix(h, 3 + uint64_t(t.scalar_type()));
      for (int64_t d : t.sizes()) h = mix(h, uint64_t(d));
      h = mix(h, 0xfeed);
    } else if (v.isTensorList()) {
      h = mix(h, 5);
      for (const at::Tensor& t : v.toTensorList().vec()) {
        if (t.defined() && plain(t))
          for (int64_t d : t.sizes()) h = mix(h, uint64_t(d));
        h = mix(h, t.defined() && !plain(t) ? 0xabcd : 0xbeef);
      }
    } else {
      h = mix(h, v.isScalar() ? 7 : (v.isList() ? 11 : 13));
    }
  }
  return h;
}

void append_sizes(std::string& s, c10::IntArrayRef sz) {
  s += "[";
  for (size_t i = 0; i < sz.size(); ++i) {
    if (i) s += ",";
    s += std::to_string(sz[i]);
  }
  s += "]";
}

void describe_inputs(const at::RecordFunction& fn, int32_t* shapes, int32_t* dtypes) {
  std::string s = "[", d = "[";
  bool first = true;
  for (const c10::IValue& v : fn.inputs()) {
    if (!first) {
      s += ",";
      d += ",";
    }
    first = false;
    if (v.isTensor()) {
      const at::Tensor& t = v.toTensor();
      if (t.defined() && !plain(t)) {
        s += "[?]";  // a subclass or symbolic shape: not read (see plain())
        d += "\"?\"";
      } else if (t.defined()) {
        append_sizes(s, t.sizes());
        d += "\"";
        d += std::string(t.dtype().name());
        d += "\"";
      } else {
        s += "[]";
        d += "\"\"";
      }
    } else if (v.isTensorList()) {
      s += "[";
      bool f2 = true;
      for (const at::Tensor& t : v.toTensorList().vec()) {
        if (!f2) s += ",";
        f2 = false;
        if (t.defined() && !plain(t))
          s += "[?]";
        else
          append_sizes(s, t.defined() ? t.sizes() : c10::IntArrayRef());
      }
      s += "]";
      d += "\"TensorList\"";
    } else {
      s += "[]";
      d += (v.isScalar() ? "\"Scalar\"" : (v.isList() ? "\"GenericList\"" : "\"\""));
    }
  }
  s += "]";
  d += "]";
  *shapes = intern(s);
  *dtypes = intern(d);
}

// The data pointer of a plain tensor input (0 for anything else), read at op entry:
// RecordFunction's inputs are the interpreter stack, gone by the op's exit.
int64_t ptr_of(const at::Tensor& t) {
  if (!t.defined() || !plain(t) || !t.has_storage()) return 0;
  return int64_t(reinterpret_cast<uintptr_t>(t.const_data_ptr()));
}

void pointers_of(const at::RecordFunction& fn, std::vector<int64_t>& out) {
  for (const c10::IValue& v : fn.inputs()) {
    if (v.isTensor()) {
      out.push_back(ptr_of(v.toTensor()));
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorList().vec()) out.push_back(ptr_of(t));
    } else {
      out.push_back(0);
    }
  }
}

struct Caches {
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> inputs;
  std::unordered_map<const char*, int32_t> op_names;  // FUNCTION scope: names owned by the dispatcher
};
thread_local Caches t_cache;

void inputs_of(const at::RecordFunction& fn, int32_t* shapes, int32_t* dtypes) {
  uint64_t key = signature(fn);
  auto& m = t_cache.inputs;
  auto it = m.find(key);
  if (it != m.end()) {
    *shapes = it->second.first;
    *dtypes = it->second.second;
    return;
  }
  describe_inputs(fn, shapes, dtypes);
  if (m.size() > (size_t(1) << 18)) m.clear();
  m.emplace(key, std::make_pair(*shapes, *dtypes));
}

int32_t name_of(const at::RecordFunction& fn, const char* name) {
  if (fn.scope() != at::RecordScope::FUNCTION) return intern(name);
  auto& m = t_cache.op_names;
  auto it = m.find(name);
  if (it != m.end()) return it->second;
  int32_t id = intern(name);
  m.emplace(name, id);
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
  if (g_shapes && fn.scope() == at::RecordScope::FUNCTION) {
    inputs_of(fn, &fr.shapes, &fr.dtypes);
    pointers_of(fn, ts.ptrs);
  }
  fr.ptr_count = uint32_t(ts.ptrs.size()) - fr.ptr_start;
  const Frame* parent = ts.stack.empty() ? nullptr : &ts.stack.back();
  fr.bwd = fn.scope() == at::RecordScope::BACKWARD_FUNCTION || (parent && parent->bwd) ||
           (name[0] == 'a' && std::strncmp(name, kEvaluate, sizeof(kEvaluate) - 1) == 0);
  if (fn.scope() == at::RecordScope::BACKWARD_FUNCTION) {
    SeqSlot s;
    if (fr.seq >= 0) {
      std::lock_guard<std::mutex> g(g_seq_mu);
      s = g_seq[size_t(fr.seq) % SEQ_SLOTS];
    }
    bool hit = fr.seq >= 0 && s.seq == fr.seq;
    fr.module = hit ? s.module : -1;
    fr.site = hit ? s.site : -1;
  } else if (parent) {
    fr.module = parent->bwd ? parent->module : ts.module;
    fr.site = parent->site;
  } else {
    fr.module = ts.module;
    fr.site = g_sites ? call_site() : -1;
  }
  if (!fr.bwd && fr.seq >= 0) {
    std::lock_guard<std::mutex> g(g_seq_mu);
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
  std::lock_guard<SpinLock> g(g_mu);
  if (g_ops.size() >= g_max_rows) {
    g_dropped.fetch_add(1, std::memory_order_relaxed);
    return;
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
}

#ifdef PP_CUDA
// ---- CUDA caching allocator ------------------------------------------------------
enum MemCol { M_T, M_DEV, M_STREAM, M_ADDR, M_BYTES, M_ACTION, M_NCOLS };
std::mutex g_mem_mu;
std::vector<int64_t> g_mem[M_NCOLS], g_mem_taken[M_NCOLS];
std::atomic<bool> g_mem_on{false};
bool g_mem_attached = false;
// The sanitizer tool's live-tensor table (sanitizer_tool.cpp), when it is loaded: tensors
// are its finest objects.  Fed even while recording is gated, so that accesses inside a
// range are attributed to tensors allocated before it.
void (*g_san_tensor)(uint64_t, uint64_t, int) = nullptr;

void on_alloc_event(const c10::cuda::CUDACachingAllocator::TraceEntry& e) {
  // Runs under the allocator's mutex: no Python, no GIL, nothing that allocates on the GPU.
  using A = c10::cuda::CUDACachingAllocator::TraceEntry::Action;
  if (g_san_tensor) {
    if (e.action_ == A::ALLOC) g_san_tensor(uint64_t(e.addr_), uint64_t(e.size_), 1);
    else if (e.action_ == A::FREE_COMPLETED) g_san_tensor(uint64_t(e.addr_), 0, 0);
  }
  if (!g_mem_on.load(std::memory_order_relaxed)) return;
  int64_t sign;
  switch (e.action_) {
    case A::ALLOC: sign = 1; break;
    case A::FREE_COMPLETED: sign = -1; break;
    case A::SEGMENT_ALLOC: sign = 2; break;
    case A::SEGMENT_FREE: sign = -2; break;
    default: return;
  }
  int64_t t = now_ns();
  std::lock_guard<std::mutex> g(g_mem_mu);
  if (g_mem[M_T].size() >= g_max_rows) {
    g_dropped.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  g_mem[M_T].push_back(t);
  g_mem[M_DEV].push_back(int64_t(e.device_));
  g_mem[M_STREAM].push_back(int64_t(reinterpret_cast<uintptr_t>(e.stream_)));
  g_mem[M_ADDR].push_back(int64_t(e.addr_));
  g_mem[M_BYTES].push_back(int64_t(e.size_));
  g_mem[M_ACTION].push_back(sign);
}
#endif

// fork(): a child (DataLoader worker) inherits the parent's pending rows, which belong to the
// parent's shard, and CUPTI function pointers it must not call.  The locks are held across
// fork so the child never inherits one mid-update.
void fork_prepare() {
  g_str_mu.lock();
  g_mu.lock();
#ifdef PP_CUDA
  g_mem_mu.lock();
#endif
}

void fork_parent() {
#ifdef PP_CUDA
  g_mem_mu.unlock();
#endif
  g_mu.unlock();
  g_str_mu.unlock();
}

void fork_child() {
  for (Columns* c : {&g_ops, &g_taken}) {
    g_op_pool.put(c->chunks);
    g_ptr_pool.put(c->ptr_chunks);
    c->rows = c->ptrs = 0;
  }
  t_state.ptrs.clear();
  g_push = nullptr;
  g_pop = nullptr;
  t_state.stack.clear();
#ifdef PP_CUDA
  for (int i = 0; i < M_NCOLS; ++i) {
    g_mem[i].clear();
    g_mem_taken[i].clear();
  }
  g_mem_on.store(false);
#endif
  fork_parent();
}

__attribute__((constructor)) void install_fork_handlers() { pthread_atfork(fork_prepare, fork_parent, fork_child); }

}  // namespace

extern "C" {

// Start observing.  push/pop: cuptiActivityPush/PopExternalCorrelationId (or null).
int pp_obs_start(void* push, void* pop, int ext_kind, int shapes, int sites) {
  g_push = reinterpret_cast<push_fn_t>(push);
  g_pop = reinterpret_cast<pop_fn_t>(pop);
  g_ext_kind = ext_kind;
  g_shapes = shapes != 0;
  g_sites = sites != 0;
  if (g_handle == 0) {
    g_handle = at::addGlobalCallback(at::RecordFunctionCallback(&on_enter, &on_exit)
                                         .needsInputs(g_shapes)
                                         .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION}));
  }
  g_on.store(true);
  return 0;
}

void pp_obs_stop() {
  g_on.store(false);
  if (g_handle != 0) {
    at::removeCallback(g_handle);
    g_handle = 0;
  }
}

void pp_obs_set_module(int32_t path_id) { t_state.module = path_id; }

int64_t pp_obs_dropped() { return g_dropped.load() + g_errors.load(); }

// Move the rows recorded so far aside; returns how many.  Then pp_obs_copy_all and
// pp_obs_release.
int64_t pp_obs_take() {
  std::lock_guard<SpinLock> g(g_mu);
  g_op_pool.put(g_taken.chunks);  // normally released already; else never taken twice
  g_ptr_pool.put(g_taken.ptr_chunks);
  g_taken.rows = g_taken.ptrs = 0;
  std::swap(g_ops, g_taken);  // g_ops starts empty
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

// ---- allocator events (only with PP_CUDA) ----
static std::string g_mem_error;
const char* pp_mem_error() { return g_mem_error.c_str(); }

int pp_mem_start() {
#ifdef PP_CUDA
  if (!g_mem_attached) {
    g_san_tensor = reinterpret_cast<void (*)(uint64_t, uint64_t, int)>(dlsym(RTLD_DEFAULT, "pp_san_tensor"));
    try {  // called through ctypes: an exception escaping here would terminate the program
      c10::cuda::CUDACachingAllocator::attachAllocatorTraceTracker(&on_alloc_event);
    } catch (const std::exception& e) {  // e.g. a CUDAPluggableAllocator (no trace trackers)
      g_mem_error = e.what();
      auto nl = g_mem_error.find('\n');
      if (nl != std::string::npos) g_mem_error.resize(nl);
      return 1;
    }
    g_mem_attached = true;  // trackers cannot be detached; g_mem_on gates them
  }
  g_mem_on.store(true);
  return 0;
#else
  return -1;
#endif
}

void pp_mem_stop() {
#ifdef PP_CUDA
  g_mem_on.store(false);
#endif
}

int64_t pp_mem_take() {
#ifdef PP_CUDA
  std::lock_guard<std::mutex> g(g_mem_mu);
  for (int i = 0; i < M_NCOLS; ++i) {
    std::swap(g_mem[i], g_mem_taken[i]);
    g_mem[i].clear();
  }
  return int64_t(g_mem_taken[M_T].size());
#else
  return 0;
#endif
}

int pp_mem_copy(int col, int64_t* dst) {
#ifdef PP_CUDA
  if (col < 0 || col >= M_NCOLS) return -1;
  auto& v = g_mem_taken[col];
  if (!v.empty()) std::memcpy(dst, v.data(), v.size() * sizeof(int64_t));
  return 0;
#else
  return -1;
#endif
}

}  // extern "C"
