"""The PASTAPROF_NATIVE_* knobs of the injection library (native/inject_cupti.c): CUPTI activity
attributes set before the buffers are registered, and zeroed activity buffers.  On a machine
without a GPU: the knobs go through the real libcupti's cuptiActivitySetAttribute (which answers
without a driver), the buffers through the library's own CUPTI buffer callbacks.  What each knob
costs a launch-bound loop is measured on the H200 (scripts/gpu_native_check.py, part loop)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import injection_env, libcupti_file, selftest_driver

from pastaprof import native

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None or not native.cupti_include_dirs(),
                                reason="needs gcc and the CUPTI headers")

PROG = r"""
#include <dlfcn.h>
#include <stdio.h>
int main(int argc, char** argv) {
  void* h = dlopen(argv[1], RTLD_NOW);
  if (!h) { fprintf(stderr, "dlopen: %s\n", dlerror()); return 3; }
  int (*st)(int, int, int, int) = (int (*)(int, int, int, int))dlsym(h, "pp_inject_selftest");
  int (*bc)(void) = (int (*)(void))dlsym(h, "pp_inject_buffer_check");
  int r = st(10, 2, 1, 1);
  printf("selftest %d buffers %d\n", r, bc());
  return 0;
}
"""

ALL = {"PASTAPROF_NATIVE_ZEROED": "1", "PASTAPROF_NATIVE_PINNED": "1", "PASTAPROF_NATIVE_DEVBUF_MB": "32",
       "PASTAPROF_NATIVE_DEVBUF_PRE": "4", "PASTAPROF_NATIVE_PERTHREAD": "0"}


@pytest.fixture(scope="module")
def prog(tmp_path_factory) -> tuple[Path, Path]:
    return selftest_driver(tmp_path_factory, "knobs", PROG)


def _run(prog: tuple[Path, Path], out: Path, **knobs: str) -> tuple[str, dict]:
    env = injection_env(out, **knobs)
    r = subprocess.run([str(prog[0]), str(prog[1])], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    metas = sorted((out / "native").glob("rank-*-pid-*.json"))
    assert len(metas) == 1, metas
    return r.stdout.strip(), json.loads(metas[0].read_text())


def test_unset_knobs_change_nothing(prog, tmp_path):
    out, meta = _run(prog, tmp_path)
    # the buffer came back for reuse as before (not zeroed: CUPTI zeroes it itself without the knob)
    assert out == "selftest 0 buffers 0"
    assert meta["status"] == "ok" and "knobs" not in meta and "note" not in meta
    assert meta["stats"]["kernels_seen"] == 10 and meta["stats"]["written"] == 25
    assert meta["stats"]["buffers"] == 2


def test_zeroed_buffers_fresh_and_reused(prog, tmp_path):
    out, meta = _run(prog, tmp_path, PASTAPROF_NATIVE_ZEROED="1", PASTAPROF_NATIVE_BUFFER=str(1 << 20))
    # pp_test_buffers filled the first buffer with 0x5a, completed it and got it back all zeros
    assert out == "selftest 0 buffers 0"
    assert meta["knobs"].startswith("PASTAPROF_NATIVE_ZEROED=1 ") and meta["note"] == meta["knobs"]
    assert meta["stats"]["written"] == 25  # records unchanged by the knob


@pytest.mark.skipif(libcupti_file() is None, reason="needs a libcupti")
def test_each_knob_reaches_cuptiActivitySetAttribute(prog, tmp_path):
    out, meta = _run(prog, tmp_path, PASTAPROF_NATIVE_CUPTI=libcupti_file(), **ALL)
    assert out == "selftest 0 buffers 0"
    said = meta["knobs"].split("; ")
    assert [s.split(" ")[0] for s in said] == [f"{k}={v}" for k, v in ALL.items()]
    # CUPTI's own answer per knob: ok with a driver; without one (this machine) its error string
    for s in said:
        assert s.endswith(" ok") or "not applied: CUPTI_ERROR_" in s, s
    assert meta["note"] == meta["knobs"]  # the run's status shows what took
    assert meta["status"] == "ok"  # a refused knob is not fatal


def test_bad_values_are_ignored_and_said(prog, tmp_path):
    out, meta = _run(prog, tmp_path, PASTAPROF_NATIVE_PINNED="7", PASTAPROF_NATIVE_DEVBUF_MB="x",
                     PASTAPROF_NATIVE_DEVBUF_PRE="250", PASTAPROF_NATIVE_PERTHREAD="")
    assert out == "selftest 0 buffers 0"
    assert meta["note"] == ("PASTAPROF_NATIVE_PINNED=7 ignored (not 0..1); PASTAPROF_NATIVE_DEVBUF_MB=x ignored "
                            "(not 1..4096); PASTAPROF_NATIVE_DEVBUF_PRE=250 ignored (not 0..249)")
    assert "knobs" not in meta and meta["status"] == "ok"


def test_without_libcupti_a_knob_is_said_not_applied(prog, tmp_path):
    out, meta = _run(prog, tmp_path, PASTAPROF_NATIVE_DEVBUF_MB="64")
    assert out == "selftest 0 buffers 0"
    assert meta["knobs"] == "PASTAPROF_NATIVE_DEVBUF_MB=64 not applied: cuptiActivitySetAttribute not bound"
    assert meta["note"] == meta["knobs"]
