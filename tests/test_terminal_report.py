"""The terminal report as a user reads it: real CLI subprocesses on real traces, piped.

Findings come first, largest time at stake first; everything fits the width (``COLUMNS``,
also when piped); kernel names are shortened to what identifies them, never to a bare
namespace; finding ids are stable; JSON keeps every finding and row.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import DATA
from rich.cells import cell_len

import pastaprof
from pastaprof.report.names import short_kernel_name, short_names
from pastaprof.report.terminal import format_value
from pastaprof.tools.base import Finding, Report

PY = [sys.executable, "-m", "pastaprof.cli"]
SEVERITIES = ("CRITICAL", "WARNING", "INFO")
TRACES = sorted([*DATA.glob("*.json.gz"), *(DATA / "recorded").glob("*.json.gz"), *(DATA / "foreign").glob("*.json"),
                 DATA / "ddp_mlp_2ranks", pastaprof.example_path()])


def cli(*args: str | Path, columns: str | None = "100") -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    if columns is not None:
        env["COLUMNS"] = columns
    return subprocess.run([*PY, *map(str, args)], capture_output=True, text=True, env=env)  # piped: not a terminal


def json_of(*args: str | Path) -> dict:
    r = cli("analyze", *args, "-q", "--json", "-")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def finding_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(SEVERITIES)]


@pytest.fixture(scope="module")
def example() -> tuple[str, dict]:
    r = cli("analyze", "--example")
    assert r.returncode == 0, r.stderr
    return r.stdout, json_of("--example")


def test_example_fits_100_columns_when_piped(example):
    text, doc = example
    lines = text.splitlines()
    assert len(lines) <= 220, len(lines)
    assert max(cell_len(line) for line in lines) <= 100
    # rows are capped in the terminal, counted in a caption; JSON keeps every row
    kernels = doc["tools"]["kernels"]["tables"]["kernels"]
    assert len(kernels) == doc["tools"]["kernels"]["summary"]["distinct_kernels"] == 74
    assert f"{len(kernels) - 10} more rows (--rows, --json)" in text
    assert sum(row["launches"] for row in kernels) == doc["tools"]["kernels"]["summary"]["kernels"]


@pytest.mark.parametrize("columns", ["60", "80", "137"])
def test_other_widths_fit_too(columns):
    r = cli("analyze", str(DATA / "two_streams_copies.pt.trace.json.gz"), columns=columns)
    assert r.returncode == 0, r.stderr
    assert max(cell_len(line) for line in r.stdout.splitlines()) <= int(columns)


def test_piped_without_columns_is_100_and_bad_columns_ignored():
    for columns in (None, "wide", "3"):
        r = cli("analyze", str(DATA / "mlp_train_3steps.pt.trace.json.gz"), columns=columns)
        assert r.returncode == 0, r.stderr
        assert max(cell_len(line) for line in r.stdout.splitlines()) <= 100, columns


def test_example_host_wait_finding_first_with_its_time(example):
    text, doc = example
    assert text.splitlines()[0].lstrip("─ ").startswith("findings")
    first = doc["findings"][0]
    assert first["tool"] == "timeline" and first["title"] == "GPU idle 45.8% waiting for launches"
    streams = doc["tools"]["timeline"]["tables"]["streams"]
    host_wait = sum(s["host_wait_ns"] for s in streams)
    assert first["impact_ns"] == min(host_wait, doc["tools"]["timeline"]["tables"]["temporal"][0]["idle_ns"])
    assert first["impact_ns"] == 82_979_465  # 45.8% of the 181.16 ms span
    assert finding_lines(text)[0] == ("WARNING    82.98 ms  GPU idle 45.8% waiting for launches @ "
                                      "rank 0: pytorch_utils.py(117): forward")
    # where: the Python call site of the ops whose launches the GPU waited for longest
    assert first["location"] == "rank 0: transformers/pytorch_utils.py(117): forward"
    sites = {row["call_site"] for row in doc["tools"]["ops"]["tables"]["call sites"]}
    assert first["location"].removeprefix("rank 0: ") in sites
    assert 0 < first["evidence"]["top_call_site_host_wait_ns"] <= host_wait


@pytest.mark.parametrize("trace", ["two_streams_copies.pt.trace.json.gz", "leak_5steps.pt.trace.json.gz",
                                   "ddp_mlp_2ranks"])
def test_findings_first_and_ordered_by_impact(trace):
    doc = json_of(DATA / trace)
    r = cli("analyze", DATA / trace)
    assert r.returncode == 0, r.stderr
    impacts = [f["impact_ns"] for f in doc["findings"]]
    assert len([i for i in impacts if i]) >= 3 and impacts == sorted(impacts, reverse=True)  # ints, never null
    rank = {"critical": 0, "warning": 1, "info": 2}
    unknown = [rank[f["severity"]] for f in doc["findings"] if f["impact_ns"] == 0]  # no time at stake: last
    assert unknown == sorted(unknown)
    with_bytes = [f for f in doc["findings"] if f["impact_bytes"] is not None]
    for f in with_bytes:  # bytes at stake come first on the finding's evidence line
        said = f"{f['tool']}: impact_bytes={format_value('impact_bytes', f['impact_bytes'])},"
        assert any(x.strip().startswith(said) for x in r.stdout.splitlines()), said
    assert with_bytes or trace != "leak_5steps.pt.trace.json.gz"
    lines = r.stdout.splitlines()
    shown = finding_lines(r.stdout)
    assert len(shown) == len(doc["findings"])
    first_table = next(i for i, line in enumerate(lines) if line.startswith("─") and "findings" not in line)
    assert lines.index(shown[-1]) < first_table  # every finding before the first tool
    for line, f in zip(shown, doc["findings"]):
        assert line.startswith(f["severity"].upper())
        assert f["title"][:30] in line


def test_evidence_impact_is_lifted_to_the_field():
    doc = json_of(DATA / "two_streams_copies.pt.trace.json.gz")
    with_evidence = [f for f in doc["findings"] if "impact_ns" in f["evidence"]]
    assert {f["tool"] for f in with_evidence} >= {"cuda_api", "copies", "steps"}
    assert all(f["impact_ns"] == f["evidence"]["impact_ns"] for f in with_evidence)


def test_launch_bound_finding_carries_the_launch_excess():
    doc = json_of(DATA / "bert4_infer_2iters.pt.trace.json.gz", "-t", "timeline")
    lb = next(f for f in doc["findings"] if "launch call" in f["title"])
    table = doc["tools"]["timeline"]["tables"]["launch_bound"]
    excess = sum(r["launch_bound_launch_ns"] - r["launch_bound_kernel_ns"] for r in table)
    assert lb["impact_ns"] == doc["tools"]["timeline"]["summary"]["launch_bound_excess_ns"] > 0
    assert lb["impact_ns"] <= excess  # per kernel the excess is clipped at 0


def test_ids_stable_across_runs_and_sources(tmp_path):
    trace = DATA / "two_streams_copies.pt.trace.json.gz"
    a, b = json_of(trace), json_of(trace)
    run_dir = tmp_path / "run"
    assert cli("import", trace, "-o", run_dir).returncode == 0
    c = json_of(run_dir)
    ids = [f["id"] for f in a["findings"]]
    assert len(ids) >= 5 and len(set(ids)) == len(ids)
    assert ids == [f["id"] for f in b["findings"]] == [f["id"] for f in c["findings"]]
    assert all(re.fullmatch(r"[0-9a-f]{12}", i) for i in ids)


def test_ids_unique_per_trace_and_independent_of_measurements():
    doc = json_of(DATA / "ddp_mlp_2ranks")
    ids = [f["id"] for f in doc["findings"]]
    assert len(set(ids)) == len(ids)  # rank 0 / rank 1, cuda:0 / cuda:1 findings stay apart
    one = Finding("warning", "step 3 of rank 1 took 5.26x the median (+9.4 ms)", location="x", tool="steps")
    two = Finding("warning", "step 4 of rank 1 took 2.01x the median (+1.2 ms)", location="x", tool="steps")
    other = Finding("warning", "step 3 of rank 2 took 5.26x the median (+9.4 ms)", location="x", tool="steps")
    assert one.id == two.id != other.id
    assert Finding("info", "a 1", kind="k", tool="t").id == Finding("info", "b 2", kind="k", tool="t").id
    moved = [Finding("info", "2 steps (iteration 0, iteration 1) took 3x", location=f"train.py({n}): step")
             for n in (12, 40)]
    fewer = Finding("info", "1 steps (iteration 4) took 2.5x", location="train.py(7): step")
    assert moved[0].id == moved[1].id == fewer.id != Finding("info", "x", location="train.py(7): step").id


def test_finding_and_report_api():
    f = Finding("warning", "t", {"impact_ns": 12.0, "x": 1})
    assert f.impact_ns == 12 and f.to_dict()["impact_ns"] == 12 and f.evidence["impact_ns"] == 12.0
    assert Finding("info", "t", {"impact_ns": "soon"}).impact_ns is None
    import numpy as np

    assert Finding("info", "t", {"impact_ns": np.int64(9)}).impact_ns == 9
    assert Finding("info", "t", {"impact_ns": float("nan")}).impact_ns is None
    assert type(Finding("info", "t", {"impact_ns": np.float32(2.5)}).to_dict()["impact_ns"]) is int
    assert Finding("info", "t", {"impact_ns": 5}, impact_ns=7).impact_ns == 7
    import pyarrow as pa

    rep = Report("kernels", tables={"kernels": pa.table({"a": [1, 2, 3]})}, findings=[f], summary={"n": 1})
    assert repr(rep) == "Report(tool='kernels', tables=1 [kernels: 3 rows], findings=1, summary keys=['n'])"
    assert f.tool == "kernels" and pastaprof.print_reports.__module__ == "pastaprof.report.terminal"


def _kernel_names(path: Path) -> list[str]:
    return [r[0] for r in pastaprof.load(path).sql("select distinct name from kernel").fetchall()]


@pytest.mark.parametrize("trace", TRACES, ids=lambda p: p.name)
def test_short_names_are_never_a_bare_namespace_and_stay_distinct(trace):
    names = _kernel_names(trace)
    assert names
    shorts = short_names(names)
    for full, short in zip(names, shorts):
        assert re.match(r"[A-Za-z_~]", short), (full, short)
        assert not short.endswith("::") and not re.fullmatch(r"[\w:]*::", short), (full, short)
        assert "(anonymous namespace)" not in short and len(short) <= len(full)
    assert len(set(shorts)) == len(set(names))


def test_short_names_of_real_kernels():
    soft = ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, "
            "at::native::(anonymous namespace)::LogSoftMaxForwardEpilogue>(float*, float const*, int)")
    assert short_kernel_name(soft) == "cunn_SoftMaxForward<4, float, float, float, LogSoftMaxForwardEpilogue>"
    copy = ("void at::native::vectorized_elementwise_kernel<8, at::native::bfloat16_copy_kernel_cuda("
            "at::TensorIteratorBase&)::{lambda(float)#1}, std::array<char*, 2ul> >(int, at::native::bfloat16_copy"
            "_kernel_cuda(at::TensorIteratorBase&)::{lambda(float)#1}, std::array<char*, 2ul>)")
    assert short_kernel_name(copy) == "vectorized_elementwise_kernel<8, bfloat16_copy_kernel_cuda, array<…>>"
    pow2 = ("void at::native::vectorized_elementwise_kernel<4, at::native::(anonymous namespace)::pow_tensor_scalar"
            "_kernel_impl<float, float>(at::TensorIteratorBase&, float)::{lambda(float)#2}, std::array<char*, 2ul> >"
            "(int, at::native::(anonymous namespace)::pow_tensor_scalar_kernel_impl<float, float>("
            "at::TensorIteratorBase&, float)::{lambda(float)#2}, std::array<char*, 2ul>)")
    pow1 = pow2.replace("#2}", "#1}")
    a, b = short_names([pow2, pow1])
    assert a != b and "{lambda#2}" in a and "{lambda#1}" in b
    # not C++ symbols: unchanged
    for name in ("aten::mm", "Memcpy HtoD (Pageable -> Device)", "train.py(42): forward", "nvjet_sm90_tst_x"):
        assert short_kernel_name(name) == name


def test_names_that_a_column_cuts_alike_are_cut_in_the_middle(example):
    """At 100 columns the kernel column is ~38 cells: the example's three cutlass GEMMs differ only
    in their tile shape near the end; each row must still say which one it is."""
    from pastaprof.report.terminal import clip, clip_column

    text, doc = example
    for shape in ("128x128_tn_align1>", "256x128_nn_align1>", "128x256_nt_align1>"):
        assert sum(shape in line and "Kernel2<cutlass_75" in line for line in text.splitlines()) == 1, shape
    names = short_names([r["name"] for r in doc["tools"]["kernels"]["tables"]["kernels"]])
    for width in (12, 20, 32, 38, 60):  # (a name column is never squeezed below 32: MIN_NAME)
        shown = clip_column(names, width)
        assert all(cell_len(x) <= width for x in shown)
        assert len(set(shown)) == len(set(names)) or width < 32, width  # distinct names stay distinct
        # a name that no other one is cut alike keeps the plain cut at its end
        plain = [clip(n, width) for n in names]
        assert all(x == p for x, p in zip(shown, plain) if plain.count(p) == 1)


def test_example_terminal_shows_no_bare_namespace(example):
    text, _ = example
    assert "at::native:: " not in text and not re.search(r"^\s*[\w:]+::\s", text, re.M)
    assert "cunn_SoftMaxForward<4, float" in text


def test_wide_shows_full_names():
    r = cli("analyze", "--example", "-t", "kernels", "--wide")
    assert r.returncode == 0, r.stderr
    full = ("void cutlass::Kernel2<cutlass_75_tensorop_bf16_s1688gemm_bf16_128x128_tn_align1>"
            "(cutlass_75_tensorop_bf16_s1688gemm_bf16_128x128_tn_align1::Params)")
    assert full in r.stdout
    assert "columns not shown" not in r.stdout
    narrow = cli("analyze", "--example", "-t", "kernels")
    assert full not in narrow.stdout and "Kernel2<cutlass_75" in narrow.stdout


def test_wide_shows_whole_summary_notes():
    """A tool's note said why it has nothing to show, cut at 64 characters even with --wide; now
    whole with --wide, and whole without it where it fits the line (cut to the width where not)."""
    from pastaprof.report.terminal import print_reports
    from pastaprof.tools.base import Report

    note = "no CUDA/HIP API calls in this run (a CPU-only trace, or a capture without CUPTI) \x1b[2J"
    rep = Report("cuda_api", tables={}, findings=[], summary={"calls": 0, "note": note})
    for wide, width, whole in ((True, 10_000, True), (False, 100, True), (False, 60, False)):
        from rich.console import Console

        con = Console(width=width, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
        print_reports([rep], console=con, wide=wide)
        text = con.export_text()
        assert ("a capture without CUPTI)" in text) is whole, text
        assert "\x1b" not in text  # control characters stay escaped
        assert max(len(line) for line in text.splitlines()) <= width


def test_tools_without_data_say_why_in_one_line():
    """A CPU-only run: kernels, timeline, memory and gemm print one line saying why, not zeros;
    ops shows its CPU columns only (JSON: the GPU ones null)."""
    src = DATA / "ranks" / "cpu_tb_2cycles"
    r = cli("analyze", src, "-t", "kernels,timeline,memory,gemm,ops")
    assert r.returncode == 0, r.stderr
    sections: dict[str, list[str]] = {}
    for line in r.stdout.splitlines():
        if line.startswith("─"):
            sections[line.strip("─ ")] = []
        else:
            sections[list(sections)[-1]].append(line)
    assert sections["kernels"] == ["kernels=0  note=no GPU kernels, copies or memsets in this run (a CPU-only trace?)"]
    assert sections["timeline"] == ["activities=0  note=no GPU kernels, copies or memsets in this run (a CPU-only "
                                    "trace?)"]
    assert sections["memory"] == ["devices=0  alloc_events=0  note=no allocator events in this run (record with "
                                  "profile_memory=True)"]
    assert sections["gemm"] == ["gemm_calls=20  calls_without_kernels=20  note=no GPU kernels in this run: GEMM "
                                "health needs them"]
    ops = "\n".join(sections["ops"])
    assert sections["ops"][0].startswith("ops=436  note=no GPU activity in this run: CPU times only")
    assert "gpu_ns" not in ops and "dominant_kernel" not in ops and "self_cpu_ns" in ops, ops
    doc = json_of(src, "-t", "ops")["tools"]["ops"]["tables"]
    assert all(row["gpu_ns"] is None and row["self_cpu_ns"] is not None for row in doc["ops"])
    assert all(row["gpu_ns"] is None for t in ("modules", "module types") for row in doc[t])


def test_units_are_the_same_everywhere():
    from pastaprof.report.terminal import format_value

    assert format_value("median_gbps", 1.2345) == "1.23 GB/s" and format_value("gbps", 51.4) == "51.40 GB/s"
    assert format_value("total_ns", 1_500_000) == "1.50 ms" and format_value("impact_ns", 999) == "999 ns"
    assert format_value("peak_bytes", 3 << 30) == "3.00 GiB"
    assert format_value("share_of_span", 0.0149) == format_value("sync_share_of_span", 0.0149) == "1.5%"
    # byte counts whose column name does not say "bytes" (the memory tool's, the tensor events')
    for column in ("allocated_at_start", "allocated_at_end", "max_total_allocated", "reserved_at_peak",
                   "total_allocated", "total_reserved"):
        assert format_value(column, 2_077_211_136) == "1.93 GiB", column
    assert format_value("alloc_events", 4482) == "4,482"
    mem = cli("analyze", DATA / "leak_5steps.pt.trace.json.gz", "-t", "memory", "--wide")
    assert mem.returncode == 0, mem.stderr
    steps = mem.stdout[mem.stdout.index("allocated_at_end"):]
    assert re.search(r"allocated_at_end.*\n.*\n.* (KiB|MiB|GiB) ", steps), steps[:600]
    r = cli("analyze", DATA / "two_streams_copies.pt.trace.json.gz", "-t", "copies")
    assert r.returncode == 0, r.stderr
    assert " GB/s" in r.stdout and "gbps=" in r.stdout and not re.search(r"gbps=\d+(\.\d+)?(,|$)", r.stdout, re.M)


def test_every_width_holds_for_real_reports_and_hostile_tables():
    import io

    import pyarrow as pa
    from rich.console import Console

    from pastaprof.report.terminal import print_reports

    reports = pastaprof.analyze(DATA / "ddp_mlp_2ranks")
    long = "void " + "::".join(["ns"] * 40) + "::k<" + ", ".join(["T"] * 60) + ">(int)"
    hostile = Report("hostile", tables={
        "names only": pa.table({"name": [long, "中" * 90], "kernel": ["x" * 300, "y"]}),
        "many numbers": pa.table({f"column_{i}_ns": [10**i, 2 * 10**i] for i in range(14)}),
        "empty": pa.table({"name": pa.array([], pa.string())})},
        summary={"k" * 150: "v" * 150, "n": 3}, findings=[Finding("critical", "t" * 300, {"e": "v" * 300})])
    for width in (20, 40, 60, 80, 100, 137, 200):
        buf = io.StringIO()
        print_reports([*reports, hostile], console=Console(file=buf, width=width, emoji=False), max_rows=5)
        lines = buf.getvalue().splitlines()
        assert lines and max(cell_len(line) for line in lines) <= width, width
        assert sum(line.startswith(SEVERITIES) for line in lines) == sum(len(r.findings) for r in [*reports, hostile])
    buf = io.StringIO()
    print_reports([hostile], console=Console(file=buf, width=100_000, emoji=False), wide=True)
    assert long in buf.getvalue() and "x" * 300 in buf.getvalue()


def test_a_table_of_no_columns_has_no_rows_in_json_terminal_or_html():
    """pyarrow slices a table of no columns to as many empty rows as asked: a tool's empty table
    became 1,000 empty objects in --json."""
    import pyarrow as pa

    from pastaprof.report.findings import reports_to_dict
    from pastaprof.report.terminal import render_table
    from pastaprof.tools.base import Report

    empty = pa.Table.from_pylist([])
    assert empty.slice(0, 5).num_rows == 5  # the quirk itself
    doc = reports_to_dict([Report("x", tables={"t": empty}, findings=[], summary={})])
    assert doc["tools"]["x"]["tables"]["t"] == []
    assert render_table("t", empty).row_count == 0


def test_a_cpu_only_run_shows_no_empty_gpu_columns():
    """A CPU-only profile's steps have null GPU columns (not zeros): the terminal leaves them out
    and says so; --wide and JSON keep them."""
    src = DATA / "ranks" / "cpu_tb_2cycles"
    r = cli("analyze", src, "-t", "steps")
    assert r.returncode == 0, r.stderr
    header = next(line for line in r.stdout.splitlines() if line.startswith("rank  step"))
    assert "wall_ns" in header and "gpu_busy_ns" not in header and "host_wait_ns" not in header, header
    assert "empty columns left out" in r.stdout
    wide = cli("analyze", src, "-t", "steps", "--wide")
    assert "gpu_busy_ns" in wide.stdout
    rows = json_of(src, "-t", "steps")["tools"]["steps"]["tables"]["steps"]
    assert rows and all(row["gpu_busy_ns"] is None for row in rows)
    # a GPU run's columns stay
    gpu = cli("analyze", DATA / "mlp_train_3steps.pt.trace.json.gz", "-t", "steps")
    assert "gpu_busy_ns" in gpu.stdout and "empty column" not in gpu.stdout
