"""The map side of the ranks tool: one rank's tables -> a few small summary tables.

Pure: sees only its rank's events, returns tables of a few rows per step, collective or
kernel name (``TOP_KERNELS`` / ``TOP_HOST`` names per rank), so that 1,024 ranks' summaries fit
in one process and the distributed engine ships little.

* ``steps``: the steps tool's table for the rank (its own clock): wall, GPU busy/idle split,
  compute, exposed communication.
* ``collectives``: :func:`collectives.rank_collectives` plus the step each was issued in.
* ``kernels``: per step and compute-kernel name (the rank's ``TOP_KERNELS`` names by time, the
  rest as ``(other kernels)``): GPU time of the kernels launched in the step.
* ``host``: per step and name of a top-level op or user range (``TOP_HOST`` names): host time.
* ``totals``: one row: NCCL kernel time (union), exposed communication, compute.
"""

from __future__ import annotations

import re

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pastaprof.tools._ranges import host_ranges
from pastaprof.tools._timeline_math import KeyIndex, merged, name_codes, to_np, window_of
from pastaprof.tools.memory import PASTAPROF_STEP_RE, PROFILER_STEP_RE, USER_STEP_RE
from pastaprof.tools.ranks.collectives import nccl_kernels, rank_collectives, resequence
from pastaprof.tools.steps import Steps
from pastaprof.tools.timeline import CONSECUTIVE_KERNEL_DELAY_NS

TOP_KERNELS = 32
TOP_HOST = 16
OTHER_KERNELS = "(other kernels)"
STEP_COLUMNS = ("gpu_busy", "gpu_idle", "host_wait", "kernel_wait", "other_idle", "compute", "communication",
                "memory", "other_gpu")
_STEP_NAME = re.compile("|".join(f"(?:{p})" for p in (PROFILER_STEP_RE, PASTAPROF_STEP_RE, USER_STEP_RE)),
                        re.IGNORECASE)


def rank_steps(rank: int, tables: dict[str, pa.Table], options: dict) -> pa.Table:
    """The steps tool's windows and GPU split of one rank (its own clock; GPU columns 0 without GPU
    work).  Only the per-step split: the steps tool's outlier analysis is not needed here and
    costs more than the rest of the map."""
    tool = Steps()
    for kind in tool.consumes:
        for b in tables[kind].to_batches():
            tool.on_batch(kind, b)
    delay = int(options.get("consecutive_kernel_delay_ns", CONSECUTIVE_KERNEL_DELAY_NS))
    act = tool._activities()
    order = np.argsort(act["start"], kind="stable")
    act = {k: v[order] for k, v in act.items()}
    lo, hi, labels, _ = tool._windows(rank, act["launch"], act["end"])
    if len(lo):  # disjoint and ordered, as the steps tool makes them
        hi = np.maximum(hi, lo)
        lo = np.maximum(lo, np.r_[np.iinfo(np.int64).min, np.maximum.accumulate(hi)[:-1]])
        hi = np.maximum(hi, lo)
    n = len(lo)
    split = tool._gpu_split(act, lo, hi, delay) if n else {c: np.zeros(0, np.int64) for c in STEP_COLUMNS}
    return pa.table({"rank": pa.array(np.full(n, rank), pa.int32()), "step": pa.array(np.arange(n), pa.int64()),
                     "label": pa.array(labels, pa.string()), "start_ns": pa.array(lo, pa.int64()),
                     "end_ns": pa.array(hi, pa.int64()), "wall_ns": pa.array(hi - lo, pa.int64()),
                     **{f"{c}_ns": pa.array(split[c], pa.int64()) for c in STEP_COLUMNS}})


def _launch_times(rank: int, kernel: pa.Table, api: pa.Table) -> np.ndarray:
    call = KeyIndex(to_np(api["rank"], dtype=np.int32), to_np(api["correlation"])).find(
        np.full(kernel.num_rows, rank, np.int32), to_np(kernel["correlation"]))
    start = to_np(kernel["start_ns"])
    if not api.num_rows:
        return start
    return np.where(call >= 0, to_np(api["start_ns"])[np.maximum(call, 0)], start)


def _per_step_names(step: np.ndarray, names_of: list[str], codes: np.ndarray, ns: np.ndarray, top: int,
                    other: str | None) -> pa.Table:
    """(step, name, ns, count) of the ``top`` names by total time; the rest summed as ``other`` (or dropped)."""
    keep = step >= 0
    step, codes, ns = step[keep], codes[keep], ns[keep]
    total = np.bincount(codes, weights=ns, minlength=len(names_of))
    best = np.argsort(-total, kind="stable")[:top]
    names = np.array(names_of + ([other] if other else []), dtype=object)
    mapped = np.full(len(names_of), len(names_of) if other else -1)
    mapped[best] = best
    codes = mapped[codes] if len(codes) else codes
    if not other:
        step, ns, codes = step[codes >= 0], ns[codes >= 0], codes[codes >= 0]
    t = pa.table({"step": step, "code": codes.astype(np.int64), "ns": ns})
    g = t.group_by(["step", "code"], use_threads=False).aggregate([("ns", "sum"), ("ns", "count")])
    return pa.table({"step": g["step"], "name": pa.array(names[to_np(g["code"])].tolist(), pa.string()),
                     "ns": g["ns_sum"], "count": g["ns_count"]})


def map_rank(rank: int, tables: dict[str, pa.Table], options: dict) -> dict[str, pa.Table]:
    """The summaries of one rank (see the module docstring)."""
    steps = rank_steps(rank, tables, options)
    lo, hi = to_np(steps["start_ns"]), to_np(steps["end_ns"])
    coll = rank_collectives(rank, tables)
    step = window_of(to_np(coll["host_ns"]), lo, hi)
    coll = coll.append_column("step", pa.array(step, pa.int64()))
    names = steps["label"].to_pylist()
    coll = resequence(coll, [names[i] if i >= 0 else None for i in step.tolist()])
    kernel = tables["kernel"]
    is_nccl = nccl_kernels(kernel)[0] if kernel.num_rows else np.zeros(0, bool)
    k_start, k_end = to_np(kernel["start_ns"]), to_np(kernel["end_ns"])
    ns = np.maximum(k_end - k_start, 0)
    comp = ~is_nccl
    codes, names = name_codes(kernel["name"])
    k_step = window_of(_launch_times(rank, kernel, tables["api"]), lo, hi)
    kernels = _per_step_names(k_step[comp], names, codes[comp], ns[comp], TOP_KERNELS, OTHER_KERNELS)
    host = _host_names(rank, tables, lo, hi)
    s, e = k_start[is_nccl], k_end[is_nccl]
    o = np.argsort(s, kind="stable")
    a, b, _ = merged(s[o], np.maximum(e[o], s[o]))
    totals = pa.table({"rank": [rank], "nccl_ns": [int((b - a).sum())],
                       "exposed_comm_ns": [int(pc.sum(steps["communication_ns"]).as_py() or 0)],
                       "compute_ns": [int(pc.sum(steps["compute_ns"]).as_py() or 0)],
                       "kernels": [int(comp.sum())], "nccl_kernels": [int(is_nccl.sum())]})
    return {"steps": steps, "collectives": coll, "kernels": kernels, "host": host, "totals": totals}


def _host_names(rank: int, tables: dict[str, pa.Table], lo: np.ndarray, hi: np.ndarray) -> pa.Table:
    """Host time per step of the top-level ops and the user ranges (step ranges excluded)."""
    op = tables["op"]
    op = op.filter(pc.fill_null(pc.equal(op["depth"], 0), True))
    rng = host_ranges(tables["range"])
    parts = [t.select(["start_ns", "end_ns", "name"]).cast(pa.schema([("start_ns", pa.int64()), ("end_ns", pa.int64()),
                                                                     ("name", pa.string())]))
             for t in (op, rng) if t.num_rows]
    if not parts:
        return pa.table({"step": pa.array([], pa.int64()), "name": pa.array([], pa.string()),
                         "ns": pa.array([], pa.int64()), "count": pa.array([], pa.int64())})
    t = pa.concat_tables(parts)
    codes, names = name_codes(t["name"])
    not_step = np.array([not _STEP_NAME.match(n) for n in names], bool)
    keep = not_step[codes]
    start, end = to_np(t["start_ns"]), to_np(t["end_ns"])
    step = np.where(keep, window_of(start, lo, hi), -1)
    return _per_step_names(step, names, codes, np.maximum(end - start, 0), TOP_HOST, None)
