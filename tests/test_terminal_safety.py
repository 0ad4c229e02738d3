"""Names never control the terminal: a real trace whose kernel, op and device names carry escape
sequences (set title, clear screen), a one-byte CSI, a bidi override and rich markup is analyzed,
stored, listed and exported by the real CLI.  What reaches stdout/stderr holds no control byte but
newline and shows the markup literally; JSON, Parquet and Perfetto keep the exact names."""

from __future__ import annotations

import gzip
import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import DATA
from hypothesis import given, settings
from hypothesis import strategies as st

PY = [sys.executable, "-m", "pastaprof.cli"]
EVIL = "\x1b]0;pwned\x07\x1b[2Jevil[red]x[/red]\x9b31m\u202e"
KERNEL = EVIL + "kern"
OP = EVIL + "op"
DEVICE = "[red]H200[/red]\x1b[2J"
# C0 but newline, DEL, and C1 (as UTF-8: a one-byte CSI 0x9b arrives as c2 9b)
CONTROL = re.compile(rb"[\x00-\x09\x0b-\x1f\x7f]|\xc2[\x80-\x9f]|\xe2\x80[\xa8-\xae]|\xe2\x81[\xa6-\xa9]")


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*PY, *map(str, args)], capture_output=True, timeout=300)


def assert_clean(data: bytes) -> None:
    bad = CONTROL.search(data)
    assert bad is None, data[max(0, bad.start() - 60): bad.end() + 20]


@pytest.fixture(scope="module")
def evil(tmp_path_factory) -> Path:
    """mlp_train_3steps with its fill kernel (6 launches, made 1000x longer so that it leads every
    table and finding), one op and the device renamed."""
    with gzip.open(DATA / "mlp_train_3steps.pt.trace.json.gz") as f:
        doc = json.load(f)
    events = doc["traceEvents"]
    kernel = next(e["name"] for e in events if e.get("cat") == "kernel")
    op = next(e["name"] for e in events if e.get("cat") == "cpu_op")
    for e in events:
        if e.get("cat") == "kernel" and e.get("name") == kernel:
            e["name"], e["dur"] = KERNEL, e["dur"] * 1000
        elif e.get("cat") == "cpu_op" and e.get("name") == op:
            e["name"] = OP
    doc["deviceProperties"][0]["name"] = DEVICE
    path = tmp_path_factory.mktemp("evil") / "evil.pt.trace.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump(doc, f)
    return path


@pytest.fixture(scope="module")
def evil_run(evil, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("evilrun") / "run"
    r = cli("import", evil, "-o", out)
    assert r.returncode == 0, r.stderr
    assert_clean(r.stdout + r.stderr)
    return out


def test_analyze_prints_no_control_bytes_and_json_keeps_the_names(evil, tmp_path):
    out = tmp_path / "f.json"
    narrow = cli("analyze", evil, "--rows", "50")  # names clipped to 100 columns: no escape cut into a control
    assert narrow.returncode == 0 and b"pwned" in narrow.stdout, narrow.stderr
    assert_clean(narrow.stdout + narrow.stderr)
    r = cli("analyze", evil, "--rows", "50", "--wide", "--json", out)  # --wide: names whole
    assert r.returncode == 0, r.stderr
    assert_clean(r.stdout)
    assert_clean(r.stderr)
    text = r.stdout.decode()
    assert "\\x1b]0;pwned\\x07\\x1b[2Jevil[red]x[/red]" in text  # shown, escaped, markup literal
    doc = json.loads(out.read_text())
    kernels = doc["tools"]["kernels"]["tables"]["kernels"]
    top = max(kernels, key=lambda row: row["total_ns"])
    assert top["name"] == KERNEL and top["launches"] == 6
    named = [f for f in doc["findings"] if f["location"] == KERNEL]
    assert named, "the leading kernel is named by a finding"
    shown = [line for line in text.splitlines() if line.startswith(("WARNING", "INFO", "CRITICAL")) and "pwned" in line]
    assert len(shown) >= len(named)
    assert any(row.get("name") == OP for t in doc["tools"]["ops"]["tables"].values() for row in t)


def test_store_and_perfetto_keep_exact_names_and_info_is_clean(evil_run, tmp_path):
    names = pa.concat_tables(pq.read_table(p) for p in (evil_run / "kernel").glob("*.parquet"))["name"]
    assert names.to_pylist().count(KERNEL) == 6
    ops = pa.concat_tables(pq.read_table(p) for p in (evil_run / "op").glob("*.parquet"))["name"].to_pylist()
    assert OP in ops
    trace = tmp_path / "t.pftrace"
    r = cli("export", evil_run, "-o", trace)
    assert r.returncode == 0, r.stderr
    assert_clean(r.stdout + r.stderr)
    assert KERNEL.encode() in trace.read_bytes() and OP.encode() in trace.read_bytes()
    r = cli("info", evil_run)
    assert r.returncode == 0, r.stderr
    assert_clean(r.stdout + r.stderr)
    assert "[red]H200[/red]\\x1b[2J" in r.stdout.decode()  # the device name, markup not interpreted


def test_errors_and_paths_are_clean(tmp_path):
    hostile = tmp_path / "x\x1b]0;pwned\x07\x1b[2J[red]y[/red]\nz.json"
    for args in (["analyze", hostile], ["info", hostile], ["analyze", "--example", "-t", "\x1b[2Jnope"],
                 ["analyze", "--example", "-q", "--json", tmp_path / "no\x1b[2J" / "f.json"],
                 ["import", DATA / "leak_5steps.pt.trace.json.gz", "-o", Path("/etc/passwd") / "r\x1b[2J"]):
        r = cli(*args)
        assert r.returncode == 2, (args, r.stderr)
        assert_clean(r.stdout + r.stderr)
        assert len(r.stderr.splitlines()) == 1 and b"\\x1b[2J" in r.stderr, r.stderr


def test_run_messages_are_clean(tmp_path):
    out = tmp_path / "r\x1b[2J[red]un[/red]"
    r = cli("run", "-o", out, "--", sys.executable, "-c", "print('ok')")
    assert r.returncode == 0, r.stderr
    assert r.stdout == b"ok\n"  # the program's own output is its own
    assert_clean(r.stderr)
    assert b"run stored in" in r.stderr and b"\\x1b[2J[red]un[/red]" in r.stderr
    assert (out / "run.json").is_file()


def test_reports_on_a_real_terminal_carry_no_escape_from_names():
    """On a terminal rich writes its own style sequences; none may come from a name."""
    from rich.console import Console

    from pastaprof.report.terminal import print_reports
    from pastaprof.tools.base import Finding, Report

    every = "".join(map(chr, range(0x20))) + "\x7f" + "".join(map(chr, range(0x80, 0xa0))) + "\u2028\u202e\u2066"
    table = pa.table({"name": [EVIL + every, "[bold]b[/bold]"], "launches": [1, 2]})
    rep = Report("k" + EVIL, summary={"top" + EVIL: EVIL}, tables={"t" + EVIL: table},
                 findings=[Finding("warning", "title " + EVIL, {"e" + EVIL: EVIL}, location=EVIL)])
    buf = io.StringIO()
    print_reports([rep], console=Console(file=buf, force_terminal=True, width=400, color_system="standard",
                                         emoji=False))
    out = buf.getvalue()
    styles = re.compile(r"\x1b\[[0-9;]*m")  # rich's own SGR colour sequences
    rest = styles.sub("", out)
    assert_clean(rest.encode())
    assert "\\x1b]0;pwned\\x07" in rest and "[bold]b[/bold]" in rest and "[red]x[/red]" in rest
    assert rest.count("\\x1b[2J") >= 6  # tool, summary key and value, table title, row, finding


_TEXT = st.text(alphabet=st.one_of(st.characters(max_codepoint=0xa0), st.sampled_from("[]\\/=#:\u2028\u202e\u2066é中")),
                max_size=40)


@settings(max_examples=400, deadline=None, derandomize=True)
@given(_TEXT)
def test_markup_safe_renders_as_the_escaped_name_exactly(s):
    """Any name, through rich, prints as terminal_safe(name): no control character, nothing of it read
    as markup (brackets, backslashes before brackets), and nothing lost (the escapes decode back)."""
    from rich.console import Console

    from pastaprof.report.names import terminal_safe
    from pastaprof.report.terminal import markup_safe

    buf = io.StringIO()
    Console(file=buf, width=10_000, color_system=None, emoji=False, highlight=False).print(markup_safe(s), end="")
    shown = terminal_safe(s)
    shown = shown[:-1] + "\\x5c" if shown.endswith("\\") else shown
    assert buf.getvalue() == shown
    framed = io.StringIO()  # between markup of pastaprof's own, as print_reports writes it
    Console(file=framed, width=10_000, color_system=None, emoji=False, highlight=False).print(
        f"[bold]{markup_safe(s)}[/]={markup_safe(s)} [dim]{markup_safe(s)}[/]", end="")
    assert framed.getvalue() == f"{shown}={shown} {shown}"
    assert_clean(buf.getvalue().encode())
    if "\\" not in s:
        back = re.sub(r"\\x([0-9a-f]{2})|\\u([0-9a-f]{4})", lambda m: chr(int(m[1] or m[2], 16)), buf.getvalue())
        assert back == s
