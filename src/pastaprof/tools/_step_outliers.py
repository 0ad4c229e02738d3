"""Outlier steps explained: which top-level ops and API calls took longer than in the rank's
median step, and the finding that says so (the steps tool's, ``tools/steps.py``).  A rank's
first step is reported on its own: its excess is one-time work (compilation, autotuning, lazy
initialization), not something every step pays."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pastaprof.tools._by_rank import rank_rows
from pastaprof.tools._timeline_math import fmt_ns, str_col, to_np, window_of
from pastaprof.tools.base import Finding, sql

SUGGESTIONS = {
    "host_wait": "The GPU waited for the host: see what the host did longer in these steps (warm-up, data "
                 "loading, synchronization, Python overhead) and keep warm-up steps out of the measurement.",
    "kernel_wait": "The GPU idled between queued work: look for synchronizations or stream dependencies in these steps.",
    "other_idle": "The GPU idled between queued work: look for synchronizations or stream dependencies in these steps.",
    "compute": "GPU compute took longer: check input shapes and first-call work (autotuning, lazy init) in these steps.",
    "communication": "Exposed communication grew: check for a straggling rank or larger collectives in these steps.",
    "memory": "Copies or memsets grew: check the data transfers issued in these steps.",
    "other_gpu": "Other GPU work (syncs, unclassified kernels) grew: check these steps' kernels.",
    "host": "The host took longer (no GPU activity recorded): look at the op with the largest excess.",
}
FIRST_STEP = ("The first step does one-time work (torch.compile's compilation, autotuning, lazy initialization, "
              "the allocator's first growth): leave it out of step-time measurements (a profiler schedule's "
              "warm-up, pastaprof run --steps), and shorten it only if start-up time matters to you.")
COMPILE_OPS = ("Torch-Compiled Region", "CompiledFunction", "TorchDynamo", "torch_compile", "Compiled Function")


def differences(api: pa.Table, steps: pa.Table, op: pa.Table, op_sid: np.ndarray, rows: np.ndarray) -> Any:
    """Per outlier step and name: time of top-level ops / API calls in the step minus the
    median over the rank's steps (0 where a step has none), with the op's call sites."""
    api_sid = np.full(api.num_rows, -1, np.int64)
    a_rank, a_start = to_np(api["rank"], dtype=np.int32), to_np(api["start_ns"])
    s_rank, lo, hi, sid = (to_np(steps[c]) for c in ("rank", "start_ns", "end_ns", "sid"))
    s_of, a_of = rank_rows(s_rank), rank_rows(a_rank)
    for r in s_of.ranks():
        m, on = s_of[r], a_of[r]
        w = window_of(a_start[on], lo[m], hi[m])
        api_sid[on[w >= 0]] = sid[m][w[w >= 0]]
    top = pc.fill_null(pc.equal(op["depth"], 0), True).to_numpy(zero_copy_only=False) & (op_sid >= 0)
    op = op.filter(pa.array(top))
    x_op = pa.table({"sid": op_sid[top], "name": str_col(op["name"]), "site": op["call_site"].cast(pa.string()),
                     "ns": pc.subtract(op["end_ns"], op["start_ns"])})
    x_api = pa.table({"sid": api_sid, "name": str_col(api["name"]), "site": pa.nulls(api.num_rows, pa.string()),
                      "ns": pc.subtract(api["end_ns"], api["start_ns"])})
    con = sql(steps=steps.select(["sid", "rank"]), x_op=x_op, x_api=x_api,
              outl=pa.table({"sid": sid[rows]}))
    out = {}
    for label in ("op", "api"):
        out[label] = con.sql(f"""
            WITH per AS (SELECT sid, name, sum(ns) AS ns FROM x_{label} WHERE sid >= 0 GROUP BY ALL),
                 names AS (SELECT DISTINCT rank, name FROM per JOIN steps USING (sid)),
                 grid AS (SELECT s.rank, s.sid, n.name, coalesce(p.ns, 0) AS ns FROM steps s
                          JOIN names n USING (rank) LEFT JOIN per p ON p.sid = s.sid AND p.name = n.name),
                 med AS (SELECT rank, name, median(ns) AS m FROM grid GROUP BY ALL),
                 sites AS (SELECT sid, name, first(site ORDER BY ns DESC, site) AS site FROM
                           (SELECT sid, name, site, sum(ns) AS ns FROM x_{label} WHERE site IS NOT NULL
                            GROUP BY ALL) GROUP BY ALL)
            SELECT g.sid, g.name, (g.ns - med.m)::DOUBLE AS excess, sites.site FROM grid g JOIN outl USING (sid)
            JOIN med USING (rank, name) LEFT JOIN sites ON sites.sid = g.sid AND sites.name = g.name
        """).to_arrow_table()
    return out


def outlier_finding(steps: pa.Table, group: tuple, explain: dict[str, pa.Table], by_sid: dict[str, Any]) -> Finding:
    """One finding for a group of a rank's outlier steps with the same dominant component
    (``first``: the group is the rank's first step alone)."""
    r, component, rows, med, excess, first = group
    wall = to_np(steps["wall_ns"])[rows]
    sids = to_np(steps["sid"])[rows]
    labels = steps["label"].take(pa.array(rows)).to_pylist()
    impact = int(round(float((wall - med).sum())))
    ratio = float(wall.max() / med) if med else float("inf")
    evidence: dict[str, Any] = {"impact_ns": impact, "steps": labels[:10], "median_wall_ns": int(round(med)),
                                "max_wall_ns": int(wall.max()), "ratio_to_median": round(ratio, 2),
                                **{f"excess_{c}_ns": v for c, v in excess.items()}}
    location = None
    for label in ("op", "api"):
        mine = [by_sid[label][int(x)] for x in np.unique(sids)]  # the rows of is_in(sid, sids), in order
        t = explain[label].take(np.sort(np.concatenate(mine)) if mine else np.zeros(0, np.int64))
        if not t.num_rows:
            continue
        g = t.group_by("name", use_threads=False).aggregate([("excess", "sum")]).sort_by([("excess_sum", "descending"),
                                                                        ("name", "ascending")])
        name, ex = g["name"][0].as_py(), g["excess_sum"][0].as_py()
        if ex <= 0:
            continue
        evidence[f"top_{label}"], evidence[f"top_{label}_excess_ns"] = name, int(round(ex))
        if label == "op":
            sites = t.filter(pc.and_(pc.equal(t["name"], name), pc.is_valid(t["site"])))["site"]
            site = sites[0].as_py() if len(sites) else None
            evidence["top_op_call_site"] = site
            location = site or name
    evidence["cause"], evidence["suggestion"] = component, SUGGESTIONS[component]
    which = labels[0] if len(labels) == 1 else f"{len(labels)} steps ({', '.join(labels[:5])})"
    evidence["first_step"] = first
    compiling = first and any(k in str(evidence.get("top_op", "")) for k in COMPILE_OPS)
    if first:
        evidence["suggestion"] = FIRST_STEP
    title = (f"{which} of rank {r}{', the first,' if first else ''} took {'up to ' if len(labels) > 1 else ''}"
             f"{ratio:.2f}x the median step (+{fmt_ns(impact)}), mostly "
             + ("torch.compile's compilation" if compiling else component.replace('_', ' ')
                + (" time (no GPU activity)" if component == "host" else ""))
             + (": one-time work" if first and not compiling else ""))
    return Finding("warning" if ratio >= 2 else "info", title, evidence, location or f"rank {r}: {labels[0]}")
