"""The injection library for native CUDA programs (native/inject.c) and its reader
(handlers/native_program.py), on a machine without a GPU: the library is built from source,
loaded into real C programs built here, and its own writer (``pp_inject_selftest``: synthetic
CUPTI records through the same decode and write path a capture takes) makes the files the
reader turns into event tables.  The GPU half is scripts/gpu-native."""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import pastaprof
from pastaprof import native
from pastaprof.handlers import native_program as npg

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None or not native.cupti_include_dirs(),
                                reason="needs gcc and the CUPTI headers")

SELFTEST = r"""
#include <dlfcn.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
static void on_term(int s) { printf("program handler %d\n", s); fflush(stdout); _exit(7); }
static void on_info(int s, siginfo_t* i, void* u) {
  (void)u; printf("siginfo handler %d from %d\n", s, i->si_pid == getpid()); fflush(stdout); _exit(9); }
int main(int argc, char** argv) {
  void* h = dlopen(argv[1], RTLD_NOW);
  if (!h) { fprintf(stderr, "dlopen: %s\n", dlerror()); return 3; }
  int (*st)(int, int, int, int) = (int (*)(int, int, int, int))dlsym(h, "pp_inject_selftest");
  const char* how = argc > 2 ? argv[2] : "exit";
  int kernels = argc > 3 ? atoi(argv[3]) : 25;
  int mangled = argc > 4 ? atoi(argv[4]) : 1;
  if (!strcmp(how, "own")) signal(SIGTERM, on_term);
  if (!strcmp(how, "ign")) signal(SIGTERM, SIG_IGN);
  if (!strcmp(how, "siginfo")) {
    struct sigaction sa; memset(&sa, 0, sizeof sa); sa.sa_sigaction = on_info; sa.sa_flags = SA_SIGINFO;
    sigaction(SIGINT, &sa, NULL);
  }
  int r = st(kernels, 3, 4, mangled);
  printf("selftest %d\n", r);
  fflush(stdout);
  if (!strcmp(how, "abort")) abort();
  if (!strcmp(how, "siginfo") || !strcmp(how, "int")) raise(SIGINT);
  if (!strcmp(how, "ign")) { raise(SIGTERM); printf("survived\n"); return 5; }
  if (!strcmp(how, "term") || !strcmp(how, "own")) raise(SIGTERM);
  if (!strcmp(how, "kill")) raise(SIGKILL);
  if (!strcmp(how, "child")) { if (fork() == 0) _exit(0); }
  if (!strcmp(how, "exec")) {  /* a new image of the same pid: 7 kernels more */
    char* again[] = {argv[0], argv[1], "exit", "7", NULL};
    execv(argv[0], again);
    return 8;
  }
  if (!strncmp(how, "exec-held", 9)) {  /* 4 kernels still held (in CUPTI's buffer), then exec */
    void (*held)(int, int) = (void (*)(int, int))dlsym(h, "pp_inject_selftest_held");
    held(kernels, 4);
    if (!strcmp(how, "exec-held-fails")) {  /* an exec that fails: the program and capture go on */
      execl("/nonexistent/program", "program", (char*)NULL);
      printf("exec failed\n");
      return 6;
    }
    execlp(argv[0], argv[0], argv[1], "exit", "7", (char*)NULL);
    return 8;
  }
  return 5;
}
"""

PLAIN = r"""
#include <dlfcn.h>
#include <stdio.h>
int main(int argc, char** argv) {
  printf("hello %d\n", argc);
  fflush(stdout);
  if (argc > 1) {
    void* h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) { fprintf(stderr, "app: no libcuda\n"); return 4; }
    int (*init)(unsigned) = (int (*)(unsigned))dlsym(h, "cuInit");
    int r = init(0);
    printf("cuInit %d\n", r);
    return r ? 6 : 0;
  }
  return 3;
}
"""


@pytest.fixture(scope="module")
def lib(tmp_path_factory) -> Path:
    os.environ.setdefault("PASTAPROF_CACHE", str(tmp_path_factory.mktemp("cache")))
    return native.build_inject()


def _cc(tmp: Path, name: str, source: str) -> Path:
    src = tmp / f"{name}.c"
    src.write_text(source)
    exe = tmp / name
    subprocess.run(["gcc", "-O1", "-o", str(exe), str(src), "-ldl"], check=True, capture_output=True)
    return exe


@pytest.fixture(scope="module")
def programs(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("programs")
    return {"selftest": _cc(d, "selftest", SELFTEST), "plain": _cc(d, "plain", PLAIN)}


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PASTAPROF_", "CUDA_INJECTION", "NVTX_INJ"))}
    env.update(extra)
    return env


def _selftest(programs, lib, out: Path, how: str = "exit", kernels: int = 25, **extra: str):
    return subprocess.run([str(programs["selftest"]), str(lib), how, str(kernels)], capture_output=True, text=True,
                          env=_env(PASTAPROF_OUT=str(out), **extra), timeout=60)


def _one(out: Path, kernels: str | None = None):
    metas = sorted((out / "native").glob("rank-*-pid-*.json"))
    assert len(metas) == 1, metas
    return npg.read_process(metas[0].with_suffix(""), kernels)


# ---- the library -----------------------------------------------------------------------------

def test_library_exports_entry_points_and_needs_no_libcupti(lib):
    so = ctypes.CDLL(str(lib))
    for sym in ("InitializeInjection", "InitializeInjectionNvtx2", "pp_inject_selftest"):
        assert hasattr(so, sym)
    # only the C library's own dependencies: libcupti is dlopen'ed at run time
    needed = subprocess.run(["ldd", str(lib)], capture_output=True, text=True).stdout
    assert "cupti" not in needed and "libcuda" not in needed and "libstdc++" not in needed
    assert not hasattr(so, "decode") and not hasattr(so, "intern")  # -fvisibility=hidden


def test_python_process_is_left_to_the_python_session(lib, tmp_path):
    """The driver calls InitializeInjection in every CUDA process, Python ones too: there the
    library does nothing (pastaprof's Python session captures; never two CUPTI clients)."""
    code = (f"import ctypes; so = ctypes.CDLL({str(lib)!r}); print(so.InitializeInjection()); "
            f"print(so.InitializeInjectionNvtx2(None))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=_env(PASTAPROF_OUT=str(tmp_path)), timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["1", "0"]  # cuInit never fails; NVTX stays a no-op
    assert r.stderr == ""
    assert not (tmp_path / "native").exists()
    maps = subprocess.run([sys.executable, "-c", code + "; print(open('/proc/self/maps').read())"],
                          capture_output=True, text=True, env=_env(PASTAPROF_OUT=str(tmp_path))).stdout
    assert "libcupti" not in maps


@pytest.mark.parametrize("args", [[], ["cuda"]])
def test_program_unchanged_by_the_injection_variables(lib, programs, tmp_path, args):
    """CUDA_INJECTION64_PATH / NVTX_INJECTION64_PATH as `pastaprof run` sets them, on a program
    with no CUDA and on one whose libcuda load fails (no driver here): same output and exit code."""
    bare = subprocess.run([str(programs["plain"]), *args], capture_output=True, text=True, env=_env())
    inj = subprocess.run([str(programs["plain"]), *args], capture_output=True, text=True,
                         env=_env(PASTAPROF_OUT=str(tmp_path), CUDA_INJECTION64_PATH=str(lib),
                                  NVTX_INJECTION64_PATH=str(lib), PASTAPROF_RUN_PARENT="1"))
    assert (inj.returncode, inj.stdout, inj.stderr) == (bare.returncode, bare.stdout, bare.stderr)
    assert bare.returncode == (4 if args else 3)


@pytest.mark.skipif(npg.has_nvidia_driver(), reason="a machine without an NVIDIA driver")
def test_no_gpu_is_one_line_and_the_program_goes_on(lib, programs, tmp_path):
    """Loaded eagerly (LD_PRELOAD) where there is no CUDA driver: one warning line, the program's
    own output and exit code as without it; the process's header says why."""
    env = _env(PASTAPROF_OUT=str(tmp_path), LD_PRELOAD=str(lib), PASTAPROF_NATIVE_EAGER="1")
    for args, code in (([], 3), (["cuda"], 4)):
        bare = subprocess.run([str(programs["plain"]), *args], capture_output=True, text=True, env=_env())
        r = subprocess.run([str(programs["plain"]), *args], capture_output=True, text=True, env=env)
        assert (r.returncode, r.stdout) == (bare.returncode, bare.stdout) == (code, bare.stdout)
        ours = [ln for ln in r.stderr.splitlines() if ln.startswith("pastaprof:")]
        assert len(ours) == 1 and "no CUDA driver" in ours[0], r.stderr
        assert [ln for ln in r.stderr.splitlines() if not ln.startswith("pastaprof:")] == bare.stderr.splitlines()
    # under `pastaprof run` the line is the run's (printed once by the launcher), not the library's
    r = subprocess.run([str(programs["plain"])], capture_output=True, text=True,
                       env={**env, "PASTAPROF_RUN_PARENT": "1"})
    assert r.stderr == "" and r.returncode == 3
    meta, tables, status = _one_latest(tmp_path)
    assert tables == {} and "no CUDA driver" in status["native"] and meta["ended"] == "not started"


def _one_latest(out: Path):
    metas = sorted((out / "native").glob("rank-*-pid-*.json"), key=lambda p: p.stat().st_mtime_ns)
    return npg.read_process(metas[-1].with_suffix(""))


# ---- the writer and the reader -----------------------------------------------------------------

def test_records_become_the_right_columns(lib, programs, tmp_path):
    r = _selftest(programs, lib, tmp_path, "exit", 25)
    assert (r.returncode, r.stdout) == (5, "selftest 0\n") and r.stderr == ""
    meta, t, status = _one(tmp_path)
    assert status == {} and meta["complete"] is True and meta["ended"] == "exit"
    assert meta["stats"]["kernels_seen"] == 25 and meta["stats"]["records"] == 25 + 25 + 6 + 4 + 2
    assert {k: v.num_rows for k, v in t.items()} == {"kernel": 25, "api": 25, "range": 3, "memcpy": 4, "alloc": 1,
                                                     "free": 1}
    k = t["kernel"].to_pydict()
    i = np.arange(25)
    t0 = 1700000000000000000
    assert k["start_ns"] == (t0 + 1000 * i).tolist() and k["end_ns"] == (t0 + 1000 * i + 500).tolist()
    assert k["name"] == [f"kernel_{j % 3}()" for j in range(25)]  # demangled _Z8kernel_Nv
    assert k["grid_x"] == (i + 1).tolist() and set(k["block_x"]) == {256} and set(k["registers"]) == {32}
    assert k["shared_bytes"] == (1024 + i).tolist() and k["correlation"] == (2 * i + 1).tolist()
    assert set(k["stream"]) == {7} and set(k["device"]) == {0} and set(k["pid"]) == {meta["pid"]}
    a = t["api"].to_pydict()
    assert a["correlation"] == k["correlation"] and set(a["api_kind"]) == {"runtime"} and set(a["tid"]) == {42}
    assert (np.array(a["end_ns"]) < np.array(k["start_ns"])).all()
    rg = t["range"].to_pydict()
    assert rg["name"] == ["step 0", "step 1", "step 2"] and set(rg["domain"]) == {"nvtx:pp"}
    assert rg["start_ns"] == [t0 + 10000 * j - 400 for j in range(3)]
    assert rg["end_ns"] == [t0 + 10000 * j + 550 for j in range(3)]
    m = t["memcpy"].to_pydict()
    assert sorted(m["bytes"]) == [4096, 8192, 12288, 16384] and set(m["direction"]) == {"HtoD"}
    assert t["alloc"]["bytes"].to_pylist() == [1 << 20] and t["free"]["memory_kind"].to_pylist() == ["device"]
    assert t["alloc"]["address"].to_pylist() == t["free"]["address"].to_pylist() == [0x7F0000000000]


def test_api_calls_named_and_filtered_by_cupti(lib, programs, tmp_path):
    """With the system libcupti bound, API rows carry CUPTI's names, and calls nothing uses
    (cudaGetDevice) are dropped while launches are kept."""
    cupti = native.system_libcupti()
    if cupti is None:
        pytest.skip("no libcupti on this machine")
    r = _selftest(programs, lib, tmp_path, "exit", 25, PASTAPROF_NATIVE_CUPTI=cupti)
    assert r.returncode == 5
    meta, t, _ = _one(tmp_path)
    assert meta["stats"]["records"] == 25 * 3 + 6 + 4 + 2  # the 25 cudaGetDevice records were seen ...
    assert t["api"]["name"].to_pylist() == ["cudaLaunchKernel_v7000"] * 25  # ... and not stored


def test_sample_and_kernel_regex(lib, programs, tmp_path):
    r = _selftest(programs, lib, tmp_path / "s", PASTAPROF_SAMPLE="4")
    meta, t, _ = _one(tmp_path / "s")
    assert t["kernel"]["grid_x"].to_pylist() == [4, 8, 12, 16, 20, 24]  # every 4th launch (grid_x = launch)
    assert meta["stats"]["sampled_out"] == 19 and r.returncode == 5
    # a POSIX ERE: applied in the library
    _selftest(programs, lib, tmp_path / "p", PASTAPROF_KERNELS="kernel_[02]")
    meta, t, _ = _one(tmp_path / "p")
    assert meta["kernel_filter"] == "posix"
    assert t["kernel"].num_rows == sum(1 for j in range(25) if j % 3 != 1)
    assert set(t["kernel"]["name"].to_pylist()) == {"kernel_0()", "kernel_2()"}
    # Python-only syntax (a lookahead): recorded in full, filtered by the reader with Python's re
    _selftest(programs, lib, tmp_path / "y", PASTAPROF_KERNELS=r"kernel_(?!1)\d")
    meta, t, _ = _one(tmp_path / "y", kernels=r"kernel_(?!1)\d")
    assert meta["kernel_filter"] == "python"
    assert set(t["kernel"]["name"].to_pylist()) == {"kernel_0()", "kernel_2()"} and t["kernel"].num_rows == 17


@pytest.mark.parametrize("how,code,ended,line", [
    ("abort", -signal.SIGABRT, "signal 6", ""),
    ("term", -signal.SIGTERM, "signal 15", ""),
    ("int", -signal.SIGINT, "signal 2", ""),
    ("own", 7, "signal 15", "program handler 15\n"),
    ("siginfo", 9, "signal 2", "siginfo handler 2 from 1\n"),  # SA_SIGINFO handler chained, its info intact
    ("ign", 5, "exit", "survived\n"),  # an ignored signal stays ignored
    ("kill", -signal.SIGKILL, "running", ""),
])
def test_exits_and_signals(lib, programs, tmp_path, how, code, ended, line):
    """Flushed on abort() and signals, the program's own handler chained (its output and exit
    code), a default action repeated (the death by signal unchanged); after SIGKILL, what was
    written before it is still read, with one status line."""
    r = _selftest(programs, lib, tmp_path, how)
    assert r.returncode == code and r.stdout == "selftest 0\n" + line
    meta, t, status = _one(tmp_path)
    assert meta["ended"] == ended and t["kernel"].num_rows == 25 and t["range"].num_rows == 3
    if how == "kill":
        assert meta["complete"] is False and "final flush" in status["native_end"]
    elif how == "ign":
        assert meta["complete"] is True and status == {}
    else:
        assert f"ended by {ended}" in status.get("native_end", f"ended by {ended}")


def test_forked_child_leaves_the_parents_files(lib, programs, tmp_path):
    r = _selftest(programs, lib, tmp_path, "child")
    assert r.returncode == 5
    meta, t, status = _one(tmp_path)  # one process's files: the child's exit did not rewrite them
    assert meta["complete"] is True and meta["pid"] != 0 and t["kernel"].num_rows == 25


def test_ranks_and_processes_each_write_their_files(lib, programs, tmp_path):
    for rank_var, rank in (("OMPI_COMM_WORLD_RANK", "1"), ("SLURM_PROCID", "3"), ("RANK", "2")):
        _selftest(programs, lib, tmp_path, "exit", 5, **{rank_var: rank})
    names = sorted(p.name.split("-pid-")[0] for p in (tmp_path / "native").glob("*.json"))
    assert names == ["rank-1", "rank-2", "rank-3"]
    # PASTAPROF_RANKS: a rank not selected records nothing, and says so
    _selftest(programs, lib, tmp_path / "r", "exit", 5, RANK="2", PASTAPROF_RANKS="0-1,3")
    meta = json.loads(next((tmp_path / "r" / "native").glob("*.json")).read_text())
    assert meta["rank"] == 2


def test_convert_makes_a_run_every_tool_reads(lib, programs, tmp_path):
    run = tmp_path / "run"
    _selftest(programs, lib, run, "exit", 25, RANK="1")
    _selftest(programs, lib, run, "exit", 7, RANK="0")
    rows = npg.convert(run)
    assert rows == {"kernel": 32, "api": 32, "range": 3 + 1, "memcpy": 8, "alloc": 2, "free": 2}
    assert not (run / "native").exists() and len(list((run / "shards").glob("*.json"))) == 2
    from pastaprof.store.compact import compact

    manifest = compact(run, command=["./app"], exit_code=5)
    assert manifest["rows"]["kernel"] == 32 and manifest["ranks"] == [0, 1]
    import duckdb

    con = duckdb.connect()
    n = con.execute(f"select count(*), count(distinct name) from '{run}/kernel/*.parquet'").fetchone()
    assert n == (32, 3)
    from pastaprof.api import analyze

    reports = analyze(run, tools=["kernels"])
    assert reports and reports[0].tables  # a native program's run through a real tool


def test_ranges_window_a_native_run_by_its_nvtx_ranges(lib, programs, tmp_path):
    """--ranges on a native program: kept are the kernels (and copies, calls, allocations)
    launched inside a selected NVTX range. The selftest's range "step j" holds exactly kernel
    10*j and its launch call; its copies come before every range."""
    from pastaprof.live.config import CaptureConfig

    run = tmp_path / "run"
    _selftest(programs, lib, run, "exit", 25)
    rows = npg.convert(run, config=CaptureConfig.from_env({"PASTAPROF_RANGES": "step 1,step 2"}))
    assert rows == {"kernel": 2, "api": 2, "range": 3}
    import duckdb

    grid = duckdb.connect().execute(f"select list(grid_x order by grid_x) from '{run}/kernel/*.parquet'").fetchone()
    assert grid == ([11, 21],)  # kernels 10 and 20 (grid_x = i + 1)
    shard = json.loads(next((run / "shards").glob("*.json")).read_text())
    assert shard["filtered_by_kind"] == {"kernel": 23, "api": 23, "memcpy": 4, "alloc": 1, "free": 1}
    assert shard["filtered_out"] == 23 + 23 + 4 + 2
    run2 = tmp_path / "all"
    _selftest(programs, lib, run2, "exit", 25)
    assert npg.convert(run2, config=CaptureConfig.from_env({"PASTAPROF_RANGES": "step *"}))["kernel"] == 3


# ---- hostile files ---------------------------------------------------------------------------

def test_damaged_files_lose_only_their_damage(lib, programs, tmp_path):
    _selftest(programs, lib, tmp_path, "exit", 25)
    base = next((tmp_path / "native").glob("*.json")).with_suffix("")
    rec = base.with_suffix(".rec")
    data = rec.read_bytes()
    rec.write_bytes(data[:-200])  # cut inside the second-to-last record
    _, t, status = npg.read_process(base)
    total = sum(x.num_rows for x in t.values())
    assert total == 25 + 25 + 3 + 4 + 2 - 2 and "partial record" in status["native_records"]  # 6 markers: 3 ranges
    s = base.with_suffix(".str")
    s.write_bytes(s.read_bytes()[:-3])  # the last string cut: its rows keep a null name
    _, t, _ = npg.read_process(base)
    assert sum(x.num_rows for x in t.values()) == 57
    rec.write_bytes(b"\0" * 128 + data[128:])  # a header that is not ours
    _, t, status = npg.read_process(base)
    assert t == {} and "header" in status["native_records"]
    base.with_suffix(".json").write_text("{not json")
    _, t, status = npg.read_process(base)
    assert t == {} and "unreadable" in status["native"]


def test_reader_fuzz_never_raises(lib, programs, tmp_path):
    """Fixed-seed fuzzing of the record and string files: flipped words, random kinds and ids,
    random string entries; the reader returns tables or a status, never an exception."""
    _selftest(programs, lib, tmp_path, "exit", 40)
    base = next((tmp_path / "native").glob("*.json")).with_suffix("")
    rec0 = base.with_suffix(".rec").read_bytes()
    str0 = base.with_suffix(".str").read_bytes()
    rng = np.random.default_rng(1234)
    for _ in range(150):
        words = np.frombuffer(rec0, "<i8").copy()
        body = words[16:]
        idx = rng.integers(0, len(body), size=rng.integers(1, 40))
        body[idx] = rng.choice([-1, 0, 1, 7, 8, 2**31, -(2**62), 2**62], size=len(idx))
        body[rng.integers(0, len(body) // 16, 5) * 16] = rng.integers(-2, 10, 5)  # kinds
        raw = words.tobytes()[: rng.integers(128, len(rec0) + 1)]
        sb = bytearray(str0)
        for j in rng.integers(0, len(sb), size=rng.integers(0, 8)):
            sb[j] = int(rng.integers(0, 256))
        base.with_suffix(".rec").write_bytes(raw)
        base.with_suffix(".str").write_bytes(bytes(sb[: rng.integers(0, len(sb) + 1)]))
        meta, tables, status = npg.read_process(base)
        for tb in tables.values():
            tb.validate(full=True)


def test_a_string_id_the_library_cannot_write_is_damage_not_a_huge_table(tmp_path):
    """A flipped word made a string id of 2^31 - 1: the name lookup was sized by the largest id
    (16 GB). Ids past the library's table end the string file there, as other damage does."""
    import struct

    p = tmp_path / "s.str"
    p.write_bytes(struct.pack("<ii", 0, 3) + b"abc" + struct.pack("<ii", 2**31 - 1, 1) + b"x"
                  + struct.pack("<ii", 1, 1) + b"y")
    strings = npg._read_strings(p)
    assert strings == {0: "abc"}
    names = npg._names(np.array([0, 0, 2**31 - 1, 5]), strings)
    assert names.to_pylist() == ["abc", "abc", None, None]


def test_convert_ignores_foreign_names_and_links(tmp_path):
    d = tmp_path / "native"
    d.mkdir()
    (d / "notes.txt").write_text("x")
    (d / "rank-0-pid-1.json").symlink_to("/etc/passwd")
    assert npg.convert(tmp_path) == {}
    assert not d.exists()
    link_run = tmp_path / "r2"
    link_run.mkdir()
    (link_run / "native").symlink_to(tmp_path)  # a link is never followed (nor removed through)
    assert npg.convert(link_run) == {} and tmp_path.exists()


# ---- before the program starts ------------------------------------------------------------

def test_prepare_sets_the_injection_and_says_why_not(lib, tmp_path, monkeypatch):
    cupti = native.system_libcupti()
    if cupti is None:
        pytest.skip("no libcupti on this machine")
    env: dict[str, str] = {"PASTAPROF_NATIVE_INJECT": "1"}  # prepared though this machine has no driver
    assert npg.prepare(env, ["./app"]) is None
    assert env["CUDA_INJECTION64_PATH"] == str(lib) and env["NVTX_INJECTION64_PATH"] == str(lib)
    assert env["PASTAPROF_NATIVE_CUPTI"] == cupti
    env = {"NVTX_INJECTION64_PATH": "/opt/nsys/libinj.so", "PASTAPROF_NATIVE_INJECT": "1"}
    assert npg.prepare(env, ["./app"]) is None and env["NVTX_INJECTION64_PATH"] == "/opt/nsys/libinj.so"
    msg = npg.prepare({"CUDA_INJECTION64_PATH": "/x.so", "PASTAPROF_NATIVE_INJECT": "1"}, ["./app"])
    assert msg and "\n" not in msg and "already set" in msg
    monkeypatch.setenv("CC", "/nonexistent/cc")
    msg = npg.prepare({"PASTAPROF_NATIVE_INJECT": "1"}, ["./app"])
    assert msg and "\n" not in msg and "compiler" in msg
    monkeypatch.delenv("CC")
    monkeypatch.setenv("PASTAPROF_NATIVE_CUPTI", str(tmp_path / "missing.so"))
    msg = npg.prepare({"PASTAPROF_NATIVE_INJECT": "1"}, ["./app"])
    assert msg and "libcupti" in msg and "\n" not in msg
    assert npg.prepare({"PASTAPROF_NATIVE_INJECT": "0"}, ["./app"]) is None
    if not npg.has_nvidia_driver():  # no driver: no CUDA program can run, nothing is prepared or said
        env = {}
        assert npg.prepare(env, ["./app"]) is None and env == {}


def test_missing_headers_are_one_line(monkeypatch):
    monkeypatch.setattr(native, "cupti_include_dirs", lambda: [])
    with pytest.raises(RuntimeError, match="CUPTI headers not found"):
        native.build_inject()


def test_python_commands_are_recognized(tmp_path, programs):
    script = tmp_path / "train.py"
    script.write_text("#!/usr/bin/env python3\nprint(1)\n")
    assert npg.is_python_command([sys.executable, "x.py"]) and npg.is_python_command(["python3.12"])
    assert npg.is_python_command([str(script)])
    assert not npg.is_python_command([str(programs["plain"])]) and not npg.is_python_command(["mpirun", "-np", "2"])
    assert not npg.is_python_command([])


# ---- the instruction-level tools' chunks (inject_sanitizer.c's format) --------------------------

def _san_chunk(tables: list[dict[int, list[int]]], names: list[tuple[str, str]], first: int, raw_addrs=None) -> bytes:
    """One chunk as inject_sanitizer.c writes it (test-only writer of the documented layout)."""
    import struct as st

    from pastaprof.handlers.native_sanitizer import MAGIC
    from pastaprof.handlers.sanitizer import NCOLS

    rows = [len(t[0]) if t else 0 for t in tables]
    out = np.array([MAGIC, 7, len(names), first, *NCOLS, *rows], np.int64).tobytes()
    for t, ncol in zip(tables, NCOLS):
        if t and len(t[0]):
            for c in range(ncol):
                out += np.asarray(t.get(c, [0] * len(t[0])), np.int64).tobytes()
    if rows[4]:
        out += np.asarray(raw_addrs, np.uint64).tobytes()
    for raw, shown in names:
        out += st.pack("<i", len(raw)) + raw.encode() + st.pack("<i", len(shown)) + shown.encode()
    return out


def _launch_tables(corr: int, reads: int, writes: int) -> list[dict[int, list[int]]]:
    from pastaprof.handlers.sanitizer import LAUNCH_COLS, OBJ_COLS

    launch = {i: [0] for i in range(len(LAUNCH_COLS))}
    for name, v in (("correlation", corr), ("start_ns", 10 * corr), ("end_ns", 10 * corr + 5), ("name_id", 0),
                    ("grid_x", 4096), ("block_x", 256), ("mode", 1), ("lanes", reads + writes)):
        launch[LAUNCH_COLS.index(name)] = [v]
    obj = {i: [0] for i in range(len(OBJ_COLS))}
    for name, v in (("correlation", corr), ("object_address", 0x7F0000000000), ("object_bytes", 4 << 20),
                    ("kind", 1), ("reads", reads), ("writes", writes), ("bytes_read", 4 * reads),
                    ("bytes_written", 4 * writes), ("page_start", -1), ("page_len", 0)):
        obj[OBJ_COLS.index(name)] = [v]
    return [launch, obj, {}, {}, {}, {}, {}]


def test_sanitizer_chunks_replayed_through_the_python_handler(tmp_path):
    """Two chunks (two vecadd launches: 2M reads + 1M writes each) -> access_launch and
    access_summary rows with those counts, made by SanitizerHandler.drain itself."""
    from pastaprof.handlers import native_sanitizer as ns
    from pastaprof.live.config import CaptureConfig

    base = tmp_path / "native" / "rank-0-pid-9"
    base.parent.mkdir()
    data = _san_chunk(_launch_tables(1, 2 << 20, 1 << 20), [("_Z6vecaddPKfS0_Pfi", "vecadd(float const*, float "
                                                                                  "const*, float*, int)")], 0)
    data += _san_chunk(_launch_tables(2, 2 << 20, 1 << 20), [], 1)
    base.with_suffix(".san").write_bytes(data)
    meta = {"sanitizer": {"stats": [2, 2] + [0] * 11, "error": "", "notes": []}}
    t, summary, trouble = ns.tables(base, meta, CaptureConfig(), rank=0, pid=9)
    assert trouble is None and summary["launches_instrumented"] == 2
    s = t["access_summary"].to_pydict()
    assert s["reads"] == [2 << 20] * 2 and s["writes"] == [1 << 20] * 2 and s["correlation"] == [1, 2]
    assert set(s["name"]) == {"vecadd(float const*, float const*, float*, int)"} and set(s["pid"]) == {9}
    assert t["access_launch"]["grid_x"].to_pylist() == [4096, 4096]
    # cut short: the whole chunks before the cut are kept
    base.with_suffix(".san").write_bytes(data[:-100])
    t, _, trouble = ns.tables(base, meta, CaptureConfig(), rank=0, pid=9)
    assert t["access_summary"].num_rows == 1 and "partial chunk" in trouble
    # fixed-seed fuzz of the chunk reader
    rng = np.random.default_rng(7)
    for _ in range(200):
        b = bytearray(data)
        for j in rng.integers(0, len(b), size=rng.integers(1, 12)):
            b[j] = int(rng.integers(0, 256))
        base.with_suffix(".san").write_bytes(bytes(b[: rng.integers(0, len(b) + 1)]))
        try:
            got, _, _ = ns.tables(base, meta, CaptureConfig(), rank=0, pid=9)
        except Exception as e:  # noqa: BLE001
            pytest.fail(f"reader raised {type(e).__name__}: {e}")
        for tb in got.values():
            tb.validate(full=True)


# ---- through `pastaprof run` ------------------------------------------------------------------

def _run(tmp: Path, *cmd: str, **extra: str) -> subprocess.CompletedProcess:
    out = tmp / "run"
    shutil.rmtree(out, ignore_errors=True)
    return subprocess.run([sys.executable, "-m", "pastaprof.cli", "run", "--out", str(out), "--", *cmd],
                          capture_output=True, text=True, env=_env(**extra), timeout=120)


def test_pastaprof_run_stores_a_native_programs_run(lib, programs, tmp_path):
    r = _run(tmp_path, str(programs["selftest"]), str(lib), "exit", "25")
    assert (r.returncode, r.stdout) == (5, "selftest 0\n"), r.stderr
    assert "25 kernel" in r.stderr and "3 range" in r.stderr
    manifest = json.loads((tmp_path / "run" / "run.json").read_text())
    assert manifest["rows"] == {"kernel": 25, "api": 25, "range": 3, "memcpy": 4, "alloc": 1, "free": 1}
    assert manifest["exit_code"] == 5 and [list(p["handlers"]) for p in manifest["processes"]] == [["native"]]
    assert not (tmp_path / "run" / "native").exists()


def test_pastaprof_run_child_processes_and_ranks(lib, programs, tmp_path):
    exe, so = programs["selftest"], lib
    r = _run(tmp_path, "sh", "-c", f"{exe} {so} exit 5; RANK=1 {exe} {so} exit 7; exit 3")
    assert r.returncode == 3 and r.stdout == "selftest 0\nselftest 0\n"
    manifest = json.loads((tmp_path / "run" / "run.json").read_text())
    assert manifest["ranks"] == [0, 1] and manifest["rows"]["kernel"] == 12
    assert sorted(p["rank"] for p in manifest["processes"]) == [0, 1]


def test_two_native_processes_of_one_rank_keep_their_own_launches(lib, programs, tmp_path):
    """Two programs of one rank, each numbering its launches from 1 as CUPTI does: in the stored
    run every kernel joins (on rank, correlation, as the tools join) the launch call of its own
    process."""
    exe, so = programs["selftest"], lib
    r = _run(tmp_path, "sh", "-c", f"{exe} {so} exit 5; {exe} {so} exit 7")
    assert r.returncode == 5 and r.stdout == "selftest 0\nselftest 0\n", r.stderr
    run = pastaprof.load(tmp_path / "run")
    kernel, api = run.table("kernel").to_pylist(), run.table("api").to_pylist()
    assert len(kernel) == 12 and len(api) == 12 and len({r["pid"] for r in kernel}) == 2
    assert len({r["correlation"] for r in kernel}) == 12
    call = {(r["rank"], r["correlation"]): r["pid"] for r in api}
    assert [call[(r["rank"], r["correlation"])] for r in kernel] == [r["pid"] for r in kernel]


def test_a_native_process_that_execs_keeps_both_images(lib, programs, tmp_path):
    """A native program that execs another (the same pid; CUPTI numbers the new image's launches
    from 1 again): the new image writes files of its own beside the earlier image's (before, it
    truncated them: 7 of 12 kernels stored), and the stored run's correlation ids are unique, so
    each kernel joins one launch call."""
    r = _run(tmp_path, str(programs["selftest"]), str(lib), "exec", "5")
    assert r.returncode == 5 and r.stdout == "selftest 0\nselftest 0\n", r.stderr
    run = pastaprof.load(tmp_path / "run")
    kernel, api = run.table("kernel").to_pylist(), run.table("api").to_pylist()
    assert len(kernel) == 12 and len(api) == 12 and len({r["pid"] for r in kernel}) == 1
    assert sorted(r["correlation"] for r in kernel) == sorted(r["correlation"] for r in api)
    assert len({r["correlation"] for r in kernel}) == 12
    assert len(run.manifest["processes"]) == 2


def test_an_exec_writes_what_capture_still_holds(lib, programs, tmp_path):
    """What CUPTI still holds when a native program execs (the buffer being filled: 4 kernels
    and their launch calls here) is written before the image is replaced, through the library's
    exec wrappers, which `pastaprof run` puts in LD_PRELOAD; with PASTAPROF_NATIVE_PRELOAD=0
    they are lost, and the run says so.  An exec that fails leaves the program and its capture
    going on."""
    same = {"PASTAPROF_NATIVE_INJECT": "1", "PASTAPROF_CACHE": os.environ["PASTAPROF_CACHE"]}  # one library
    r = _run(tmp_path, str(programs["selftest"]), str(lib), "exec-held", "5", **same)
    assert r.returncode == 5 and r.stdout == "selftest 0\nselftest 0\n", r.stderr
    run = pastaprof.load(tmp_path / "run")
    kernel, api = run.table("kernel").to_pylist(), run.table("api").to_pylist()
    assert (len(kernel), len(api)) == (16, 16), r.stderr  # 5 + 4 held, then 7
    assert len({r["correlation"] for r in kernel}) == 16 and "final flush" not in r.stderr

    r = _run(tmp_path, str(programs["selftest"]), str(lib), "exec-held", "5", PASTAPROF_NATIVE_PRELOAD="0", **same)
    assert r.returncode == 5 and len(pastaprof.load(tmp_path / "run").table("kernel")) == 12
    assert "final flush" in r.stderr

    r = _run(tmp_path, str(programs["selftest"]), str(lib), "exec-held-fails", "5", **same)
    assert r.returncode == 6 and r.stdout == "selftest 0\nexec failed\n", r.stderr
    assert len(pastaprof.load(tmp_path / "run").table("kernel")) == 9 and "final flush" not in r.stderr


def test_the_preloaded_library_leaves_programs_as_they_are(lib, programs, tmp_path):
    """The library in LD_PRELOAD (after the user's own) changes no program that is not
    capturing: a shell's exec, and an AddressSanitizer program (which refuses to start when a
    library is preloaded before its runtime, unless ASAN_OPTIONS says otherwise)."""
    same = {"PASTAPROF_NATIVE_INJECT": "1", "PASTAPROF_CACHE": os.environ["PASTAPROF_CACHE"]}
    (tmp_path / "user.c").write_text("int user_lib_marker(void) { return 1; }\n")
    user_lib = tmp_path / "libuser.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(user_lib), str(tmp_path / "user.c")], check=True)
    r = _run(tmp_path, "sh", "-c", 'exec printf "%s|%s" "$LD_PRELOAD" "$ASAN_OPTIONS"', LD_PRELOAD=str(user_lib),
             **same)
    assert r.returncode == 0 and r.stdout == f"{user_lib} {lib}|verify_asan_link_order=0", (r.stdout, r.stderr)
    src = tmp_path / "asan.c"
    src.write_text('#include <stdio.h>\n#include <stdlib.h>\n#include <unistd.h>\nint main(void) { char* p = '
                   'malloc(8); p[0] = 4; printf("asan %d\\n", p[0]); fflush(stdout); free(p); '
                   'execl("/bin/sh", "sh", "-c", "echo exec done; exit 3", (char*)NULL); return 9; }\n')
    exe = tmp_path / "asan"
    if subprocess.run(["gcc", "-fsanitize=address", "-o", str(exe), str(src)], capture_output=True).returncode:
        pytest.skip("no AddressSanitizer runtime here")
    bare = subprocess.run([str(exe)], capture_output=True, text=True, env=_env(), timeout=60)
    r = _run(tmp_path, str(exe), **same)
    assert (r.returncode, r.stdout) == (bare.returncode, bare.stdout) == (3, "asan 4\nexec done\n"), r.stderr


def test_a_python_programs_native_children_are_captured(lib, programs, tmp_path):
    """A Python program that starts native programs (a harness, a launcher script): its
    children get native capture as a shell's do (the library preloaded too: a child that execs
    keeps what CUPTI held), and the Python program's os.environ does not show what was added."""
    same = {"PASTAPROF_NATIVE_INJECT": "1", "PASTAPROF_CACHE": os.environ["PASTAPROF_CACHE"]}
    code = ("import os, subprocess, sys; print(sorted(k for k in ('CUDA_INJECTION64_PATH', 'LD_PRELOAD') "
            "if k in os.environ)); subprocess.run(['sh', '-c', 'echo $CUDA_INJECTION64_PATH $LD_PRELOAD']); "
            "print(subprocess.run(sys.argv[1:]).returncode)")
    r = _run(tmp_path, sys.executable, "-c", code, str(programs["selftest"]), str(lib), "exec-held", "5", **same)
    assert r.returncode == 0 and r.stdout == f"[]\n{lib} {lib}\nselftest 0\nselftest 0\n5\n", (r.stdout, r.stderr)
    kernel = pastaprof.load(tmp_path / "run").table("kernel")
    assert len(kernel) == 16 and len(set(kernel.column("correlation").to_pylist())) == 16, r.stderr


def test_pastaprof_run_killed_native_process_says_what_was_lost(lib, programs, tmp_path):
    r = _run(tmp_path, str(programs["selftest"]), str(lib), "kill", "25")
    assert r.returncode == -signal.SIGKILL
    manifest = json.loads((tmp_path / "run" / "run.json").read_text())
    assert manifest["rows"]["kernel"] == 25  # written before the kill
    assert "final flush" in r.stderr and any("final flush" in v for v in manifest["status"].values())


def test_registered_as_a_handler_and_its_settings_checked(tmp_path, programs):
    """One registration line: listed by `pastaprof handlers`, never created inside a Python
    session, and a bad PASTAPROF_NATIVE_* value is one line and exit 2 before the program starts."""
    from pastaprof.handlers import registry

    found = registry.available(refresh=True)
    assert found["native"] is npg.NativeProgram and npg.NativeProgram.create(None) is None  # type: ignore[arg-type]
    for var, value in (("PASTAPROF_NATIVE_FLUSH_MS", "soon"), ("PASTAPROF_NATIVE_KINDS", "kernel,bogus"),
                       ("PASTAPROF_NATIVE_CUPTI", str(tmp_path / "missing.so")), ("PASTAPROF_NATIVE_INJECT", "2"),
                       ("PASTAPROF_NATIVE_API_MECHANISM", "both")):
        r = _run(tmp_path, str(programs["plain"]), **{var: value})
        assert r.returncode == 2 and r.stdout == "", (var, r.stdout)
        assert r.stderr.count("\n") == 1 and r.stderr.startswith(f"pastaprof: error: {var}="), r.stderr


def test_hostile_names_and_arguments(lib, programs, tmp_path):
    """A 5,000-byte kernel name with escapes, quotes, a newline and invalid UTF-8, and argv with
    UTF-8 and control characters: valid JSON, the name kept (up to the 4,096-byte cap) with
    replacement characters, nothing raised."""
    weird = "r\u00e9sum\u00e9-\u65e5\u672c\x07\"q"
    r = subprocess.run([str(programs["selftest"]), str(lib), "exit", "5", "2", weird], capture_output=True,
                       text=True, env=_env(PASTAPROF_OUT=str(tmp_path)), timeout=60)
    assert r.returncode == 5
    meta, t, status = _one(tmp_path)
    assert meta["argv"][-1] == weird  # valid UTF-8 kept as it is, the control character escaped
    names = t["kernel"]["name"].to_pylist()
    assert len(names) == 6 and names[:5] == [f"kernel_{j % 3}()" for j in range(5)]
    assert names[5].startswith("\x1b[31m\"q\\\n\ufffd\ufffd") and len(names[5].encode()) <= 4096 + 6


def test_unwritable_output_is_one_line(lib, programs, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    env = _env(PASTAPROF_OUT=str(blocker / "run"), LD_PRELOAD=str(lib), PASTAPROF_NATIVE_EAGER="1")
    r = subprocess.run([str(programs["plain"])], capture_output=True, text=True, env=env)
    assert (r.returncode, r.stdout) == (3, "hello 1\n")
    assert r.stderr.count("\n") == 1 and "native capture not started: cannot create" in r.stderr
    assert blocker.read_text() == "x"


def test_rank_not_selected_records_nothing(lib, programs, tmp_path):
    env = _env(PASTAPROF_OUT=str(tmp_path), LD_PRELOAD=str(lib), PASTAPROF_NATIVE_EAGER="1", RANK="2",
               PASTAPROF_RANKS="0-1,3", PASTAPROF_RUN_PARENT="1")
    r = subprocess.run([str(programs["plain"])], capture_output=True, text=True, env=env)
    assert (r.returncode, r.stderr) == (3, "")
    meta, t, status = _one(tmp_path)
    assert t == {} and meta["rank"] == 2 and "not selected" in status["native"]


def test_a_header_change_rebuilds_the_library(tmp_path, monkeypatch):
    """The cache key covers the headers the sources include: a changed record layout in a
    header must never reuse a library built against the old one."""
    from pastaprof import native

    src = tmp_path / "lib.c"
    src.write_text('#include "lib.h"\nint pp_value(void) { return VALUE; }\n')
    (tmp_path / "lib.h").write_text("#define VALUE 1\n")
    monkeypatch.setattr(native, "HERE", tmp_path)
    monkeypatch.setenv("PASTAPROF_CACHE", str(tmp_path / "cache"))
    first = native._build("pp_header_test", [src], [f"-I{tmp_path}"], cpp=False)
    assert native._build("pp_header_test", [src], [f"-I{tmp_path}"], cpp=False) == first
    (tmp_path / "lib.h").write_text("#define VALUE 2\n")
    second = native._build("pp_header_test", [src], [f"-I{tmp_path}"], cpp=False)
    assert second != first
    import ctypes

    assert ctypes.CDLL(str(first)).pp_value() == 1 and ctypes.CDLL(str(second)).pp_value() == 2
