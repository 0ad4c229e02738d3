"""Hostile data the part checks cannot see, outputs that are the input, rank lists, empty
program names and an unwritable terminal: through the real CLI in a subprocess, on a REAL import
of a recorded trace.  Each must end in one line and exit 2 (or, for data a tool can read around,
an analysis), never a traceback or a hang, and leave the input as it was."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import DATA

import pastaprof
from pastaprof.report.names import terminal_safe

SRC = DATA / "mlp_train_3steps.pt.trace.json.gz"
TIMEOUT = 60


def cli(*args: str, cwd: Path | None = None, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pastaprof.cli", *args], capture_output=True, text=True,
                          timeout=TIMEOUT, stdin=subprocess.DEVNULL, cwd=cwd, **kw)


def one_line(r: subprocess.CompletedProcess, needle: str) -> str:
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(lines) == 1, (r.returncode, r.stderr)
    assert lines[0].startswith("pastaprof: error: ") and needle in lines[0], lines[0]
    return lines[0]


def digest(p: Path) -> str:
    if p.is_file():
        return hashlib.sha256(p.read_bytes()).hexdigest()
    return ",".join(f"{q.relative_to(p)}:{digest(q)}" for q in sorted(p.rglob("*")) if q.is_file())


@pytest.fixture(scope="module")
def good_run(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("good") / "run"
    assert cli("import", str(SRC), "-o", str(run)).returncode == 0
    return run


def _copy_with(good: Path, tmp: Path, kind: str, change) -> Path:
    run = tmp / "run"
    shutil.copytree(good, run)
    part = run / kind / "rank-0.parquet"
    pq.write_table(change(pq.read_table(part)), part)
    return run


def _set(t: pa.Table, name: str, values) -> pa.Table:
    i = t.schema.get_field_index(name)
    return t.set_column(i, t.schema.field(i), pa.array(values).cast(t.schema.field(i).type))


def test_kernels_on_another_clock_than_ops_are_one_line(tmp_path):
    """Kernel times from 0 while the ops' are Unix-epoch ns (the bundled GPT-2 run, whose ops
    launch many kernels each): each kind's own span passes the part checks, but a tool's sum of
    launch delays passes int64 (it raised DuckDB's ConversionException)."""
    example = tmp_path / "example"
    assert cli("import", str(Path(pastaprof.__file__).parent / "data" / "example_gpt2_train_3steps.pt.trace.json.gz"),
               "-o", str(example)).returncode == 0
    run = _copy_with(example, tmp_path, "kernel", lambda t: _set(_set(t, "start_ns", range(t.num_rows)), "end_ns",
                                                                   range(1, t.num_rows + 1)))
    before = digest(run)
    for args in (["analyze", str(run), "-q"], ["report", str(run), "-o", str(tmp_path / "r.html")]):
        one_line(cli(*args), "do not fit 64-bit integers")
    assert digest(run) == before and not (tmp_path / "r.html").exists()


def test_a_parent_cycle_ends(good_run, tmp_path):
    """op.parent_id rolled by one: every op's parent chain is one cycle.  The host-wait roots
    (cuda_api.root_ops' pointer jumping never settled: the command hung) end, and so does every
    other tool: the analysis finishes."""
    run = _copy_with(good_run, tmp_path, "op", lambda t: _set(t, "parent_id", np.roll(t["id"].to_numpy(), 1)))
    r = cli("analyze", str(run), "-q", "-t", "timeline,ops,cuda_api,critical_path")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr


def test_nested_shape_strings_are_skipped(good_run, tmp_path):
    """input_shapes of 3,000 nested brackets (json.loads raised RecursionError in the gemm tool):
    shapes that do not parse say nothing, as unrecorded ones."""
    run = _copy_with(good_run, tmp_path, "op", lambda t: _set(t, "input_shapes", ["[" * 3000] * t.num_rows))
    r = cli("analyze", str(run), "-q", "-t", "gemm,ops")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr


def test_an_output_that_is_the_input_is_refused(good_run, tmp_path):
    """Every command that writes a file or a run refuses one that is its input, lies inside it
    (run.json of the input run) or reaches it through a link -- before, the input was replaced."""
    trace = tmp_path / "t.json.gz"
    shutil.copy(SRC, trace)
    (tmp_path / "link").symlink_to(trace)
    run = tmp_path / "run"
    shutil.copytree(good_run, run)
    before = (digest(trace), digest(run))
    for args in (["analyze", str(trace), "-q", "--json", str(trace)], ["report", str(trace), "-o", str(trace)],
                 ["export", str(trace), "-o", str(trace)], ["diff", str(trace), str(run), "-q", "--json", str(trace)],
                 ["import", str(trace), "-o", str(trace), "--force"],
                 ["analyze", str(trace), "-q", "--json", str(tmp_path / "link")],
                 ["analyze", str(run), "-q", "--json", str(run / "run.json")],
                 ["analyze", str(run), "-q", "-o", str(tmp_path / "new")]):
        one_line(cli(*args), "input")
    assert (digest(trace), digest(run)) == before and not (tmp_path / "new").exists()


@pytest.mark.parametrize("ranks, needle", [("3-1", "backwards"), ("5", "no rank of the run"),
                                           ("0-2000000000", "more than"), ("\u0661", "rank list"),
                                           ("1_0", "rank list"), ("0-99999999999", "rank list")])
def test_rank_lists_are_checked_before_anything_is_made(good_run, ranks, needle):
    """A reversed range, a rank the run lacks (a trace's "no trace matches" already), a range of
    two billion ranks (expanded into a list: the machine ran out of memory), non-ASCII digits
    and underscores (int() takes both)."""
    one_line(cli("analyze", str(good_run), "-q", "--ranks", ranks), needle)


def test_an_empty_program_name_is_one_line_and_leaves_nothing(tmp_path):
    """`pastaprof run -- ''`: posix_spawnp's ValueError was a traceback, and each try left a
    hidden partial run directory."""
    for cmd in ([""], ["", "arg"]):
        one_line(cli("run", "-o", str(tmp_path / "run"), "--", *cmd, cwd=tmp_path), "cannot start ''")
    assert not [p for p in tmp_path.iterdir() if "partial" in p.name]


@pytest.mark.parametrize("args", [["analyze", "RUN", "-t", "kernels"], ["info", "RUN"], ["diff", "RUN", "RUN"],
                                  ["tools"]])
def test_terminal_output_that_cannot_be_written(good_run, args):
    """Standard output on a full disk, or closed by the shell: one line, exit 2 (before: an
    OSError or AttributeError traceback)."""
    args = [str(good_run) if a == "RUN" else a for a in args]
    with open("/dev/full", "w") as full:
        r = subprocess.run([sys.executable, "-m", "pastaprof.cli", *args], stdout=full, stderr=subprocess.PIPE,
                           text=True, timeout=TIMEOUT)
    one_line(r, "no space left")
    r = subprocess.run([sys.executable, "-m", "pastaprof.cli", *args], stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, text=True, timeout=TIMEOUT,
                       preexec_fn=lambda: os.close(1))
    one_line(r, "standard output is closed")


def test_invisible_format_characters_are_written_out():
    text = "a\u200bb\ufeffc\u00add\u061ce\U000e0041f\u2060g"
    assert terminal_safe(text) == "a\\u200bb\\ufeffc\\xadd\\u061ce\\U000e0041f\\u2060g"
