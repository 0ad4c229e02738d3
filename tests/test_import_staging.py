"""Staging a big plain trace without reading its events (staging.stage_plain): the parts it
writes are byte for byte those of the exact path (stage_events + split_staged), and a wrong
guess of where the event array closes falls back to the exact path."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from conftest import DATA

from pastaprof.importers import kineto, staging

TRACE = DATA / "gpt2_small2l_train_3steps.pt.trace.json.gz"


@pytest.fixture
def plain(tmp_path, monkeypatch) -> Path:
    """The real trace, uncompressed, with the size threshold of cutting lifted."""
    monkeypatch.setattr(staging, "SPLIT_MIN_BYTES", 0)
    p = tmp_path / "trace.json"
    p.write_bytes(gzip.decompress(TRACE.read_bytes()))
    return p


def _exact(path: Path, dest: Path, parts: int = 2):
    dest.parent.mkdir(parents=True, exist_ok=True)
    meta = staging.stage_events(path, dest)
    return meta, staging.split_staged(dest, parts)


@pytest.mark.parametrize("parts", [2, 3])
def test_plain_staging_writes_the_exact_paths_parts(plain, tmp_path, parts):
    seen: list[int] = []
    (tmp_path / "a").mkdir()
    fast = staging.stage_plain(plain, tmp_path / "a" / "events.json", parts, seen.append)
    meta, files = _exact(plain, tmp_path / "b" / "events.json", parts)
    assert fast is not None
    assert fast[0] == meta and meta["traceName"].endswith("gpt2_train_3steps.pt.trace.json")
    assert len(fast[1]) == len(files) == parts
    for a, b in zip(fast[1], files):
        assert a.name == b.name and a.read_bytes() == b.read_bytes()
    assert sum(seen) == plain.stat().st_size == meta["_bytes"]


def test_gzip_and_small_files_are_staged_exactly(plain, tmp_path, monkeypatch):
    assert staging.stage_plain(TRACE, tmp_path / "events.json", 2) is None
    monkeypatch.setattr(staging, "SPLIT_MIN_BYTES", plain.stat().st_size + 1)
    assert staging.stage_plain(plain, tmp_path / "events.json", 2) is None


def test_a_wrong_guess_of_the_array_end_falls_back_to_the_exact_path(plain, monkeypatch):
    """An array of objects in Kineto's layout after ``traceEvents``: the last event boundary
    of the file is in it, the guessed end is its ']', DuckDB rejects the staged bytes and
    the exact path reads the trace."""
    text = plain.read_text()
    tail = '"traceName"'
    samples = '"samples": [\n  {\n    "a": 1\n  },\n  {\n    "a": 2\n  }\n  ],\n  '
    plain.write_text(text[: text.rindex(tail)] + samples + text[text.rindex(tail):])
    guesses, exact = [], []
    real_plain, real_exact = staging.stage_plain, kineto._stage_exactly
    monkeypatch.setattr(kineto, "stage_plain", lambda *a: guesses.append(real_plain(*a)) or guesses[-1])
    monkeypatch.setattr(kineto, "_stage_exactly", lambda *a: exact.append(1) or real_exact(*a))
    tables, meta = kineto.import_file(plain)
    assert guesses[0] is not None and "samples" not in guesses[0][0]  # the guess missed the member
    assert exact == [1] and meta["samples"] == [{"a": 1}, {"a": 2}]
    monkeypatch.setattr(kineto, "stage_plain", lambda *a: None)
    ref_tables, ref_meta = kineto.import_file(plain)
    assert meta == ref_meta
    assert tables.keys() == ref_tables.keys()
    for k, t in tables.items():
        assert t.equals(ref_tables[k]), k


def test_import_of_a_plain_trace_equals_the_gzip_import(plain):
    tables, meta = kineto.import_file(plain)
    ref_tables, ref_meta = kineto.import_file(TRACE)
    assert tables["kernel"].num_rows > 500 and tables["op"].num_rows > 1000
    assert {k: v for k, v in meta.items() if k != "bytes"} == {k: v for k, v in ref_meta.items() if k != "bytes"}
    for k, t in tables.items():
        assert t.equals(ref_tables[k]), k
    assert json.dumps(meta["category_counts"], sort_keys=True) == json.dumps(ref_meta["category_counts"],
                                                                            sort_keys=True)
