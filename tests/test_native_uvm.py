"""Unified-memory counters of native programs (``pastaprof run --uvm``): the injection library's
UNIFIED_MEMORY_COUNTER records (native/inject.c, configured in inject_cupti.c) and their decode
into the run's ``uvm`` kind (handlers/native_program.py), on a machine without a GPU.  Synthetic
CUPTI records go through the library's own decode and writer (``pp_inject_selftest_uvm``); the
GPU half (a real managed-memory program) is scripts/gpu_native_check.py, part uvm."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import injection_env, selftest_driver

from pastaprof import native
from pastaprof.handlers import native_program as npg

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None or not native.cupti_include_dirs(),
                                reason="needs gcc and the CUPTI headers")

PROG = r"""
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
int main(int argc, char** argv) {
  void* h = dlopen(argv[1], RTLD_NOW);
  if (!h) { fprintf(stderr, "dlopen: %s\n", dlerror()); return 3; }
  int (*st)(int) = (int (*)(int))dlsym(h, "pp_inject_selftest_uvm");
  printf("uvm %d\n", st(atoi(argv[2])));
  return 0;
}
"""

PAGES = 16  # a managed allocation of 16 x 64 KiB; 16 HtoD x 64 KiB, 1 GPU fault record of 4 groups, 8 CPU faults, 8 DtoH x 4 KiB


@pytest.fixture(scope="module")
def prog(tmp_path_factory) -> tuple[Path, Path]:
    return selftest_driver(tmp_path_factory, "uvm", PROG)


def _run(prog: tuple[Path, Path], out: Path, **extra: str):
    env = injection_env(out, **extra)
    r = subprocess.run([str(prog[0]), str(prog[1]), str(PAGES)], capture_output=True, text=True, env=env, timeout=60)
    assert (r.returncode, r.stdout) == (0, "uvm 0\n"), r.stderr
    metas = sorted((out / "native").glob("rank-*-pid-*.json"))
    assert len(metas) == 1
    return npg.read_process(metas[0].with_suffix(""))


def test_uvm_records_become_the_python_paths_uvm_rows(prog, tmp_path):
    meta, t, status = _run(prog, tmp_path)
    assert set(t) == {"uvm", "alloc"} and meta["stats"]["records"] == 1 + PAGES + 1 + PAGES // 2 * 2
    assert t["alloc"]["memory_kind"].to_pylist() == ["managed"] and t["alloc"]["bytes"].to_pylist() == [PAGES << 16]
    assert "uvm" not in status  # not asked for (no PASTAPROF_UVM): no counters status
    u = t["uvm"].to_pydict()
    kinds = np.array(u["uvm_kind"])
    assert (kinds == "htod").sum() == PAGES and (kinds == "gpu_page_fault").sum() == 1
    assert (kinds == "cpu_page_fault").sum() == PAGES // 2 and (kinds == "dtoh").sum() == PAGES // 2
    b = np.array([x if x is not None else -1 for x in u["bytes"]])
    assert b[kinds == "htod"].sum() == PAGES * 65536 and b[kinds == "dtoh"].sum() == PAGES // 2 * 4096
    assert set(b[(kinds == "gpu_page_fault") | (kinds == "cpu_page_fault")]) == {-1}  # faults carry counts, no bytes
    count = {k: [c for c, kk in zip(u["count"], kinds) if kk == k] for k in ("gpu_page_fault", "cpu_page_fault")}
    assert count["gpu_page_fault"] == [PAGES // 4] and count["cpu_page_fault"] == [1] * (PAGES // 2)
    assert all(c is None for c, k in zip(u["count"], kinds) if k in ("htod", "dtoh"))
    cause = dict(zip(kinds, u["cause"]))
    assert cause == {"htod": "coherence", "dtoh": "coherence", "gpu_page_fault": "write", "cpu_page_fault": "read"}
    # the GPU involved: HtoD's destination, DtoH's source; the CPU is -1
    assert {(k, s, d, g) for k, s, d, g in zip(kinds, u["src_device"], u["dst_device"], u["device"])} == {
        ("htod", -1, 0, 0), ("dtoh", 0, -1, 0), ("gpu_page_fault", 0, 0, 0), ("cpu_page_fault", -1, -1, -1)}
    t0 = 1700000000000000000
    i = np.arange(len(kinds))
    assert u["start_ns"] == (t0 + 1000 * i).tolist()  # written in order, so stored sorted as written
    end = np.array(u["end_ns"])
    assert (end[kinds == "cpu_page_fault"] == np.array(u["start_ns"])[kinds == "cpu_page_fault"]).all()  # instants
    assert (end[kinds == "htod"] == np.array(u["start_ns"])[kinds == "htod"] + 400).all()
    assert u["address"][:PAGES] == [0x7F1000000000 + 65536 * j for j in range(PAGES)]
    assert set(u["stream"]) == {7} and set(u["rank"]) == {0}


def test_uvm_refused_is_one_status_line_and_the_records_stay(prog, tmp_path):
    """With --uvm the library configures the counters through the real libcupti; on this machine
    (no driver) CUPTI refuses, and that is one line of the process's status, nothing more."""
    cupti = native.system_libcupti()
    if cupti is None:
        pytest.skip("no libcupti on this machine")
    meta, t, status = _run(prog, tmp_path, PASTAPROF_UVM="1", PASTAPROF_NATIVE_CUPTI=cupti)
    assert t["uvm"].num_rows == PAGES + 1 + PAGES // 2 * 2 and meta["status"] == "ok"
    line = status["uvm"]
    assert "\n" not in line and line != "ok", line
    assert line.startswith("unified-memory counters not supported here (") and "the rest of the capture goes on" in line
    assert set(status) == {"uvm"}


def test_convert_stores_uvm_parts(prog, tmp_path):
    run = tmp_path / "run"
    _run(prog, run)
    rows = npg.convert(run)
    assert rows == {"uvm": PAGES + 1 + PAGES // 2 * 2, "alloc": 1}
    assert len(list((run / "uvm").glob("rank-0-pid-*-part-00000.parquet"))) == 1


def test_uvm_reaches_the_childs_environment(prog, tmp_path):
    """--uvm is PASTAPROF_UVM=1 in the program's environment (the library reads it); a chosen
    tool that reads uvm (uvm_advisor) turns it on for a native program too."""
    from pastaprof.live.config import CaptureConfig

    assert CaptureConfig.from_env({"PASTAPROF_UVM": "1"}).to_env()["PASTAPROF_UVM"] == "1"
    assert "PASTAPROF_UVM" not in CaptureConfig.from_env({}).to_env()
    if native.system_libcupti() is None:
        pytest.skip("no libcupti on this machine")
    cfg = CaptureConfig.from_env({"PASTAPROF_TOOLS": "uvm_advisor"})
    env = {"PASTAPROF_NATIVE_INJECT": "1"}
    assert npg.prepare(env, ["./app"], cfg) is None and env["PASTAPROF_UVM"] == "1"
    env = {"PASTAPROF_NATIVE_INJECT": "1"}
    npg.prepare(env, ["./app"], CaptureConfig.from_env({"PASTAPROF_TOOLS": "kernels"}))
    assert "PASTAPROF_UVM" not in env


def _pastaprof_run(tmp: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PASTAPROF_", "CUDA_INJECTION", "NVTX_INJ"))}
    env.update(PASTAPROF_NATIVE_INJECT="1", PASTAPROF_CACHE=os.environ["PASTAPROF_CACHE"])  # prepared without a driver
    return subprocess.run([sys.executable, "-m", "pastaprof.cli", "run", "--out", str(tmp / "run"), *args],
                          capture_output=True, text=True, env=env, timeout=120)


def test_pastaprof_run_uvm_flag_reaches_the_native_program(prog, tmp_path):
    if native.system_libcupti() is None:
        pytest.skip("no libcupti on this machine")
    r = _pastaprof_run(tmp_path / "a", "--uvm", "--", "/bin/sh", "-c",
                       'echo "uvm=$PASTAPROF_UVM injected=${CUDA_INJECTION64_PATH:+yes}"')
    assert r.returncode == 0 and r.stdout == "uvm=1 injected=yes\n", r.stderr
    r = _pastaprof_run(tmp_path / "b", "--", "/bin/sh", "-c", 'echo "uvm=$PASTAPROF_UVM"')
    assert r.returncode == 0 and r.stdout == "uvm=\n", r.stderr
    # the library in the program reads it: the counters are configured (refused here: one line), records stored
    r = _pastaprof_run(tmp_path / "c", "--uvm", "--", str(prog[0]), str(prog[1]), str(PAGES))
    assert r.returncode == 0 and r.stdout == "uvm 0\n", r.stderr
    assert r.stderr.count("unified-memory counters not supported here") == 1, r.stderr
    assert "(1 alloc, 33 uvm)" in r.stderr, r.stderr
    # the tool that reads uvm reports the counters the program's records carry
    j = tmp_path / "uvm.json"
    a = subprocess.run([sys.executable, "-m", "pastaprof.cli", "analyze", str(tmp_path / "c" / "run"), "-t",
                        "uvm_advisor", "--json", str(j), "-q"], capture_output=True, text=True, timeout=120)
    assert a.returncode == 0, a.stderr
    s = json.loads(j.read_text())["tools"]["uvm_advisor"]["summary"]
    assert (s["htod_bytes"], s["dtoh_bytes"], s["gpu_faults"]) == (PAGES << 16, PAGES // 2 * 4096, PAGES // 4), s
    assert s["allocations"] == 1 and s["unattributed"] == 0, s
