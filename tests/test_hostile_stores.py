"""Hostile run directories and odd input paths, through the real CLI in a subprocess.

Each run directory starts as a REAL import of a recorded trace (the real ``pastaprof import``)
and is then damaged one way: run.json a FIFO, a directory, a link to /dev/zero, nested 100,000
deep, of wrong types; parts truncated, of another table, FIFOs, missing.  Every command must end
within seconds with exit 2 and exactly one stderr line naming the problem, no traceback, and the
run directory exactly as it was.  A seeded fuzzer then damages run.json and part bytes at random.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import DATA

SRC = DATA / "mlp_train_3steps.pt.trace.json.gz"
KERNELS = 81  # kernel events in SRC (cat == "kernel"), as run.json's rows count them
TIMEOUT = 60  # seconds per command: each should take about one


def cli(*args: str, timeout: float = TIMEOUT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pastaprof.cli", *args], capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def one_error_line(r: subprocess.CompletedProcess) -> str:
    """The single stderr line of a failed command (asserting there is exactly one)."""
    assert "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("pastaprof: error: "), lines[0]
    assert "pastaprof-" not in lines[0], lines[0]  # never names pastaprof's own temporary files
    return lines[0]


@pytest.fixture(scope="module")
def good_run(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("good") / "run"
    r = cli("import", str(SRC), "-o", str(run))
    assert r.returncode == 0, r.stderr
    assert json.loads((run / "run.json").read_text())["rows"]["kernel"] == KERNELS
    return run


def snapshot(root: Path) -> dict[str, tuple]:
    """Every entry under ``root``: type and, for files, a hash; links by target (never followed)."""
    out: dict[str, tuple] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = os.lstat(p)
            if stat.S_ISLNK(st.st_mode):
                out[str(p.relative_to(root))] = ("link", os.readlink(p))
            elif stat.S_ISREG(st.st_mode):
                with open(p, "rb") as f:
                    out[str(p.relative_to(root))] = ("file", hashlib.sha256(f.read()).hexdigest(), st.st_mode)
            else:
                out[str(p.relative_to(root))] = (stat.S_IFMT(st.st_mode), st.st_mode)
    return out


# --- the damages: each changes a copy of the good run and says what the error must name ---

def _manifest(run: Path) -> dict:
    return json.loads((run / "run.json").read_text())


def _set_field(name: str, value) -> Callable[[Path], None]:
    def damage(run: Path) -> None:
        m = _manifest(run)
        m[name] = value
        (run / "run.json").write_text(json.dumps(m))
    return damage


def _replace(rel: str, make: Callable[[Path], None]) -> Callable[[Path], None]:
    def damage(run: Path) -> None:
        p = run / rel
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()
        make(p)
    return damage


def _socket_at(p: Path) -> None:
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(p))
    s.close()


def _rewrite_part(rel: str, change: Callable[[pa.Table], pa.Table]) -> Callable[[Path], None]:
    def damage(run: Path) -> None:
        p = run / rel
        t = pq.read_table(p)
        pq.write_table(change(t), p)
    return damage


def _cut(rel: str, keep: Callable[[int], int]) -> Callable[[Path], None]:
    def damage(run: Path) -> None:
        p = run / rel
        data = p.read_bytes()
        p.write_bytes(data[: keep(len(data))])
    return damage


def _outside_copy(rel: str) -> Callable[[Path], None]:
    """``rel`` replaced by a link to an intact copy of it outside the run directory."""
    def damage(run: Path) -> None:
        p = run / rel
        outside = run.parent / ("outside-" + p.name)
        shutil.copy(p, outside)
        p.unlink()
        p.symlink_to(outside)
    return damage


def _deep_field(run: Path) -> None:
    m = _manifest(run)
    m["versions"] = {"x": json.loads("[" * 70 + "]" * 70)}
    (run / "run.json").write_text(json.dumps(m))


def _string_start(t: pa.Table) -> pa.Table:
    i = t.schema.get_field_index("start_ns")
    return t.set_column(i, pa.field("start_ns", pa.string()), t["start_ns"].cast(pa.string()))


def _huge_unsigned(t: pa.Table) -> pa.Table:
    i = t.schema.get_field_index("start_ns")
    return t.set_column(i, pa.field("start_ns", pa.uint64()), pa.array([2**63 + 5] * t.num_rows, pa.uint64()))


def _foreign_part(t: pa.Table) -> pa.Table:  # no pastaprof metadata, no start_ns
    return t.drop_columns(["start_ns"]).replace_schema_metadata(None)


def _bad_utf8_names(t: pa.Table) -> pa.Table:  # Parquet decoding does not check UTF-8; DuckDB refuses it
    bad = pa.array([b"\xff\xfe-kernel"] * t.num_rows, pa.binary()).view(pa.string())
    return t.set_column(t.schema.get_field_index("name"), pa.field("name", pa.string()), bad)


def _part_version(t: pa.Table) -> pa.Table:
    return t.replace_schema_metadata({**t.schema.metadata, b"pastaprof.schema_version": b"99"})


MANIFEST_CASES: dict[str, tuple[Callable[[Path], None], str]] = {
    "fifo": (_replace("run.json", lambda p: os.mkfifo(p)), "FIFO"),
    "directory": (_replace("run.json", lambda p: p.mkdir()), "is a directory"),
    "link_dev_zero": (_replace("run.json", lambda p: p.symlink_to("/dev/zero")), "link out of the run directory"),
    "link_outside": (_outside_copy("run.json"), "link out of the run directory"),
    "link_loop": (_replace("run.json", lambda p: p.symlink_to(p.name)), "symbolic link loop"),
    "dangling_link": (_replace("run.json", lambda p: p.symlink_to("nowhere.json")), "no such file"),
    "socket": (_replace("run.json", _socket_at), "socket"),
    "nested_100000": (_replace("run.json", lambda p: p.write_text("[" * 100_000 + "]" * 100_000)), "nested"),
    "nested_field": (_deep_field, "nested"),
    "too_large": (_replace("run.json", lambda p: os.truncate(p.touch() or p, 65 << 20)), "too large"),
    "empty": (_replace("run.json", lambda p: p.write_bytes(b"")), "empty file"),
    "not_utf8": (_replace("run.json", lambda p: p.write_bytes(b'{"a": "\xff\xfe"}')), "UTF-8"),
    "not_json": (_replace("run.json", lambda p: p.write_text("{schema_version: 1")), "not valid JSON"),
    "list": (_replace("run.json", lambda p: p.write_text("[1, 2]")), "expected a JSON object"),
    "huge_int": (_replace("run.json", lambda p: p.write_text('{"schema_version": ' + "9" * 5000 + "}")),
                 "not valid JSON"),
    "ranks_str": (_set_field("ranks", "x"), "field 'ranks' is a string"),
    "ranks_float": (_set_field("ranks", [0.5]), "field 'ranks[0]'"),
    "ranks_negative": (_set_field("ranks", [-1]), "field 'ranks[0]'"),
    "ranks_twice": (_set_field("ranks", [0, 0]), "lists a rank twice"),
    "ranks_long_bad": (_set_field("ranks", list(range(100_000)) + ["1"]), "field 'ranks[100000]' is a string"),
    "rows_list": (_set_field("rows", []), "field 'rows' is a list"),
    "rows_negative": (_set_field("rows", {"kernel": -81}), "field 'rows.kernel' is the integer -81"),
    "rows_str": (_set_field("rows", {"kernel": "81"}), "field 'rows.kernel'"),
    "counts_list": (_set_field("category_counts", []), "field 'category_counts'"),
    "devices_str": (_set_field("devices", "H200"), "field 'devices'"),
    "devices_null": (_set_field("devices", None), "field 'devices' is null"),
    "process_rank_null": (_set_field("processes", [{"rank": None}]), "field 'processes[0].rank' is null"),
    "program_pids_int": (_set_field("program", {"unflushed_pids": 5}), "field 'program.unflushed_pids'"),
    "device_id_str": (_set_field("devices", [{"id": "x", "name": "H200"}]), "field 'devices[0].id'"),
    "versions_list": (_set_field("versions", [1]), "field 'versions'"),
    "processes_handlers": (_set_field("processes", [{"rank": 0, "handlers": []}]), "field 'processes[0].handlers'"),
    "version_1e400": (_replace("run.json", lambda p: p.write_text('{"schema_version": 1e400, "ranks": [0]}')),
                      "field 'schema_version'"),
    "version_str": (_set_field("schema_version", "1"), "field 'schema_version'"),
    "version_bool": (_set_field("schema_version", True), "field 'schema_version'"),
    "version_float": (_set_field("schema_version", 1.0), "field 'schema_version'"),
    "version_missing": (_set_field("schema_version", None), "field 'schema_version'"),
    "version_unknown": (_set_field("schema_version", 2), "schema version 2 is not supported"),
}

K = "kernel/rank-0.parquet"
PART_CASES: dict[str, tuple[Callable[[Path], None], str]] = {
    "truncated": (_cut(K, lambda n: n // 2), "corrupt or truncated Parquet"),
    "truncated_footer": (_cut(K, lambda n: n - 3), "corrupt or truncated Parquet"),
    "zero_bytes": (_cut(K, lambda n: 0), "empty file"),
    "garbage": (_replace(K, lambda p: p.write_bytes(os.urandom(5000))), "corrupt or truncated Parquet"),
    "json_as_part": (_replace(K, lambda p: shutil.copy(SRC, p)), "corrupt or truncated Parquet"),
    "other_table": (lambda run: shutil.copy(run / "op/rank-0.parquet", run / K), "holds op events, not kernel"),
    "wrong_column_type": (_rewrite_part(K, _string_start), "column 'start_ns' is string, expected int64"),
    "invalid_utf8": (_rewrite_part(K, _bad_utf8_names), "Invalid UTF8"),
    "int_out_of_range": (_rewrite_part(K, _huge_unsigned), "cannot be read as kernel events"),
    "foreign_no_column": (_rewrite_part(K, _foreign_part), "no 'start_ns' column"),
    "part_schema_version": (_rewrite_part(K, _part_version), "event schema version 99"),
    "fifo": (_replace(K, lambda p: os.mkfifo(p)), "FIFO"),
    "directory": (_replace(K, lambda p: p.mkdir()), "is a directory"),
    "socket": (_replace(K, _socket_at), "socket"),
    "link_dev_zero": (_replace(K, lambda p: p.symlink_to("/dev/zero")), "link out of the run directory"),
    "link_outside": (_outside_copy(K), "link out of the run directory"),
    "missing": (lambda run: (run / K).unlink(), "run.json counts 81 kernel rows but kernel/ has no parts"),
    "kind_dir_missing": (lambda run: shutil.rmtree(run / "kernel"), "run.json counts 81 kernel rows"),
    "extra_rank": (lambda run: shutil.copy(run / K, run / "kernel/rank-1.parquet"),
                   "a part of rank 1, but run.json lists ranks [0]"),
    "extra_part": (lambda run: shutil.copy(run / K, run / "kernel/rank-0-pid-7-part-00001.parquet"),
                   "its parts hold 162"),
    "kind_dir_file": (_replace("kernel", lambda p: p.write_text("x")), "not a directory of Parquet parts"),
    "kind_dir_link_out": (_replace("kernel", lambda p: p.symlink_to("/tmp")), "link out of the run directory"),
    "odd_part_name": (lambda run: (run / K).rename(run / "kernel/rank-x.parquet"), "not a part name"),
    "unused_kind": (_cut("frame/rank-0.parquet", lambda n: n // 3), "frame/rank-0.parquet"),
}


def _damaged(good: Path, tmp: Path, damage: Callable[[Path], None]) -> Path:
    run = tmp / "run"
    shutil.copytree(good, run, symlinks=True)
    damage(run)
    return run


COMMANDS = {
    "analyze": lambda run, tmp: ["analyze", str(run), "-q", "--json", str(tmp / "f.json")],
    "info": lambda run, tmp: ["info", str(run)],
    "export": lambda run, tmp: ["export", str(run), "-o", str(tmp / "t.pftrace")],
    "import": lambda run, tmp: ["import", str(run), "-o", str(tmp / "copy")],
    "diff": lambda run, tmp: ["diff", str(run), str(run), "--json", str(tmp / "d.json")],
    "report": lambda run, tmp: ["report", str(run), "-o", str(tmp / "r.html")],
}


def _check_refused(good: Path, tmp: Path, damage: Callable[[Path], None], needle: str, commands) -> None:
    run = _damaged(good, tmp, damage)
    before = snapshot(tmp)
    for name in commands:
        line = one_error_line(cli(*COMMANDS[name](run, tmp)))
        assert needle.lower() in line.lower(), (name, line)
        assert snapshot(tmp) == before, name  # nothing changed, deleted or written


# Every command opens a run directory the same way (api.load / open_run_dir); all of them run on
# these cases, `analyze` alone on the others (each CLI start costs about a second).
ALL_COMMANDS = {"fifo", "directory", "link_dev_zero", "link_loop", "nested_100000", "ranks_str", "truncated",
                "missing"}


@pytest.mark.parametrize("case", sorted(MANIFEST_CASES))
def test_hostile_manifest(good_run, tmp_path, case):
    damage, needle = MANIFEST_CASES[case]
    _check_refused(good_run, tmp_path, damage, needle, COMMANDS if case in ALL_COMMANDS else ["analyze"])


@pytest.mark.parametrize("case", sorted(PART_CASES))
def test_hostile_parts(good_run, tmp_path, case):
    damage, needle = PART_CASES[case]
    _check_refused(good_run, tmp_path, damage, needle, COMMANDS if case in ALL_COMMANDS else ["analyze"])


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a chmod-000 file anyway (the link loop and "
                                               "socket cases cover a run.json that cannot be opened)")
def test_unreadable_manifest(good_run, tmp_path):
    run = _damaged(good_run, tmp_path, lambda run: os.chmod(run / "run.json", 0))
    assert "permission denied" in one_error_line(cli("info", str(run)))


def _as_nobody(*args: str) -> subprocess.CompletedProcess:
    """The CLI as user nobody (root reads a chmod-000 file anyway): setpriv drops the privileges."""
    if os.geteuid() != 0:
        return cli(*args)
    if shutil.which("setpriv") is None:
        pytest.skip("no setpriv to drop root's privileges")
    return subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-m",
                           "pastaprof.cli", *args], capture_output=True, text=True, timeout=TIMEOUT,
                          stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("rel", ["run.json", K, "kernel"])
def test_unreadable_entry_is_permission_denied(good_run, rel):
    """A run.json, part or kind directory the user may not read is "permission denied" on that path
    (an unreadable kernel/ read as "has no parts: a part is missing or damaged")."""
    import tempfile

    top = Path(tempfile.mkdtemp(prefix="hostile-"))  # /tmp itself, so that user nobody reaches it
    try:
        top.chmod(0o755)
        run = top / "run"
        shutil.copytree(good_run, run, symlinks=True)
        for p in (run, *run.rglob("*")):
            p.chmod(0o755 if p.is_dir() else 0o644)
        (run / rel).chmod(0)
        if os.geteuid() != 0 and os.access(run / rel, os.R_OK):
            pytest.skip("this user reads a chmod-000 file")
        for args in (["analyze", str(run), "-q"], ["info", str(run)]):
            line = one_error_line(_as_nobody(*args))
            assert line == f"pastaprof: error: {run / rel}: permission denied", line
    finally:
        for p in (top, *top.rglob("*")):
            p.chmod(0o755)
        shutil.rmtree(top)


def test_the_good_run_reads_and_counts(good_run, tmp_path):
    """The undamaged copy: every command works and the counts are the trace's."""
    r = cli("info", str(good_run))
    assert r.returncode == 0, r.stderr
    assert "81" in r.stdout  # kernel events
    r = cli("export", str(good_run), "-o", str(tmp_path / "t.pftrace"))
    assert r.returncode == 0, r.stderr
    assert f"kernels={KERNELS}" in r.stdout


# --- odd trace paths ---------------------------------------------------------------------

def _bash(script: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=TIMEOUT,
                          stdin=subprocess.DEVNULL)


def _py() -> str:
    return f"'{sys.executable}' -m pastaprof.cli"


def test_process_substitution_is_read(tmp_path, good_run):
    """`pastaprof import <(zcat t.json.gz)`: a pipe, read like the file (same rows per kind)."""
    out = tmp_path / "piped"
    r = _bash(f"{_py()} import <(gzip -dc '{SRC}') -o '{out}'")
    assert r.returncode == 0, r.stderr
    piped, direct = json.loads((out / "run.json").read_text()), _manifest(good_run)
    assert piped["rows"] == direct["rows"] and piped["rows"]["kernel"] == KERNELS
    assert piped["source"].startswith("/dev/fd/")
    r = _bash(f"{_py()} analyze -t kernels --json '{tmp_path / 'k.json'}' -q <(cat '{SRC}')")  # gzip bytes piped
    assert r.returncode == 0, r.stderr
    assert _kernels_found(tmp_path / "k.json") == KERNELS


def _kernels_found(findings: Path) -> int:
    return json.loads(findings.read_text())["tools"]["kernels"]["summary"]["kernels"]


@pytest.mark.parametrize("source, needle", [
    ("<(yes)", "not JSON"),                                  # endless non-JSON: refused at the first bytes
    (f"<(head -c 20000 '{SRC}')", "gzip"),                   # truncated gzip through a pipe
    ("<(true)", "empty file"),                               # a pipe that closes at once
    ("/dev/null", "empty file"),
    ("/dev/zero", "character device"),
])
def test_odd_trace_paths(tmp_path, source, needle):
    for cmd in (f"analyze {source}", f"info {source}", f"import {source} -o '{tmp_path / 'out'}'"):
        r = _bash(f"{_py()} {cmd}")
        line = one_error_line(r)
        assert needle.lower() in line.lower(), (cmd, line)
        assert not (tmp_path / "out").exists()
        assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_fifo_without_writer_and_socket(tmp_path):
    fifo, sock = tmp_path / "trace.json", tmp_path / "trace.sock"
    os.mkfifo(fifo)
    _socket_at(sock)
    assert "empty file" in one_error_line(cli("analyze", str(fifo), timeout=20))
    assert "socket" in one_error_line(cli("analyze", str(sock), timeout=20))


def test_proc_self_fd_pipe(tmp_path):
    """A pipe as /proc/self/fd/N (the child's descriptor N), fed by this process."""
    r_fd, w_fd = os.pipe()
    data = SRC.read_bytes()

    def feed() -> None:
        with os.fdopen(w_fd, "wb") as w:
            w.write(data)

    t = threading.Thread(target=feed)
    t.start()
    try:
        proc = subprocess.run([sys.executable, "-m", "pastaprof.cli", "analyze", "-t", "kernels", "-q", "--json",
                               str(tmp_path / "k.json"), f"/proc/self/fd/{r_fd}"], pass_fds=(r_fd,),
                              capture_output=True, text=True, timeout=TIMEOUT)
    finally:
        os.close(r_fd)
        t.join()
    assert proc.returncode == 0, proc.stderr
    assert _kernels_found(tmp_path / "k.json") == KERNELS


# --- seeded fuzzing of real stores ----------------------------------------------------------

FUZZ_CASES = 300
FUZZ_SEED = 20260501
_FIELDS = ["schema_version", "ranks", "rows", "devices", "versions", "category_counts", "unknown_categories",
           "processes", "clock", "capture_overhead", "dropped_events", "trace_bytes", "format", "source",
           "command", "host", "status", "exit_code", "finished_ns", "notes", "program", "skipped"]


def _fuzz_value(rng):
    return rng.choice([None, True, False, 0, -1, 1.5, 2**70, float("nan"), "", "x", "\x1b[31m\n", [], [1], ["a"],
                       [None], [-1], [0, 0], {}, {"kernel": "x"}, {"kernel": -5}, {"0": []}, [{"id": "x"}],
                       [{"handlers": [1]}], [[[[]]]]])


def _fuzz_one(good: Path, work: Path, rng) -> None:
    """One random damage of a copy of ``good``: a run.json field, run.json bytes, or part bytes."""
    run = work / "run"
    shutil.copytree(good, run)
    how = rng.randrange(4)
    if how == 0:  # a field of a random type (or removed)
        m = _manifest(run)
        name = rng.choice(_FIELDS)
        if rng.random() < 0.2:
            m.pop(name, None)
        else:
            m[name] = _fuzz_value(rng)
        (run / "run.json").write_text(json.dumps(m))
    elif how == 1:  # a nested value one level down
        m = _manifest(run)
        name = rng.choice(["rows", "category_counts", "clock", "devices", "versions"])
        target = m.get(name)
        if isinstance(target, dict) and target:
            target[rng.choice(sorted(target))] = _fuzz_value(rng)
        elif isinstance(target, list) and target and isinstance(target[0], dict):
            target[0][rng.choice(sorted(target[0]) or ["id"])] = _fuzz_value(rng)
        else:
            m[name] = _fuzz_value(rng)
        (run / "run.json").write_text(json.dumps(m))
    else:  # bytes of run.json (1) or of a part (2): cut, flipped, or both
        parts = sorted(run.glob("*/rank-*.parquet"))
        p = run / "run.json" if how == 2 and rng.random() < 0.3 else rng.choice(parts)
        data = bytearray(p.read_bytes())
        for _ in range(rng.randrange(1, 8)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        if rng.random() < 0.4:
            data = data[: rng.randrange(len(data) + 1)]
        p.write_bytes(bytes(data))


def fuzz_main(goods: list[str], work: str, cases: int, seed: int) -> None:
    """Run in a subprocess (a hang or a crash fails the test): each case damages a copy of one
    of ``goods`` and goes through the public API (load, every table, analyze with every tool,
    the Perfetto export; a rank selection in some); only InputError may escape.  Prints one
    JSON summary line."""
    import random

    import pastaprof
    from pastaprof.errors import InputError
    from pastaprof.report.perfetto import write_perfetto

    rng = random.Random(seed)
    work_p = Path(work)
    outcome = {"ok": 0, "refused": 0, "multi_line": 0, "other": []}
    for i in range(cases):
        case = work_p / str(i)
        case.mkdir()
        _fuzz_one(Path(goods[i % len(goods)]), case, rng)
        ranks = [1] if rng.random() < 0.25 else None
        try:
            run = pastaprof.load(case / "run", ranks=ranks)
            for _kind, _t in run.iter_tables():
                pass
            pastaprof.analyze(run)
            write_perfetto(run, case / "t.pftrace")
            outcome["ok"] += 1
        except InputError as e:
            outcome["refused"] += 1
            outcome["multi_line"] += "\n" in str(e)
        except Exception as e:  # noqa: BLE001 -- what the test counts
            outcome["other"].append(f"case {i}: {type(e).__name__}: {e}"[:300])
        shutil.rmtree(case)
    print(json.dumps(outcome))


@pytest.fixture(scope="module")
def two_rank_run(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("ddp") / "run"
    r = cli("import", str(DATA / "ddp_mlp_2ranks"), "-o", str(run))
    assert r.returncode == 0, r.stderr
    assert _manifest(run)["ranks"] == [0, 1]
    return run


def test_fuzzed_stores_never_traceback_or_hang(good_run, two_rank_run, tmp_path):
    goods = [str(good_run), str(two_rank_run)]
    code = (f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import test_hostile_stores as t; "
            f"t.fuzz_main({goods!r}, {str(tmp_path)!r}, {FUZZ_CASES}, {FUZZ_SEED})")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    outcome = json.loads(r.stdout.strip().splitlines()[-1])
    assert outcome["other"] == [], outcome["other"][:5]
    assert outcome["multi_line"] == 0
    assert outcome["ok"] + outcome["refused"] == FUZZ_CASES
    assert outcome["refused"] > FUZZ_CASES // 3  # the damages are mostly caught, not silently read


# --- what pastaprof itself writes always passes the checks -------------------------------------

OWN_SOURCES = sorted(DATA.glob("*.pt.trace.json.gz")) + sorted((DATA / "foreign").glob("*.json")) + \
    sorted((DATA / "recorded").glob("*.pt.trace.json.gz")) + [DATA / "ddp_mlp_2ranks"]


@pytest.mark.parametrize("source", OWN_SOURCES, ids=lambda p: p.name.split(".")[0])
def test_every_imported_run_reads_back(tmp_path, source):
    """A run imported from each real trace is read back whole: the manifest's checks and the
    parts' checks never refuse pastaprof's own output, and every kind has the rows it counts."""
    import pastaprof

    out = pastaprof.import_trace(source, tmp_path / "run")
    run = pastaprof.load(out)
    counted = _manifest(out)["rows"]
    read = {kind: t.num_rows for kind, t in run.iter_tables()}
    assert {k: v for k, v in read.items() if k in counted} == counted
    assert sum(counted.values()) > 0
    assert run.sql("select count(*) from kernel").fetchall() == [(counted.get("kernel", 0),)]


def test_named_fifo_whose_writer_comes_late(tmp_path):
    """`pastaprof import p & gzip -dc t.json.gz > p`: the writer may open the FIFO after pastaprof
    did; what it then writes is read (an anonymous pipe at EOF, by contrast, is empty at once)."""
    from pastaprof.store.safe_read import readable_trace

    fifo, data, got = tmp_path / "late.json", SRC.read_bytes(), {}
    os.mkfifo(fifo)

    def read() -> None:
        try:
            with readable_trace(fifo) as p:
                got["bytes"] = p.read_bytes()
        except Exception as e:  # noqa: BLE001 -- reported below
            got["error"] = e

    t = threading.Thread(target=read)
    t.start()
    import time

    time.sleep(0.5)  # the reader has opened the FIFO (non-blocking) and found no writer
    fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)  # ENXIO (a failure, not a hang) if the reader gave up
    os.set_blocking(fd, True)
    with os.fdopen(fd, "wb") as w:
        w.write(data)
    t.join(30)
    assert got.get("bytes") == data, got.get("error")


def test_parts_claiming_more_than_memory_are_refused(good_run, monkeypatch):
    """A small part may claim billions of rows (run-length-encoded nulls): its footer is checked
    against the machine's memory before anything is read.  Here the machine is made small."""
    import pastaprof
    from pastaprof.errors import InputError
    from pastaprof.store import safe_read

    frame = good_run / "frame/rank-0.parquet"
    md = pq.ParquetFile(frame).metadata
    need = md.num_rows * md.num_columns * 8
    monkeypatch.setattr(safe_read, "_memory_bytes", lambda: need - 1)
    with pytest.raises(InputError, match=f"claims {md.num_rows:,} rows .*more than this machine's memory"):
        pastaprof.load(good_run)
    monkeypatch.setattr(safe_read, "_memory_bytes", lambda: need)
    assert pastaprof.load(good_run).table("frame").num_rows == md.num_rows == 1155
