"""The third-party tool of docs/writing-a-tool.md, installed as its own package and
discovered through the ``pastaprof.tools`` entry point."""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

import pastaprof

ROOT = Path(__file__).resolve().parents[1]
PLUGIN = ROOT / "examples" / "plugin"


def test_doc_shows_exactly_the_shipped_example():
    doc = (ROOT / "docs" / "writing-a-tool.md").read_text()
    code = re.search(r"```python\n(.*?)```", doc, re.S).group(1)
    src = (PLUGIN / "src" / "pastaprof_outliers.py").read_text()
    assert code == src
    assert len(src.strip().splitlines()) <= 30


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    target = tmp_path_factory.mktemp("plugin-site")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--no-index", "--target", str(target), str(PLUGIN)], check=True)
    return target


def _env(site: Path) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(site), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def test_plugin_is_discovered_and_its_numbers_are_right(installed, tmp_path):
    listed = subprocess.run([sys.executable, "-m", "pastaprof.cli", "tools"], capture_output=True, text=True,
                            env=_env(installed), check=True).stdout
    assert "kernel_outliers" in listed and "3x the median" in listed
    out = tmp_path / "f.json"
    subprocess.run([sys.executable, "-m", "pastaprof.cli", "analyze", "--example", "-t", "kernel_outliers", "-q",
                    "--json", str(out)], env=_env(installed), check=True)
    got = json.loads(out.read_text())["tools"]["kernel_outliers"]
    # independent recomputation from the example's kernels
    k = pastaprof.load(pastaprof.example_path()).table("kernel").to_pydict()
    by_name = defaultdict(list)
    for n, s, e in zip(k["name"], k["start_ns"], k["end_ns"]):
        by_name[n].append(e - s)
    expect = {n: sum(1 for d in ds if d > 3 * statistics.median(ds)) for n, ds in by_name.items()}
    expect = {n: c for n, c in expect.items() if c}
    assert got["summary"]["slow_launches"] == sum(expect.values()) > 0
    assert {r["name"]: r["slow_launches"] for r in got["tables"]["outliers"]} == expect
