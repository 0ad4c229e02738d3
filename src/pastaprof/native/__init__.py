"""Native capture helpers, compiled on first use and cached.

Small shared libraries, loaded with ctypes (no Python extension ABI, so no
pybind11 and a short build):

* ``cupti_drain.c``: CUPTI's activity buffers are decoded in C into columns,
  instead of cupti-python building a Python object per record (capture.md section 1:
  ~1-2 us per record on a thread that competes for the GIL).  Needs only the
  CUPTI headers; it calls the libcupti already in the process (never a second one).
* ``inject.c``: the injection library for native CUDA programs (``CUDA_INJECTION64_PATH``),
  which writes CUPTI's records to raw files that handlers/native_program.py reads.
* ``torch_observer.cpp`` (op rows), ``torch_sampling.cpp`` (which ops' inputs are boxed),
  ``torch_inputs.cpp`` (shapes, dtypes, input pointers), ``torch_frames.cpp`` (call sites and
  module paths) and ``torch_memory.cpp`` (with CUDA, a caching-allocator trace tracker): one
  library, a global RecordFunction observer for PyTorch ops.  Built against the installed torch.

Builds go to ``$PASTAPROF_CACHE`` (default ``~/.cache/pastaprof``), one directory per
(source, compiler inputs) hash, written to a temporary name and renamed, under a
file lock so concurrent ranks build once.  The profiled program builds them the first
time it needs them (a one-line notice); ``pastaprof build-native`` builds them ahead
of time and says what could not be built.  A failed build is
remembered (``build.log`` next to it) and capture falls back to the pure-Python
handlers, saying so in the run's status.
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

from pastaprof.native._declare import declare_cupti as _declare_cupti
from pastaprof.native._declare import declare_sanitizer as _declare_sanitizer
from pastaprof.native._declare import declare_torch as _declare_torch

HERE = Path(__file__).resolve().parent


def cache_dir() -> Path:
    return Path(os.environ.get("PASTAPROF_CACHE") or Path.home() / ".cache" / "pastaprof") / "native"


def _compiler(cpp: bool) -> str:
    return os.environ.get("CXX" if cpp else "CC") or ("g++" if cpp else "gcc")


def _build(name: str, sources: list[Path], args: list[str], cpp: bool, suffix: str = ".so",
           command: list[str] | None = None) -> Path:
    """Compile ``sources`` into ``<cache>/<hash>/<name><suffix>`` unless it is there; returns
    its path.  ``command`` replaces the default ``cc -O2 -shared -fPIC`` (e.g. nvcc for the
    sanitizer patches).  Raises RuntimeError with the compiler's last lines on failure."""
    h = hashlib.sha256()
    for s in [*sources, *sorted(HERE.glob("*.h"))]:  # a header's change rebuilds too
        h.update(s.read_bytes())
    h.update(" ".join(args).encode())
    h.update(" ".join(command or [_compiler(cpp)]).encode())
    d = cache_dir() / f"{name}-{h.hexdigest()[:16]}"
    lib = d / f"{name}{suffix}"
    if lib.exists():
        return lib
    d.mkdir(parents=True, exist_ok=True)
    with open(d / ".lock", "w", encoding="utf-8") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if lib.exists():
            return lib
        failed = d / "build.log"
        if failed.exists():
            raise RuntimeError(f"an earlier build failed (see {failed})")
        tmp = d / f".{name}.{os.getpid()}{suffix}"
        sys.stderr.write(f"pastaprof: building native capture library {name} (once; cached in {d})\n")
        cmd = [*(command or [_compiler(cpp), "-O2", "-shared", "-fPIC"]), "-o", str(tmp), *map(str, sources), *args]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            failed.write_text(" ".join(cmd) + "\n" + r.stdout + r.stderr, encoding="utf-8")
            lines = r.stderr.strip().splitlines() or ["?"]
            first = next((ln for ln in lines if "error" in ln), lines[-1])
            raise RuntimeError(f"build of {name} failed: {first.strip()[:200]} (log: {failed})")
        os.replace(tmp, lib)
    return lib


# ---- CUPTI ------------------------------------------------------------------------

def cupti_include_dirs() -> list[str]:
    """Where cupti_activity.h is: first the nvidia-cuda-cupti wheel next to the loaded
    libcupti (its headers match the library), then the CUDA toolkit."""
    cands = []
    for sp in {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], *sys.path}:
        for sub in ("nvidia/cu13/include", "nvidia/cuda_cupti/include", "nvidia/cu12/include"):
            cands.append(Path(sp) / sub)
    for env in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(env):
            cands += [Path(os.environ[env]) / "include", Path(os.environ[env]) / "extras" / "CUPTI" / "include"]
    cands += [Path("/usr/local/cuda/include"), Path("/usr/local/cuda/extras/CUPTI/include")]
    cupti = [str(c) for c in cands if (c / "cupti_activity.h").exists()]
    # cupti_activity.h includes cuda.h and, through it, crt/host_defines.h, which the wheels
    # do not all ship: the toolkit's include directory comes after the CUPTI one.
    cuda = [str(c) for c in cands if (c / "crt" / "host_defines.h").exists()]
    out: list[str] = []
    for c in cupti[:1] + cuda[:1]:
        if c not in out:
            out.append(c)
    return out if cupti else []


def build_cupti() -> Path:
    inc = cupti_include_dirs()
    if not inc:
        raise RuntimeError("CUPTI headers not found (CUDA toolkit or the nvidia-cuda-cupti wheel)")
    # the shared header's hash in the flags: the build cache is keyed by sources and flags
    return _build("pastaprof_cupti", [HERE / "cupti_drain.c", HERE / "cupti_callbacks.c"],
                  [f"-I{i}" for i in inc] + ["-ldl", "-lpthread", "-lstdc++",  # -lstdc++: __cxa_demangle
                                             f"-DPP_CUPTI_HASH={_hash(HERE / 'cupti_drain.h')}",
                                             f"-DPP_UVM_HASH={_hash(HERE / 'uvm_counters.h')}", f"-I{HERE}"],
                  cpp=False)


def external_correlation_fns(path: str) -> tuple[int, int]:
    """Addresses of cuptiActivityPush/PopExternalCorrelationId in the loaded libcupti
    ``path`` (for the C++ op observer when the C drain is not available)."""
    lib = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_NOW)
    return (ctypes.cast(lib.cuptiActivityPushExternalCorrelationId, ctypes.c_void_p).value,
            ctypes.cast(lib.cuptiActivityPopExternalCorrelationId, ctypes.c_void_p).value)


def loaded_libcupti() -> str | None:
    """Path of the libcupti already mapped in this process (torch's or cupti-python's)."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            for line in f:
                p = line.split()[-1] if line.strip() else ""
                if "/libcupti.so" in p:
                    return p
    except OSError:
        pass
    return None


# ---- PyTorch -------------------------------------------------------------------------

def _cuda_home() -> str | None:
    """The CUDA toolkit's directory, found as torch.utils.cpp_extension finds it."""
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home is None:
        nvcc = shutil.which("nvcc")
        home = os.path.dirname(os.path.dirname(nvcc)) if nvcc else "/usr/local/cuda"
        home = home if os.path.exists(home) else None
    return home


def _torch_args() -> tuple[list[str], bool]:
    # not torch.utils.cpp_extension: it imports setuptools, which puts its _vendor directory on
    # the program's sys.path and its own distutils in the program's sys.modules, and logs a warning
    # through torch's logger where no CUDA runtime is found
    import torch

    include = os.path.join(os.path.dirname(torch.__file__), "include")
    args = [f"-I{include}", f"-I{os.path.join(include, 'torch', 'csrc', 'api', 'include')}"]
    args.append(f"-I{sysconfig.get_paths()['include']}")
    libdir = os.path.join(os.path.dirname(torch.__file__), "lib")
    args += ["-std=c++17", "-DNDEBUG", f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
             f"-L{libdir}", f"-Wl,-rpath,{libdir}", "-lc10", "-ltorch_cpu", "-w"]
    cuda = False
    if torch.version.cuda and os.path.exists(os.path.join(libdir, "libc10_cuda.so")):
        home = _cuda_home()
        inc = [Path(home) / "include"] if home else []
        inc += [Path(p) / "nvidia" / "cu13" / "include" for p in sys.path] + \
               [Path(p) / "nvidia" / "cuda_runtime" / "include" for p in sys.path]
        found = next((str(i) for i in inc if (i / "cuda_runtime_api.h").exists()), None)
        if found:
            args += [f"-I{found}", "-DPP_CUDA", "-lc10_cuda"]
            cuda = True
    args.append(f"-DPP_TORCH_VERSION=\"{torch.__version__}\"")
    return args, cuda


def build_torch() -> tuple[Path, bool]:
    args, cuda = _torch_args()
    sources = [HERE / "torch_observer.cpp", HERE / "torch_inputs.cpp", HERE / "torch_frames.cpp",
               HERE / "torch_memory.cpp", HERE / "torch_sampling.cpp"]
    # the shared header's hash in the flags: the build cache is keyed by sources and flags
    args = [*args, f"-DPP_OBS_HASH={_hash(HERE / 'torch_observer.h')}"]
    return _build("pastaprof_torch", sources, args, cpp=True), cuda


# ---- Compute Sanitizer ---------------------------------------------------------------

def sanitizer_home() -> Path | None:
    """The Compute Sanitizer API's directory (``include/sanitizer.h`` and
    ``libsanitizer-public.so``): ``$PASTAPROF_SANITIZER_HOME``, the CUDA toolkit's
    ``compute-sanitizer``, or the ``nvidia-cuda-sanitizer-api`` wheel."""
    cands: list[Path] = []
    if os.environ.get("PASTAPROF_SANITIZER_HOME"):  # authoritative when set
        home = Path(os.environ["PASTAPROF_SANITIZER_HOME"])
        ok = (home / "include" / "sanitizer.h").exists() and any(
            (p / "libsanitizer-public.so").exists() for p in (home, home / "lib"))
        return home if ok else None
    for env in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(env):
            cands.append(Path(os.environ[env]) / "compute-sanitizer")
    cands += [Path("/usr/local/cuda/compute-sanitizer"), *sorted(Path("/usr/local").glob("cuda-*/compute-sanitizer"))]
    for sp in sys.path:
        cands += [Path(sp) / "nvidia" / "cu13" / "compute-sanitizer", Path(sp) / "nvidia" / "cuda_sanitizer_api"]
    for c in cands:
        lib = next((p for p in (c / "libsanitizer-public.so", c / "lib" / "libsanitizer-public.so") if p.exists()), None)
        if lib is not None and (c / "include" / "sanitizer.h").exists():
            return c
    return None


def _nvcc() -> str | None:
    for env in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(env) and (Path(os.environ[env]) / "bin" / "nvcc").exists():
            return str(Path(os.environ[env]) / "bin" / "nvcc")
    return shutil.which("nvcc") or (str(Path("/usr/local/cuda/bin/nvcc")) if Path("/usr/local/cuda/bin/nvcc").exists()
                                    else None)


def gpu_archs() -> list[str]:
    """Compute capabilities of this machine's GPUs, from nvidia-smi (it does not create a
    CUDA context in this process, which must stay uninitialized for the sanitizer)."""
    env = os.environ.get("PASTAPROF_SANITIZER_ARCH")
    if env:
        return [a.strip().replace(".", "") for a in env.split(",") if a.strip()]
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"], capture_output=True,
                           text=True, timeout=20)
        archs = sorted({ln.strip().replace(".", "") for ln in r.stdout.splitlines() if ln.strip()})
        return archs or ["90"]
    except (OSError, subprocess.SubprocessError):
        return ["90"]


def build_sanitizer() -> tuple[Path, Path]:
    """The sanitizer host library and its device patches (fatbin, one cubin per GPU arch)."""
    home = sanitizer_home()
    if home is None:
        raise RuntimeError("Compute Sanitizer API not found (CUDA toolkit's compute-sanitizer, "
                           "nvidia-cuda-sanitizer-api, or PASTAPROF_SANITIZER_HOME)")
    nvcc = _nvcc()
    if nvcc is None:
        raise RuntimeError("nvcc not found: the sanitizer's device patches are CUDA code")
    cuda_inc = next((d for d in [*(Path(os.environ[e]) / "include" for e in ("CUDA_HOME", "CUDA_PATH")
                                   if os.environ.get(e)),
                                 Path(nvcc).resolve().parent.parent / "include", Path("/usr/local/cuda/include")]
                     if (d / "cuda.h").exists()), None)
    if cuda_inc is None:
        raise RuntimeError("cuda.h not found (CUDA toolkit)")
    libdir = home if (home / "libsanitizer-public.so").exists() else home / "lib"
    inc = [f"-I{home / 'include'}", f"-I{cuda_inc}", f"-I{HERE}"]
    archs = gpu_archs()
    # a cubin per GPU of this machine, plus PTX of the newest for GPUs the driver JIT-compiles for
    gencode = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in archs]
    gencode.append(f"-gencode=arch=compute_{max(archs, key=int)},code=compute_{max(archs, key=int)}")
    patch = _build("pastaprof_sanitizer_patch", [HERE / "sanitizer_patch.cu"],
                   [*inc, *gencode, f"-DPP_SHARED_HASH={_hash(HERE / 'sanitizer_shared.h')}"], cpp=True,
                   suffix=".fatbin", command=[nvcc, "-fatbin", "--keep-device-functions", "-Xptxas",
                                              "--compile-as-tools-patch"])
    lib = _build("pastaprof_sanitizer", [HERE / "sanitizer_tool.cpp"],
                 [*inc, "-std=c++17", f"-DPP_SHARED_HASH={_hash(HERE / 'sanitizer_shared.h')}", f"-L{libdir}",
                  f"-Wl,-rpath,{libdir}", "-lsanitizer-public", "-lpthread"], cpp=True)
    return lib, patch


# ---- native programs (CUDA_INJECTION64_PATH) -------------------------------------------

def build_inject() -> Path:
    """The injection library for native CUDA programs (inject.c): CUPTI headers only, no
    link-time libcupti (it dlopens the one ``system_libcupti`` finds, at run time)."""
    inc = cupti_include_dirs()
    if not inc:
        raise RuntimeError("CUPTI headers not found (CUDA toolkit or the nvidia-cuda-cupti wheel)")
    return _build("pastaprof_inject", [HERE / f"inject{p}.c" for p in ("", "_records", "_cupti", "_callbacks", "_files",
                                                                        "_util", "_exits", "_exec", "_sanitizer",
                                                                        "_selftest")],
                  [f"-I{i}" for i in inc] + [f"-I{HERE}", "-fvisibility=hidden", "-Werror=implicit-function-declaration", "-ldl", "-lpthread",
                                             f"-DPP_INJECT_HASH={_hash(HERE / 'inject.h')}",
                                             f"-DPP_STATE_HASH={_hash(HERE / 'inject_state.h')}",
                                             f"-DPP_UVM_HASH={_hash(HERE / 'uvm_counters.h')}"], cpp=False)


def system_libcupti() -> str | None:
    """The libcupti a native program's capture uses: ``$PASTAPROF_NATIVE_CUPTI``, else the CUDA
    toolkit's (``$CUDA_HOME``, the nvcc on PATH, /usr/local/cuda*), else the nvidia-cuda-cupti
    wheel's.  Native programs have no torch, so no copy is loaded yet to reuse."""
    if os.environ.get("PASTAPROF_NATIVE_CUPTI"):
        p = Path(os.environ["PASTAPROF_NATIVE_CUPTI"])
        return str(p) if p.is_file() else None
    homes = [Path(os.environ[e]) for e in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(e)]
    nvcc = _nvcc()
    if nvcc:
        homes.append(Path(nvcc).resolve().parent.parent)
    homes += [Path("/usr/local/cuda"), *sorted(Path("/usr/local").glob("cuda-*"), reverse=True)]
    dirs = [d for h in homes for d in (h / "extras" / "CUPTI" / "lib64", h / "lib64", h / "lib",
                                       h / "targets" / "x86_64-linux" / "lib")]
    for sp in sys.path:
        dirs += [Path(sp) / "nvidia" / "cu13" / "lib", Path(sp) / "nvidia" / "cuda_cupti" / "lib"]
    for d in dirs:
        for name in ("libcupti.so.13", "libcupti.so.12", "libcupti.so"):
            if (d / name).is_file():
                return str(d / name)
    return None


def _hash(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()[:12]


def build_all() -> dict[str, str]:
    """Build every native library this machine can build; name -> path or reason."""
    out: dict[str, str] = {}
    try:
        out["cupti"] = str(build_cupti())
    except (OSError, RuntimeError) as e:
        out["cupti"] = f"not built: {e}"
    try:
        import torch  # noqa: F401

        path, cuda = build_torch()
        out["torch"] = f"{path}" + (" (with the CUDA allocator tracker)" if cuda else "")
    except ImportError:
        out["torch"] = "not built: torch is not installed"
    except (OSError, RuntimeError) as e:
        out["torch"] = f"not built: {e}"
    try:
        out["inject"] = str(build_inject()) + (f" (libcupti {system_libcupti()})" if system_libcupti()
                                              else " (no libcupti found for native programs)")
    except (OSError, RuntimeError) as e:
        out["inject"] = f"not built: {e}"
    try:
        lib, patch = build_sanitizer()
        out["sanitizer"] = f"{lib} (patches {patch})"
    except (OSError, RuntimeError) as e:
        out["sanitizer"] = f"not built: {e}"
    return out


def copy_columns(copy: Any, names: tuple[str, ...], n: int) -> dict[str, Any]:
    """``n`` int64 values of each column ``i`` that ``copy(i, pointer)`` writes, as NumPy arrays."""
    import numpy as np

    cols = {}
    for i, name in enumerate(names):
        a = np.empty(n, np.int64)
        copy(i, a.ctypes.data_as(ctypes.c_void_p))
        cols[name] = a
    return cols


def copy_all_columns(copy_all: Any, names: tuple[str, ...], n: int) -> dict[str, Any]:
    """``n`` int64 values of every column, written in one pass by ``copy_all(pointers)``
    (an array of one destination pointer per column), as NumPy arrays."""
    import numpy as np

    cols = {name: np.empty(n, np.int64) for name in names}
    dst = (ctypes.c_void_p * len(names))(*(a.ctypes.data for a in cols.values()))
    copy_all(dst)
    return cols


_LIBS: dict[str, Any] = {}


def load(name: str) -> Any:
    """The ctypes library ``name`` ("cupti", "torch" or "sanitizer"), building it if needed; raises
    RuntimeError with a one-line reason when it cannot be had."""
    if name in _LIBS:
        if isinstance(_LIBS[name], Exception):
            raise _LIBS[name]
        return _LIBS[name]
    if os.environ.get("PASTAPROF_NATIVE", "1") == "0":
        err = RuntimeError("native capture disabled (PASTAPROF_NATIVE=0)")
        _LIBS[name] = err
        raise err
    try:
        if shutil.which(_compiler(name != "cupti")) is None:
            raise RuntimeError(f"no C/C++ compiler ({_compiler(name != 'cupti')}) to build native capture")
        if name == "cupti":
            lib = ctypes.CDLL(str(build_cupti()))
            _declare_cupti(lib)
        elif name == "sanitizer":
            path, patch = build_sanitizer()
            # RTLD_GLOBAL: the torch observer finds pp_san_tensor with dlsym(RTLD_DEFAULT)
            lib = ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
            _declare_sanitizer(lib)
            lib.patch_path = str(patch)
        else:
            path, cuda = build_torch()
            lib = ctypes.CDLL(str(path))
            _declare_torch(lib)
            lib.has_cuda = cuda
    except (OSError, RuntimeError, ImportError) as e:
        err = e if isinstance(e, RuntimeError) else RuntimeError(f"{type(e).__name__}: {e}")
        _LIBS[name] = err
        raise err from None
    _LIBS[name] = lib
    return lib
