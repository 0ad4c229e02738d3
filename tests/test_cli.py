"""The command line end to end, as a user runs it (subprocesses, real files)."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import DATA, dur_ns, raw_events

import pastaprof
from pastaprof.tools.registry import DEFAULT_TOOLS

PY = [sys.executable, "-m", "pastaprof.cli"]


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*PY, *args], capture_output=True, text=True)


def test_version_and_tools():
    assert run("--version").stdout.strip() == f"pastaprof, version {pastaprof.__version__}"
    out = run("tools").stdout
    for name in DEFAULT_TOOLS:
        assert any(line.startswith(name + " ") for line in out.splitlines()), name


def test_analyze_example_json_findings_carry_true_numbers(tmp_path):
    out = tmp_path / "f.json"
    r = run("analyze", "--example", "--json", str(out), "--rows", "3")
    assert r.returncode == 0, r.stderr
    assert "kernels" in r.stdout and "timeline" in r.stdout
    doc = json.loads(out.read_text())
    assert set(doc["tools"]) == set(DEFAULT_TOOLS)
    for f in doc["findings"]:
        assert f["severity"] in ("info", "warning", "critical") and f["title"] and isinstance(f["evidence"], dict)
    raw = [e for e in raw_events(pastaprof.example_path()) if e.get("cat") == "kernel"]
    k = doc["tools"]["kernels"]
    assert k["summary"]["kernels"] == len(raw)
    assert k["summary"]["kernel_ns"] == sum(dur_ns(e) for e in raw)
    assert sum(row["launches"] for row in k["tables"]["kernels"]) == len(raw)
    mem = doc["tools"]["memory"]["summary"]
    allocs = [e["args"]["Total Allocated"] for e in raw_events(pastaprof.example_path())
              if e.get("name") == "[memory]" and e["args"].get("Device Type") == 1]
    assert mem["peak_bytes"] == max(allocs)


def test_analyze_ranks_filter_and_store(tmp_path):
    out = tmp_path / "f.json"
    runs = tmp_path / "run"
    r = run("analyze", str(DATA / "ddp_mlp_2ranks"), "-t", "timeline", "--ranks", "1", "-q", "--json", str(out),
            "-o", str(runs))
    assert r.returncode == 0, r.stderr
    per_rank = json.loads(out.read_text())["tools"]["timeline"]["summary"]["per_rank"]
    assert [p["rank"] for p in per_rank] == [1]
    assert json.loads((runs / "run.json").read_text())["ranks"] == [1]
    info = run("info", str(runs))
    assert info.returncode == 0 and "kernel" in info.stdout and "ranks=[1]" in info.stdout


def test_import_then_export_perfetto(tmp_path):
    runs = tmp_path / "run"
    assert run("import", str(DATA / "mlp_train_3steps.pt.trace.json.gz"), "-o", str(runs)).returncode == 0
    pf = tmp_path / "x.pftrace"
    r = run("export", "--perfetto", str(runs), "-o", str(pf))
    assert r.returncode == 0, r.stderr
    assert pf.stat().st_size > 1000
    nk = sum(1 for e in raw_events(DATA / "mlp_train_3steps.pt.trace.json.gz") if e.get("cat") == "kernel")
    assert f"kernel_slices={nk}" in r.stdout or str(nk) in r.stdout


def test_build_native_says_what_it_built():
    import pytest

    pytest.importorskip("torch")
    r = subprocess.run([sys.executable, "-m", "pastaprof.cli", "build-native"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    lines = dict(line.split(": ", 1) for line in r.stdout.strip().splitlines())
    assert set(lines) == {"cupti", "torch", "sanitizer", "inject"}
    # the injection library for native programs needs CUPTI's headers: built, or one reason why not
    assert lines["inject"].startswith("not built: ") or lines["inject"].split(" ")[0].endswith(".so")
    assert lines["torch"].split(" ")[0].endswith("pastaprof_torch.so")   # the observer builds wherever torch is
    # the sanitizer tool needs the Compute Sanitizer API and nvcc: built, or one reason why not
    assert lines["sanitizer"].startswith("not built: ") or ".so (patches " in lines["sanitizer"]


def test_terminal_report_does_not_turn_device_names_into_emoji(capsys):
    """rich replaced ':-1:' in 'cpu:-1: ...' finding titles with a thumbs-down emoji."""
    from pastaprof.report.terminal import print_reports
    from pastaprof.tools.base import Finding, Report

    print_reports([Report("memory", findings=[Finding("warning", "cpu:-1: memory grows 2.00 MiB per step", {})])])
    out = capsys.readouterr().out
    assert "cpu:-1: memory grows" in out and "\N{THUMBS DOWN SIGN}" not in out


def test_info_times_are_offsets_from_the_first_event_and_lines_never_wrap():
    """Epoch nanoseconds say nothing to a reader: first/last are offsets from the trace's first event,
    computed here from the raw JSON (complete events but the profiler's own span; us), and at 40 columns the header stays one line."""
    import os

    trace = DATA / "mlp_train_3steps.pt.trace.json.gz"
    ev = [e for e in raw_events(trace) if e.get("ph") == "X" and "ts" in e and e.get("cat") != "Trace"]
    t0 = min(float(e["ts"]) for e in ev)
    kernels = [e for e in ev if e.get("cat") == "kernel"]
    last_us = max(float(e["ts"]) + float(e.get("dur", 0)) for e in kernels) - t0
    r = subprocess.run([*PY, "info", str(trace)], capture_output=True, text=True, env=dict(os.environ, COLUMNS="40"))
    assert r.returncode == 0, r.stderr
    header = r.stdout.splitlines()[0]
    assert header.endswith("ranks=[0]") and "format=kineto" in header
    row = next(line for line in r.stdout.splitlines() if "kernel" in line and f"{len(kernels):,}" in line)
    assert "1779" not in row and "17" not in row.split("│")[3][:3]  # no epoch digits
    cells = [c.strip() for c in row.split("│")[1:-1]]
    value, unit = cells[3].split()
    scale = {"s": 1e6, "ms": 1e3, "us": 1.0, "ns": 1e-3}[unit]
    assert abs(float(value.replace(",", "")) * scale - last_us) <= 0.01 * scale + 1e-3 * last_us, (cells, last_us)


def _closed_after_one_line(*args: str) -> tuple[int, str]:
    """``pastaprof ARGS | head -1``: the reader takes one line and closes its end."""
    p = subprocess.Popen([*PY, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.readline()
    p.stdout.close()
    err = p.stderr.read().decode()
    return p.wait(timeout=120), err


def test_a_reader_that_closes_early_ends_the_command_as_sigpipe_after_its_files(tmp_path):
    """``analyze | head``: the --json file is still written whole, no message, and the command
    ends as a Unix tool does (killed by SIGPIPE), not exit 1 (rich's and click's default)."""
    import signal

    out = tmp_path / "f.json"
    code, err = _closed_after_one_line("analyze", "--example", "--json", str(out), "--rows", "50")
    assert (code, err) == (-signal.SIGPIPE, "")
    doc = json.loads(out.read_text())
    assert set(doc["tools"]) == set(DEFAULT_TOOLS)
    code, err = _closed_after_one_line("tools")
    assert code in (0, -signal.SIGPIPE) and err == ""  # (all of it may fit the pipe before it closes)
    full = run("analyze", "--example", "--json", str(tmp_path / "g.json"))
    assert full.returncode == 0 and json.loads((tmp_path / "g.json").read_text())["findings"] == doc["findings"]


def test_json_to_a_pipe_whose_reader_leaves_ends_as_sigpipe_and_writes_the_other_outputs(tmp_path):
    """``analyze --json - --html R | head -1``: the JSON on stdout loses its reader after one line;
    no error line, the HTML page is written whole, and the command dies of SIGPIPE like a Unix tool
    (it said 'cannot write -: broken pipe' and exited 2)."""
    import signal

    page = tmp_path / "r.html"
    code, err = _closed_after_one_line("analyze", "--example", "-q", "--json", "-", "--html", str(page))
    assert (code, err) == (-signal.SIGPIPE, "")
    text = page.read_text()
    assert text.rstrip().endswith("</html>") and "findings" in text
