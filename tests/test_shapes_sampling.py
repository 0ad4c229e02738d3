"""`--shapes sample` (the default), `all` and `none`: which ops' inputs RecordFunction boxes.

The native observer's own callback asks for no inputs; a second callback that does is enabled
for the first SAMPLE_FIRST ops and then for sampled windows (native/torch_sampling.cpp).  These
tests run real programs under `pastaprof run` (real torch, the real C++ observer) and check the
counts: every op is still recorded, the ops with shapes are exactly those the sampler boxed, the
first ops all have theirs, a sampled op's shapes are its own (never a stale neighbour's), and the
ops and memory tools say the shapes are sampled.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections import defaultdict
from pathlib import Path

import pyarrow.compute as pc
import pytest

import pastaprof
from pastaprof.errors import UsageError
from pastaprof.handlers.torch_native import SAMPLE_FIRST
from pastaprof.live.config import CaptureConfig
from pastaprof.tools._memory_patterns import _incomplete_ranks

torch = pytest.importorskip("torch")

PP = [sys.executable, "-m", "pastaprof.cli", "run"]

# ~28,000 ops, two layer widths (each op name has a few fixed shapes), then one new op
APP = textwrap.dedent("""
    import torch
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(64, 48), torch.nn.ReLU(), torch.nn.Linear(48, 10))
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    xs = [torch.randn(32, 64), torch.randn(16, 64)]
    for i in range(260):
        m(xs[i % 2]).sum().backward()
        opt.step()
        opt.zero_grad()
    print("done", flush=True)
""")


def _native() -> bool:
    from pastaprof import native

    try:
        native.load("torch")
    except RuntimeError:
        return False
    return True


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    if not _native():
        pytest.skip("the native op observer does not build here")
    d = tmp_path_factory.mktemp("shapes")
    app = d / "app.py"
    app.write_text(APP)
    out = {}
    for mode in ("sample", "all", "none"):
        flags = ("--no-shapes",) if mode == "none" else ("--shapes", mode)
        r = subprocess.run([*PP, "-o", str(d / mode), *flags, "--", sys.executable, str(app)],
                           capture_output=True, text=True, env=dict(os.environ, PASTAPROF_FLUSH_MS="200"))
        assert r.returncode == 0 and r.stdout == "done\n", r.stderr[-2000:]
        out[mode] = d / mode
    return out


def _shapes_info(run: Path) -> dict:
    return json.loads((run / "run.json").read_text())["processes"][0]["handlers"]["torch"]["shapes"]


def _ops(run: Path):
    return pastaprof.load(run).table("op")


def test_every_op_is_recorded_in_each_mode(runs):
    counts = {m: _ops(r).num_rows for m, r in runs.items()}
    assert counts["sample"] == counts["all"] == counts["none"] > 25_000


def test_sampled_rows_are_exactly_the_boxed_ops(runs):
    info, ops = _shapes_info(runs["sample"]), _ops(runs["sample"])
    with_shapes = ops.num_rows - ops["input_shapes"].null_count
    assert info["mode"] == "sample" and info["ops_with_shapes"] == with_shapes
    assert SAMPLE_FIRST <= with_shapes < info["ops"]  # the first ops, then a sample: fewer than all
    assert info["windows"] >= 2 and info["toggles"] >= 2 * info["windows"] - 1
    every = _shapes_info(runs["all"])
    assert every["mode"] == "all" and every["ops_with_shapes"] == every["ops"] == info["ops"]
    assert every["windows"] == every["toggles"] == 0
    none = _shapes_info(runs["none"])
    assert none == {"mode": "none"} and _ops(runs["none"])["input_shapes"].null_count == _ops(runs["none"]).num_rows


def test_the_first_ops_all_have_their_shapes(runs):
    every = _ops(runs["all"])
    nodes = set(pc.unique(every.filter(pc.is_null(every["input_shapes"]))["name"].cast("string")).to_pylist())
    assert nodes and all("Backward" in n or "autograd::" in n for n in nodes)  # autograd nodes only
    ops = _ops(runs["sample"]).sort_by("id")
    calls = ops.filter(pc.invert(pc.is_in(ops["name"].cast("string"), pc.cast(list(nodes), "string"))))
    first = calls.slice(0, SAMPLE_FIRST)  # the ops RecordFunction's FUNCTION scope saw first
    assert first["input_shapes"].null_count == 0
    later = calls.slice(SAMPLE_FIRST + 2_100)
    assert 0 < later.num_rows - later["input_shapes"].null_count < later.num_rows // 4  # sampled windows


def test_a_sampled_op_carries_its_own_shapes(runs):
    """An unboxed op never takes a boxed neighbour's inputs: every (name, module) shape seen in
    sample mode is one that op has with every op's shapes recorded."""
    def shapes_by(run: Path) -> dict:
        ops = _ops(run)
        seen = defaultdict(set)
        for n, mod, s in zip(ops["name"].to_pylist(), ops["module"].to_pylist(), ops["input_shapes"].to_pylist(),
                             strict=True):
            if s is not None:
                seen[(n, mod)].add(s)
        return seen
    every, sample = shapes_by(runs["all"]), shapes_by(runs["sample"])
    assert set(sample) == set(every)  # each op (and module) has shapes from its first calls
    for key, shapes in sample.items():
        assert shapes <= every[key], key
    addmm = [k for k in every if k[0] == "aten::addmm"]
    assert addmm and all(len(every[k]) == 2 for k in addmm)  # both batch sizes, told apart


def test_ops_tool_says_shapes_are_sampled(runs):
    sample, every = (pastaprof.analyze(runs[m], tools=["ops"])[0] for m in ("sample", "all"))
    assert sample.summary["shapes"] == "sampled" and every.summary["shapes"] == "all"
    assert 0 < sample.summary["forward_ops_with_shapes"] < every.summary["forward_ops_with_shapes"]
    assert any(f.title == "input shapes are from a sample of the calls" for f in sample.findings)
    assert not any("sample" in f.title for f in every.findings)
    # the most common shape of an op is one of its shapes, not the unsampled calls' null
    by_name = {r["name"]: r["input_shapes"] for r in sample.tables["ops"].to_pylist()}
    addmm = {r["input_shapes"] for r in every.details["per op"].to_pylist() if r["name"] == "aten::addmm"}
    assert by_name["aten::addmm"] in addmm - {None} and by_name["aten::relu"] is not None


def test_memory_uses_need_every_ops_pointers(runs):
    """Sampled input pointers cannot prove a block unused: the rank counts as incomplete."""
    for mode, incomplete in (("sample", {0}), ("all", set())):
        manifest = json.loads((runs[mode] / "run.json").read_text())
        assert _incomplete_ranks(manifest) == incomplete, mode


def test_shapes_setting_is_validated_and_the_memory_tool_takes_all():
    assert CaptureConfig().shapes == "sample"
    assert CaptureConfig(tools=("ops", "memory")).shapes == "all"
    assert CaptureConfig(shapes=False).shapes == "none"
    env = {"PASTAPROF_SHAPES": "ALL"}
    assert CaptureConfig.from_env(env).shapes == "all"
    assert CaptureConfig.from_env({"PASTAPROF_SHAPES": "0"}).shapes == "none"
    assert CaptureConfig.from_env({"PASTAPROF_SHAPES": "1"}).shapes == "sample"
    assert CaptureConfig.from_env({"PASTAPROF_SHAPES": "sample", "PASTAPROF_TOOLS": "memory"}).shapes == "sample"
    assert CaptureConfig.from_env({"PASTAPROF_TOOLS": "memory"}).shapes == "all"
    assert CaptureConfig.from_env(CaptureConfig(shapes="all").to_env()).shapes == "all"  # children inherit it
    with pytest.raises(UsageError, match="expected sample, all or none"):
        CaptureConfig.from_env({"PASTAPROF_SHAPES": "most"})


def test_bad_shapes_flag_stops_before_the_program(tmp_path):
    marker = tmp_path / "ran"
    r = subprocess.run([*PP, "-o", str(tmp_path / "run"), "--shapes", "every", "--", sys.executable, "-c",
                        f"open({str(marker)!r}, 'w')"], capture_output=True, text=True)
    assert r.returncode == 2 and not marker.exists() and not (tmp_path / "run").exists()
    assert r.stderr.count("\n") == 1 and "PASTAPROF_SHAPES='every'" in r.stderr and "Traceback" not in r.stderr


THREADS_APP = textwrap.dedent("""
    import threading, torch, pastaprof
    a4, b4 = torch.zeros(4), torch.ones(4)
    a8, b8 = torch.zeros(8), torch.ones(8)
    def adds():
        for _ in range(16000):
            a4.add_(b4)
    def muls():
        for _ in range(16000):
            a8.mul_(b8)
    for step in range(4):          # --steps 1:3: the observer is removed and re-added while sampling
        ts = [threading.Thread(target=adds), threading.Thread(target=muls)]
        for t in ts: t.start()
        for t in ts: t.join()
        pastaprof.step()
    print(float(a4.sum()), float(a8.sum()), flush=True)
""")


def test_threads_and_gate_switches_keep_each_ops_own_shapes(tmp_path):
    """Two threads' ops toggle the sampler while the session's gate removes and re-adds the
    observer: no callback is lost or unmatched (torch warns of either), each sampled op has its
    own shapes, and the program's output is its own."""
    if not _native():
        pytest.skip("the native op observer does not build here")
    app = tmp_path / "threads.py"
    app.write_text(THREADS_APP)
    bare = subprocess.run([sys.executable, str(app)], capture_output=True, text=True)
    r = subprocess.run([*PP, "-o", str(tmp_path / "run"), "--steps", "1:3", "--", sys.executable, str(app)],
                       capture_output=True, text=True, env=dict(os.environ, PASTAPROF_FLUSH_MS="200"))
    assert r.returncode == 0 and r.stdout == bare.stdout == "256000.0 0.0\n", r.stderr[-2000:]
    assert "callback is not found" not in r.stderr and "Could not match" not in r.stderr
    ops = _ops(tmp_path / "run")
    top = ops.filter(pc.equal(ops["depth"], 0))
    names = top["name"].cast("string").to_pylist()
    assert names.count("aten::add_") == names.count("aten::mul_") == 32000  # steps 1 and 2, every op
    shapes = {(n, s) for n, s in zip(names, top["input_shapes"].to_pylist(), strict=True) if s is not None}
    assert shapes == {("aten::add_", "[[4],[4],[]]"), ("aten::mul_", "[[8],[8]]")}
    info = _shapes_info(tmp_path / "run")
    assert info["mode"] == "sample" and info["windows"] >= 1 and 0 < info["ops_with_shapes"] < info["ops"]
