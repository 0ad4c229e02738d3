"""Who each rank waited for in its collectives, from the kernel and collective tables of all ranks.

For tools that see every rank at once (the timeline tool) and must not report a rank's wait for
a late peer as the rank's own exposed communication.  The same matching, alignment and delay as
the ranks tool (:mod:`.analysis`), on the NCCL kernels and collective rows only: a member's wait
at an instance counts as waiting for the last arriver of the instance's origin (that rank, or
the one whose lateness it inherits), up to that rank's own delay.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pyarrow as pa

from pastaprof.events.schema import empty
from pastaprof.tools._timeline_math import to_np
from pastaprof.tools.ranks import analysis
from pastaprof.tools.ranks.collectives import nccl_kernels, rank_collectives

_NO_STEPS = pa.table({"rank": pa.array([], pa.int32()), "step": pa.array([], pa.int64()),
                      "label": pa.array([], pa.string()), "start_ns": pa.array([], pa.int64()),
                      "end_ns": pa.array([], pa.int64()), "wall_ns": pa.array([], pa.int64())})


def _by_rank(t: pa.Table) -> dict[int, pa.Table]:
    if not t.num_rows:
        return {}
    r = to_np(t["rank"])
    order = np.argsort(r, kind="stable")
    t, r = t.take(pa.array(order)), r[order]
    cuts = np.r_[0, np.flatnonzero(np.diff(r)) + 1, len(r)]
    return {int(r[a]): t.slice(a, b - a) for a, b in zip(cuts[:-1], cuts[1:])}


def waited_for(kernel: pa.Table, collective: pa.Table | None = None) -> dict[int, dict[str, int]]:
    """rank -> {"wait_ns": its summed waits, "attributed_ns": the part explained by late peers,
    "rank": the peer it waited for most, "rank_ns": how long}.  Empty with fewer than 2 ranks."""
    if collective is None:
        collective = empty("collective")
    mask = nccl_kernels(kernel)[0] if kernel.num_rows else np.zeros(0, bool)
    k = _by_rank(kernel.filter(pa.array(mask)) if kernel.num_rows else kernel)
    c = _by_rank(collective)
    ranks = sorted(set(k) | set(c))
    if len(ranks) < 2:
        return {}
    none_k, none_c, none_a = empty("kernel"), empty("collective"), empty("api")
    summaries = {}
    for r in ranks:
        coll = rank_collectives(r, {"kernel": k.get(r, none_k), "collective": c.get(r, none_c), "api": none_a})
        coll = coll.append_column("step", pa.array(np.full(coll.num_rows, -1, np.int64)))
        summaries[r] = {"collectives": coll, "steps": _NO_STEPS, "kernels": pa.table({}), "host": pa.table({}),
                        "totals": pa.table({})}
    job = analysis.build(summaries)
    out: dict[int, dict[str, int]] = {}
    if not job.n_inst:
        return out
    ranks_a = np.array(job.ranks)
    last = ranks_a[job.ridx[job.last_row]]
    part = analysis.blamed(job)
    src = job.origin[job.inst]
    for i, r in enumerate(job.ranks):
        mine = (job.ridx == i) & (part > 0)
        who: Counter = Counter()
        for m, ns in zip(src[mine], part[mine]):
            if int(last[m]) != r:
                who[int(last[m])] += int(ns)
        top = who.most_common(1)
        out[r] = {"wait_ns": int(job.wait[mine].sum()), "attributed_ns": int(sum(who.values())),
                  "rank": top[0][0] if top else -1, "rank_ns": top[0][1] if top else 0}
    return out

