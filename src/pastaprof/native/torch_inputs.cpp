// What an op was called with (part of the pastaprof_torch library, with torch_observer.cpp):
// its input shapes and dtypes as Kineto writes them, interned once per distinct signature and
// thread, and its input tensors' data pointers.
#include <ATen/core/ivalue.h>
#include <ATen/record_function.h>
#include <c10/util/ArrayRef.h>

#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "torch_observer.h"

namespace ppobs {
namespace {

// ---- shapes and dtypes, as Kineto writes them ------------------------------------
// Sizes are read only from plain tensors: a tensor subclass (FakeTensor, functional tensors
// under torch.compile), a symbolic-shape or a nested tensor would dispatch back into Python
// or throw, which inside a RecordFunction callback prints a warning per op.
inline bool plain(const at::Tensor& t) {
  const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  return !impl->is_python_dispatch() && !impl->has_symbolic_sizes_strides() && !impl->is_nested();
}

// A TensorList input's tensors, read in place: toTensorList().vec() copied the list, two
// refcount changes per tensor (an optimizer's foreach op over 600 parameters: ~2,400 per op).
inline const at::Tensor& tensor_at(const c10::IValue& e) {
  static const at::Tensor undefined;
  return e.isTensor() ? e.toTensor() : undefined;
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
      for (const c10::IValue& e : v.toListRef()) {
        const at::Tensor& t = tensor_at(e);
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
      for (const c10::IValue& e : v.toListRef()) {
        const at::Tensor& t = tensor_at(e);
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

void input_pointers(const at::RecordFunction& fn, std::vector<int64_t>& out) {
  for (const c10::IValue& v : fn.inputs()) {
    if (v.isTensor()) {
      out.push_back(ptr_of(v.toTensor()));
    } else if (v.isTensorList()) {
      for (const c10::IValue& e : v.toListRef()) out.push_back(ptr_of(tensor_at(e)));
    } else {
      out.push_back(0);
    }
  }
}

thread_local std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> t_inputs;  // signature -> (shapes, dtypes)

}  // namespace

void pointers_of(const at::RecordFunction& fn, std::vector<int64_t>& out) { input_pointers(fn, out); }

void inputs_of(const at::RecordFunction& fn, int32_t* shapes, int32_t* dtypes) {
  uint64_t key = signature(fn);
  auto& m = t_inputs;
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

}  // namespace ppobs
