"""Foreign formats under hostile values, through the real CLI: every importer's events must fit
the tools' int64 arithmetic (an overflow inside a tool was a traceback), and a fixed-seed slice of
bench/fuzz_foreign.py (execution trace, memory snapshot, rocpd, nsys) ends in reports or one line."""

from __future__ import annotations

import importlib.util
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import DATA

BENCH = Path(__file__).resolve().parent.parent / "bench" / "fuzz_foreign.py"
ROCPD = DATA / "rocpd" / "single_3.0.3.db"


def _kernel_table(con: sqlite3.Connection) -> str:
    (name,) = con.execute("SELECT name FROM sqlite_master WHERE name LIKE 'rocpd_kernel_dispatch_%'").fetchone()
    return name


@pytest.mark.parametrize("start, end", [(-(2**63), None), (0, 2**63 - 1), (-(2**62), 2**62)])
def test_rocpd_times_past_int64_arithmetic_are_one_line(tmp_path, start, end):
    """A kernel at int64's ends (the typeless SQLite column takes any integer): the steps tool summed
    such spans into an INT128 it could not cast back (DuckDB ConversionException, a traceback)."""
    def change(con: sqlite3.Connection) -> None:
        table = _kernel_table(con)
        (first,) = con.execute(f'SELECT min(id) FROM "{table}"').fetchone()
        con.execute(f'UPDATE "{table}" SET start = ?, "end" = coalesce(?, "end") WHERE id = ?', (start, end, first))

    _db, line = _analyze_changed_rocpd(tmp_path, change)
    assert "event times span" in line and "not the timestamps of one trace" in line, line


def _analyze_changed_rocpd(tmp_path: Path, change) -> tuple[Path, str]:
    """The rocpd fixture changed by ``change(connection)``, analyzed: exit 2, no traceback and one
    stderr line; (the database, that line)."""
    db = tmp_path / "hostile.db"
    shutil.copy(ROCPD, db)
    con = sqlite3.connect(db)
    change(con)
    con.commit()
    con.close()
    r = subprocess.run([sys.executable, "-m", "pastaprof.cli", "analyze", str(db), "-q"], capture_output=True,
                       text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    return db, lines[0]


def test_fuzz_foreign_slice_has_no_traceback_and_no_hang():
    spec = importlib.util.spec_from_file_location("fuzz_foreign", BENCH)
    fz = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fz)
    res = fz.fuzz(["et", "snapshot", "rocpd"], cases=12, seed=20261202, timeout=120.0)
    counts = res["counts"]
    assert all(sum(c.values()) == 12 for c in counts.values()), counts
    assert not res["failures"], res["failures"][:3]
    assert sum(c["ok"] for c in counts.values()) >= 9 and sum(c["clean"] for c in counts.values()) >= 3, counts


def test_rocpd_copy_sizes_past_int64_totals_are_one_line(tmp_path):
    """Copies of 2**62 bytes each (the typeless SQLite column takes them): the copies tool's total
    was an INT128-to-BIGINT ConversionException traceback (bench/fuzz_foreign.py rocpd:88117:115)."""
    def change(con: sqlite3.Connection) -> None:
        (table,) = con.execute("SELECT name FROM sqlite_master WHERE name LIKE 'rocpd_memory_copy_%'").fetchone()
        con.execute(f'UPDATE "{table}" SET size = ?', (2**62,))

    db, line = _analyze_changed_rocpd(tmp_path, change)
    assert line.startswith(f"pastaprof: error: {db}: memcpy sizes add up to "), line
    assert "not the sizes of one trace" in line, line
