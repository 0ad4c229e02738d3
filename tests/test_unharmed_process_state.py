"""What a captured program sees of its own process is what it sees bare: sys.path and the
modules it did not import, os.environ (and the environment its children get), and its
threads.  tests/data/unharmed/observe.py prints each aspect on a labelled line, once the
capture session runs; it runs bare and under the real ``pastaprof run``, and each line must
be the same."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import pastaprof

pytest.importorskip("torch")

PROGRAM = Path(__file__).parent / "data" / "unharmed" / "observe.py"


def _env(**extra: str) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if not k.startswith("PASTAPROF_")}, **extra}


def _lines(stdout: str) -> dict[str, str]:
    return dict(line.split(":", 1) for line in stdout.splitlines())


@pytest.fixture(scope="module")
def observed(tmp_path_factory) -> tuple[dict[str, str], dict[str, str], Path]:
    tmp = tmp_path_factory.mktemp("observe")
    cmd = [sys.executable, str(PROGRAM)]
    bare = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp, env=_env(), timeout=300)
    assert bare.returncode == 0, bare.stderr
    run = subprocess.run([sys.executable, "-m", "pastaprof.cli", "run", "-o", str(tmp / "run"), "--", *cmd],
                         capture_output=True, text=True, cwd=tmp, env=_env(), timeout=300)
    assert run.returncode == 0, run.stderr
    assert [ln for ln in run.stderr.splitlines() if not ln.startswith("pastaprof:")] == \
        [ln for ln in bare.stderr.splitlines() if not ln.startswith("pastaprof:")]
    return _lines(bare.stdout), _lines(run.stdout), tmp / "run"


def _same(observed, *labels: str) -> None:
    bare, run, _ = observed
    for label in labels:
        assert label in bare, bare
        assert run.get(label) == bare[label]


def test_sys_path_and_modules_as_bare(observed):
    """Building/keying the native op observer imported torch.utils.cpp_extension in the program,
    which imports setuptools: its _vendor directory went onto the program's sys.path (older
    vendored packages shadowing the installed ones) and its distutils into sys.modules."""
    _same(observed, "path", "modules")


def test_environment_as_bare_and_children_still_captured(observed):
    """os.environ showed PYTHONPATH=<bootstrap>; a program that sets PYTHONPATH itself left its
    children uncaptured.  Both children (one given a copy of os.environ, one after the program
    set its own PYTHONPATH) see what they see bare, and both are captured."""
    _same(observed, "env", "pythonpath", "env copy", "child", "child own path")
    m = json.loads((observed[2] / "run.json").read_text())
    children = {p["pid"] for p in m["processes"] if p["argv"] == ["-c"]}
    ops = pastaprof.load(observed[2]).table("op")
    with_adds = {pid for pid, name in zip(ops["pid"].to_pylist(), ops["name"].to_pylist()) if name == "aten::add"}
    assert len(children) == 2 and children <= with_adds, m["processes"]


def test_threads_as_bare(observed):
    """threading.enumerate() and active_count() listed the capture's flush, deadline, spill and
    signal threads."""
    _same(observed, "threads")
