"""Launch-bound kernels for the timeline tool: per kernel, whether its launch call outlasts it,
and the per-name table and totals of the ``launch_bound`` report (definitions: tools/timeline.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

#: (launches, graph launches, launch-bound launches, launch-bound graph launches) without kernels.
NO_UNITS = (0, 0, 0, 0)


def launch_bound_flags(start: np.ndarray, end: np.ndarray, launch: np.ndarray, a_start: np.ndarray,
                       a_end: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                                                   tuple[int, int, int, int]]:
    """Per kernel: has a launch call, is launch-bound, its duration, its share of the
    call's duration; and (launches, graph launches, launch-bound launches, launch-bound
    graph launches).  A call that launched one kernel is launch-bound when the kernel is
    shorter than the call.  A call that launched several (``cudaGraphLaunch``: every
    kernel of the graph carries the call's correlation id) is judged once, on the GPU
    time of all its kernels; each of its kernels takes that verdict and an equal share
    of the call's time (so per-name sums add up to the call, not n times it)."""
    has = launch >= 0
    call = launch[has].astype(np.int64)
    kernel_ns = end - start
    n_calls = len(a_start)
    per_call = np.bincount(call, minlength=n_calls)
    gpu_ns = np.rint(np.bincount(call, weights=kernel_ns[has], minlength=n_calls)).astype(np.int64)
    call_ns = a_end - a_start
    multi = per_call[call] > 1
    bound_has = np.where(multi, gpu_ns[call] < call_ns[call], kernel_ns[has] < call_ns[call])
    bound = np.zeros(len(start), dtype=bool)
    bound[has] = bound_has
    launch_ns = np.zeros(len(start), dtype=np.int64)
    launch_ns[has] = call_ns[call] // np.maximum(per_call[call], 1)
    used = per_call > 0
    graphs = per_call > 1
    call_bound = gpu_ns < call_ns
    units = (int(used.sum()), int(graphs.sum()), int((used & call_bound).sum()), int((graphs & call_bound).sum()))
    return has, bound, kernel_ns, launch_ns, units


def launch_bound_table(lb: tuple | None, top_n: int) -> tuple[pa.Table, dict[str, Any]]:
    """The ``launch_bound`` table (top ``top_n`` kernel names by launch-bound count) and the
    summary totals, from ``(names, codes) + launch_bound_flags(...)`` of the kernels (None: no kernels)."""
    if lb is None:
        z = np.zeros(0, np.int64)
        names, codes, has, bound, kdur, ldur, units = [], np.zeros(0, np.int32), z > 0, z > 0, z, z, NO_UNITS
    else:
        names, codes, has, bound, kdur, ldur, units = lb
    m = len(names)

    def per_name(weights: np.ndarray) -> np.ndarray:  # exact int64 sums per name (float64 sums of ints < 2**53)
        return np.rint(np.bincount(codes, weights=weights, minlength=m)).astype(np.int64)

    launches = np.bincount(codes, minlength=m)
    with_launch, lb = per_name(has), per_name(bound)
    order = np.lexsort((np.arange(m), -lb))
    order = order[lb[order] > 0][:top_n]
    table = pa.table({
        "name": pa.array([names[i] for i in order], pa.string()),
        "launches": launches[order], "with_launch": with_launch[order], "launch_bound": lb[order],
        "launch_bound_share": np.round(lb[order] / np.maximum(with_launch[order], 1), 4),
        "kernel_ns": per_name(kdur)[order],
        "launch_bound_kernel_ns": per_name(np.where(bound, kdur, 0))[order],
        "launch_bound_launch_ns": per_name(np.where(bound, ldur, 0))[order],
    })
    n_units, n_graphs, lb_units, lb_graphs = units
    totals = {"kernels": int(len(codes)), "kernels_with_launch": int(has.sum()),
              "launch_bound_kernels": int(bound.sum()), "launches": n_units, "graph_launches": n_graphs,
              "launch_bound_launches": lb_units, "launch_bound_graph_launches": lb_graphs,
              "launch_bound_share": round(lb_units / n_units, 4) if n_units else 0.0,
              # GPU time lost to launch-bound kernels: their launch call outlasts them
              "launch_bound_excess_ns": int(np.maximum(np.where(bound, ldur - kdur, 0), 0).sum())}
    return table, totals
