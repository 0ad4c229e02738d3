// Where an op was called from (part of the pastaprof_torch library, with torch_observer.cpp):
// the user's call site -- the innermost Python frame outside torch and pastaprof -- and, on
// CPython 3.11-3.13, the path of the nn.Module calls around it, both read in one walk of the
// interpreter's frames.  Module paths read here replace torch's global module hooks, which send
// every module call down torch's slow path (~2 us a call; bench/module_hooks.py).
#include <Python.h>
#include <frameobject.h>
// CPython 3.11-3.13 with the GIL: the interpreter's own frame records (see where_from_frames)
#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030E0000 && !defined(Py_GIL_DISABLED) && !defined(PP_SLOW_FRAMES)
#define PP_FAST_FRAMES 1
#define Py_BUILD_CORE
#include <internal/pycore_frame.h>
#undef Py_BUILD_CORE
#else
#define PP_FAST_FRAMES 0
#endif

#include <cstdint>
#include <iterator>
#include <string>
#include <unordered_map>
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

// Module calls are frames of torch's Module._call_impl, whose first local is the module (a
// cell there: a nested function uses it).  Its path is found outermost first, one map probe
// per level; a (parent path, module) pair not seen before is named by Python
// (handlers/module_paths.py), which also says when a module died (its address may then be
// another module's).
PyObject* g_call_code = nullptr;  // Module._call_impl.__code__ while module paths come from frames
PyObject* g_namer = nullptr;      // (parent path id, module) -> path id
struct PathKey {
  int32_t parent;
  const void* module;
  bool operator==(const PathKey& o) const { return parent == o.parent && module == o.module; }
};
struct PathHash {
  size_t operator()(const PathKey& k) const {
    return std::hash<const void*>()(k.module) ^ (size_t(uint32_t(k.parent)) * 0x9E3779B97F4A7C15ull);
  }
};
std::unordered_map<PathKey, int32_t, PathHash> g_paths;  // guarded by the GIL

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

int32_t path_of(int32_t parent, PyObject* module) {
  auto it = g_paths.find(PathKey{parent, module});
  if (it != g_paths.end()) return it->second;
  PyObject* r = PyObject_CallFunction(g_namer, "iO", int(parent), module);
  long id = r ? PyLong_AsLong(r) : -1;
  Py_XDECREF(r);
  if (PyErr_Occurred()) {  // never the program's: this level goes unnamed
    PyErr_Clear();
    return parent;
  }
  g_paths.emplace(PathKey{parent, module}, int32_t(id));
  return int32_t(id);
}

PyObject* module_of(_PyInterpreterFrame* f) {
  PyObject* self = f->localsplus[0];
  if (self != nullptr && PyCell_Check(self)) self = PyCell_GET(self);
  return self;
}

// One walk from the innermost frame: the call site (the first frame outside the library) and,
// while module paths come from frames, the path of the module calls around it.
void where_from_frames(PyThreadState* ts, bool sites, int32_t* site, int32_t* module) {
  const PyObject* call_code = g_call_code;
  // The module calls met, innermost first: on this stack (a naming call into Python may reach
  // an op, and so this function, again), on the heap past 64 levels.
  constexpr size_t kLevels = 64;
  PyObject* shallow[kLevels];
  size_t n = 0;
  std::vector<PyObject*> deep;
  for (_PyInterpreterFrame* f = innermost_frame(ts); f != nullptr; f = f->previous) {
    if (skipped(f)) continue;
    PyCodeObject* code = frame_code(f);
    if (code == nullptr) continue;
    if (reinterpret_cast<PyObject*>(code) == call_code) {
      if (PyObject* m = module_of(f)) {
        if (n < kLevels) {
          shallow[n++] = m;
        } else {
          if (deep.empty()) deep.assign(shallow, shallow + kLevels);
          deep.push_back(m);
        }
      }
      continue;
    }
    if (sites && *site < 0 && !is_library(code)) {
      *site = site_id(code, int64_t(_PyInterpreterFrame_LASTI(f)) * int64_t(sizeof(_Py_CODEUNIT)));
      if (call_code == nullptr) return;
    }
  }
  if (call_code == nullptr) return;
  PyObject* const* chain = deep.empty() ? shallow : deep.data();
  size_t levels = deep.empty() ? n : deep.size();
  int32_t path = -1;
  for (size_t i = levels; i-- > 0;) path = path_of(path, chain[i]);
  *module = path;
}
#else
void where_from_frames(PyThreadState*, bool, int32_t* site, int32_t*) {
  int32_t& out = *site;
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
}
#endif

// Takes the GIL (the program's thread holds it already, as its Python code called the op);
// a thread that never ran Python has neither a site nor a module call.
void where_from_python(bool sites, int32_t* site, int32_t* module) {
  if (!Py_IsInitialized()) return;
  PyThreadState* mine = PyGILState_GetThisThreadState();
  if (mine == nullptr) return;
#if PP_FAST_FRAMES
  // A thread that runs no Python code now -- the autograd engine's device threads, which keep
  // a thread state for their Python hooks, run every backward op so -- has no site and no
  // module call: said without taking the GIL, which such a thread would otherwise wait for
  // once per top-level op while the program's thread (or a flush) runs Python.  Read without
  // the GIL: only this thread changes its own frames, and it is inside an op.
  if (innermost_frame(mine) == nullptr) return;
#endif
#if PY_VERSION_HEX >= 0x030D0000
  if (Py_IsFinalizing()) return;
#else
  if (_Py_IsFinalizing()) return;
#endif
  PyGILState_STATE g = PyGILState_Ensure();
  where_from_frames(PyThreadState_Get(), sites, site, module);
  PyGILState_Release(g);
}

}  // namespace

bool modules_from_frames() { return PP_FAST_FRAMES && g_call_code != nullptr; }

void where_from(bool sites, int32_t* site, int32_t* module) {
  *site = -1;
  if (sites || modules_from_frames()) where_from_python(sites, site, module);
}

}  // namespace ppobs

extern "C" {

// Module paths from the frames of `call_code` (torch's Module._call_impl.__code__), new ones
// named by `namer(parent path id, module) -> path id`: 0; -1 where frames cannot be read
// (a Python outside 3.11-3.13: the global module hooks stay).  call_code NULL turns it off.
int pp_obs_module_frames(PyObject* call_code, PyObject* namer) {
  using namespace ppobs;
  if (!PP_FAST_FRAMES || !Py_IsInitialized()) return -1;
  PyGILState_STATE g = PyGILState_Ensure();
  if (call_code == Py_None) call_code = nullptr;  // ctypes passes None, not NULL
  if (namer == Py_None) namer = nullptr;
  if (call_code == nullptr || namer == nullptr) call_code = namer = nullptr;  // both, or off
  PyObject *old_code = g_call_code, *old_namer = g_namer;
  Py_XINCREF(call_code);
  Py_XINCREF(namer);
  g_call_code = call_code;
  g_namer = namer;
  g_paths.clear();  // ids the previous namer gave: a new one names from its own table
  Py_XDECREF(old_code);
  Py_XDECREF(old_namer);
  PyGILState_Release(g);
  return 0;
}

// A module died: forget the paths keyed by its address (another module may get it).
void pp_obs_forget_module(const void* module) {
  using namespace ppobs;
  if (!Py_IsInitialized()) return;
  PyGILState_STATE g = PyGILState_Ensure();
  for (auto it = g_paths.begin(); it != g_paths.end();) it = it->first.module == module ? g_paths.erase(it) : std::next(it);
  PyGILState_Release(g);
}

}  // extern "C"
