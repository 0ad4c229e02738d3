"""The sequences tool on real traces: every reported sequence is re-found by a plain left-to-right
scan of each stream's kernel names in the raw JSON; count, GPU time and idle time re-added."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pyarrow as pa
import pytest
from conftest import interval_ns as ival
from conftest import raw_events as load

import pastaprof
from pastaprof.events.schema import conform
from pastaprof.report.diff_names import normalize_kernel_name
from pastaprof.tools.sequences import Sequences

DATA = Path(__file__).parent / "data"
EXAMPLE = Path(pastaprof.__file__).parent / "data" / "example_gpt2_train_3steps.pt.trace.json.gz"
TRACES = [EXAMPLE, DATA / "gpt2_small2l_train_3steps.pt.trace.json.gz", DATA / "mlp_train_3steps.pt.trace.json.gz",
          DATA / "bert4_infer_2iters.pt.trace.json.gz", DATA / "two_streams_copies.pt.trace.json.gz",
          DATA / "recorded" / "cuda_graphs_mlp_4replays.pt.trace.json.gz"]


def streams(ev: list[dict]) -> dict:
    out = defaultdict(list)
    for e in ev:
        if e.get("cat") == "kernel" and e.get("ph") == "X":
            s, t = ival(e)
            out[(e["args"].get("device"), e["args"].get("stream"))].append((s, t, normalize_kernel_name(e["name"])))
    return {k: sorted(v) for k, v in out.items()}


def scan(per_stream: dict, seq: list[str]) -> tuple[int, int, int]:
    """Greedy non-overlapping occurrences: (count, summed kernel time, idle between their kernels)."""
    n, count, busy, idle = len(seq), 0, 0, 0
    for ks in per_stream.values():
        names = [k[2] for k in ks]
        i = 0
        while i + n <= len(names):
            if names[i:i + n] == seq:
                b = sum(t - s for s, t, _ in ks[i:i + n])
                count, busy, idle = count + 1, busy + b, idle + max(0, ks[i + n - 1][1] - ks[i][0] - b)
                i += n
            else:
                i += 1
    return count, busy, idle


@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.name.split(".")[0])
def test_sequences_are_refound_by_a_plain_scan(path):
    (rep,) = pastaprof.analyze(path, tools=["sequences"])
    per_stream = streams(load(path))
    total = sum(t - s for ks in per_stream.values() for s, t, _ in ks)
    rows = rep.tables["sequences"].to_pylist() if rep.tables else []
    (steps,) = pastaprof.analyze(path, tools=["steps"])
    n_steps = rep.summary["steps"]
    assert n_steps == steps.summary["steps"] >= 2  # a sequence repeats within a step: 2 times a step or more
    if not rows:  # two_streams_copies: one kernel stream of a GEMM per step; no pair repeats within a step
        assert path.name.startswith("two_streams") and "per step" in rep.summary["note"]
        pairs = {(a[2], b[2]) for ks in per_stream.values() for a, b in zip(ks, ks[1:])}
        assert pairs and all(scan(per_stream, list(p))[0] < 2 * n_steps for p in pairs)
    for r in rows:
        assert r["length"] == len(r["kernels"]) >= 2
        assert (r["count"], r["gpu_ns"], r["idle_ns"]) == scan(per_stream, r["kernels"])
        assert r["count"] >= 2 * n_steps and r["per_step"] == round(r["count"] / n_steps, 2)
        assert r["share"] == pytest.approx(r["gpu_ns"] / total, abs=1e-4)
    assert rep.summary["kernel_ns"] == total
    # rows name different stretches: no two sequences share a kernel launch
    assert sum(r["length"] * r["count"] for r in rows) <= rep.summary["kernels"]
    for f in rep.findings:
        assert f.impact_ns >= 0.02 * total and f.evidence["suggestion"]


def test_gpt2_layers_are_the_repeated_sequences():
    (rep,) = pastaprof.analyze(EXAMPLE, tools=["sequences"])
    rows = rep.tables["sequences"].to_pylist()
    assert rows[0]["count"] == rows[1]["count"] == 36  # 12 layers x 3 steps, both stretches
    assert rows[0]["gpu_ns"] == max(r["gpu_ns"] for r in rows)  # the stretch with the most GPU time first
    assert len({f.id for f in rep.findings}) == len(rep.findings) >= 1


def _kernels(names: list[str], stream: int = 7, gap: int = 1000, dur: int = 500) -> pa.Table:
    n = len(names)
    start = [i * (gap + dur) for i in range(n)]
    return conform("kernel", pa.table({"start_ns": pa.array(start, pa.int64()),
                                       "end_ns": pa.array([s + dur for s in start], pa.int64()),
                                       "rank": pa.array([0] * n, pa.int32()), "device": pa.array([0] * n, pa.int32()),
                                       "stream": pa.array([stream] * n, pa.int64()), "name": pa.array(names)}))


def _run(table: pa.Table):
    tool = Sequences()
    for b in table.to_batches():
        tool.on_batch("kernel", b)
    return tool.report()


def test_planted_sequence_between_noise_and_across_streams():
    unit = ["gemm", "bias", "gelu", "dropout"]
    noise = [f"k{i}" for i in range(40)]
    names = noise[:5] + unit + noise[5:12] + unit + noise[12:20] + unit + noise[20:24] + unit + noise[24:]
    rep = _run(_kernels(names))
    (row,) = rep.tables["sequences"].to_pylist()
    assert row["kernels"] == unit and row["count"] == 4 and row["gpu_ns"] == 4 * 4 * 500
    assert row["idle_ns"] == 4 * 3 * 1000
    # the same unit split across two streams never counts as one window
    half = pa.concat_tables([_kernels(unit[:2] * 3, stream=1), _kernels(unit[2:] * 3, stream=2)])
    rows = _run(half).tables["sequences"].to_pylist()
    assert all(set(r["kernels"]) <= set(unit[:2]) or set(r["kernels"]) <= set(unit[2:]) for r in rows)


def test_runs_of_one_kernel_and_empty_traces():
    rep = _run(_kernels(["same"] * 50))
    rows = rep.tables["sequences"].to_pylist()
    assert sum(r["length"] * r["count"] for r in rows) <= 50
    rep = Sequences().report()
    assert rep.summary["sequences"] == 0 and "too few kernels" in rep.summary["note"]
    rep = _run(_kernels([f"k{i}" for i in range(30)]))
    assert rep.tables == {} and "no kernel sequence" in rep.summary["note"]


def test_fixed_seed_fuzz_against_the_plain_scan():
    """Random small alphabets (so sequences repeat by chance and overlap), random durations and
    gaps: every row the tool reports is re-found with the same count, GPU time and idle time."""
    import numpy as np

    rng = np.random.default_rng(20261201)
    checked = 0
    for _ in range(150):
        n = int(rng.integers(6, 80))
        names = [f"k{x}" for x in rng.integers(0, int(rng.integers(2, 6)), n)]
        dur = rng.integers(1, 5000, n)
        start = np.cumsum(rng.integers(0, 3000, n) + np.r_[0, dur[:-1]])
        t = conform("kernel", pa.table({"start_ns": pa.array(start, pa.int64()),
                                        "end_ns": pa.array(start + dur, pa.int64()),
                                        "rank": pa.array([0] * n, pa.int32()), "device": pa.array([0] * n, pa.int32()),
                                        "stream": pa.array([7] * n, pa.int64()), "name": pa.array(names)}))
        rep = _run(t)
        per_stream = {0: [(int(s), int(s + d), x) for s, d, x in zip(start, dur, names)]}
        for r in rep.tables["sequences"].to_pylist() if rep.tables else []:
            assert (r["count"], r["gpu_ns"], r["idle_ns"]) == scan(per_stream, r["kernels"]), (names, r)
            checked += 1
    assert checked > 100
