"""What pastaprof says about a file: its format and version for every foreign format it reads,
and, for a file no importer reads, which formats are read; docs/events.md against the schema.

Versions are read back from the fixtures themselves (SQLite metadata tables, the pickle's protocol
byte, the execution trace's ``schema`` key), not copied from pastaprof's output.  The CLI runs with
COLUMNS=60: the ``info`` header must not wrap on a narrow terminal.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from pastaprof.events.schema import COMMON, KINDS, schema
from pastaprof.importers import registry
from pastaprof.importers.sniff import sniff

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
NSYS = DATA / "nsys" / "mfu_2gpu_before.sqlite"
ROCPD = DATA / "rocpd" / "single_3.0.3.db"
SNAPSHOT = DATA / "snapshots" / "leak.pickle"
ET = DATA / "recorded" / "et_beside_kineto" / "rank-0.et.json.gz"


def cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "60"}
    return subprocess.run([sys.executable, "-m", "pastaprof.cli", *args], capture_output=True, text=True, env=env)


def _sqlite_value(path: Path, q: str) -> str:
    con = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
    try:
        return con.execute(q).fetchone()[0]
    finally:
        con.close()


def _nsys_version(p: Path) -> str:
    return _sqlite_value(p, "SELECT value FROM META_DATA_EXPORT WHERE name = 'EXPORT_SCHEMA_VERSION'")


def _rocpd_version(p: Path) -> str:
    return _sqlite_value(p, "SELECT value FROM rocpd_metadata WHERE tag = 'schema_version'")


def _pickle_version(p: Path) -> str:
    head = p.read_bytes()[:2]
    assert head[0] == 0x80  # a pickle's PROTO opcode, then the protocol number
    return f"pickle protocol {head[1]}"


def _et_version(p: Path) -> str:
    with gzip.open(p, "rt") as f:
        return json.load(f)["schema"]


FOREIGN = [
    (NSYS, "nsys-sqlite", _nsys_version),
    (ROCPD, "rocpd", _rocpd_version),
    (SNAPSHOT, "memory_snapshot", _pickle_version),
    (ET, "pytorch_et", _et_version),
]


@pytest.mark.parametrize(("path", "fmt", "version_of"), FOREIGN, ids=["nsys", "rocpd", "snapshot", "et"])
def test_info_prints_format_and_version_of_each_foreign_format(tmp_path, path, fmt, version_of):
    version = version_of(path)
    assert version and fmt
    r = cli("info", str(path))
    assert r.returncode == 0, r.stderr[-2000:]
    header = r.stdout.splitlines()[0]
    assert f"format={fmt} {version}" in header, header
    # imported to a run directory, the run says the same
    out = tmp_path / "run"
    r = cli("import", str(path), "-o", str(out))
    assert r.returncode == 0, r.stderr[-2000:]
    manifest = json.loads((out / "run.json").read_text())
    assert manifest["format"] == fmt and manifest["format_version"] == version
    r = cli("info", str(out))
    assert r.returncode == 0 and f"format={fmt} {version}" in r.stdout.splitlines()[0], r.stdout[:500]


def test_an_execution_trace_is_named_as_read_not_as_unsupported():
    s = sniff(ET)
    assert s.kind == "et"
    assert "execution_trace importer" in s.why and "yet" not in s.why and "no importer" not in s.why


def _error_line(r: subprocess.CompletedProcess) -> str:
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("pastaprof: error: "), r.stderr[-2000:]
    assert "Traceback" not in r.stderr
    return lines[0]


def test_a_file_no_importer_reads_names_what_is_read(tmp_path):
    """The line names the file's look and every installed importer's formats."""
    looks = [cls.looks_for for cls in registry.available().values()]
    assert {".sqlite Nsight Systems exports", ".db rocpd databases (rocprofv3)",
            ".pickle PyTorch memory snapshots"} <= set(looks)
    zipf = tmp_path / "traces.zip"
    zipf.write_bytes(b"PK\x03\x04" + bytes(200))
    app = tmp_path / "app.sqlite"
    con = sqlite3.connect(app)
    con.execute("CREATE TABLE users (id INTEGER, name TEXT)")
    con.commit()
    con.close()
    for path, look in ((zipf, "a zip archive"), (app, "an SQLite database")):
        line = _error_line(cli("info", str(path)))
        assert f"is {look}, not a trace any importer reads" in line, line
        assert all(x in line for x in looks), line
    empty = tmp_path / "empty"
    empty.mkdir()
    line = _error_line(cli("info", str(empty)))
    assert "(it is empty)" in line and all(x in line for x in looks), line


def _documented(text: str) -> dict[str, list[tuple[str, str]]]:
    """kind (or "common") -> the (column, type) rows of its table in docs/events.md."""
    rows = re.compile(r"^\| `(\w+)` \| `([^`]+)` \|", re.M)
    out = {}
    common = text.split("## Common columns", 1)[1].split("\n## ", 1)[0]
    out["common"] = rows.findall(common)
    kinds = text.split("## Kinds", 1)[1].split("\n## ", 1)[0]
    parts = re.split(r"^### `(\w+)`\s*$", kinds, flags=re.M)
    for name, body in zip(parts[1::2], parts[2::2]):
        out[name] = rows.findall(body)
    return out


def test_events_md_lists_every_column_of_every_kind():
    doc = _documented((ROOT / "docs" / "events.md").read_text())
    assert doc["common"] == [(f.name, str(f.type)) for f in COMMON]
    common = {f.name for f in COMMON}
    assert sorted(k for k in doc if k != "common") == sorted(KINDS)
    for kind in KINDS:
        want = [(f.name, str(f.type)) for f in schema(kind) if f.name not in common]
        assert doc[kind] == want, kind
    assert ("rf_id", "int64") in doc["op"] and ("data_deps", "list<item: int64>") in doc["op"]
