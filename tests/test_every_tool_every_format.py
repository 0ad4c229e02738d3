"""Every registered tool on a run of every format pastaprof reads (issue K: "every existing tool
runs on each imported run"): a report from each, never an exception, and the numbers that the
format holds reach the tools that count them (kernels, memory)."""

from __future__ import annotations

from pathlib import Path

import pytest

import pastaprof
from pastaprof.tools.registry import available

DATA = Path(__file__).parent / "data"
SOURCES = {
    "kineto": DATA / "mlp_train_3steps.pt.trace.json.gz",
    "nsys-sqlite": DATA / "nsys" / "mfu_2gpu_before.sqlite",
    "rocpd": DATA / "rocpd" / "single_3.0.3.db",
    "memory_snapshot": DATA / "snapshots" / "recorded" / "leak.pickle",
    "execution_trace": DATA / "recorded" / "et_beside_kineto" / "rank-0.et.json.gz",
}


@pytest.mark.parametrize("fmt", sorted(SOURCES))
def test_every_tool_reports_on_every_format(fmt):
    path = SOURCES[fmt]
    if not path.exists():
        pytest.skip(f"{path} not in this checkout")
    tools = sorted(available())
    run = pastaprof.load(path)
    reports = {r.tool: r for r in pastaprof.analyze(run, tools)}
    assert set(reports) == set(tools)
    for name, rep in reports.items():
        assert isinstance(rep.summary, dict) and isinstance(rep.tables, dict), name
    kernels = run.table("kernel").num_rows
    if kernels:  # the kernels tool counts every kernel the import stored
        counted = sum(reports["kernels"].tables["kernels"]["launches"].to_pylist())
        assert counted == kernels, (fmt, counted, kernels)
    if fmt == "memory_snapshot":  # the recording's own max_memory_allocated()
        assert reports["memory"].summary["peak_bytes"] == 82187264
