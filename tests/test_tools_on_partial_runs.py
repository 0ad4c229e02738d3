"""Every registered tool on runs that lack kinds (issue E: a report, never a traceback).

Real runs hold only some kinds: a CPU-only capture has no kernels, a memory snapshot has no
API calls, one rank of a job may have recorded nothing.  Each tool must then report what it can
(or say it has no data), whatever subset of kinds arrives.  Each real run below is cut to: every
kind but one, one kind alone, and every kind present but empty; each cut's reports also render
as HTML, its events as a Perfetto trace, and it compares against the whole run."""

from __future__ import annotations

from pathlib import Path

import pytest

import pastaprof
from pastaprof.events.schema import KINDS
from pastaprof.report.html import write_html
from pastaprof.report.perfetto import write_perfetto
from pastaprof.store.run import Run
from pastaprof.tools.registry import available

DATA = Path(__file__).parent / "data"
SOURCES = {
    "kineto": DATA / "mlp_train_3steps.pt.trace.json.gz",
    "nsys_2_ranks": DATA / "nsys" / "mfu_2gpu_before.sqlite",
    "memory_snapshot": DATA / "snapshots" / "recorded" / "leak.pickle",
}


def _cuts(tables: dict) -> list[tuple[str, dict]]:
    present = [k for k in KINDS if tables[k].num_rows]
    cuts = [(f"without {k}", {x: t for x, t in tables.items() if x != k}) for k in present]
    cuts += [(f"only {k}", {k: tables[k]}) for k in present]
    cuts.append(("every kind empty", {x: t.slice(0, 0) for x, t in tables.items()}))
    return cuts


@pytest.mark.parametrize("fmt", sorted(SOURCES))
def test_every_tool_reports_on_every_cut_of_a_real_run(fmt, tmp_path):
    path = SOURCES[fmt]
    if not path.exists():
        pytest.skip(f"{path} not in this checkout")
    tools = sorted(available())
    run = pastaprof.load(path)
    tables = {k: run.table(k) for k in KINDS}
    cuts = _cuts(tables)
    assert len(cuts) >= 5  # the run has kinds to cut
    for what, cut in cuts:
        part = Run(run.manifest, tables=cut)
        reports = pastaprof.analyze(part, tools)
        assert sorted(r.tool for r in reports) == tools, what
        assert write_html(reports, tmp_path / "r.html", str(path)) > 0, what
        write_perfetto(part, tmp_path / "t.pftrace")
        assert pastaprof.diff(run, part) is not None, what
        if "kernel" in cut and cut["kernel"].num_rows:  # what the cut keeps is still counted
            counted = sum(next(r for r in reports if r.tool == "kernels").tables["kernels"]["launches"].to_pylist())
            assert counted == cut["kernel"].num_rows, (what, counted)
