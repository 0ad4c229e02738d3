"""The ranks tool on synthetic jobs with planted causes (pastaprof.testing.jobs) and on the real
2-rank NCCL trace: each cause named with its rank, step and size within 10%, against the
simulation's own truth (arrivals, waits, offsets) or an independent count of the raw trace."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from pastaprof import api
from pastaprof.testing import ClockSkew, Imbalance, SlowLink, SlowRank, Straggler, make_job
from pastaprof.testing.jobs import GEMM, LOADER, default_workload, workload_from_trace

DATA = Path(__file__).parent / "data" / "ddp_mlp_2ranks"
MS = 1_000_000


def near(value: float, truth: float, rel: float = 0.10) -> bool:
    return abs(value - truth) <= rel * abs(truth)


def compute_per_step(phases) -> int:
    return sum(ns for p in phases if p.kind is None for _, ns in p.kernels)


def ranks_report(path, **kw):
    return next(r for r in api.analyze(path, tools=["ranks"], **kw) if r.tool == "ranks")


def by_kind(report, kind):
    return [f for f in report.findings if f.kind == kind]


@pytest.fixture(scope="module")
def straggler16(tmp_path_factory):
    out = tmp_path_factory.mktemp("straggler16")
    job = make_job(out, ranks=16, steps=4, seed=1,
                   plants=[Straggler(11, 2, 25 * MS, "compute"), ClockSkew(spread_ns=5 * MS)])
    reports = {r.tool: r for r in api.analyze(out, tools=["ranks", "timeline"])}
    return job, reports


def test_compute_straggler_named_with_rank_step_size_and_kernel(straggler16):
    job, reports = straggler16
    rep = reports["ranks"]
    found = by_kind(rep, "straggler")
    assert len(found) == 1 and not by_kind(rep, "slow link") and not by_kind(rep, "consistently slow rank")
    ev = found[0].evidence
    assert (ev["rank"], ev["step"], ev["cause"]) == (11, "ProfilerStep#2", "compute")
    assert near(ev["delay_ns"], 25 * MS)
    assert ev["grew"][0]["name"] == GEMM and near(ev["grew"][0]["excess_ns"], 25 * MS)
    truth_wait = job.waits()[(2, 11)]  # the simulation's own arrivals: sum over the 15 others
    assert ev["waiting_ranks"] == 15 and near(found[0].impact_ns, truth_wait, 0.02)
    assert near(truth_wait, 15 * 25 * MS)


def test_clock_offsets_recovered_within_the_stated_bound(straggler16):
    job, reports = straggler16
    clocks = reports["ranks"].tables["clocks"].to_pylist()
    assert max(abs(o) for o in job.offsets_ns.values()) > 2 * MS  # several ms of skew were planted
    for row in clocks:
        err = abs(row["offset_ns"] - job.offsets_ns[row["rank"]])
        assert row["aligned"] and err <= row["error_bound_ns"], row
        assert row["error_bound_ns"] < 5_000  # and the bound says something (ends jitter by 1 us)


def test_waiting_ranks_attributed_to_the_straggler_not_their_own_communication(straggler16):
    _, reports = straggler16
    per = {r["rank"]: r for r in reports["ranks"].tables["per_rank"].to_pylist()}
    for rank, row in per.items():
        if rank == 11:
            assert row["waiting_for"] is None and row["waiting_for_straggler_ns"] == 0
            continue
        assert row["waiting_for"] == 11 and near(row["waiting_for_straggler_ns"], 25 * MS)
        assert row["own_exposed_comm_ns"] == row["exposed_comm_ns"] - row["waiting_for_straggler_ns"]
        assert row["own_exposed_comm_ns"] < row["exposed_comm_ns"] / 3
    tl = reports["timeline"]
    own = [f for f in tl.findings if f.title.startswith("exposed communication")]
    assert own == []  # before: "exposed communication 25%" on each of the 15 waiting ranks
    waiting = [f for f in tl.findings if f.kind == "waiting for a rank"]
    assert len(waiting) == 1 and waiting[0].evidence["waiting_for_rank"] == 11
    assert waiting[0].evidence["waiting_ranks"] == 15 and 11 not in waiting[0].evidence["ranks"]


def test_what_if_and_critical_path_name_the_straggler(straggler16):
    _, reports = straggler16
    rep = reports["ranks"]
    best = rep.tables["what_if"].to_pylist()[0]
    assert best["rank"] == 11 and near(best["saved_ns"], 25 * MS)
    path = [s for s in rep.tables["critical_path"].to_pylist() if s["step"] == "ProfilerStep#2"]
    work = max((s for s in path if s["segment"] == "work"), key=lambda s: s["ns"])
    assert work["rank"] == 11 and work["ns"] > 25 * MS
    total = rep.tables["critical_path"].to_pylist()
    assert all(a["end_ns"] <= b["start_ns"] + 1_000 for a, b in zip(total, total[1:]))  # one chain in time


def test_host_straggler_names_the_data_loading(tmp_path):
    make_job(tmp_path, ranks=8, steps=4, plants=[Straggler(5, 1, 10 * MS, "host")])
    found = by_kind(ranks_report(tmp_path), "straggler")
    assert len(found) == 1
    ev = found[0].evidence
    assert (ev["rank"], ev["step"], ev["cause"]) == (5, "ProfilerStep#1", "host") and near(ev["delay_ns"], 10 * MS)
    assert ev["grew"][0]["name"] == LOADER and near(ev["host_excess_ns"], 10 * MS)


def test_slow_link_in_2d_groups_names_the_rank_whose_link_is_slow(tmp_path):
    job = make_job(tmp_path, ranks=16, steps=4, tp=4, seed=2,
                   plants=[SlowLink(11, 2, 3 * MS), ClockSkew(spread_ns=3 * MS)])
    rep = ranks_report(tmp_path)
    links = by_kind(rep, "slow link")
    assert len(links) == 1 and not by_kind(rep, "straggler")
    ev = links[0].evidence
    assert (ev["rank"], ev["step"], ev["cause"]) == (11, "ProfilerStep#2", "link")
    assert near(ev["extra_transfer_ns"], 3 * MS)
    slowed = [c for c in job.collectives if c["step"] == 2 and 11 in c["members"]]
    assert ev["collectives"] == len(slowed) == 3 and near(ev["delay_ns"], 3 * 3 * MS)
    for row in rep.tables["clocks"].to_pylist():  # 2-D groups: offsets through tp and dp groups
        assert abs(row["offset_ns"] - job.offsets_ns[row["rank"]]) <= row["error_bound_ns"]


def test_straggler_in_2d_groups_is_blamed_for_the_waits_it_causes_downstream(tmp_path):
    """Rank 11 late in its tensor-parallel group [8..11] makes that group late for the four
    data-parallel all-reduces: those 12 ranks wait for rank 11 too, not for ranks 8-10."""
    job = make_job(tmp_path, ranks=16, steps=4, tp=4, seed=4,
                   plants=[Straggler(11, 2, 20 * MS, "compute"), ClockSkew(spread_ns=3 * MS)])
    rep = ranks_report(tmp_path)
    found = by_kind(rep, "straggler")
    assert len(found) == 1
    ev = found[0].evidence
    assert (ev["rank"], ev["step"], ev["waiting_ranks"], ev["downstream_collectives"]) == (11, "ProfilerStep#2", 15, 4)
    truth = sum(w for (step, _), w in job.waits().items() if step == 2)  # every wait of the step, all groups
    assert near(ev["delay_ns"], 20 * MS) and near(found[0].impact_ns, truth, 0.02) and near(truth, 15 * 20 * MS)
    per = {r["rank"]: r for r in rep.tables["per_rank"].to_pylist()}
    assert all(per[r]["waiting_for"] == 11 and near(per[r]["waiting_for_straggler_ns"], 20 * MS)
               for r in per if r != 11)


def test_consistently_slow_rank_is_one_finding(tmp_path):
    make_job(tmp_path, ranks=8, steps=5, plants=[SlowRank(3, 1.10)])
    rep = ranks_report(tmp_path)
    slow = by_kind(rep, "consistently slow rank")
    assert len(slow) == 1 and not by_kind(rep, "straggler") and not by_kind(rep, "compute imbalance")
    ev = slow[0].evidence
    expected = 0.10 * compute_per_step(default_workload())  # 10% of the step's compute, per step
    assert ev["rank"] == 3 and ev["step_count"] == 5 and ev["cause"] == "compute" and near(ev["delay_ns"], expected)
    per = {r["rank"]: r for r in rep.tables["per_rank"].to_pylist()}
    assert per[3]["last_arrivals"] == 10 and near(per[3]["median_compute_ns"] / per[0]["median_compute_ns"], 1.10, 0.01)


def test_imbalanced_shapes_each_step_names_the_busiest_rank(tmp_path):
    job = make_job(tmp_path, ranks=8, steps=5, seed=3, plants=[Imbalance(0.2)])
    rep = ranks_report(tmp_path)
    assert len(by_kind(rep, "compute imbalance")) == 1
    events = {e.evidence["step"]: e.evidence for e in by_kind(rep, "straggler")}
    work = compute_per_step(default_workload())
    f = job.compute_factor
    for s in range(job.steps):
        top = int(np.argmax(f[:, s]))
        others = np.delete(f[:, s], top)
        expected = (f[top, s] - np.median(others)) * work
        if expected < 2 * MS:  # below the finding threshold (5% of the step)
            continue
        ev = events[f"ProfilerStep#{s}"]
        assert ev["rank"] == top and ev["cause"] == "compute" and near(ev["delay_ns"], expected), (s, ev)


def _raw_nccl(path: Path) -> list[dict]:
    with gzip.open(path) as f:
        ev = json.load(f)["traceEvents"]
    return [e for e in ev if e.get("cat") == "kernel" and e["name"].startswith("ncclDevKernel")]


def test_real_two_rank_nccl_trace_matches_collectives_by_independent_count():
    rep = ranks_report(DATA)
    coll = rep.tables["collectives"].to_pylist()
    raw = {r: _raw_nccl(DATA / f"rank-{r}.pt.trace.json.gz") for r in (0, 1)}
    assert len(raw[0]) == len(raw[1]) == len(coll) == rep.summary["matched_collectives"] == 8
    assert all(c["ranks"] == 2 for c in coll)
    kinds = Counter(c["kind"] for c in coll)
    assert kinds == Counter(e["args"]["Collective name"] for e in raw[0])  # allreduce 6, broadcast 2
    # bus bandwidth recomputed from the raw kernels: bytes x 2(n-1)/n / (common end - last start)
    for c, e0, e1 in zip([c for c in coll if c["kind"] == "allreduce"],
                         *[[e for e in raw[r] if e["args"]["Collective name"] == "allreduce"] for r in (0, 1)]):
        nbytes = e0["args"]["In msg nelems"] * 4
        assert c["bytes"] == nbytes
        transfer = c["transfer_ns"]
        last_start = max(e0["ts"], e1["ts"]) * 1000
        ends = sorted([(e0["ts"] + e0["dur"]) * 1000, (e1["ts"] + e1["dur"]) * 1000])
        assert ends[0] - 5_000 <= last_start + transfer <= ends[1] + 5_000  # same host: offset within us
        assert c["busbw_gbps"] == pytest.approx(nbytes * 2 * (2 - 1) / 2 / transfer, rel=1e-3)
    clocks = rep.tables["clocks"].to_pylist()
    assert all(abs(r["offset_ns"]) <= r["error_bound_ns"] < 20_000 for r in clocks)  # one host: offset 0


def test_rank_subsets(tmp_path):
    make_job(tmp_path, ranks=16, steps=4, plants=[Straggler(11, 2, 25 * MS, "compute")])
    one = subprocess.run([sys.executable, "-m", "pastaprof.cli", "analyze", str(tmp_path), "-t", "ranks",
                          "--ranks", "3"], capture_output=True, text=True)
    assert one.returncode == 0, one.stderr
    assert one.stdout.count("needs at least 2 ranks") == 1 and "(rank 3)" in one.stdout
    rep = ranks_report(tmp_path, ranks=[10, 11, 12])
    ev = by_kind(rep, "straggler")[0].evidence
    assert (ev["rank"], ev["waiting_ranks"]) == (11, 2) and near(ev["delay_ns"], 25 * MS)
    assert rep.summary["ranks"] == 3 and rep.summary["partial_collectives"] == 8


def test_run_directory_gives_the_same_findings(tmp_path):
    make_job(tmp_path / "job", ranks=4, steps=3, plants=[Straggler(2, 1, 8 * MS, "host"), ClockSkew(spread_ns=4 * MS)])
    run = api.import_trace(tmp_path / "job", tmp_path / "run")
    a, b = ranks_report(tmp_path / "job"), ranks_report(run)
    assert [f.to_dict() for f in a.findings] == [f.to_dict() for f in b.findings]
    assert a.tables["clocks"].equals(b.tables["clocks"])


def test_job_from_a_real_single_rank_trace(tmp_path):
    phases = workload_from_trace(DATA / "rank-0.pt.trace.json.gz")
    colls = [p for p in phases if p.kind]
    assert [p.kind for p in colls] == ["allreduce", "allreduce"] and {p.bytes for p in colls} == {16781312, 16793600}
    make_job(tmp_path, ranks=4, steps=3, workload=phases, plants=[Straggler(1, 1, 2 * MS, "compute")])
    ev = by_kind(ranks_report(tmp_path), "straggler")[0].evidence
    assert (ev["rank"], ev["step"]) == (1, "ProfilerStep#1") and near(ev["delay_ns"], 2 * MS)


@pytest.mark.parametrize("seed", range(6))
def test_fixed_seed_random_plants(tmp_path, seed):
    """Random straggler (rank, step, size, cause) plus random skew: always named right."""
    rng = np.random.default_rng(100 + seed)
    n, steps = int(rng.integers(2, 7)), int(rng.integers(2, 5))
    plant = Straggler(int(rng.integers(0, n)), int(rng.integers(0, steps)), int(rng.integers(3, 30)) * MS,
                      str(rng.choice(["host", "compute"])))
    job = make_job(tmp_path, ranks=n, steps=steps, seed=seed, tp=None, gzip_files=bool(seed % 2),
                   plants=[plant, ClockSkew(spread_ns=int(rng.integers(0, 9)) * MS)])
    assert len(list(tmp_path.glob("rank-*.pt.trace.json" + (".gz" if seed % 2 else "")))) == n
    rep = ranks_report(tmp_path)
    found = by_kind(rep, "straggler")
    assert len(found) == 1, [f.title for f in rep.findings]
    ev = found[0].evidence
    assert (ev["rank"], ev["step"], ev["cause"]) == (plant.rank, f"ProfilerStep#{plant.step}", plant.cause)
    assert near(ev["delay_ns"], plant.delay_ns)
    for row in rep.tables["clocks"].to_pylist():
        assert abs(row["offset_ns"] - job.offsets_ns[row["rank"]]) <= row["error_bound_ns"]


# ---------------------------------------------------------------- hostile jobs


def _edit(path: Path, keep) -> None:
    """Rewrite a generated rank file with only the events ``keep(event)`` accepts."""
    with gzip.open(path) as f:
        doc = json.load(f)
    doc["traceEvents"] = [e for e in doc["traceEvents"] if keep(e)]
    with gzip.open(path, "wt") as f:
        json.dump(doc, f)


def _step_start(path: Path, step: int) -> float:
    with gzip.open(path) as f:
        return next(e["ts"] for e in json.load(f)["traceEvents"] if e["name"] == f"ProfilerStep#{step}")


def test_profiles_starting_at_different_steps_still_match(tmp_path):
    make_job(tmp_path, ranks=4, steps=4, plants=[Straggler(2, 2, 10 * MS, "compute"), ClockSkew(spread_ns=3 * MS)])
    f1 = tmp_path / "rank-1.pt.trace.json.gz"
    t1 = _step_start(f1, 1)
    _edit(f1, lambda e: e["ts"] >= t1)  # rank 1's profile starts one step later
    rep = ranks_report(tmp_path)
    ev = by_kind(rep, "straggler")[0].evidence
    assert (ev["rank"], ev["step"], ev["waiting_ranks"]) == (2, "ProfilerStep#2", 3) and near(ev["delay_ns"], 10 * MS)
    members = Counter(c["ranks"] for c in rep.tables["collectives"].to_pylist())
    assert members == Counter({4: 6, 3: 2})  # step 0's two all-reduces lack rank 1, the rest match
    assert all(abs(w["saved_ns"]) < 11 * MS for w in rep.tables["what_if"].to_pylist())


def test_nccl_kernels_alone_as_in_live_runs(tmp_path):
    """No record_param_comms rows and no collective args on the kernels (a live run, an nsys
    import): the kind comes from the kernel name, the process group is unknown."""
    make_job(tmp_path, ranks=6, steps=3, plants=[Straggler(4, 1, 6 * MS, "host"), ClockSkew(spread_ns=2 * MS)])
    comm_args = ("Collective name", "In msg nelems", "Out msg nelems", "Group size", "dtype", "Process Group Name",
                 "Process Group Description", "Process Group Ranks")

    def keep(e: dict) -> bool:
        for key in comm_args:
            e["args"].pop(key, None)
        return e["name"] != "record_param_comms"

    for f in tmp_path.glob("rank-*"):
        _edit(f, keep)
    rep = ranks_report(tmp_path)
    coll = rep.tables["collectives"].to_pylist()
    assert len(coll) == 6 and {c["pg"] for c in coll} == {""} and {c["kind"] for c in coll} == {"allreduce"}
    ev = by_kind(rep, "straggler")[0].evidence
    assert (ev["rank"], ev["step"], ev["cause"]) == (4, "ProfilerStep#1", "host") and near(ev["delay_ns"], 6 * MS)


def test_rank_without_collectives_is_not_aligned_and_harms_nothing(tmp_path):
    make_job(tmp_path, ranks=3, steps=3, plants=[Straggler(1, 1, 5 * MS, "compute")])
    _edit(tmp_path / "rank-2.pt.trace.json.gz",
          lambda e: not e["name"].startswith("ncclDevKernel") and e["name"] != "record_param_comms")
    rep = ranks_report(tmp_path)
    assert rep.summary["unaligned_ranks"] == [2]
    clocks = {r["rank"]: r for r in rep.tables["clocks"].to_pylist()}
    assert clocks[2]["error_bound_ns"] is None and not clocks[2]["aligned"]
    ev = by_kind(rep, "straggler")[0].evidence
    assert (ev["rank"], ev["waiting_ranks"]) == (1, 1) and near(ev["delay_ns"], 5 * MS)


def test_truncated_rank_and_no_collectives_at_all(tmp_path):
    make_job(tmp_path / "a", ranks=4, steps=3)
    f3 = tmp_path / "a" / "rank-3.pt.trace.json.gz"
    t2 = _step_start(f3, 2)
    _edit(f3, lambda e: e["ts"] < t2)  # rank 3 died before its last step
    rep = ranks_report(tmp_path / "a")
    assert Counter(c["ranks"] for c in rep.tables["collectives"].to_pylist()) == Counter({4: 4, 3: 2})
    assert not by_kind(rep, "straggler")
    make_job(tmp_path / "b", ranks=2, steps=2)
    for f in (tmp_path / "b").glob("rank-*"):
        _edit(f, lambda e: e["cat"] != "kernel" and e["name"] != "record_param_comms")
    rep = ranks_report(tmp_path / "b")
    assert rep.summary["collectives"] == 0 and rep.findings == [] and rep.tables["collectives"].num_rows == 0


def test_map_is_pure_and_small(tmp_path):
    """map_rank sees one rank's tables; combine gives the same report whatever order the
    summaries come in; the summaries are small (a few kB per rank here)."""
    import pyarrow.compute as pc

    from pastaprof.tools.ranks import Ranks

    make_job(tmp_path, ranks=5, steps=3, plants=[Straggler(3, 2, 7 * MS, "compute"), ClockSkew(spread_ns=4 * MS)])
    run = api.load(tmp_path)
    tool = Ranks()
    tables = {k: run.table(k) for k in tool.consumes}
    sums = {r: tool.map_rank(r, {k: t.filter(pc.equal(t["rank"], r)) for k, t in tables.items()}) for r in range(5)}
    assert max(sum(t.nbytes for t in s.values()) for s in sums.values()) < 64_000
    a = tool.combine(sums)
    b = Ranks().combine({r: sums[r] for r in (4, 2, 0, 3, 1)})
    assert [f.to_dict() for f in a.findings] == [f.to_dict() for f in b.findings]
    assert all(a.tables[k].equals(b.tables[k]) for k in a.tables)
    assert a.findings[0].evidence["rank"] == 3


def test_timeline_keeps_a_ranks_own_exposed_communication(tmp_path):
    """Slow transfers (10 ms per all-reduce, nothing overlaps) are each rank's own exposed
    communication: the timeline finding stays, minus the wait for the straggler."""
    phases = default_workload(transfer_ns=10 * MS)
    make_job(tmp_path, ranks=4, steps=3, workload=phases, plants=[Straggler(2, 1, 15 * MS, "compute")])
    reports = {r.tool: r for r in api.analyze(tmp_path, tools=["timeline", "ranks"])}
    tl = {f.location: f for f in reports["timeline"].findings if f.title.startswith("exposed communication")}
    temporal = {r["rank"]: r for r in reports["timeline"].tables["temporal"].to_pylist()}
    per = {r["rank"]: r for r in reports["ranks"].tables["per_rank"].to_pylist()}
    assert set(tl) == {f"rank {r}" for r in range(4)}
    for r in range(4):
        ev = tl[f"rank {r}"].evidence
        waited = ev["waiting_for_peers_ns"]
        assert waited < MS if r == 2 else near(waited, 15 * MS)
        assert ev["communication_ns"] == temporal[r]["communication_ns"] - waited
        assert near(ev["communication_ns"], 3 * 2 * 10 * MS, 0.05)  # 6 transfers of 10 ms
        assert abs(waited - per[r]["waiting_for_straggler_ns"]) <= 50_000


def test_dask_engine_gives_the_same_report(tmp_path):
    pytest.importorskip("distributed")
    make_job(tmp_path, ranks=4, steps=3, plants=[Straggler(2, 1, 8 * MS, "host"), ClockSkew(spread_ns=3 * MS)])
    a = ranks_report(tmp_path)
    b = ranks_report(tmp_path, engine="dask")
    assert [f.to_dict() for f in a.findings] == [f.to_dict() for f in b.findings]
    assert all(a.tables[k].equals(b.tables[k]) for k in a.tables) and a.summary == b.summary
    assert a.findings[0].evidence["rank"] == 2
