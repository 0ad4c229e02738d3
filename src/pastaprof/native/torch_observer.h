// Shared by the pastaprof_torch library's parts: torch_observer.cpp (the op rows, the
// interned strings), torch_inputs.cpp (what an op was called with), torch_frames.cpp (from where),
// torch_memory.cpp (allocator events) and torch_sampling.cpp (which ops' inputs are boxed).
#pragma once

#include <ATen/record_function.h>
#include <time.h>

#include <cstdint>
#include <string>
#include <vector>

namespace ppobs {

// Event times of every part: CLOCK_REALTIME, the clock of time.time_ns() and of CUPTI.
inline int64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return int64_t(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

// torch_observer.cpp: the id of `s` in the library's string table (thread-safe).
int32_t intern(const std::string& s);

// torch_frames.cpp (top-level ops only; takes the GIL).  The call site's string id, or -1 (when
// `sites`), and, while module paths come from frames, the module path's id into *module
// (left as it is otherwise: the global module hooks' path).
void where_from(bool sites, int32_t* site, int32_t* module);
bool modules_from_frames();
// torch_inputs.cpp.
// The ids of the op's input shapes and dtypes strings (cached per signature and thread).
void inputs_of(const at::RecordFunction& fn, int32_t* shapes, int32_t* dtypes);
// Appends the data pointer of each input (0 for non-tensors) to `out`.
void pointers_of(const at::RecordFunction& fn, std::vector<int64_t>& out);

// torch_sampling.cpp: which ops' inputs are boxed (--shapes all|sample|none).
enum ShapesMode { kShapesNone = 0, kShapesAll = 1, kShapesSample = 2 };
// Register / remove the callback that makes RecordFunction box inputs: added before the
// observer's own callback (callbacks run in registration order), removed with it.
void sampler_add();
void sampler_remove();
// Held across fork() with the observer's other locks.
void sampler_lock();
void sampler_unlock();
// For each FUNCTION op the observer enters: whether its inputs were boxed (counts, toggles).
bool sampler_enter(const at::RecordFunction& fn);
// The op's (name, call site), boxed or not: an unsampled signature may open a window.
void sampler_signature(int32_t name, int32_t site, bool boxed);

}  // namespace ppobs

// torch_sampling.cpp, also called from Python before pp_obs_start: the mode (ShapesMode) and the
// sample mode's numbers of ops (first, period, window, chase; 0 keeps a default).
extern "C" int pp_obs_sampling(int mode, int64_t first, int64_t period, int64_t window, int64_t chase);
