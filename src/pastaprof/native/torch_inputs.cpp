// What an op was called with and from where (part of the pastaprof_torch library, with
// torch_observer.cpp): its input shapes and dtypes as Kineto writes them, interned once per
// distinct signature and thread; its input tensors' data pointers; and the user's call site,
// the innermost Python frame outside torch and pastaprof.
#include <Python.h>
#include <frameobject.h>
// CPython 3.11-3.13: the interpreter's own frame records (see site_of_frames)
#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030E0000 && !defined(PP_SLOW_FRAMES)
#define PP_FAST_FRAMES 1
#define Py_BUILD_CORE
#include <internal/pycore_frame.h>
#undef Py_BUILD_CORE
#else
#define PP_FAST_FRAMES 0
#endif
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

// A direct-mapped cache in front of g_lib_code: a walk passes ~3 library frames per module
// level, and a hash-map probe per frame was most of what the walk still cost.  Entries are
// never stale: a code object in g_lib_code is kept alive, so its address is not reused.
struct LibSlot {
  const void* code;
  bool lib;
};
constexpr size_t kLibSlots = 1024;
LibSlot g_lib_slots[kLibSlots];  // guarded by the GIL

bool is_library_slow(PyCodeObject* code);

inline bool is_library(PyCodeObject* code) {
  LibSlot& s = g_lib_slots[(reinterpret_cast<uintptr_t>(code) >> 4) & (kLibSlots - 1)];
  if (s.code == code) return s.lib;
  bool lib = is_library_slow(code);
  s = LibSlot{code, lib};
  return lib;
}

bool is_library_slow(PyCodeObject* code) {
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

// The site's id for a frame outside the library: (code, instruction offset) -> interned
// "file(line): function".  Keyed by the offset, not the line: the line number is a scan of the
// code's line table (~3% of a small op's time on the program's thread), needed only on a miss.
// is_library() holds a reference to the code object, so its address is not reused.
int32_t site_id(PyCodeObject* code, int64_t offset_bytes) {
  SiteKey key{code, offset_bytes};
  auto it = g_site_ids.find(key);
  if (it != g_site_ids.end()) return it->second;
  int line = PyCode_Addr2Line(code, int(offset_bytes));
  const char* fn = PyUnicode_AsUTF8(code->co_filename);
  const char* name = PyUnicode_AsUTF8(code->co_name);
  if (!fn || !name) {
    PyErr_Clear();
    return -1;
  }
  int32_t out = intern(std::string(fn) + "(" + std::to_string(line) + "): " + name);
  g_site_ids.emplace(key, out);
  return out;
}

#if PP_FAST_FRAMES
// The innermost frames are walked as the interpreter keeps them, the way py-spy and
// torch.profiler's Python tracer read them: PyEval_GetFrame()/PyFrame_GetBack() would make a
// frame object for every frame passed (an allocation, and a copy when the frame returns),
// ~4 of them per op called from inside torch.nn modules, about a third of an op's recording
// cost on the program's thread (dev VM, a 100-module conv net).
inline _PyInterpreterFrame* innermost_frame(PyThreadState* ts) {
#if PY_VERSION_HEX >= 0x030D0000
  return ts->current_frame;
#else
  return ts->cframe ? ts->cframe->current_frame : nullptr;
#endif
}

inline PyCodeObject* frame_code(_PyInterpreterFrame* f) {
#if PY_VERSION_HEX >= 0x030D0000
  PyObject* e = f->f_executable;
  return e && PyCode_Check(e) ? (PyCodeObject*)e : nullptr;
#else
  return f->f_code;
#endif
}

inline bool skipped(_PyInterpreterFrame* f) {  // a C shim or a frame not yet started
#if PY_VERSION_HEX >= 0x030C0000
  if (f->owner == FRAME_OWNED_BY_CSTACK) return true;
#endif
  return _PyFrame_IsIncomplete(f);
}

int32_t site_of_frames(PyThreadState* ts) {
  for (_PyInterpreterFrame* f = innermost_frame(ts); f != nullptr; f = f->previous) {
    if (skipped(f)) continue;
    PyCodeObject* code = frame_code(f);
    if (code == nullptr || is_library(code)) continue;
    return site_id(code, int64_t(_PyInterpreterFrame_LASTI(f)) * int64_t(sizeof(_Py_CODEUNIT)));
  }
  return -1;
}
#else
int32_t site_of_frames(PyThreadState*) {
  int32_t out = -1;
  PyFrameObject* f = PyEval_GetFrame();  // borrowed
  Py_XINCREF(f);
  while (f != nullptr) {
    PyCodeObject* code = PyFrame_GetCode(f);  // new reference
    if (!is_library(code)) {
#if PY_VERSION_HEX >= 0x030B0000
      out = site_id(code, int64_t(PyFrame_GetLasti(f)));
#else
#if PY_VERSION_HEX >= 0x030A0000
      out = site_id(code, int64_t(f->f_lasti) * 2);  // 3.10: in code units
#else
      out = site_id(code, int64_t(f->f_lasti));
#endif
#endif
      Py_DECREF(code);
      break;
    }
    Py_DECREF(code);
    PyFrameObject* back = PyFrame_GetBack(f);  // new reference
    Py_DECREF(f);
    f = back;
  }
  Py_XDECREF(f);
  return out;
}
#endif

int32_t site_of_python_caller() {
  if (!Py_IsInitialized() || PyGILState_GetThisThreadState() == nullptr) return -1;
#if PY_VERSION_HEX >= 0x030D0000
  if (Py_IsFinalizing()) return -1;
#else
  if (_Py_IsFinalizing()) return -1;
#endif
  PyGILState_STATE g = PyGILState_Ensure();
  int32_t out = site_of_frames(PyThreadState_Get());
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

int32_t call_site() { return site_of_python_caller(); }

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
