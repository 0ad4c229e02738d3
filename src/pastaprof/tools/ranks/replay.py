"""Cross-rank critical path and the what-if, by replaying the job's synchronizations.

The job is modeled as each rank's *work* between its collectives (measured, see
:mod:`.analysis`) and each collective's *transfer*: a member arrives at an instance when its work
since its previous instance is done; the instance ends ``transfer`` after its last arrival and
releases every member.  Replaying the measured work reproduces the measured timeline (up to the
members' end jitter); the chain of last arrivers and transfers that ends last is the critical
path.  The what-if replays with rank r's work before each instance cut to the median of that
instance's members (and its tail after the last collective to the median tail): the job's time
saved is what making rank r as fast as the median rank would give.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from pastaprof.tools.ranks.analysis import Job
from pastaprof.tools.ranks.clocks import group_median

WHAT_IF_RANKS = 16  # the what-if is replayed for the ranks with the most delay (the others save ~0)


def _order(job: Job) -> tuple[np.ndarray, list[np.ndarray]]:
    """Instances in the order they completed, and the rows of each."""
    order = np.argsort(job.t_last, kind="stable")
    by_inst = np.argsort(job.inst, kind="stable")
    bounds = np.r_[0, np.cumsum(np.bincount(job.inst, minlength=job.n_inst))]
    rows = [by_inst[bounds[m]:bounds[m + 1]] for m in range(job.n_inst)]
    return order, rows


def _tail(job: Job) -> np.ndarray:
    """Per rank: its last step's end minus the end of its last collective (>= 0)."""
    last_release = np.full(len(job.ranks), np.iinfo(np.int64).min)
    if len(job.inst):
        np.maximum.at(last_release, job.ridx, job.t_end[job.inst])
    none = last_release == np.iinfo(np.int64).min
    return np.where(none, job.last_end - job.first_release, np.maximum(job.last_end - last_release, 0))


def replay(job: Job, work: np.ndarray, tail: np.ndarray, order: np.ndarray, rows: list[np.ndarray],
           ) -> tuple[int, np.ndarray, np.ndarray, np.ndarray]:
    """(job end, end per instance, critical row per instance, release per rank before its tail)."""
    release = job.first_release.astype(np.int64).copy()
    ends = np.zeros(job.n_inst, np.int64)
    crit = np.full(job.n_inst, -1, np.int64)
    for m in order:
        rs = rows[m]
        who = job.ridx[rs]
        arr = release[who] + work[rs]
        k = int(np.argmax(arr))
        ends[m] = int(arr[k]) + int(job.transfer[m])
        crit[m] = rs[k]
        release[who] = ends[m]
    return int((release + tail).max()), ends, crit, release


def what_if(job: Job) -> pa.Table:
    """Per rank (the ``WHAT_IF_RANKS`` with most delay): the job's time if it were as fast as the median."""
    order, rows = _order(job)
    tail = _tail(job)
    base, *_ = replay(job, job.work, tail, order, rows)
    med = group_median(job.inst, job.work.astype(np.float64), job.n_inst)
    med_tail = float(np.median(tail)) if len(tail) else 0.0
    own = np.zeros(len(job.ranks))
    if job.n_inst:
        np.add.at(own, job.ridx[job.last_row], job.delay)
    own += np.maximum(tail - med_tail, 0)
    cand = [i for i in np.argsort(-own, kind="stable")[:WHAT_IF_RANKS] if own[i] > 0]
    out = []
    for i in cand:
        w = job.work.copy()
        mine = job.ridx == i
        w[mine] = np.minimum(w[mine], np.rint(med[job.inst[mine]]).astype(np.int64))
        t = tail.copy()
        t[i] = min(t[i], int(round(med_tail)))
        new, *_ = replay(job, w, t, order, rows)
        out.append((job.ranks[i], base, new))
    span = base - int(job.first_release.min()) if len(job.first_release) else 0
    return pa.table({"rank": pa.array([r for r, _, _ in out], pa.int32()),
                     "job_ns": pa.array([span] * len(out), pa.int64()),
                     "saved_ns": pa.array([b - x for _, b, x in out], pa.int64()),
                     "saved_pct": pa.array([round(100 * (b - x) / span, 2) if span else 0.0 for _, b, x in out],
                                           pa.float64())}).sort_by([("saved_ns", "descending"), ("rank", "ascending")])


def critical_path(job: Job) -> pa.Table:
    """The chain of work and transfers that ends the job last, back to its start, per step."""
    order, rows = _order(job)
    tail = _tail(job)
    _, ends, crit, release = replay(job, job.work, tail, order, rows)
    ranks = np.array(job.ranks)
    segs: list[tuple] = []
    r = int(np.argmax(release + tail))
    if tail[r] > 0:
        segs.append((None, ranks[r], "tail", None, int(release[r]), int(release[r] + tail[r])))
    # each rank's instances in order: the one before a row is the previous row of that rank
    by_rank = np.lexsort((job.start, job.ridx))
    prev = np.full(len(job.start), -1, np.int64)
    if len(by_rank):
        same = np.r_[False, job.ridx[by_rank][1:] == job.ridx[by_rank][:-1]]
        prev[by_rank[1:][same[1:]]] = by_rank[:-1][same[1:]]
    mine = np.flatnonzero(job.ridx == r)
    m = int(job.inst[mine[np.argmax(job.start[mine])]]) if len(mine) else -1
    kinds, pgs, seqs = (job.coll[c].to_pylist() for c in ("kind", "pg", "seq"))
    while m >= 0:
        c = int(crit[m])
        name = f"{kinds[c]} {pgs[c] or ''} #{seqs[c]}".replace("  ", " ")
        segs.append((job.label[c], ranks[job.ridx[c]], "transfer", name, int(ends[m] - job.transfer[m]), int(ends[m])))
        p = int(prev[c])
        begin = int(ends[job.inst[p]]) if p >= 0 else int(job.first_release[job.ridx[c]])
        segs.append((job.label[c], ranks[job.ridx[c]], "work", name, begin, begin + int(job.work[c])))
        m = int(job.inst[p]) if p >= 0 else -1
    segs.reverse()
    return pa.table({"step": pa.array([s[0] for s in segs], pa.string()),
                     "rank": pa.array([int(s[1]) for s in segs], pa.int32()),
                     "segment": pa.array([s[2] for s in segs], pa.string()),
                     "collective": pa.array([s[3] for s in segs], pa.string()),
                     "start_ns": pa.array([s[4] for s in segs], pa.int64()),
                     "end_ns": pa.array([s[5] for s in segs], pa.int64()),
                     "ns": pa.array([s[5] - s[4] for s in segs], pa.int64())})
