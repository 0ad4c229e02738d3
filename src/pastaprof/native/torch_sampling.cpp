// Which ops' inputs RecordFunction boxes (part of the pastaprof_torch library, with
// torch_observer.cpp and torch_inputs.cpp).
//
// Boxing an op's arguments into IValues for a callback is the largest per-op cost of observing
// ops, and RecordFunction boxes them for every call when any active callback asks for inputs.
// A callback's samplingProb does not help: the active set's needs_inputs is the OR over all
// registered callbacks, sampled ones included, whether or not they run for this call
// (record_function.cpp, CacheEntry::rebuildActiveCallbacks).  So the observer's own callback asks
// for no inputs, and a second, empty callback that does ask for them (FUNCTION scope only:
// autograd nodes' inputs were never read) is registered before it and enabled only while inputs
// are wanted.  It marks the RecordFunction it ran for; the observer, which runs right after it
// (callbacks run in registration order), reads the inputs of marked ops only.
//
// Modes: all (the inputs callback always on), sample (below), none (no inputs callback).
// Sample: every op's inputs for the first `first` ops of the process, then windows of `window`
// consecutive ops about every `period` ops (jittered, so a window does not land on the same op of
// a periodic step each time), and a window of `chase` ops when an op (name, call site) without
// sampled shapes on its thread appears, at most one such window per 8 x `chase` ops.  Enabling or
// disabling a global callback bumps RecordFunction's version and every thread rebuilds its
// callback cache at its next op (microseconds), so toggles are kept to a few per `period` ops.
#include <ATen/record_function.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <unordered_set>

#include "torch_observer.h"

namespace ppobs {
namespace {

std::atomic<int> g_mode{kShapesAll};
int64_t g_first = 20000, g_period = 2048, g_window = 32, g_chase = 2048;
at::CallbackHandle g_in_handle = 0;  // under g_toggle_mu
std::atomic<bool> g_in_on{true};     // the inputs callback is enabled (or would be, while removed)
std::atomic<int64_t> g_count{0};     // FUNCTION ops entered while observing
std::atomic<int64_t> g_boxed{0};     // ... of them with their inputs
std::atomic<int64_t> g_next{0};      // op count of the next toggle (sample mode)
std::atomic<int64_t> g_windows{0}, g_chases{0}, g_toggles{0};
int64_t g_chase_allowed_at = 0;      // under g_toggle_mu
uint64_t g_rng = 0x9E3779B97F4A7C15ull;  // under g_toggle_mu
std::mutex g_toggle_mu;

thread_local const at::RecordFunction* t_marked = nullptr;
thread_local std::unordered_set<int64_t> t_sampled, t_chased;  // (name, site) keys

std::unique_ptr<at::ObserverContext> mark_boxed(const at::RecordFunction& fn) {
  t_marked = &fn;
  return nullptr;
}

int64_t jittered(int64_t period) {  // uniform in [period/2, 3 period/2), under g_toggle_mu
  g_rng ^= g_rng << 13;
  g_rng ^= g_rng >> 7;
  g_rng ^= g_rng << 17;
  return period / 2 + int64_t(g_rng % uint64_t(period > 0 ? period : 1));
}

void set_inputs(bool on) {  // under g_toggle_mu
  if (g_in_on.load(std::memory_order_relaxed) == on) return;
  g_in_on.store(on, std::memory_order_relaxed);
  g_toggles.fetch_add(1, std::memory_order_relaxed);
  if (g_in_handle != 0) {
    if (on) {
      at::reenableCallback(g_in_handle);
    } else {
      at::disableCallback(g_in_handle);
    }
  }
}

// At op count c: end the current phase (sample mode), or open a chase window.  Never blocks the
// program's thread: if another thread is toggling, this op leaves it to that one.
void toggle(int64_t c, bool chase) {
  std::unique_lock<std::mutex> g(g_toggle_mu, std::try_to_lock);
  if (!g.owns_lock() || g_mode.load(std::memory_order_relaxed) != kShapesSample) return;
  if (chase) {
    if (g_in_on.load(std::memory_order_relaxed) || c < g_chase_allowed_at) return;
    set_inputs(true);
    g_next.store(c + g_chase, std::memory_order_relaxed);
    g_chase_allowed_at = c + 8 * g_chase;
    g_chases.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  if (c < g_next.load(std::memory_order_relaxed)) return;  // another thread toggled first
  if (g_in_on.load(std::memory_order_relaxed)) {
    set_inputs(false);
    g_next.store(c + jittered(g_period), std::memory_order_relaxed);
  } else {
    set_inputs(true);
    g_next.store(c + g_window, std::memory_order_relaxed);
    g_windows.fetch_add(1, std::memory_order_relaxed);
  }
}

}  // namespace

void sampler_add() {
  if (g_mode.load() == kShapesNone) return;
  std::lock_guard<std::mutex> g(g_toggle_mu);
  if (g_in_handle != 0) return;
  g_in_handle = at::addGlobalCallback(
      at::RecordFunctionCallback(&mark_boxed).needsInputs(true).scopes({at::RecordScope::FUNCTION}));
  if (!g_in_on.load()) at::disableCallback(g_in_handle);
}

void sampler_remove() {
  std::lock_guard<std::mutex> g(g_toggle_mu);
  if (g_in_handle != 0) {
    at::removeCallback(g_in_handle);
    g_in_handle = 0;
  }
}

void sampler_lock() { g_toggle_mu.lock(); }
void sampler_unlock() { g_toggle_mu.unlock(); }

bool sampler_enter(const at::RecordFunction& fn) {
  bool boxed = t_marked == &fn;
  t_marked = nullptr;
  int64_t c = g_count.fetch_add(1, std::memory_order_relaxed) + 1;
  if (boxed) g_boxed.fetch_add(1, std::memory_order_relaxed);
  if (g_mode.load(std::memory_order_relaxed) == kShapesSample && c >= g_next.load(std::memory_order_relaxed))
    toggle(c, false);
  return boxed;
}

void sampler_signature(int32_t name, int32_t site, bool boxed) {
  if (g_mode.load(std::memory_order_relaxed) != kShapesSample) return;
  int64_t key = (int64_t(name) << 32) | int64_t(uint32_t(site));
  if (boxed) {
    t_sampled.insert(key);
    return;
  }
  if (t_sampled.count(key) || !t_chased.insert(key).second) return;
  toggle(g_count.load(std::memory_order_relaxed), true);
}

}  // namespace ppobs

extern "C" {

// Before pp_obs_start: mode (kShapes*) and the sample mode's numbers (ops; 0 keeps the default).
int pp_obs_sampling(int mode, int64_t first, int64_t period, int64_t window, int64_t chase) {
  using namespace ppobs;
  if (mode < kShapesNone || mode > kShapesSample) return -1;
  std::lock_guard<std::mutex> g(g_toggle_mu);
  g_mode.store(mode);
  if (first > 0) g_first = first;
  if (period > 0) g_period = period;
  if (window > 0) g_window = window;
  if (chase > 0) g_chase = chase;
  g_in_on.store(mode != kShapesNone);
  g_next.store(g_first + g_count.load());
  return 0;
}

// ops entered, ops with inputs, sampling windows, chase windows, callback toggles.
void pp_obs_sampling_stats(int64_t* out) {
  using namespace ppobs;
  out[0] = g_count.load();
  out[1] = g_boxed.load();
  out[2] = g_windows.load();
  out[3] = g_chases.load();
  out[4] = g_toggles.load();
}

}  // extern "C"
