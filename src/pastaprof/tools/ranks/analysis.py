"""The combine side: every rank's summaries -> aligned, matched collectives and who waited for whom.

Definitions (times after clock alignment, see :mod:`.clocks`):

* *arrival* of a rank at a collective instance: its kernel's start (the host op's start when it
  launched no kernel); the *last arriver* is the member with the latest arrival;
* *wait* of a member: last arrival - its arrival (its kernel spins until the last one comes);
* *transfer*: the instance's end (median of the members' ends) - the last arrival;
* *work* of a member before an instance: its arrival - the end of its previous instance (its
  first step's start for the first one) -- what the rank did between two synchronizations;
* *delay* of the last arriver: its work minus the median work of the other members, at most its
  arrival minus the others' median arrival.  A rank late only because its previous collective
  ended late (a slow link or a straggler upstream) has no delay of its own;
* *origin* of an instance: where the lateness of its last arriver comes from (see ``_origins``):
  the waits of an instance are blamed on its origin's last arriver.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from pastaprof.tools._timeline_math import KeyIndex, to_np
from pastaprof.tools.ranks import clocks
from pastaprof.tools.ranks.collectives import SYNCHRONIZING, bus_bandwidth, match

OWN_SHARE = 0.5
OUTSIDE_STEPS = "(outside steps)"  # the step label of collectives issued in no step of their rank


@dataclass
class Job:
    """All ranks' summaries concatenated, aligned and matched (NumPy columns)."""

    ranks: list[int]
    steps: pa.Table                # every rank's steps, start/end aligned
    coll: pa.Table                 # every rank's collectives
    kernels: pa.Table              # (rank, step, name, ns, count)
    host: pa.Table
    totals: pa.Table
    ridx: np.ndarray               # rank index of each collective row
    inst: np.ndarray               # instance of each row
    n_inst: int
    start: np.ndarray              # aligned arrival per row
    end: np.ndarray                # aligned end per row
    work: np.ndarray               # work before the instance per row
    label: np.ndarray              # step label per row (object), None outside steps
    offset: np.ndarray             # per rank index
    bound: np.ndarray
    aligned: np.ndarray
    anchors: np.ndarray
    # per instance
    members: np.ndarray
    last_row: np.ndarray
    t_last: np.ndarray
    t_end: np.ndarray
    transfer: np.ndarray
    delay: np.ndarray
    wait: np.ndarray               # per row
    first_release: np.ndarray      # per rank index: start of its first step (aligned)
    last_end: np.ndarray           # per rank index: end of its last step (aligned)
    origin: np.ndarray             # per instance: the instance whose own delay it inherits, or -1


def _concat(summaries: dict[int, dict[str, pa.Table]], name: str) -> pa.Table:
    parts = []
    for r in sorted(summaries):
        t = summaries[r][name]
        if "rank" not in t.column_names:
            t = t.append_column("rank", pa.array(np.full(t.num_rows, r, np.int32)))
        parts.append(t)
    return pa.concat_tables(parts, promote_options="permissive") if parts else pa.table({})


def _last_per_group(codes: np.ndarray, values: np.ndarray, n: int) -> np.ndarray:
    """Row index of the largest value per code (the later row on ties)."""
    out = np.full(n, -1, np.int64)
    if len(codes) == 0:
        return out
    order = np.lexsort((values, codes))
    sc = codes[order]
    ends = np.r_[np.flatnonzero(np.diff(sc)), len(sc) - 1]
    out[sc[ends]] = order[ends]
    return out


def _median_without(codes: np.ndarray, values: np.ndarray, drop: np.ndarray, n: int) -> np.ndarray:
    keep = np.ones(len(codes), bool)
    keep[drop[drop >= 0]] = False
    return clocks.group_median(codes[keep], values[keep], n)


def build(summaries: dict[int, dict[str, pa.Table]]) -> Job:
    ranks = sorted(summaries)
    n = len(ranks)
    steps, coll = _concat(summaries, "steps"), _concat(summaries, "collectives")
    kernels, host, totals = (_concat(summaries, k) for k in ("kernels", "host", "totals"))
    rank_arr = np.array(ranks, np.int64)

    def index(col: pa.ChunkedArray) -> np.ndarray:  # rank -> its position in ``ranks``
        return np.searchsorted(rank_arr, to_np(col)) if len(col) else np.zeros(0, np.int64)

    ridx = index(coll["rank"]) if coll.num_rows else np.zeros(0, np.int64)
    inst, n_inst = match(coll)
    start, end = to_np(coll["start_ns"]), to_np(coll["end_ns"])
    kinds = coll["kind"].to_pylist() if coll.num_rows else []
    sync = np.array([k in SYNCHRONIZING for k in kinds], bool) & to_np(coll["on_gpu"], 0, bool) \
        if coll.num_rows else np.zeros(0, bool)
    per = np.bincount(inst, minlength=n_inst) if n_inst else np.zeros(0, np.int64)
    anchor = sync & (per[inst] >= 2) if len(inst) else sync
    if not anchor.any():
        anchor = per[inst] >= 2 if len(inst) else anchor
    offset, bound, aligned, anchors = clocks.estimate(ridx[anchor], inst[anchor], end[anchor], n)
    off = offset.astype(np.int64)
    start, end = start - off[ridx], end - off[ridx]
    s_r = index(steps["rank"]) if steps.num_rows else np.zeros(0, np.int64)
    steps = steps.set_column(steps.schema.get_field_index("start_ns"), "start_ns",
                             pa.array(to_np(steps["start_ns"]) - off[s_r]))
    steps = steps.set_column(steps.schema.get_field_index("end_ns"), "end_ns", pa.array(to_np(steps["end_ns"]) - off[s_r]))
    first = np.full(n, np.iinfo(np.int64).max)
    last = np.full(n, np.iinfo(np.int64).min)
    np.minimum.at(first, s_r, to_np(steps["start_ns"]))
    np.maximum.at(last, s_r, to_np(steps["end_ns"]))
    no_steps = first == np.iinfo(np.int64).max
    if no_steps.any() and len(start):  # a rank without steps: its first arrival / last end
        fa = np.full(n, np.iinfo(np.int64).max)
        np.minimum.at(fa, ridx, start)
        la = np.full(n, np.iinfo(np.int64).min)
        np.maximum.at(la, ridx, end)
        first, last = np.where(no_steps, fa, first), np.where(no_steps, la, last)
    empty = first == np.iinfo(np.int64).max  # a rank with neither steps nor rows: an empty span
    if empty.any():
        fill = int(first[~empty].min()) if (~empty).any() else 0
        first, last = np.where(empty, fill, first), np.where(empty, fill, last)
    # labels of the rows' steps
    srow = KeyIndex(s_r, to_np(steps["step"])).find(ridx, to_np(coll["step"])) if coll.num_rows else ridx
    labels = np.array(steps["label"].to_pylist() + [OUTSIDE_STEPS], dtype=object)
    label = labels[np.where(srow >= 0, srow, len(labels) - 1)]
    # per instance
    last_row = _last_per_group(inst, start, n_inst)
    t_last = start[last_row] if n_inst else np.zeros(0, np.int64)
    t_end = np.rint(clocks.group_median(inst, end, n_inst)).astype(np.int64) if n_inst else np.zeros(0, np.int64)
    transfer = np.maximum(t_end - t_last, 0)
    wait = t_last[inst] - start if n_inst else np.zeros(0, np.int64)
    # work: arrival - end of the rank's previous instance (its first step start for the first)
    order = np.lexsort((start, ridx))
    prev_end = np.empty(len(start), np.int64)
    if len(order):
        o_r = ridx[order]
        prev = np.r_[-1, order[:-1]]
        same = np.r_[False, o_r[1:] == o_r[:-1]]
        pe = np.where(same, t_end[inst[np.maximum(prev, 0)]], first[o_r])
        prev_end[order] = pe
    work = np.maximum(start - prev_end, 0)
    med_work = _median_without(inst, work.astype(np.float64), last_row, n_inst)
    med_arr = _median_without(inst, start.astype(np.float64), last_row, n_inst)
    delay = np.zeros(n_inst, np.int64)
    late = np.zeros(n_inst, np.int64)
    if n_inst:
        lw = work[last_row]
        own = np.nan_to_num(lw - med_work, nan=0.0)
        late = np.maximum(np.rint(np.nan_to_num(t_last - med_arr, nan=0.0)), 0).astype(np.int64)
        delay = np.rint(np.clip(own, 0, late)).astype(np.int64)
        delay[per < 2] = 0
    origin = _origins(inst, n_inst, last_row, start, ridx, t_last, delay, late)
    return Job(ranks, steps, coll, kernels, host, totals, ridx, inst, n_inst, start, end, work, label, offset,
               bound, aligned, anchors, per, last_row, t_last, t_end, transfer, delay, wait, first, last, origin)


def _origins(inst: np.ndarray, n_inst: int, last_row: np.ndarray, start: np.ndarray, ridx: np.ndarray,
             t_last: np.ndarray, delay: np.ndarray, late: np.ndarray) -> np.ndarray:
    """Per instance, the instance whose last arriver's own delay explains its last arrival.

    An instance whose last arriver is late mostly by its own work (delay >= ``OWN_SHARE`` of its
    lateness) is its own origin; one whose last arriver is late because its previous collective
    ended late inherits that collective's origin (a straggler in a tensor-parallel group makes
    its group late for the data-parallel collectives: those waits are the straggler's too);
    -1 where neither holds."""
    origin = np.full(n_inst, -1, np.int64)
    if not n_inst:
        return origin
    by_rank = np.lexsort((start, ridx))
    prev = np.full(len(start), -1, np.int64)
    same = np.r_[False, ridx[by_rank][1:] == ridx[by_rank][:-1]]
    prev[by_rank[1:][same[1:]]] = by_rank[:-1][same[1:]]
    own = (late > 0) & (delay >= OWN_SHARE * late)
    for m in np.argsort(t_last, kind="stable").tolist():
        if own[m]:
            origin[m] = m
            continue
        p = prev[last_row[m]]
        if p >= 0 and late[m] > 0:
            origin[m] = origin[inst[p]]
    return origin


def blamed(job: Job) -> np.ndarray:
    """Per row: the part of its wait explained by its instance's origin (at most the origin's
    delay), 0 where the instance has no origin."""
    if not job.n_inst:
        return np.zeros(0, np.int64)
    o = job.origin[job.inst]
    return np.where(o >= 0, np.minimum(job.wait, job.delay[np.maximum(o, 0)]), 0)


def instance_table(job: Job) -> pa.Table:
    """One row per matched collective: who came last, the wait it caused, transfer, bus bandwidth."""
    if not job.n_inst:
        return pa.table({"pg": pa.array([], pa.string())})
    lr = job.last_row
    c = job.coll
    kind = c["kind"].take(pa.array(lr))
    nbytes = c["bytes"].take(pa.array(lr)).to_pylist()
    first = np.full(job.n_inst, np.iinfo(np.int64).max)
    np.minimum.at(first, job.inst, job.start)
    total_wait = np.bincount(job.inst, weights=job.wait, minlength=job.n_inst)
    ranks = np.array(job.ranks)
    bw = [bus_bandwidth(k, b, int(m), int(t)) for k, b, m, t in zip(kind.to_pylist(), nbytes, job.members,
                                                                         job.transfer)]
    t = pa.table({
        "step": pa.array(job.label[lr].tolist(), pa.string()), "pg": c["pg"].take(pa.array(lr)), "kind": kind,
        "seq": c["seq"].take(pa.array(lr)), "ranks": job.members, "bytes": pa.array(nbytes, pa.int64()),
        "first_arrival_ns": first, "last_arrival_ns": job.t_last, "end_ns": job.t_end,
        "last_rank": ranks[job.ridx[lr]].astype(np.int32), "arrival_spread_ns": job.t_last - first,
        "delay_ns": job.delay, "wait_ns": np.rint(total_wait).astype(np.int64), "transfer_ns": job.transfer,
        "busbw_gbps": pa.array(bw, pa.float64()),
    })
    return t.sort_by([("last_arrival_ns", "ascending")])


def arrivals_table(job: Job) -> pa.Table:
    """Per matched collective and rank: arrival, end, wait, work before it (a details table)."""
    ranks = np.array(job.ranks)
    return pa.table({"instance": job.inst, "rank": ranks[job.ridx].astype(np.int32) if len(job.ridx) else
                     np.zeros(0, np.int32), "pg": job.coll["pg"], "kind": job.coll["kind"], "seq": job.coll["seq"],
                     "step": pa.array(job.label.tolist(), pa.string()), "arrival_ns": job.start, "end_ns": job.end,
                     "wait_ns": job.wait, "work_ns": job.work})


def clock_table(job: Job) -> pa.Table:
    bound = job.bound
    return pa.table({"rank": np.array(job.ranks, np.int32), "offset_ns": job.offset.astype(np.int64),
                     "error_bound_ns": pa.array(np.where(np.isnan(bound), 0, bound).astype(np.int64),
                                                mask=np.isnan(bound)),
                     "aligned": job.aligned, "anchor_collectives": job.anchors})
