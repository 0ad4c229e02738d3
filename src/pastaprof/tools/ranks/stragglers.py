"""Stragglers, slow links and who waited for whom.

Straggler event (table ``stragglers``): a (step, rank) where the rank was the last to arrive at
the step's collectives with a summed *delay* (see :mod:`.analysis`) of at least
``max(min_delay_ns, delay_share x the median step)``.  Its cause, from the steps tool's split
of that step on the late rank against the median of the other ranks:

* ``compute``: its GPU compute grew most (``grew``: the compute kernels whose time in the step
  exceeds the other ranks' median the most);
* ``host``: its GPU idled longer (the host was late: data loading, Python, launches; ``grew``:
  the top-level ops and user ranges that took longer than on the other ranks).

Slow link event: a step where collectives took longer to transfer than the median instance of
the same kind, size and group size (by ``link_share`` of it and ``min_delay_ns``): nobody
arrived late, the wire was slow.  The rank named is the one member every slow instance of the
step shares (with 2-D groups that is the rank whose link is slow); ``delay_ns`` is the extra
transfer time summed over the slow instances that rank took part in.

Attribution: a member's wait at an instance whose origin (see :mod:`.analysis`) is a straggler
event is time spent waiting for that rank, up to the rank's delay, also downstream (the
data-parallel collectives a late tensor-parallel group holds up); ``impact_ns`` sums it.  It is
not the member's own exposed communication (table ``per_rank``:
``waiting_ns``, ``waiting_for``, ``own_exposed_comm_ns``).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pastaprof.tools._timeline_math import to_np
from pastaprof.tools.ranks.analysis import Job, blamed
from pastaprof.tools.ranks.clocks import group_median

MIN_DELAY_NS = 100_000
DELAY_SHARE = 0.05
LINK_SHARE = 0.5
TOP_GREW = 3


def _step_rows(job: Job) -> dict[tuple[str, int], dict[str, int]]:
    out = {}
    for row in job.steps.to_pylist():
        out[(row["label"], row["rank"])] = row
    return out


def _grew(table: pa.Table, label: str, rank: int, others_list: list[int]) -> list[dict[str, Any]]:
    """Names whose time in step ``label`` on ``rank`` exceeds the other ranks' median the most."""
    if not table.num_rows:
        return []
    others = set(others_list)
    rows = table.filter(pc.equal(table["step_label"], label)).to_pylist()
    mine: dict[str, int] = defaultdict(int)
    theirs: dict[str, list[int]] = defaultdict(list)
    for r in rows:
        if r["rank"] == rank:
            mine[r["name"]] += r["ns"]
        elif r["rank"] in others:
            theirs[r["name"]].append(r["ns"])
    n = max(len(others), 1)
    excess = []
    for name, ns in mine.items():
        vals = theirs.get(name, []) + [0] * (n - len(theirs.get(name, [])))
        excess.append((ns - float(np.median(vals)), name))
    excess.sort(key=lambda x: (-x[0], x[1]))
    return [{"name": name, "excess_ns": int(round(e))} for e, name in excess[:TOP_GREW] if e > 0]


def _labelled(job: Job, table: pa.Table) -> pa.Table:
    """``table`` (rank, step index, ...) with the step's label."""
    if not table.num_rows:
        return table.append_column("step_label", pa.array([], pa.string()))
    key = {(r, s): lab for r, s, lab in zip(job.steps["rank"].to_pylist(), job.steps["step"].to_pylist(),
                                            job.steps["label"].to_pylist())}
    labels = [key.get((r, s)) for r, s in zip(table["rank"].to_pylist(), table["step"].to_pylist())]
    return table.append_column("step_label", pa.array(labels, pa.string()))


def stragglers(job: Job, options: dict) -> tuple[list[dict[str, Any]], float]:
    """Straggler events (dicts, largest impact first) and the threshold used."""
    if not job.n_inst:
        return [], 0.0
    wall = to_np(job.steps["wall_ns"]).astype(np.float64)
    median_step = float(np.median(wall)) if len(wall) else 0.0
    threshold = max(float(options.get("min_delay_ns", MIN_DELAY_NS)),
                    float(options.get("delay_share", DELAY_SHARE)) * median_step)
    ranks = np.array(job.ranks)
    last_rank = ranks[job.ridx[job.last_row]]
    labels = job.label[job.last_row]
    part = blamed(job)
    row_origin = job.origin[job.inst]
    groups: dict[tuple[Any, int], list[int]] = defaultdict(list)
    for m in np.flatnonzero((job.origin == np.arange(job.n_inst)) & (job.delay > 0)):
        groups[(labels[m], int(last_rank[m]))].append(int(m))
    steps = _step_rows(job)
    kernels, host = _labelled(job, job.kernels), _labelled(job, job.host)
    events = []
    for (label, rank), inst in groups.items():
        delay = int(job.delay[inst].sum())
        if delay < threshold:
            continue
        rows = np.flatnonzero(np.isin(job.inst, inst))
        others = sorted({int(x) for x in ranks[job.ridx[rows]]} - {rank})
        hit = np.isin(row_origin, inst) & (part > 0)  # waits here and downstream that it explains
        waiting = {int(x) for x in ranks[job.ridx[hit]]} - {rank}
        ev: dict[str, Any] = {"rank": rank, "step": label, "delay_ns": delay, "impact_ns": int(part[hit].sum()),
                              "waiting_ranks": len(waiting), "collectives": len(inst),
                              "downstream_collectives": int(len(set(job.inst[hit].tolist()) - set(inst)))}
        ev.update(_cause(steps, label, rank, others, delay, kernels, host))
        events.append(ev)
    events.sort(key=lambda e: (-e["impact_ns"], e["rank"]))
    return events, threshold


def _cause(steps: dict, label: str, rank: int, others: list[int], delay: int, kernels: pa.Table,
           host: pa.Table) -> dict[str, Any]:
    me = steps.get((label, rank))
    them = [steps[(label, o)] for o in others if (label, o) in steps]
    if me is None or not them:
        return {"cause": "unknown", "compute_excess_ns": None, "host_excess_ns": None, "grew": []}
    compute = int(me["compute_ns"] - np.median([t["compute_ns"] for t in them]))
    idle = int(me["gpu_idle_ns"] - np.median([t["gpu_idle_ns"] for t in them]))
    cause = "compute" if compute >= idle else "host"
    grew = _grew(kernels if cause == "compute" else host, label, rank, others)
    return {"cause": cause, "compute_excess_ns": compute, "host_excess_ns": idle, "grew": grew}


def slow_links(job: Job, options: dict) -> list[dict[str, Any]]:
    """Steps whose collectives transferred slower than usual (see the module docstring)."""
    if not job.n_inst:
        return []
    lr = job.last_row
    kinds, nbytes = job.coll["kind"].to_pylist(), job.coll["bytes"].to_pylist()
    classes: dict[tuple, int] = {}
    cls = np.array([classes.setdefault((kinds[r], nbytes[r], int(job.members[m])), len(classes))
                    for m, r in enumerate(lr)], np.int64)
    base = group_median(cls, job.transfer.astype(np.float64), len(classes))[cls]
    count = np.bincount(cls)[cls]
    excess = job.transfer - base
    floor = float(options.get("min_delay_ns", MIN_DELAY_NS))
    slow = (count >= 3) & (job.members >= 2) & (excess >= np.maximum(floor, float(options.get("link_share", LINK_SHARE))
                                                                      * base))
    ranks = np.array(job.ranks)
    by_step: dict[Any, list[int]] = defaultdict(list)
    for m in np.flatnonzero(slow):
        by_step[job.label[lr[m]]].append(int(m))
    out = []
    for label, inst in by_step.items():
        sets = [set(ranks[job.ridx[job.inst == m]].tolist()) for m in inst]
        common = set.intersection(*sets)
        rank = min(common) if len(common) == 1 else None
        mine = [m for m, s in zip(inst, sets) if rank is None or rank in s]
        out.append({"rank": rank, "step": label, "delay_ns": int(excess[mine].sum()),
                    "cause": "link", "ranks": sorted(common)[:16] if rank is None else [rank],
                    "collectives": len(inst), "extra_transfer_ns": int(np.median(excess[inst])),
                    "usual_transfer_ns": int(np.median(base[inst])),
                    "impact_ns": int(sum(excess[m] * job.members[m] for m in inst))})
    out.sort(key=lambda e: -e["impact_ns"])
    return out


def per_rank(job: Job, events: list[dict[str, Any]]) -> pa.Table:
    """Per rank: step-time distribution, compute, waits (and for whom), own exposed communication, overlap."""
    ranks = np.array(job.ranks)
    strag = {(e["step"], e["rank"]) for e in events}
    lr_rank = ranks[job.ridx[job.last_row]] if job.n_inst else np.zeros(0, np.int64)
    n = len(ranks)
    waiting = np.zeros(n)
    attributed: list[Counter] = [Counter() for _ in range(n)]
    if job.n_inst:
        np.add.at(waiting, job.ridx, job.wait)
        part = blamed(job)
        o = job.origin[job.inst]
        for row in np.flatnonzero(part > 0):
            src = int(o[row])
            who = int(lr_rank[src])
            if (job.label[job.last_row[src]], who) in strag and who != job.ranks[job.ridx[row]]:
                attributed[job.ridx[row]][who] += int(part[row])
    last_count = np.bincount(job.ridx[job.last_row], minlength=n) if job.n_inst else np.zeros(n, np.int64)
    steps = job.steps
    s_rank = to_np(steps["rank"])
    wall, comp = to_np(steps["wall_ns"]), to_np(steps["compute_ns"])
    totals = {r["rank"]: r for r in job.totals.to_pylist()}
    cols: dict[str, list] = defaultdict(list)
    for i, r in enumerate(ranks.tolist()):
        m = s_rank == r
        t = totals.get(r, {})
        exposed = int(t.get("exposed_comm_ns", 0))
        att = sum(attributed[i].values())
        top = attributed[i].most_common(1)
        cols["rank"].append(r)
        cols["steps"].append(int(m.sum()))
        cols["median_wall_ns"].append(int(np.median(wall[m])) if m.any() else None)
        cols["max_wall_ns"].append(int(wall[m].max()) if m.any() else None)
        cols["median_compute_ns"].append(int(np.median(comp[m])) if m.any() else None)
        cols["exposed_comm_ns"].append(exposed)
        cols["waiting_ns"].append(int(waiting[i]))
        cols["waiting_for_straggler_ns"].append(att)
        cols["waiting_for"].append(top[0][0] if top else None)
        cols["own_exposed_comm_ns"].append(max(0, exposed - att))
        nccl = int(t.get("nccl_ns", 0))
        cols["comm_overlap_pct"].append(round(100 * (1 - exposed / nccl), 2) if nccl else None)
        cols["last_arrivals"].append(int(last_count[i]))
        cols["straggler_steps"].append(sum(1 for e in events if e["rank"] == r))
    types = {"rank": pa.int32(), "waiting_for": pa.int32(), "comm_overlap_pct": pa.float64()}
    return pa.table({k: pa.array(v, types.get(k, pa.int64())) for k, v in cols.items()})
