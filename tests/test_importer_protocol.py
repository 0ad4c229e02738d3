"""The importer interface end to end: plugins found through a real ``pastaprof.importers``
entry point (a dist-info on PYTHONPATH, run in a subprocess), validated at registration,
dispatched by content, their mistakes named; companions; linking over any subset of kinds."""

from __future__ import annotations

import itertools
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.compute as pc
import pytest

from pastaprof.importers.base import Importer, check_importer
from pastaprof.importers.kineto import import_file
from pastaprof.processor.link import link_rank

DATA = Path(__file__).parent / "data"
TRACE = DATA / "mlp_train_3steps.pt.trace.json.gz"

PLUGIN = '''
from pathlib import Path
import pyarrow as pa
from pastaprof.importers.base import STRONG, LIKELY, Claim, Importer

class MyTrace(Importer):
    name = "mytrace"
    formats = ("mytrace",)
    looks_for = ".mytrace files"

    def sniff(self, path):
        if path.is_file() and path.read_bytes()[:8] == b"MYTRACE1":
            return Claim(self.name, "mytrace", STRONG, version="1", why="a mytrace file")
        return None

    def import_ranks(self, path, ranks=None, *, progress=None, kinds=None, note=None):
        rows = [line.split() for line in path.read_text().splitlines()[1:]]
        for rank in sorted({int(r[0]) for r in rows}):
            if ranks is not None and rank not in ranks:
                continue
            mine = [r for r in rows if int(r[0]) == rank]
            kind = "bogus" if any(r[3] == "BOGUS" for r in mine) else "kernel"
            yield rank, {kind: pa.table({"start_ns": [int(r[1]) for r in mine], "end_ns": [int(r[2]) for r in mine],
                                         "name": [r[3] for r in mine]})}, {"rank": rank}

    def manifest_fields(self, path, metas):
        return {"source": str(path), "format": "mytrace", "format_version": "1",
                "ranks": [m["rank"] for m in metas], "devices": [], "notes": []}

class Extra(Importer):
    name = "extra"
    formats = ("extra",)
    looks_for = ".extra.json companions"
    accompanies = ("kineto",)

    def sniff(self, path):
        return Claim(self.name, "extra", LIKELY) if path.is_file() and b'"extra_marker"' in path.read_bytes()[:64] else None

    def attach(self, rank, tables, files, meta):
        # replaces the rank's ranges with one naming what it was given (what the test checks)
        t = pa.table({"start_ns": [1], "end_ns": [2], "name": [f"extra:{meta['file']}:{len(files)}"]})
        return dict(tables, range=t)

class NotAnImporter:
    name = "nope"

class BadName(MyTrace):
    name = "Bad Name!"
'''


def site(tmp: Path, entries: dict[str, str]) -> Path:
    d = tmp / "site"
    (d / "ki_fake_plugin-0.1.dist-info").mkdir(parents=True)
    (d / "ki_fake_plugin.py").write_text(PLUGIN)
    (d / "ki_fake_plugin-0.1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: ki-fake-plugin\nVersion: 0.1\n")
    eps = "[pastaprof.importers]\n" + "".join(f"{k} = ki_fake_plugin:{v}\n" for k, v in entries.items())
    (d / "ki_fake_plugin-0.1.dist-info" / "entry_points.txt").write_text(eps)
    return d


def cli(sitedir: Path, *args: str) -> subprocess.CompletedProcess:
    import os

    env = dict(os.environ, PYTHONPATH=str(sitedir))
    return subprocess.run([sys.executable, "-m", "pastaprof.cli", *args], capture_output=True, text=True, env=env)


def mytrace(tmp: Path, rows: list[str]) -> Path:
    p = tmp / "a.mytrace"
    p.write_text("MYTRACE1\n" + "\n".join(rows) + "\n")
    return p


def test_a_plugin_importer_registered_by_one_entry_point_line(tmp_path):
    s = site(tmp_path, {"mytrace": "MyTrace"})
    p = mytrace(tmp_path, ["0 1000 3000 k1", "0 4000 4500 k2", "1 1000 1100 k1"])
    r = cli(s, "info", str(p))
    assert r.returncode == 0, r.stderr
    assert "format=mytrace 1" in r.stdout and "ranks=[0, 1]" in r.stdout
    r = cli(s, "analyze", str(p), "-t", "kernels", "--json", str(tmp_path / "f.json"))
    assert r.returncode == 0, r.stderr
    rep = json.loads((tmp_path / "f.json").read_text())["tools"]["kernels"]
    assert rep["summary"]["kernels"] == 3 and rep["summary"]["kernel_ns"] == 2000 + 500 + 100


def test_broken_plugins_are_skipped_with_a_warning_naming_them(tmp_path):
    s = site(tmp_path, {"nope": "NotAnImporter", "badname": "BadName", "missing": "DoesNotExist"})
    r = cli(s, "info", str(TRACE))
    assert r.returncode == 0, r.stderr
    for name in ("'nope'", "'badname'", "'missing'"):
        assert f"importer plugin {name}" in r.stderr


def test_a_plugin_that_breaks_the_contract_is_named_in_one_line(tmp_path):
    s = site(tmp_path, {"mytrace": "MyTrace"})
    p = mytrace(tmp_path, ["0 1000 3000 BOGUS"])
    r = cli(s, "import", str(p), "-o", str(tmp_path / "out"))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines() == ["pastaprof: error: importer 'mytrace' yielded unknown kind 'bogus' "
                                             f"(known: {r.stderr.split('(known: ')[1].strip()}"]
    assert not (tmp_path / "out").exists()


def test_companion_files_are_attached_not_skipped(tmp_path):
    s = site(tmp_path, {"extra": "Extra"})
    job = tmp_path / "job"
    job.mkdir()
    shutil.copy(TRACE, job / "rank-0.pt.trace.json.gz")
    (job / "side.extra.json").write_text('{"extra_marker": 1}')
    (job / "config.json").write_text('{"lr": 1}')
    r = cli(s, "import", str(job), "-o", str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr
    m = json.loads((tmp_path / "out" / "run.json").read_text())
    assert m["companions"] == {"extra": ["side.extra.json"]}
    assert m["skipped"] == {"config.json": "JSON without a traceEvents array"}
    assert "1 file read by the extra importer beside the Kineto traces: side.extra.json" in r.stderr
    from pastaprof.store.run import open_run_dir

    rng = open_run_dir(tmp_path / "out").table("range")
    assert rng["name"].cast("string").to_pylist() == ["extra:rank-0.pt.trace.json.gz:1"]


def test_nothing_claims_a_folder_or_a_file(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / "x.bin").write_bytes(b"PK\x03\x04rest")
    r = cli(tmp_path, "analyze", str(tmp_path))
    line = r.stderr.strip()
    assert r.returncode == 2 and len(line.splitlines()) == 1
    assert "folder holds no .json or .json.gz trace files, no " in line and "no .sqlite Nsight Systems exports" in line
    assert "notes.txt: text" in line and "x.bin: a zip archive" in line
    r = cli(tmp_path, "info", str(tmp_path / "x.bin"))
    assert r.returncode == 2 and "is a zip archive, not a trace any importer reads" in r.stderr


def test_validation_names_the_plugin_and_the_problem():
    class NoLooks(Importer):
        name, formats = "x", ("x",)

    class NoMethods(Importer):
        name, formats, looks_for = "y", ("y",), "y files"

    class Companion(Importer):
        name, formats, looks_for, accompanies = "z", ("z",), "z files", ("kineto",)

        def sniff(self, path):
            return None

    with pytest.raises(ValueError, match="'p1': looks_for"):
        check_importer(NoLooks, "p1")
    with pytest.raises(ValueError, match="'p2' does not implement sniff, import_ranks, manifest_fields"):
        check_importer(NoMethods, "p2")
    with pytest.raises(ValueError, match="'p3' does not implement attach"):
        check_importer(Companion, "p3")
    with pytest.raises(ValueError, match="'p4' is 3, not a subclass"):
        check_importer(3, "p4")


def test_linking_is_total_over_every_subset_of_kinds():
    """Whatever kinds an importer gives, link_rank links what it can and never raises;
    the kernel -> op links it makes with everything equal the ones it makes with only what they need."""
    tables, _ = import_file(TRACE)
    full = link_rank(tables)
    kinds = [k for k in ("op", "api", "frame", "kernel", "memcpy", "memset", "collective", "range") if k in tables]
    for n in range(len(kinds) + 1):
        for sub in itertools.combinations(kinds, n):
            out = link_rank({k: tables[k] for k in sub})
            assert set(out) == set(sub)
            if {"op", "api", "kernel"} <= set(sub):
                assert pc.equal(pc.fill_null(out["kernel"]["op_id"], -1),
                                pc.fill_null(full["kernel"]["op_id"], -1)).to_pylist().count(False) == 0
