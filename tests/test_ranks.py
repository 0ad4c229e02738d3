"""Which rank each trace of a folder is read as: distributedInfo, rank-N names, the
process (host + pid), and what is guessed, merged or skipped -- said, never silent.

Shapes are built in tmp_path from the real traces in tests/data (recorded on an
H200) and the real CPU fixtures in tests/data/ranks (see its README)."""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import DATA, raw_events

import pastaprof
from pastaprof.errors import InputError
from pastaprof.importers import iter_ranks

PY = [sys.executable, "-m", "pastaprof.cli"]
RANKS = DATA / "ranks"
RECORDED = DATA / "recorded"  # real GPU traces (H200, torch 2.11): see its README
DDP = DATA / "ddp_mlp_2ranks"
MLP = DATA / "mlp_train_3steps.pt.trace.json.gz"
LEAK = DATA / "leak_5steps.pt.trace.json.gz"
UNRELATED = [DATA / "bert4_infer_2iters.pt.trace.json.gz", LEAK, MLP, DATA / "two_streams_copies.pt.trace.json.gz"]


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*PY, *args], capture_output=True, text=True)


def one_error_line(r: subprocess.CompletedProcess) -> str:
    """The one line a refused input gets: exit 2, no traceback."""
    assert r.returncode == 2, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pastaprof: error: ") and "Traceback" not in r.stderr, r.stderr
    return lines[0]


def notes(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ln.startswith("pastaprof: note: ")]


def count(path: Path, cat: str) -> int:
    return sum(1 for e in raw_events(path) if e.get("cat") == cat and e.get("ph") == "X")


def kernels_per_rank(run) -> dict[int, int]:
    return dict(run.sql("select rank, count(*) from kernel group by rank").fetchall())


def load_quiet(path: Path, **kw):
    """pastaprof.load, with the note lines collected instead of printed."""
    said: list[str] = []
    metas = [m for _r, _t, m in iter_ranks(path, note=said.append, **kw)]
    return pastaprof.load(path), said, metas


def write_trace(src: Path, dest: Path, shift_us: float = 0.0, **top) -> Path:
    """A copy of ``src`` (gzip), its events moved by ``shift_us`` and top-level keys
    set from ``top`` (a value of None removes the key)."""
    doc = json.loads(gzip.open(src).read()) if src.read_bytes()[:2] == b"\x1f\x8b" else json.loads(src.read_text())
    if shift_us:
        for e in doc["traceEvents"]:
            if isinstance(e.get("ts"), (int, float)):
                e["ts"] += shift_us
    for k, v in top.items():
        if v is None:
            doc.pop(k, None)
        else:
            doc[k] = v
    # distributedInfo first, as Kineto writes it: the header before traceEvents
    events = doc.pop("traceEvents")
    body = json.dumps(doc)[:-1] + (", " if doc else "") + '"traceEvents": ' + json.dumps(events) + "}"
    dest.write_bytes(gzip.compress(body.encode()))
    return dest


# -- two cycles of one process ---------------------------------------------------------------------------

def test_real_tensorboard_folder_of_one_process_two_cycles_is_one_rank(tmp_path):
    """tensorboard_trace_handler + schedule(repeat=2), one process: two files, one rank, all
    events of both cycles, one note saying so (the old code made them ranks [0, 1])."""
    folder = RANKS / "cpu_tb_2cycles"
    files = sorted(folder.iterdir())
    assert len(files) == 2
    run, said, metas = load_quiet(folder)
    assert run.ranks == [0]
    ops = sum(count(f, "cpu_op") for f in files)
    assert ops > 100 and run.sql("select count(*) from op where rank = 0").fetchall()[0][0] == ops
    assert len(said) == 1 and "2 captures of one process" in said[0] and "pid 17290" in said[0]
    src = run.manifest["rank_source"]
    assert [src[f.name]["rank"] for f in files] == [0, 0]
    assert all(src[f.name]["from"] == "process" and src[f.name]["guess"] for f in files)
    a, b = (src[f.name] for f in files)  # consecutive, not overlapping: the first ends before the second
    assert a["end_ns"] <= b["start_ns"]
    assert run.manifest["notes"] == said
    # the command line says it once on stderr, and the stored run keeps it
    r = cli("import", str(folder), "-o", str(tmp_path / "run"))
    assert r.returncode == 0, r.stderr
    assert notes(r.stderr) == ["pastaprof: note: " + said[0]]
    assert pastaprof.load(tmp_path / "run").sql("select count(*) from op where rank = 0").fetchall()[0][0] == ops
    stored = json.loads((tmp_path / "run" / "run.json").read_text())
    assert stored["ranks"] == [0] and stored["notes"] == said and set(stored["rank_source"]) == {f.name for f in files}
    info = cli("info", str(tmp_path / "run"))
    assert info.returncode == 0 and "ranks=[0]" in info.stdout and "2 captures of one process" in info.stdout


def test_two_gpu_cycles_named_by_tensorboard_handler_are_one_rank_in_time_order(tmp_path):
    """Two captures of one process with kernels (host_pid.time names, no distributedInfo):
    one rank holding the kernels of both, read in time order."""
    first = shutil.copy(MLP, tmp_path / "gpu-node_4242.1790000000000000002.pt.trace.json.gz")
    second = shutil.copy(LEAK, tmp_path / "gpu-node_4242.1790000000000000001.pt.trace.json.gz")
    run, said, metas = load_quiet(tmp_path)
    assert run.ranks == [0]
    assert kernels_per_rank(run) == {0: count(MLP, "kernel") + count(LEAK, "kernel")}
    # time order: the events' own times decide (MLP's come first), not the names
    assert [m["file"] for m in metas] == [Path(first).name, Path(second).name]
    assert metas[0]["rank_source"]["end_ns"] < metas[1]["rank_source"]["start_ns"]
    assert len(said) == 1 and "host gpu-node, pid 4242" in said[0] and "read as rank 0" in said[0]


def test_overlapping_captures_of_one_process_are_refused(tmp_path):
    """A copy of a capture under a second cycle name overlaps the first in time: it cannot
    be a second cycle of that process, so the import stops with one line (the old code
    counted every kernel twice, as ranks 0 and 1)."""
    shutil.copy(MLP, tmp_path / "node_7.1790000000000000001.pt.trace.json.gz")
    shutil.copy(MLP, tmp_path / "node_7.1790000000000000002.pt.trace.json.gz")
    line = one_error_line(cli("analyze", str(tmp_path), "-t", "kernels"))
    assert "overlap in time" in line and "node_7.1790000000000000001" in line and "node_7.1790000000000000002" in line
    with pytest.raises(InputError, match="overlap in time"):
        pastaprof.import_trace(tmp_path, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_ddp_job_with_two_cycles_per_rank(tmp_path):
    """A DDP job profiled with a schedule: two files per rank, each with distributedInfo.
    Two ranks, each with both cycles' kernels (the old code refused: "rank 0 appears in
    more than one trace file")."""
    for r in (0, 1):
        src = DDP / f"rank-{r}.pt.trace.json.gz"
        shutil.copy(src, tmp_path / f"node_{600 + r}.1790000000000000001.pt.trace.json.gz")
        write_trace(src, tmp_path / f"node_{600 + r}.1790000000000000002.pt.trace.json.gz", shift_us=2e6)
    run, said, _ = load_quiet(tmp_path)
    assert run.ranks == [0, 1]
    assert kernels_per_rank(run) == {r: 2 * count(DDP / f"rank-{r}.pt.trace.json.gz", "kernel") for r in (0, 1)}
    assert len(said) == 1 and said[0].startswith("2 ranks come from several captures each")
    assert all(s["from"] == "distributedInfo" and not s["guess"] for s in run.manifest["rank_source"].values())


# -- traces that state no rank ---------------------------------------------------------------------------

def test_unrelated_traces_are_not_silently_one_job(tmp_path):
    """Four traces of four different programs (no distributedInfo, no rank names): read as
    ranks by file order, and the note and the manifest say it is a guess."""
    for f in UNRELATED:
        shutil.copy(f, tmp_path / f.name)
    run, said, _ = load_quiet(tmp_path)
    assert run.ranks == [0, 1, 2, 3]
    assert kernels_per_rank(run) == {i: count(f, "kernel") for i, f in enumerate(UNRELATED)}
    assert len(said) == 1
    assert said[0].startswith("4 traces state no rank") and "ranks 0-3 by file order, a guess" in said[0]
    assert "separate runs" in said[0]
    src = run.manifest["rank_source"]
    assert [(src[f.name]["rank"], src[f.name]["from"], src[f.name]["guess"]) for f in UNRELATED] == [
        (0, "file order", True), (1, "file order", True), (2, "file order", True), (3, "file order", True)]
    r = cli("analyze", str(tmp_path), "-t", "kernels", "-q")
    assert r.returncode == 0 and len(notes(r.stderr)) == 1 and "a guess" in r.stderr


def test_ranks_whose_traces_name_different_devices_are_said_so(tmp_path):
    """The run's devices are one rank's: where another rank's trace names other GPUs (unrelated
    traces, a mixed cluster), a note says which rank names which, and the manifest keeps them."""
    doc = json.loads(gzip.open(MLP).read())
    props = doc["deviceProperties"]
    write_trace(MLP, tmp_path / "rank-0.pt.trace.json.gz")
    write_trace(MLP, tmp_path / "rank-1.pt.trace.json.gz", deviceProperties=[{**d, "name": "NVIDIA H100"} for d in props])
    run, said, _ = load_quiet(tmp_path)
    names = sorted({d["name"] for d in props})
    assert said == [f"the ranks' traces name different devices (rank 0: {', '.join(names)}; rank 1: NVIDIA H100): "
                    "the run's devices are rank 0's"]
    assert run.manifest["device_names_by_rank"] == {"0": names, "1": ["NVIDIA H100"]}
    same = tmp_path / "same"
    same.mkdir()
    for r in (0, 1):
        write_trace(MLP, same / f"rank-{r}.pt.trace.json.gz")
    run, said, _ = load_quiet(same)
    assert said == [] and run.manifest["device_names_by_rank"] is None


def test_an_unranked_trace_beside_ranked_ones_gets_the_next_free_rank(tmp_path):
    for r in (0, 1):
        shutil.copy(DDP / f"rank-{r}.pt.trace.json.gz", tmp_path / f"rank-{r}.pt.trace.json.gz")
    shutil.copy(MLP, tmp_path / "extra.pt.trace.json.gz")
    run, said, _ = load_quiet(tmp_path)
    assert run.ranks == [0, 1, 2]
    assert kernels_per_rank(run)[2] == count(MLP, "kernel")
    assert len(said) == 1 and said[0].startswith("1 trace states no rank") and "extra.pt.trace.json.gz" in said[0]
    assert run.manifest["rank_source"]["extra.pt.trace.json.gz"]["guess"] is True
    one = run.manifest["rank_source"]["rank-1.pt.trace.json.gz"]
    assert (one["rank"], one["from"], one["guess"], one["pid"]) == (1, "distributedInfo", False, 604)


def test_one_trace_is_rank_zero_without_a_note(tmp_path):
    run, said, _ = load_quiet(MLP)
    assert run.ranks == [0] and said == []
    assert run.manifest["rank_source"][MLP.name]["from"] == "single trace"
    assert not run.manifest["rank_source"][MLP.name]["guess"]


# -- distributedInfo and file-name ranks ----------------------------------------------------------------

@pytest.mark.parametrize("dist, expect", [
    ({"rank": -1, "world_size": 2}, "distributedInfo.rank is -1: out of range"),
    ({"rank": 2**40, "world_size": 2**41}, "distributedInfo.rank is 1099511627776: out of range"),
    ({"rank": 2**70}, "distributedInfo.rank is 1180591620717411303424: out of range"),
    ({"rank": "1", "world_size": 2}, 'distributedInfo.rank is "1": not a rank'),
    ({"rank": 1.0, "world_size": 2}, "distributedInfo.rank is 1.0: not a rank"),
    ({"rank": True, "world_size": 2}, "distributedInfo.rank is true: not a rank"),
    ({"rank": [0]}, "distributedInfo.rank is [0]: not a rank"),
    ({"rank": 5, "world_size": 2}, "distributedInfo.rank is 5, not below its world_size 2"),
    ("rank 0", 'distributedInfo is "rank 0": not an object'),
])
def test_bad_distributed_rank_is_one_line(tmp_path, dist, expect):
    """Each hostile rank is one line naming it, for a single file and inside a folder
    (the old code took -1 as a rank, read "1"/1.0/true as rank 0 or by position, and
    failed on 2**40 with a misleading "wrong type" line)."""
    (tmp_path / "job").mkdir()
    bad = write_trace(DDP / "rank-1.pt.trace.json.gz", tmp_path / "job" / "node.pt.trace.json.gz", distributedInfo=dist)
    shutil.copy(DDP / "rank-0.pt.trace.json.gz", tmp_path / "job" / "rank-0.pt.trace.json.gz")
    for target in (bad, bad.parent):
        line = one_error_line(cli("analyze", str(target), "-t", "kernels"))
        assert expect in line and line.startswith(f"pastaprof: error: {bad}: "), line


def test_distributed_rank_at_the_int32_limit_reads_right(tmp_path):
    f = write_trace(DDP / "rank-1.pt.trace.json.gz", tmp_path / "t.pt.trace.json.gz",
                    distributedInfo={"rank": 2**31 - 1, "world_size": 2**31})
    run, said, _ = load_quiet(f)
    assert run.ranks == [2**31 - 1] and said == []
    assert kernels_per_rank(run) == {2**31 - 1: count(DDP / "rank-1.pt.trace.json.gz", "kernel")}


@pytest.mark.parametrize("name, expect", [
    ("rank-99999999999.pt.trace.json.gz", "rank 99999999999 in the file name is out of range"),
    ("rank-2147483648.pt.trace.json.gz", "rank 2147483648 in the file name is out of range"),
    ("rank_" + "9" * 240 + ".json.gz", "rank 99999999999999999... in the file name is out of range"),
])
def test_huge_rank_in_file_name_is_one_line(tmp_path, name, expect):
    """Beyond int32: one line (the old code died with an Arrow overflow traceback)."""
    f = shutil.copy(MLP, tmp_path / name)
    for target in (f, tmp_path):
        assert expect in one_error_line(cli("analyze", str(target), "-t", "kernels"))


def test_rank_in_file_name_at_the_limit_and_with_leading_zeros(tmp_path):
    shutil.copy(MLP, tmp_path / "rank-2147483647.pt.trace.json.gz")
    shutil.copy(LEAK, tmp_path / "rank-0007.pt.trace.json.gz")
    run, said, _ = load_quiet(tmp_path)
    assert run.ranks == [7, 2**31 - 1] and said == []
    assert kernels_per_rank(run) == {7: count(LEAK, "kernel"), 2**31 - 1: count(MLP, "kernel")}


def test_distributed_info_wins_over_the_file_name_with_a_note(tmp_path):
    shutil.copy(DDP / "rank-0.pt.trace.json.gz", tmp_path / "rank-1.pt.trace.json.gz")
    shutil.copy(DDP / "rank-1.pt.trace.json.gz", tmp_path / "rank-0.pt.trace.json.gz")
    run, said, _ = load_quiet(tmp_path)
    assert run.ranks == [0, 1]
    assert kernels_per_rank(run) == {r: count(DDP / f"rank-{r}.pt.trace.json.gz", "kernel") for r in (0, 1)}
    assert sorted(said) == ["rank-0.pt.trace.json.gz: distributedInfo says rank 1, the file name says 0: read as rank 1",
                            "rank-1.pt.trace.json.gz: distributedInfo says rank 0, the file name says 1: read as rank 0"]


def test_two_files_claiming_one_rank_at_the_same_time_are_refused(tmp_path):
    """rank-0.json next to rank-0.json.gz (the same capture twice): one line, not double counts."""
    shutil.copy(DDP / "rank-0.pt.trace.json.gz", tmp_path / "rank-0.pt.trace.json.gz")
    (tmp_path / "rank-0.pt.trace.json").write_bytes(gzip.open(DDP / "rank-0.pt.trace.json.gz").read())
    line = one_error_line(cli("analyze", str(tmp_path), "-t", "kernels"))
    assert "is rank 0 (distributedInfo)" in line and "overlap in time" in line


# -- what else a folder holds ----------------------------------------------------------------------------

def test_execution_trace_and_config_beside_kineto_traces(tmp_path):
    """A real execution trace (ExecutionTraceObserver) and a config next to a DDP job's two
    traces: the config is skipped with one note, the execution traces are read as companions
    of the Kineto traces (said in notes), and the two ranks are imported."""
    for r in (0, 1):
        shutil.copy(DDP / f"rank-{r}.pt.trace.json.gz", tmp_path / f"rank-{r}.pt.trace.json.gz")
    (tmp_path / "pytorch_et.json").write_bytes(gzip.open(RANKS / "pytorch_et.json.gz").read())
    shutil.copy(RANKS / "pytorch_et.json.gz", tmp_path / "rank-0_et.json.gz")  # gzip'd, rank-like name
    (tmp_path / "config.json").write_text(json.dumps({"lr": 0.1, "rank": 3, "nodes": 2}))
    run, said, _ = load_quiet(tmp_path)
    assert run.ranks == [0, 1]
    assert kernels_per_rank(run) == {r: count(DDP / f"rank-{r}.pt.trace.json.gz", "kernel") for r in (0, 1)}
    assert said[0] == "skipped 1 file that is no Kineto trace (config.json: JSON without a traceEvents array)"
    assert any("execution_trace importer" in n and "pytorch_et.json" in n and "rank-0_et.json.gz" in n for n in said)
    assert run.manifest["skipped"] == {"config.json": "JSON without a traceEvents array"}
    assert sorted(run.manifest["companions"]["execution_trace"]) == ["pytorch_et.json", "rank-0_et.json.gz"]
    r = cli("import", str(tmp_path), "-o", str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "out" / "run.json").read_text())["ranks"] == [0, 1]


def test_folder_of_an_execution_trace_and_a_config_reads_the_trace(tmp_path):
    (tmp_path / "pytorch_et.json").write_bytes(gzip.open(RANKS / "pytorch_et.json.gz").read())
    (tmp_path / "config.json").write_text('{"lr": 0.1}')
    r = cli("info", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "format=pytorch_et 1.1.1-chakra" in " ".join(r.stdout.split())


def test_a_folder_of_nothing_readable_is_one_line(tmp_path):
    (tmp_path / "config.json").write_text('{"lr": 0.1}')
    (tmp_path / "notes.json").write_text('[1, 2]')
    line = one_error_line(cli("analyze", str(tmp_path)))
    assert "config.json: JSON without a traceEvents array" in line


def test_an_execution_trace_given_alone_is_read(tmp_path):
    et = tmp_path / "pytorch_et.json"
    et.write_bytes(gzip.open(RANKS / "pytorch_et.json.gz").read())
    for f in (et, RANKS / "pytorch_et.json.gz"):
        r = cli("info", str(f))
        assert r.returncode == 0 and "format=pytorch_et 1.1.1-chakra" in " ".join(r.stdout.split()), r.stderr


def test_hidden_files_are_skipped_and_a_broken_rank_can_be_left_out(tmp_path):
    """macOS's ._ files are no traces; a truncated rank-1 fails the folder in one line,
    and --ranks 0 reads the rest without touching it."""
    shutil.copy(DDP / "rank-0.pt.trace.json.gz", tmp_path / "rank-0.pt.trace.json.gz")
    (tmp_path / "._rank-0.pt.trace.json.gz").write_bytes(b"\x00\x05\x16\x07" + b"\x00" * 60)
    whole = (DDP / "rank-1.pt.trace.json.gz").read_bytes()
    (tmp_path / "rank-1.pt.trace.json.gz").write_bytes(whole[: len(whole) // 2])
    line = one_error_line(cli("analyze", str(tmp_path), "-t", "kernels"))
    assert "rank-1.pt.trace.json.gz" in line
    out = tmp_path / "f.json"
    r = cli("analyze", str(tmp_path), "-t", "kernels", "--ranks", "0", "-q", "--json", str(out))
    assert r.returncode == 0, r.stderr
    assert json.loads(out.read_text())["tools"]["kernels"]["summary"]["kernels"] == count(
        DDP / "rank-0.pt.trace.json.gz", "kernel")
    assert notes(r.stderr) == ["pastaprof: note: skipped 1 file that is no Kineto trace "
                               "(._rank-0.pt.trace.json.gz: a hidden file)"]


def test_file_names_with_control_characters_stay_one_line(tmp_path):
    shutil.copy(MLP, tmp_path / "a\nb.pt.trace.json.gz")
    shutil.copy(LEAK, tmp_path / "c.pt.trace.json.gz")
    r = cli("analyze", str(tmp_path), "-t", "kernels", "-q")
    assert r.returncode == 0 and len(notes(r.stderr)) == 1 and "'a\\nb.pt.trace.json.gz'" in r.stderr


def write_with_tail(src: Path, dest: Path, head: dict, tail: dict) -> Path:
    """A copy of ``src`` whose metadata is split: ``head`` before traceEvents, ``tail`` after."""
    doc = json.loads(gzip.open(src).read())
    events = doc.pop("traceEvents")
    body = json.dumps(head)[:-1] + (", " if head else "") + '"traceEvents": ' + json.dumps(events)
    body += (", " + json.dumps(tail)[1:] if tail else "}")
    dest.write_bytes(gzip.compress(body.encode()))
    return dest


def test_distributed_info_past_the_first_bytes_is_the_rank(tmp_path):
    """distributedInfo after the events, or behind a header larger than the sniffed bytes:
    the rank found on import wins over the guess, with a note, and --ranks still selects it."""
    shutil.copy(DDP / "rank-0.pt.trace.json.gz", tmp_path / "rank-0.pt.trace.json.gz")
    src = DDP / "rank-1.pt.trace.json.gz"
    write_with_tail(src, tmp_path / "late.pt.trace.json.gz", {"schemaVersion": 1},
                    {"distributedInfo": {"rank": 5, "world_size": 8}})
    write_with_tail(src, tmp_path / "wide.pt.trace.json.gz",
                    {"distributedInfo": {"rank": 3, "world_size": 8}, "padding": "x" * (2 << 20)}, {})
    run, said, _ = load_quiet(tmp_path)
    assert run.ranks == [0, 3, 5]
    assert kernels_per_rank(run) == {0: count(DDP / "rank-0.pt.trace.json.gz", "kernel"),
                                     3: count(src, "kernel"), 5: count(src, "kernel")}
    assert sum("found past the first bytes, says rank 5" in n for n in said) == 1
    assert sum("found past the first bytes, says rank 3" in n for n in said) == 1
    assert run.manifest["rank_source"]["late.pt.trace.json.gz"]["from"] == "distributedInfo"
    only = pastaprof.load(tmp_path, ranks=[3])
    assert only.ranks == [3] and kernels_per_rank(only) == {3: count(src, "kernel")}


def test_a_guess_every_file_corrects_is_not_said(tmp_path):
    """Two ranks whose distributedInfo comes after their events (as HTA's traces lay it out):
    the first bytes state no rank, so the plan guesses by file order; the files then state
    theirs (1 and 0, against the guess).  The notes say what the files state, and no longer
    that the ranks are a guess -- on stderr and in the stored run."""
    write_with_tail(DDP / "rank-1.pt.trace.json.gz", tmp_path / "a_worker.json.gz", {"schemaVersion": 1},
                    {"distributedInfo": {"rank": 1, "world_size": 2}})
    write_with_tail(DDP / "rank-0.pt.trace.json.gz", tmp_path / "b_worker.json.gz", {"schemaVersion": 1},
                    {"distributedInfo": {"rank": 0, "world_size": 2}})
    run, said, _ = load_quiet(tmp_path)
    assert run.ranks == [0, 1] and kernels_per_rank(run) == {0: count(DDP / "rank-0.pt.trace.json.gz", "kernel"),
                                                             1: count(DDP / "rank-1.pt.trace.json.gz", "kernel")}
    assert len(said) == 2 and all("found past the first bytes" in n for n in said), said
    r = cli("import", str(tmp_path), "-o", str(tmp_path / "run"))
    assert r.returncode == 0 and notes(r.stderr) == ["pastaprof: note: " + n for n in said], r.stderr
    assert json.loads((tmp_path / "run" / "run.json").read_text())["notes"] == said


def test_guessed_ranks_skip_the_ranks_files_state(tmp_path):
    """rank-1 stated; two traces of unknown processes around it: ranks 0 and 2, not 1 twice."""
    shutil.copy(MLP, tmp_path / "a.pt.trace.json.gz")
    shutil.copy(DDP / "rank-1.pt.trace.json.gz", tmp_path / "b_rank-1.pt.trace.json.gz")
    shutil.copy(LEAK, tmp_path / "c.pt.trace.json.gz")
    run, said, _ = load_quiet(tmp_path)
    assert run.ranks == [0, 1, 2]
    assert kernels_per_rank(run) == {0: count(MLP, "kernel"), 1: count(DDP / "rank-1.pt.trace.json.gz", "kernel"),
                                     2: count(LEAK, "kernel")}
    assert len(said) == 1 and "read as ranks 0, 2 by file order, a guess" in said[0]


@pytest.mark.parametrize("head, kind, pid", [
    # brackets and quotes inside strings do not count; the key is found at depth 1 only
    (b'{"a\\"]": "}{[", "x": {"traceEvents": 1}, "traceEvents": [{"ph": "X", "cat": "cpu_op", "pid": 9, '
     b'"name": "f]}\\"", "ts": 1}]}', "trace", 9),
    (b'{"schema": "1.1.1-chakra.0.0.4", "pid": 7, "time": "t", "start_ts": 1, "nodes": [', "et", None),
    (b'{"nodes": [], "schema": "x"}', "et", None),
    (b'{"nodes": [1, 2], "edges": []}', "json", None),
    (b'[{"ph": "X", "cat": "Kernel", "pid": 0}, {"ph": "X", "cat": "Operator", "pid": 31, "ts": 5}]', "trace", 31),
    (b'[[1, 2], 3]', "json", None),
    (b'{"traceEvents": [{"ph": "M", "name": "process_labels", "pid": 44, "args": {"labels": "CPU"}}]}', "trace", 44),
])
def test_sniff_reads_structure_not_bytes(head, kind, pid):
    from pastaprof.importers.sniff import classify

    s = classify(head)
    assert (s.kind, s.pid) == (kind, pid)


def test_sniff_stays_undecided_on_hostile_heads():
    """An unterminated string full of escaped quotes, or a million brackets: no answer
    (the importer then judges the file), reached on a budget, not by scanning forever."""
    from pastaprof.importers.sniff import classify

    for head in (b'{"k": "' + b'\\"' * (1 << 19), b'{"a": ' + b"[" * (1 << 20),
                 b"{" + b'"a": 1, ' * (1 << 17)):
        s = classify(head)
        assert s.kind == "trace" and not s.decided


def test_recorded_gpu_tensorboard_schedule_is_one_rank():
    """The real H200 tensorboard_trace_handler folder (schedule repeat=2, one process):
    one rank with both cycles' 68 kernels each, ProfilerStep#2-#3 and #6-#7."""
    folder = RECORDED / "tb_schedule"
    files = sorted(folder.iterdir())
    run, said, metas = load_quiet(folder)
    assert run.ranks == [0]
    assert [count(f, "kernel") for f in files] == [68, 68] and kernels_per_rank(run) == {0: 136}
    steps = run.sql("select name from range where domain = 'user' and name like 'ProfilerStep#%' order by start_ns").fetchall()
    assert [s[0] for s in steps] == ["ProfilerStep#2", "ProfilerStep#3", "ProfilerStep#6", "ProfilerStep#7"]
    assert [m["file"] for m in metas] == [f.name for f in files]  # the first cycle first
    assert len(said) == 1 and "2 captures of one process (host vm, pid 581)" in said[0]


def test_recorded_execution_trace_beside_its_kineto_trace():
    """The real ET written by profile(execution_trace_observer=...) is named rank-0.et.json.gz:
    recognized by content and joined to the Kineto trace beside it (rank 0, its 44 kernels):
    every one of its 252 ops matched by record function id."""
    folder = RECORDED / "et_beside_kineto"
    run, said, _ = load_quiet(folder)
    assert count(folder / "rank-0.pt.trace.json.gz", "kernel") == 44
    assert run.ranks == [0] and kernels_per_rank(run) == {0: 44}
    assert run.manifest["skipped"] == {}
    assert run.manifest["companions"] == {"execution_trace": ["rank-0.et.json.gz"]}
    assert said[-1] == "rank-0.et.json.gz: execution trace joined to rank 0: 252 of 252 ops matched by record function id"
