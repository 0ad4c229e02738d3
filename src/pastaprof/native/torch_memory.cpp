// pastaprof's CUDA caching-allocator events (part of the pastaprof_torch library, with
// torch_observer.cpp): a trace tracker attached to PyTorch's CUDA caching allocator puts
// every block alloc/free and segment alloc/free into int64 columns -- no Python, no GIL --
// and feeds the sanitizer tool's live-tensor table when that tool is loaded.  Without
// -DPP_CUDA (a CPU build of torch) the functions say there is nothing to record.
//
// Python drains the columns through the extern "C" functions below (ctypes).
#ifdef PP_CUDA
#include <dlfcn.h>
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include <pthread.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "torch_observer.h"

namespace {

#ifdef PP_CUDA
constexpr size_t kMaxRows = size_t(1) << 22;  // events kept between drains; more are counted as dropped
std::atomic<int64_t> g_mem_dropped{0};

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
  int64_t t = ppobs::now_ns();
  std::lock_guard<std::mutex> g(g_mem_mu);
  if (g_mem[M_T].size() >= kMaxRows) {
    g_mem_dropped.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  g_mem[M_T].push_back(t);
  g_mem[M_DEV].push_back(int64_t(e.device_));
  g_mem[M_STREAM].push_back(int64_t(reinterpret_cast<uintptr_t>(e.stream_)));
  g_mem[M_ADDR].push_back(int64_t(e.addr_));
  g_mem[M_BYTES].push_back(int64_t(e.size_));
  g_mem[M_ACTION].push_back(sign);
}

// fork(): a child (DataLoader worker) must not repeat the parent's pending events; the
// lock is held across fork so the child never inherits it mid-update.
void fork_prepare() { g_mem_mu.lock(); }
void fork_parent() { g_mem_mu.unlock(); }
void fork_child() {
  for (int i = 0; i < M_NCOLS; ++i) {
    g_mem[i].clear();
    g_mem_taken[i].clear();
  }
  g_mem_on.store(false);
  g_mem_mu.unlock();
}
__attribute__((constructor)) void install_fork_handlers() { pthread_atfork(fork_prepare, fork_parent, fork_child); }
#endif

}  // namespace

extern "C" {

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

int64_t pp_mem_dropped() {
#ifdef PP_CUDA
  return g_mem_dropped.load();
#else
  return 0;
#endif
}

}  // extern "C"
