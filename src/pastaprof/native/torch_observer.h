// Shared by the pastaprof_torch library's parts: torch_observer.cpp (the op rows, the
// interned strings), torch_inputs.cpp (what an op was called with and from where) and
// torch_memory.cpp (allocator events).
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

// torch_inputs.cpp.  The call site's string id, or -1 (takes the GIL; top-level ops only).
int32_t call_site();
// The ids of the op's input shapes and dtypes strings (cached per signature and thread).
void inputs_of(const at::RecordFunction& fn, int32_t* shapes, int32_t* dtypes);
// Appends the data pointer of each input (0 for non-tensors) to `out`.
void pointers_of(const at::RecordFunction& fn, std::vector<int64_t>& out);

}  // namespace ppobs
