"""Bad input: one clear line naming the file and the problem, exit 2, no traceback,
nothing half-written.  Plus a fuzzer over the importer."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import DATA
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pastaprof
from pastaprof.errors import InputError

SMALL = DATA / "leak_5steps.pt.trace.json.gz"


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pastaprof.cli", *args], capture_output=True, text=True, cwd=cwd)


def _bad_files(tmp: Path) -> dict[str, tuple[Path, str]]:
    good = gzip.decompress(SMALL.read_bytes())
    cases = {
        "empty": (b"", "empty file"),
        "not_json": (b"hello world", "not JSON"),
        "truncated_json": (good[: len(good) // 2], "truncated"),
        "wrong_schema": (json.dumps({"foo": [1, 2, 3]}).encode(), "no traceEvents"),
        "events_not_objects": (json.dumps({"traceEvents": [1, 2, 3]}).encode(), "traceEvents"),
        "wrong_type_ts": (json.dumps({"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "pid": 0,
                                                       "tid": 1, "ts": "soon", "dur": 1}]}).encode(), "wrong type"),
        "no_ph": (json.dumps({"traceEvents": [{"name": "x"}, {"name": "y"}]}).encode(), "not a Chrome"),
        "binary": (bytes(range(256)) * 10, "not JSON"),
    }
    out = {}
    for name, (data, why) in cases.items():
        p = tmp / f"{name}.json"
        p.write_bytes(data)
        out[name] = (p, why)
    gz = tmp / "truncated.json.gz"
    gz.write_bytes(SMALL.read_bytes()[:3000])
    out["truncated_gz"] = (gz, "gzip")
    return out


def test_bad_files_one_line_exit_2_nothing_written(tmp_path):
    for name, (path, why) in _bad_files(tmp_path).items():
        out = tmp_path / f"run_{name}"
        r = cli("analyze", str(path), "-o", str(out))
        assert r.returncode == 2, (name, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1, (name, r.stderr)
        assert str(path) in lines[0] and why.lower() in lines[0].lower(), (name, lines[0])
        assert "Traceback" not in r.stderr
        assert not out.exists()
        assert not list(tmp_path.glob(f".run_{name}.partial*"))


@pytest.mark.parametrize("args, needle", [
    (["analyze", "/nonexistent/trace.json"], "no such file"),
    (["analyze", str(SMALL), "-t", "kernels,nosuchtool"], "unknown tool 'nosuchtool'"),
    (["analyze", str(SMALL), "--ranks", "zero"], "rank list"),
    (["analyze"], "PATH or --example"),
    (["info", "/nonexistent"], "no such file"),
    (["export", str(SMALL)], "Missing option '-o'"),
    (["analyze", "--example", "--bogus"], "No such option '--bogus'"),
    (["analyze", "--example", "--rows", "0"], "Invalid value for '--rows'"),
    (["analyze", str(SMALL), "--json", "/nonexistent/dir/f.json"], "does not exist"),
])
def test_bad_flags_and_paths(args, needle):
    r = cli(*args)
    assert r.returncode == 2, r.stderr
    assert needle in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert "Traceback" not in r.stderr


def test_folder_without_traces(tmp_path):
    r = cli("analyze", str(tmp_path))
    assert r.returncode == 2 and "no .json or .json.gz trace files" in r.stderr


def test_corrupt_run_directory(tmp_path):
    (tmp_path / "run.json").write_text("{not json")
    r = cli("analyze", str(tmp_path))
    assert r.returncode == 2 and "corrupt manifest" in r.stderr and "Traceback" not in r.stderr


# --- fuzzing: whatever the bytes, the importer either works or raises InputError ---

_SEED = gzip.decompress(SMALL.read_bytes())


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.integers(0, len(_SEED)), flips=st.lists(st.tuples(st.integers(0, len(_SEED) - 1), st.integers(0, 255)),
                                                      max_size=4))
def test_fuzz_mutated_real_trace(tmp_path, cut, flips):
    data = bytearray(_SEED[:cut] if cut < len(_SEED) else _SEED)
    for pos, val in flips:
        if pos < len(data):
            data[pos] = val
    p = tmp_path / "fuzz.json"
    p.write_bytes(bytes(data))
    try:
        run = pastaprof.load(p)
    except InputError as e:
        assert str(p) in str(e)
        return
    assert run.table("kernel").num_rows >= 0


_json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=False),
                          st.text(max_size=8))
_json = st.recursive(_json_scalars, lambda c: st.one_of(st.lists(c, max_size=4),
                                                        st.dictionaries(st.text(max_size=6), c, max_size=4)),
                     max_leaves=12)
_event = st.fixed_dictionaries(
    {"ph": st.sampled_from(["X", "i", "s", "f", "M", 3, None])},
    optional={"cat": st.sampled_from(["kernel", "cpu_op", "cuda_runtime", "gpu_memcpy", "python_function",
                                      "cpu_instant_event", "ac2g", "weird"]),
              "name": st.one_of(st.text(max_size=10), st.just("[memory]"), _json),
              "pid": _json, "tid": _json, "ts": _json, "dur": _json, "id": _json, "args": _json})


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(events=st.lists(_event, max_size=6), extra=st.dictionaries(st.text(max_size=5), _json, max_size=3))
def test_fuzz_structured_events(tmp_path, events, extra):
    p = tmp_path / "fuzz.json"
    p.write_text(json.dumps({**extra, "traceEvents": events}))
    try:
        pastaprof.analyze(p, tools=["kernels", "ops"])
    except InputError as e:
        assert str(p) in str(e)


def test_a_gzip_bomb_is_refused_in_one_line_before_it_fills_the_disk(tmp_path):
    """~300 KB of gzip holding 300 MB of blanks inside traceEvents (a real one holds TBs)."""
    import zlib

    comp = zlib.compressobj(9, zlib.DEFLATED, 31)
    bomb = tmp_path / "bomb.json.gz"
    with open(bomb, "wb") as f:
        f.write(comp.compress(b'{"traceEvents": ['))
        blank = b" " * (8 << 20)
        for _ in range(300 // 8):
            f.write(comp.compress(blank))
        f.write(comp.compress(b"]}") + comp.flush())
    assert bomb.stat().st_size < (1 << 20)
    r = cli("analyze", str(bomb), "-o", str(tmp_path / "run"))
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "decompression bomb" in lines[0] and "bomb.json.gz" in lines[0], r.stderr
    assert not (tmp_path / "run").exists()
