"""Values no reader takes in a run directory, through the real CLI in a subprocess: numbers beyond
int64 or float overflow in run.json, lone UTF-16 surrogates, NaN tokens, part times no int64
arithmetic takes.  Each must end in exactly one ``pastaprof: error:`` line naming the problem,
exit 2, the run directory untouched."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pytest
from test_hostile_stores import _damaged, _rewrite_part, cli, good_run, one_error_line, snapshot  # noqa: F401

I64 = 2**63


def _field_raw(name: str, raw: str) -> Callable[[Path], None]:
    """run.json with ``name`` set to the JSON text ``raw`` (which json.dumps may not write)."""
    def damage(run: Path) -> None:
        p = run / "run.json"
        m = json.loads(p.read_text())
        m.pop(name, None)
        p.write_text(json.dumps(m)[:-1] + f', "{name}": {raw}}}')
    return damage


VALUE_CASES: dict[str, tuple[Callable[[Path], None], str, list[str]]] = {
    # an int no 64-bit writer takes: orjson's "Integer exceeds 64-bit range" was a traceback of analyze --json
    "dropped_events_2e70": (_field_raw("dropped_events", str(2**70)), "does not fit 64 bits", ["analyze", "info"]),
    "versions_2e70": (_field_raw("versions", '{"cuda": ' + str(2**70) + '}'), "does not fit 64 bits", ["analyze"]),
    "rows_2e63": (_field_raw("rows", '{"kernel": ' + str(I64) + '}'), "does not fit 64 bits", ["analyze"]),
    # a float no tool's int() of it fits: the same traceback
    "dropped_events_1e300": (_field_raw("dropped_events", "1e300"),
                             "field 'dropped_events' is the number 1e+300, expected a finite number", ["analyze"]),
    "trace_bytes_nan": (_field_raw("trace_bytes", "NaN"), "NaN is not a JSON number", ["analyze"]),
    "capture_overhead_inf": (_field_raw("capture_overhead", '{"x": -Infinity}'), "-Infinity is not a JSON number",
                             ["analyze"]),
    # a lone surrogate: `info` printing the note was a UnicodeEncodeError traceback
    "notes_lone_surrogate": (_field_raw("notes", '["\\ud800 half a pair"]'), "lone UTF-16 surrogate",
                             ["info", "analyze"]),
}


@pytest.mark.parametrize("case", sorted(VALUE_CASES))
def test_manifest_values_no_reader_takes_are_one_line(good_run, tmp_path, case):  # noqa: F811 - the fixture
    damage, needle, commands = VALUE_CASES[case]
    run = _damaged(good_run, tmp_path, damage)
    before = snapshot(tmp_path)
    for command in commands:
        args = ["analyze", str(run), "-q", "--json", str(tmp_path / "f.json")] if command == "analyze" \
            else [command, str(run)]
        line = one_error_line(cli(*args))
        assert needle in line and str(run / "run.json") in line, (command, line)
        assert snapshot(tmp_path) == before, command


def test_a_surrogate_pair_in_run_json_is_read(good_run, tmp_path):  # noqa: F811 - the fixture
    """A proper pair (an emoji written as two escapes) is a valid character and is read."""
    run = _damaged(good_run, tmp_path, _field_raw("notes", '["\\ud83d\\ude00 fine"]'))
    r = cli("info", str(run))
    assert r.returncode == 0, r.stderr
    assert "\U0001f600 fine" in r.stdout


def _kernel_start_at(value: int) -> Callable[[Path], None]:
    def change(t: pa.Table) -> pa.Table:
        i = t.schema.get_field_index("start_ns")
        return t.set_column(i, t.schema.field(i), pa.array([value] * t.num_rows, pa.int64()))
    return _rewrite_part("kernel/rank-0.parquet", change)


@pytest.mark.parametrize("start", [-(2**63), -(2**62), 0])  # 0: each span fits, their sum does not
def test_part_times_past_int64_arithmetic_are_one_line(good_run, tmp_path, start):  # noqa: F811 - the fixture
    """Kernels starting at int64's minimum beside ops of today: the steps tool's sum of their spans
    was a DuckDB ConversionException traceback (INT128 to BIGINT)."""
    run = _damaged(good_run, tmp_path, _kernel_start_at(start))
    for args in (["analyze", str(run), "-q", "--json", str(tmp_path / "f.json")],
                 ["export", str(run), "-o", str(tmp_path / "t.pftrace")]):
        line = one_error_line(cli(*args))
        assert line.startswith(f"pastaprof: error: {run / 'kernel'}"), line  # the part, or the kind's view
        assert ": event times span " in line or ": event durations add up to " in line, line
        assert "not the timestamps of one trace" in line, line
    assert not (tmp_path / "f.json").exists() and not (tmp_path / "t.pftrace").exists()


def test_part_with_nulls_where_its_schema_has_none_is_one_line(good_run, tmp_path):  # noqa: F811 - the fixture
    """A kernel part whose start_ns is all null (Parquet takes it; the kind's schema does not):
    the steps tool summed spans from 0 to today into a ConversionException traceback."""
    def nulls(t: pa.Table) -> pa.Table:
        i = t.schema.get_field_index("start_ns")
        return t.set_column(i, pa.field("start_ns", pa.int64()), pa.nulls(t.num_rows, pa.int64()))
    run = _damaged(good_run, tmp_path, _rewrite_part("kernel/rank-0.parquet", nulls))
    line = one_error_line(cli("analyze", str(run), "-q", "--json", str(tmp_path / "f.json")))
    assert line == f"pastaprof: error: {run / 'kernel/rank-0.parquet'}: column 'start_ns' holds 81 nulls; " \
                   "kernel events have none", line
    r = cli("info", str(run))  # every part is read before anything is printed: the error line alone
    assert (r.returncode, r.stdout) == (2, ""), r.stdout
    assert one_error_line(r) == line
