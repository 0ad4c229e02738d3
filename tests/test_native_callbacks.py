"""API calls and synchronizations of native programs through CUPTI's callback API
(native/inject_callbacks.c), on a machine without a GPU: the library's own callback is called
as CUPTI calls it (ENTER/EXIT, a driver call nested in a runtime one), with CUPTI's real cbid
names from the system libcupti; the rows go through the library's writer and the run's reader.
What the mechanism saves a launch-bound loop is measured on the GPU (scripts/gpu_native_check.py,
part loop: default against default+activity)."""

from __future__ import annotations

import ctypes
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import injection_env, libcupti_file, selftest_driver

from pastaprof import native
from pastaprof.handlers import native_program as npg

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None or not native.cupti_include_dirs(),
                                reason="needs gcc and the CUPTI headers")

PROG = r"""
#include <dlfcn.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
static int (*call)(const char*, const char*, unsigned, long long);
static long long (*pending)(void);
static int bad;
static void c(const char* outer, const char* inner, unsigned corr, long long stream) {
  if (call(outer, inner, corr, stream) != 0) { printf("unknown %s %s\n", outer, inner ? inner : ""); bad++; }
}
int main(int argc, char** argv) {
  void* h = dlopen(argv[1], RTLD_NOW);
  if (!h) { fprintf(stderr, "dlopen: %s\n", dlerror()); return 3; }
  int (*st)(int, int, int, int) = (int (*)(int, int, int, int))dlsym(h, "pp_inject_selftest");
  int (*live)(void) = (int (*)(void))dlsym(h, "pp_inject_cb_live");
  int (*start)(void) = (int (*)(void))dlsym(h, "pp_inject_cb_start");
  call = (int (*)(const char*, const char*, unsigned, long long))dlsym(h, "pp_inject_cb_call");
  pending = (long long (*)(void))dlsym(h, "pp_inject_cb_pending");
  const char* how = argv[2];
  if (st(0, 1, 0, 0) != 0) return 4;  /* no kernels: the two allocation records only */
  if (!strcmp(how, "start")) { printf("start %d\n", start()); return 0; }
  printf("live %d\n", live() > 0);
  for (unsigned i = 0; i < 3; ++i) c("cudaLaunchKernel_v7000", "cuLaunchKernel", 101 + 10 * i, 0);
  c("cudaStreamSynchronize_v3020", "cuStreamSynchronize", 201, 0x10);
  c("cudaStreamWaitEvent_ptsz_v7000", NULL, 202, 0x20);
  c("cudaStreamSynchronize_v3020", NULL, 203, 0xbad);
  c("cudaDeviceSynchronize_v3020", "cuCtxSynchronize", 204, 0);
  c("cudaEventSynchronize_v3020", NULL, 205, 0x30);
  c("cuStreamSynchronize", NULL, 206, 0x40);
  c("cudaMemcpy_v3020", NULL, 301, 0);
  c("cudaMemcpy_v3020", NULL, 302, 0);
  c("cudaGetDevice_v3020", NULL, 401, 0);
  c("cuMemAlloc_v2", NULL, 402, 0);
  printf("calls %d pending %lld\n", bad, pending());
  fflush(stdout);
  if (!strcmp(how, "abort")) abort();
  if (!strcmp(how, "term")) raise(SIGTERM);
  if (!strcmp(how, "child")) {
    pid_t p = fork();
    if (p == 0) {  /* the parent's rows are not the child's, and the child records none */
      long long before = pending();
      c("cudaLaunchKernel_v7000", NULL, 501, 0);
      _exit(before == 0 && pending() == 0 ? 0 : 1);
    }
    int status = 0;
    waitpid(p, &status, 0);
    printf("child %d pending %lld\n", WEXITSTATUS(status), pending());
  }
  return 5;
}
"""


@pytest.fixture(scope="module")
def prog(tmp_path_factory) -> tuple[Path, Path]:
    return selftest_driver(tmp_path_factory, "callbacks", PROG)


def _run(prog, out: Path, how: str, **extra: str) -> subprocess.CompletedProcess:
    cupti = libcupti_file()
    if cupti is None:
        pytest.skip("no libcupti on this machine (CUPTI's cbid names)")
    env = injection_env(out, PASTAPROF_NATIVE_CUPTI=cupti, **extra)
    return subprocess.run([str(prog[0]), str(prog[1]), how], capture_output=True, text=True, env=env, timeout=60)


def _one(out: Path):
    metas = sorted((out / "native").glob("rank-*-pid-*.json"))
    assert len(metas) == 1, metas
    return npg.read_process(metas[0].with_suffix(""))


CALLS = "live 1\ncalls 0 pending 11\n"
API_CORR = [101, 111, 121, 201, 202, 203, 204, 205, 206, 301, 302]


def _check_rows(meta, t) -> None:
    a = t["api"].to_pydict()
    # one row per outermost call: the nested cuLaunchKernel / cuStreamSynchronize / cuCtxSynchronize
    # are not rows, cudaGetDevice is not kept, cuMemAlloc only enables the MEMORY2 kind
    assert a["correlation"] == API_CORR
    assert a["name"] == ["cudaLaunchKernel_v7000"] * 3 + [
        "cudaStreamSynchronize_v3020", "cudaStreamWaitEvent_ptsz_v7000", "cudaStreamSynchronize_v3020",
        "cudaDeviceSynchronize_v3020", "cudaEventSynchronize_v3020", "cuStreamSynchronize", "cudaMemcpy_v3020",
        "cudaMemcpy_v3020"]
    assert a["api_kind"] == ["runtime"] * 8 + ["driver"] + ["runtime"] * 2
    assert set(a["pid"]) == {meta["pid"]} and len(set(a["tid"])) == 1 and a["tid"][0] > 0
    # CLOCK_REALTIME, the clock of the header's times (and of CUPTI's activity timestamps)
    assert all(meta["started_ns"] <= s <= e <= meta["updated_ns"] for s, e in zip(a["start_ns"], a["end_ns"]))
    y = t["sync"].to_pydict()
    assert y["correlation"] == [201, 202, 203, 204, 205, 206]
    assert y["sync_kind"] == ["stream", "stream_wait_event", "stream", "context", "event", "stream"]
    # the stream of a stream sync / wait by cuptiGetStreamIdEx (here: the handle, +1000 per-thread);
    # -1 where it fails (0xbad) and for event and context syncs, as the activity records have it
    assert y["stream"] == [0x10, 0x20 + 1000, -1, -1, -1, 0x40]
    assert y["start_ns"] == a["start_ns"][3:9] and y["end_ns"] == a["end_ns"][3:9]
    assert meta["stats"]["callback_rows"] == 11 and meta["stats"]["callback_dropped"] == 0
    assert meta["api_mechanism"] == "callbacks"
    # the lazily enabled kinds: each once, at its first call (CUPTI refuses without a driver: said)
    assert [k.split()[0] for k in meta["lazy_kinds"].split("; ")] == ["memcpy", "memory"]


def test_callback_rows_become_api_and_sync_rows(prog, tmp_path):
    r = _run(prog, tmp_path, "exit")
    assert (r.returncode, r.stdout) == (5, CALLS), r.stderr
    meta, t, status = _one(tmp_path)
    assert meta["complete"] is True and status == {}
    assert {k: v.num_rows for k, v in t.items()} == {"api": 11, "sync": 6, "alloc": 1, "free": 1}
    _check_rows(meta, t)


@pytest.mark.parametrize("how,code,ended", [("abort", -6, "signal 6"), ("term", -15, "signal 15")])
def test_rows_after_the_last_buffer_are_written_on_signals(prog, tmp_path, how, code, ended):
    """No CUPTI buffer completes after the calls: the signal's flush writes the callback rows."""
    r = _run(prog, tmp_path, how)
    assert (r.returncode, r.stdout) == (code, CALLS), r.stderr
    meta, t, _ = _one(tmp_path)
    assert meta["ended"] == ended
    _check_rows(meta, t)


def test_forked_child_starts_with_no_rows(prog, tmp_path):
    r = _run(prog, tmp_path, "child")
    assert (r.returncode, r.stdout) == (5, CALLS + "child 0 pending 11\n"), r.stderr
    meta, t, _ = _one(tmp_path)  # the parent's rows, once; the child's call is not among them
    assert t["api"]["correlation"].to_pylist() == API_CORR


def test_kinds_switch_the_rows(prog, tmp_path):
    """PASTAPROF_NATIVE_KINDS: without api no API rows (syncs stay), without sync no sync rows;
    memcpy off: no MEMCPY kind enabled, though the calls are rows."""
    r = _run(prog, tmp_path / "a", "exit", PASTAPROF_NATIVE_KINDS="kernel,sync,memcpy")
    assert r.returncode == 5, r.stderr
    meta, t, _ = _one(tmp_path / "a")
    assert "api" not in t and t["sync"].num_rows == 6 and meta["lazy_kinds"].split()[0] == "memcpy"
    assert meta["stats"]["callback_rows"] == 6
    r = _run(prog, tmp_path / "b", "exit", PASTAPROF_NATIVE_KINDS="kernel,api")
    meta, t, _ = _one(tmp_path / "b")
    assert "sync" not in t and t["api"].num_rows == 11 and meta["lazy_kinds"] == ""


def test_hybrid_leaves_launch_calls_to_activity_records(prog, tmp_path):
    """PASTAPROF_NATIVE_API_MECHANISM=hybrid: launch calls are CUPTI's per-call activity records,
    so the callbacks make no row for them; syncs, copies and the lazy kinds are as before."""
    r = _run(prog, tmp_path, "exit", PASTAPROF_NATIVE_API_MECHANISM="hybrid")
    assert r.returncode == 5 and r.stdout == "live 1\ncalls 0 pending 8\n", r.stderr
    meta, t, _ = _one(tmp_path)
    assert meta["api_mechanism"] == "hybrid"
    assert t["api"]["correlation"].to_pylist() == API_CORR[3:] and t["sync"].num_rows == 6


def test_mechanism_said_in_the_header_and_the_run(prog, tmp_path):
    r = _run(prog, tmp_path / "a", "start", PASTAPROF_NATIVE_API_MECHANISM="activity")
    assert r.stdout == "start 0\n", r.stderr
    meta, _, status = _one(tmp_path / "a")
    assert meta["api_mechanism"] == "activity (PASTAPROF_NATIVE_API_MECHANISM=activity)"
    assert "activity records: PASTAPROF_NATIVE_API_MECHANISM=activity" in status["native_note"]
    # nothing asked of the callbacks: no subscriber at all
    r = _run(prog, tmp_path / "b", "start", PASTAPROF_NATIVE_KINDS="kernel")
    assert r.stdout == "start 1\n", r.stderr
    meta, _, status = _one(tmp_path / "b")
    assert meta["api_mechanism"].startswith("callbacks (none needed") and "native_note" not in status
    # the default: the subscriber, or (no driver here: CUPTI refuses) the activity records, and why
    r = _run(prog, tmp_path / "c", "start")
    meta, _, status = _one(tmp_path / "c")
    if r.stdout == "start 1\n":
        assert meta["api_mechanism"] == "callbacks"
    else:
        assert r.stdout == "start 0\n" and meta["api_mechanism"].startswith("activity (cuptiSubscribe: ")
        assert "cuptiSubscribe" in status["native_note"]
    # through `pastaprof run`: run.json's process says which mechanism recorded its API calls
    out = tmp_path / "run"
    env = injection_env(tmp_path, PASTAPROF_NATIVE_CUPTI=libcupti_file())
    env.pop("PASTAPROF_OUT")
    r = subprocess.run([sys.executable, "-m", "pastaprof.cli", "run", "--out", str(out), "--", str(prog[0]),
                        str(prog[1]), "exit"], capture_output=True, text=True, env=env, timeout=120)
    assert (r.returncode, r.stdout) == (5, CALLS), r.stderr
    manifest = json.loads((out / "run.json").read_text())
    native_h = manifest["processes"][0]["handlers"]["native"]
    assert native_h["api_mechanism"] == "callbacks" and native_h["lazy_kinds"].split()[0] == "memcpy"
    assert manifest["rows"]["api"] == 11 and manifest["rows"]["sync"] == 6


# ---- pure functions, through the library's test entry points ---------------------------------

@pytest.fixture(scope="module")
def so(prog):
    lib = ctypes.CDLL(str(prog[1]))
    lib.pp_inject_sync_type.argtypes = lib.pp_inject_cb_class.argtypes = [ctypes.c_char_p]
    return lib


@pytest.mark.parametrize("name,want", [
    ("cudaEventSynchronize_v3020", 1), ("cuEventSynchronize", 1),
    ("cudaStreamWaitEvent_v3020", 2), ("cuStreamWaitEvent", 2), ("cudaStreamWaitEvent_ptsz_v7000", 2 + 256),
    ("cuStreamWaitEvent_ptsz", 2 + 256),
    ("cudaStreamSynchronize_v3020", 3), ("cuStreamSynchronize", 3), ("cudaStreamSynchronize_ptsz_v7000", 3 + 256),
    ("cuStreamSynchronize_ptsz", 3 + 256),
    ("cudaDeviceSynchronize_v3020", 4), ("cudaThreadSynchronize_v3020", 4), ("cuCtxSynchronize", 4),
    ("cuCtxSynchronize_v2", 4),
    ("cudaLaunchKernel_v7000", 0), ("cudaLaunchKernel_ptsz_v7000", 256), ("cuCtxWaitEvent", 0),
    ("cudaEventRecord_v3020", 0), ("cudaStreamQuery_v3020", 0),
])
def test_sync_type_of_a_name(so, name, want):
    """CUpti_ActivitySynchronizationType: 1 event sync, 2 stream wait event, 3 stream sync, 4 context sync."""
    assert so.pp_inject_sync_type(name.encode()) == want


API, PT, MEMCPY, MEMSET, MEMORY = 1, 16, 32, 64, 128


@pytest.mark.parametrize("kinds,name,want", [
    ("", "cudaLaunchKernel_v7000", API),
    ("", "cudaMemcpyAsync_v3020", API | MEMCPY),
    ("", "cuMemcpyHtoD_v2", API | MEMCPY),
    ("", "cudaMemsetAsync_v3020", API | MEMSET),
    ("", "cudaStreamSynchronize_ptsz_v7000", API | 3 << 1 | PT),
    ("", "cuEventSynchronize", API | 1 << 1),
    ("", "cudaMalloc_v3020", API | MEMORY),
    ("", "cuMemFree_v2", API | MEMORY),
    ("", "cuMemAlloc_v2", MEMORY),  # not a kept call: it only enables the MEMORY2 kind
    ("", "cudaHostAlloc_v3020", MEMORY),
    ("", "cudaGetDevice_v3020", 0),
    ("kernel", "cudaMemcpyAsync_v3020", 0),  # KINDS=kernel: no callback at all
    ("kernel", "cudaStreamSynchronize_v3020", 0),
    ("kernel,memcpy", "cudaMemcpyAsync_v3020", MEMCPY),  # enables MEMCPY, writes no row
    ("kernel,sync", "cudaDeviceSynchronize_v3020", 4 << 1),
    ("kernel,api", "cudaDeviceSynchronize_v3020", API),
    ("kernel,memory", "cudaFree_v3020", MEMORY),
])
def test_class_of_a_call(so, monkeypatch, kinds, name, want):
    if kinds:
        monkeypatch.setenv("PASTAPROF_NATIVE_KINDS", kinds)
    else:
        monkeypatch.delenv("PASTAPROF_NATIVE_KINDS", raising=False)
    assert so.pp_inject_cb_class(name.encode()) == want
