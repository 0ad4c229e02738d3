"""Training steps for the memory tool: where a rank's steps are (ProfilerStep ranges,
``pastaprof.step()`` calls, user ``stepN`` ranges, optimizer steps, else a repeating op
sequence), and per device and step the allocated level, growth and survivors (leaks).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pastaprof.tools._by_rank import rank_rows, rows_of_rank
from pastaprof.tools._codes import dense_codes
from pastaprof.tools._memory_patterns import device_label
from pastaprof.tools._ranges import host_ranges
from pastaprof.tools.memory.common import SITE, as_str, group, i64, matches
from pastaprof.tools.memory.replay import Replay

MIN_STEPS = 3               # growth needs >= 2 step-to-step deltas
LEAK_MIN_BYTES_PER_STEP = 1 << 20
PROFILER_STEP_RE = r"^ProfilerStep#\d+$"
USER_STEP_RE = r"^(train_?|iter(ation)?_?)?step[\s#_-]*\d+$"
#: The ranges a live run records for ``pastaprof.step()`` calls (handlers/session.py).
PASTAPROF_STEP_RE = r"^pastaprof\.step#\d+$"
OPTIMIZER_STEP = "Optimizer.step#"


def step_windows(rng: pa.Table, ops: pa.Table, r: int, t_lo: int,
                 t_hi: int) -> tuple[np.ndarray, np.ndarray, list[str], str]:
    """Step windows of rank ``r``: ProfilerStep#N, user ``stepN`` ranges, optimizer steps,
    else exact repetition of the top-level op sequence on the busiest thread."""
    rng = host_ranges(rows_of_rank(rng, r))
    ops = rows_of_rank(ops, r)
    named = pa.schema([("name", pa.string()), ("start_ns", pa.int64()), ("end_ns", pa.int64())])
    for pattern, source in ((PROFILER_STEP_RE, "ProfilerStep"), (PASTAPROF_STEP_RE, "pastaprof.step()"),
                            (USER_STEP_RE, "step ranges")):
        hit = pa.concat_tables([x.filter(matches(x["name"], pattern)).select(["name", "start_ns", "end_ns"])
                                .cast(named) for x in (rng, ops)])
        if hit.num_rows:
            g = hit.group_by("name", use_threads=False).aggregate([("start_ns", "min"), ("end_ns", "max")]).sort_by("start_ns_min")
            return i64(g["start_ns_min"]), i64(g["end_ns_max"]), g["name"].to_pylist(), source
    opt = rng.filter(pc.starts_with(rng["name"].cast(pa.string()), OPTIMIZER_STEP))
    if opt.num_rows:
        ends = np.sort(i64(opt["end_ns"]))
        return np.r_[t_lo, ends[:-1]], ends, [f"step {i}" for i in range(len(ends))], "optimizer steps"
    top = ops.filter(pc.fill_null(pc.equal(ops["depth"], 0), True))
    if top.num_rows >= MIN_STEPS:
        th = dense_codes(i64(top["pid"]), i64(top["tid"]))
        top = top.filter(pa.array(th == np.bincount(th).argmax())).sort_by("start_ns")
        c = np.unique(as_str(top["name"]), return_inverse=True)[1]
        nt = len(c)
        periods = np.arange(1, nt // MIN_STEPS + 1)
        for p in periods[nt % periods == 0]:        # the sequence must be whole repetitions of a block
            if np.array_equal(c[p:], c[:-p]):
                starts = i64(top["start_ns"])[::p]
                return starts, np.r_[starts[1:], t_hi], [f"iteration {i}" for i in range(len(starts))], "repeated ops"
    return np.array([], np.int64), np.array([], np.int64), [], "none"


def step_growth(r: Replay, blocks: pa.Table, bseg: np.ndarray, rng: pa.Table, ops: pa.Table,
                min_growth: int) -> tuple[list[dict], list[pa.Table], list[dict]]:
    """Per device and step: level at step start/end, growth, survivors; leak records."""
    rank, dev, dtype, t, level, offset, fpos = r.rank, r.dev, r.dtype, r.t, r.level, r.offset, r.fpos
    step_rows, surv_tabs, leaks = [], [], []
    windows: dict[int, tuple] = {}
    alloc_ns = i64(blocks["alloc_ns"], -1)
    bbytes = i64(blocks["bytes"], 0)
    of_event = rank_rows(rank)
    for k, (s, e) in enumerate(zip(r.seg, r.seg_end, strict=True)):
        rk = int(rank[s])
        if rk not in windows:
            mine = of_event[rk]
            hi = max([int(t[mine].max())] + [int(i64(rows_of_rank(x, rk)["end_ns"]).max(initial=0))
                                              for x in (ops, rng)])
            windows[rk] = step_windows(rng, ops, rk, int(t[mine].min()), hi + 1)
        starts, ends, labels, source = windows[rk]
        if len(starts) == 0:
            continue
        tk, lk = t[s:e], level[s:e]
        i_start = np.searchsorted(tk, starts, "left") - 1   # last event before the step starts
        i_end = np.searchsorted(tk, ends, "left") - 1       # last event before it ends
        at_start = np.where(i_start >= 0, lk[np.clip(i_start, 0, None)], offset[k])
        at_end = np.where(i_end >= 0, lk[np.clip(i_end, 0, None)], offset[k])
        bs, be = bseg[k], bseg[k + 1]
        a_k, f_k, b_k = alloc_ns[bs:be], fpos[bs:be], bbytes[bs:be]
        for j in range(len(starts)):
            lo, hi = i_start[j] + 1, i_end[j] + 1
            surv = (a_k >= starts[j]) & (a_k < ends[j]) & (f_k >= s + hi)   # made in the step, live after it
            step_rows.append({"rank": rk, "device": int(dev[s]), "device_type": str(dtype[s]), "step": labels[j],
                              "source": source, "start_ns": int(starts[j]), "end_ns": int(ends[j]),
                              "allocated_at_start": int(at_start[j]), "allocated_at_end": int(at_end[j]),
                              "growth_bytes": int(at_end[j] - at_start[j]),
                              "peak_bytes": int(lk[lo:hi].max(initial=at_start[j])),
                              "survivor_blocks": int(surv.sum()), "survivor_bytes": int(b_k[surv].sum())})
        deltas = np.diff(at_end)
        if len(starts) < MIN_STEPS or not (deltas > 0).all() or np.median(deltas) < min_growth:
            continue
        # What accumulates: blocks made during the steps and still live after the last one.
        made = bs + np.flatnonzero((a_k >= starts[0]) & (a_k < ends[-1]) & (f_k >= s + i_end[-1] + 1))
        sub = blocks.take(pa.array(made, pa.int64()))
        sub = sub.append_column("step", pa.array(np.searchsorted(starts, i64(sub["alloc_ns"]), "right") - 1))
        g = group(sub, SITE, ["bytes"], [("step", "count_distinct")], {"step_count_distinct": "steps"})
        surv_tabs.append(g)
        leaks.append({"device": device_label(dtype[s], dev[s]), "rank": rk, "steps": len(starts), "source": source,
                      "growth_bytes_per_step": int(np.median(deltas)),
                      "total_growth_bytes": int(at_end[-1] - at_start[0]),
                      "allocated_at_step_end": [int(x) for x in at_end], "sites": g.slice(0, 3).to_pylist()})
    return step_rows, surv_tabs, leaks
