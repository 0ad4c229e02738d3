"""steps -- the program's training/inference steps, found without annotations, and what each cost.

Step rules, per rank, the first that applies (summary ``rule``, table column ``rule``):

``ProfilerStep``
    ranges (or ops) named ``ProfilerStep#N`` (torch.profiler's schedule): each is a step.
``pastaprof.step()``
    in a live run, each ``pastaprof.step()`` call ends the step the previous call began (ranges
    ``pastaprof.step#N``); the work before the first call is in no step.
``step ranges``
    user ranges named like ``step3``, ``train_step 3``, ``iteration_3`` (``record_function``).
``optimizer steps``
    ``Optimizer.step#...`` ranges.  Step k spans from the end of optimizer step k-1 to the end
    of optimizer step k; step 0 starts at the rank's first host event (op, API call or user
    range: where the profile starts).  Work after the last optimizer step belongs to no step
    (summary ``after_last_step_ns``).
``repeated ops``
    the names of the top-level ops of the rank's busiest thread are whole repetitions (at least
    2) of one block (inference loops).  Step k spans from the first op of block k to the first op
    of block k+1; the last step ends when its last op or the GPU work it launched ends.

Per step (table ``steps``, one row per step and rank; times are host-clock windows [start, end)):

* ``wall_ns`` = end - start.
* GPU: the kernels, copies and memsets of the rank on all its devices, merged into one timeline
  (the timeline tool's temporal breakdown; sync events are not activities).  ``gpu_busy_ns`` =
  length of their union inside the window, ``gpu_idle_ns`` = wall - busy.  Every idle interval
  ends where an activity starts and is classified with the timeline tool's rule for the
  activity that ends it: ``host_wait`` if its launch call started after the interval began (the
  host had not asked for the work yet), else ``kernel_wait`` if shorter than
  ``consecutive_kernel_delay_ns``, else ``other_idle``.  Idle after the rank's last activity is
  host_wait (nothing was launched).  host_wait + kernel_wait + other_idle == gpu_idle exactly.
  A rank with no GPU activity at all (a CPU-only profile) has null GPU columns.
* ``compute_ns``, ``communication_ns``, ``memory_ns``, ``other_gpu_ns``: the timeline tool's
  priority split of the busy time (HTA's kernel classes, compute > communication > memory >
  other); they sum to gpu_busy exactly, so communication and memory are the *exposed* parts.
* ``kernels``, ``memcpys``, ``memsets``, ``gpu_ns`` (their summed durations), ``top_op`` (the
  innermost op whose launched GPU work took longest): GPU work whose launch call started in
  the window (the activity's own start when no call is known).  ``cpu_ops``: ops starting in it.

Outliers: with at least ``MIN_STEPS_FOR_OUTLIERS`` steps, a step whose wall time exceeds the
rank's median step by more than ``OUTLIER_EXCESS`` of it.  What differed: the component above
(host_wait ... other_gpu) with the largest excess over its median, and the top-level op and the
API call whose time in the step exceeds their median the most.  One finding per rank and
dominant component; ``impact_ns`` = the summed excess over the median.
Options: ``consecutive_kernel_delay_ns`` (30_000), ``outlier_excess`` (0.25).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pastaprof.events.schema import GPU_ACTIVITY_KINDS
from pastaprof.tools._by_rank import rank_rows, rows_of_rank
from pastaprof.tools._ranges import host_ranges
from pastaprof.tools._step_outliers import differences, outlier_finding
from pastaprof.tools._timeline_math import (
    COMMUNICATION,
    COMPUTATION,
    MEMORY,
    KeyIndex,
    hta_kernel_class,
    merged,
    name_codes,
    overlap,
    str_col,
    to_np,
    window_of,
)
from pastaprof.tools.base import Finding, Report, Tool, sql
from pastaprof.tools.memory import OPTIMIZER_STEP, PASTAPROF_STEP_RE, PROFILER_STEP_RE, USER_STEP_RE
from pastaprof.tools.timeline import CONSECUTIVE_KERNEL_DELAY_NS

OUTLIER_EXCESS = 0.25          # a step more than 25% slower than the median step is an outlier ...
MIN_STEPS_FOR_OUTLIERS = 3     # ... when there are enough steps for a median to mean "usual"
MIN_REPEATS = 2                # the repeated-ops rule needs the block at least twice
_NO_LAUNCH = np.iinfo(np.int64).max
COMPONENTS = ("host_wait", "kernel_wait", "other_idle", "compute", "communication", "memory", "other_gpu")
DISPLAY = {"steps": ["rank", "step", "label", "wall_ns", "gpu_busy_ns", "host_wait_ns", "kernel_wait_ns",
                     "other_idle_ns", "compute_ns", "communication_ns", "memory_ns", "kernels", "top_op", "outlier"]}


def _occurrences(hits: pa.Table) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """(starts, ends, labels) of step ranges: the ranges of one name that overlap (the op and
    the annotation of one step) make one window; the same name again later (a second capture
    of the process restarts ProfilerStep#N) makes another."""
    hits = hits.sort_by([("name", "ascending"), ("start_ns", "ascending")])
    names = hits["name"].to_pylist()
    starts, ends = to_np(hits["start_ns"]), to_np(hits["end_ns"])
    out_s: list[int] = []
    out_e: list[int] = []
    labels: list[str] = []
    for name, start, end in zip(names, starts.tolist(), ends.tolist()):  # one row per step range: few
        if labels and labels[-1] == name and start <= out_e[-1]:
            out_e[-1] = max(out_e[-1], end)
            continue
        out_s.append(start)
        out_e.append(end)
        labels.append(name)
    order = np.argsort(np.array(out_s, dtype=np.int64), kind="stable")
    return (np.array(out_s, dtype=np.int64)[order], np.array(out_e, dtype=np.int64)[order],
            [labels[i] for i in order])


class Steps(Tool):
    name = "steps"
    description = ("Training/inference steps (ProfilerStep, step ranges, optimizer steps or repeated ops): "
                   "wall time, GPU busy/idle split, compute/comm/memory, outlier steps")
    consumes = ("kernel", "memcpy", "memset", "api", "op", "range")

    # ------------------------------------------------------------------ inputs

    def _activities(self) -> dict[str, np.ndarray]:
        """GPU activities of all kinds as columns: start, end, rank, cls (HTA class), lag (start minus
        launch-call start, or _NO_LAUNCH), launch (call start, else own start), kind (0..2), op_id."""
        api = self.table("api")
        index = KeyIndex(to_np(api["rank"], dtype=np.int32), to_np(api["correlation"]))
        a_start = to_np(api["start_ns"])
        parts = []
        for code, kind in enumerate(GPU_ACTIVITY_KINDS):
            t = self.table(kind)
            if t.num_rows == 0:
                continue
            start = to_np(t["start_ns"])
            end = np.maximum(to_np(t["end_ns"]), start)
            rank = to_np(t["rank"], dtype=np.int32)
            call = index.find(rank, to_np(t["correlation"]))
            has = call >= 0
            launch = start.copy()
            launch[has] = a_start[call[has]]
            lag = np.full(len(start), _NO_LAUNCH, np.int64)
            lag[has] = start[has] - launch[has]
            if kind == "kernel":
                codes, names = name_codes(t["name"])
                cls = np.array([hta_kernel_class(x) for x in names], dtype=np.int8)[codes]
            else:
                cls = np.full(len(start), MEMORY, np.int8)
            parts.append({"start": start, "end": end, "rank": rank, "cls": cls, "lag": lag, "launch": launch,
                          "kind": np.full(len(start), code, np.int8), "op_id": to_np(t["op_id"])})
        keys = ("start", "end", "rank", "cls", "lag", "launch", "kind", "op_id")
        if not parts:
            return {k: np.zeros(0, np.int64) for k in keys}
        return {k: np.concatenate([p[k] for p in parts]) for k in keys}

    def _host_bounds(self, rank: int) -> tuple[int, int] | None:
        """(first start, last end) of the rank's host events (ops, API calls, user ranges)."""
        lo, hi = [], []
        for kind in ("op", "api", "range"):
            t = rows_of_rank(self.table(kind), rank)
            if kind == "range":  # gpu_user ranges are GPU-side projections, not host events
                t = host_ranges(t)
            if t.num_rows:
                lo.append(pc.min(t["start_ns"]).as_py())
                hi.append(pc.max(t["end_ns"]).as_py())
        return (min(lo), max(hi)) if lo else None

    # ------------------------------------------------------------------ step windows

    def _windows(self, rank: int, act_launch: np.ndarray, act_end: np.ndarray) -> tuple[np.ndarray, np.ndarray,
                                                                                         list[str], str]:
        """(starts, ends, labels, rule) of the rank's steps; see the module docstring."""
        rng, ops = self.table("range"), self.table("op")
        rng = host_ranges(rows_of_rank(rng, rank))
        ops = rows_of_rank(ops, rank)
        coded = [(x, *name_codes(x["name"])) for x in (rng, ops)]
        for pattern, rule in ((PROFILER_STEP_RE, "ProfilerStep"), (PASTAPROF_STEP_RE, "pastaprof.step()"),
                              (USER_STEP_RE, "step ranges")):
            regex = re.compile(pattern, re.IGNORECASE)
            hits = []
            for t, codes, names in coded:  # the regex runs once per distinct name, never per event
                keep = np.array([bool(regex.match(n)) for n in names], bool)[codes] if names else np.zeros(0, bool)
                if keep.any():
                    hits.append(pa.table({"name": pa.array(np.array(names, dtype=object)[codes[keep]], pa.string()),
                                          "start_ns": to_np(t["start_ns"])[keep], "end_ns": to_np(t["end_ns"])[keep]}))
            if hits:
                return (*_occurrences(pa.concat_tables(hits)), rule)
        opt = rng.filter(pc.starts_with(str_col(rng["name"]), OPTIMIZER_STEP))
        bounds = self._host_bounds(rank)
        if opt.num_rows and bounds is not None:
            ends = np.sort(to_np(opt["end_ns"]))
            return np.r_[min(bounds[0], int(ends[0])), ends[:-1]], ends, [f"step {i}" for i in range(len(ends))], \
                "optimizer steps"
        return self._repeated(ops, act_launch, act_end)

    @staticmethod
    def _repeated(ops: pa.Table, act_launch: np.ndarray, act_end: np.ndarray) -> tuple[np.ndarray, np.ndarray,
                                                                                       list[str], str]:
        none = (np.zeros(0, np.int64), np.zeros(0, np.int64), [], "none")
        top = ops.filter(pc.fill_null(pc.equal(ops["depth"], 0), True))
        if top.num_rows < MIN_REPEATS:
            return none
        pid, tid = to_np(top["pid"]), to_np(top["tid"])
        _, thread = np.unique(np.stack([pid, tid], axis=1), axis=0, return_inverse=True)
        thread = thread.reshape(-1)
        top = top.filter(pa.array(thread == np.bincount(thread).argmax())).sort_by("start_ns")
        codes, _ = name_codes(top["name"])
        n = len(codes)
        for p in range(1, n // MIN_REPEATS + 1):  # the smallest block the sequence repeats exactly
            if n % p == 0 and np.array_equal(codes[p:], codes[:-p]):
                starts = to_np(top["start_ns"])[::p]
                last_ops_end = int(to_np(top["end_ns"])[-p:].max())
                tail = act_end[act_launch >= starts[-1]]
                last = max(last_ops_end, int(tail.max()) if len(tail) else last_ops_end)
                return starts, np.r_[starts[1:], last], [f"iteration {i}" for i in range(len(starts))], "repeated ops"
        return none

    # ------------------------------------------------------------------ GPU split per window

    @staticmethod
    def _gpu_split(act: dict[str, np.ndarray], lo: np.ndarray, hi: np.ndarray, delay: int) -> dict[str, np.ndarray]:
        """Busy, idle classes and busy classes per window for one rank's activities (sorted by start)."""
        s, e, cls, lag = act["start"], act["end"], act["cls"], act["lag"]
        wall = hi - lo
        out = {c: np.zeros(len(lo), np.int64) for c in ("gpu_busy", *COMPONENTS)}
        if len(s) == 0:
            out["host_wait"] = wall.copy()
            out["gpu_idle"] = wall.copy()
            return out
        a, b, opener = merged(s, e)
        out["gpu_busy"] = overlap(a, b, lo, hi)
        # Idle intervals: before the first activity (from the first window), between merged
        # intervals, after the last one (to the last window's end).
        ia = np.concatenate([[min(int(lo[0]), int(a[0]))], b])
        ib = np.concatenate([a, [max(int(hi[-1]), int(b[-1]))]])
        gap = ib - ia
        host = np.ones(len(ia), bool)
        host[:-1] = gap[:-1] > lag[opener]
        kern = ~host & (gap < delay)
        for label, mask in (("host_wait", host), ("kernel_wait", kern), ("other_idle", ~host & ~kern)):
            keep = mask & (gap > 0)
            out[label] = overlap(ia[keep], ib[keep], lo, hi)
        out["gpu_idle"] = wall - out["gpu_busy"]
        unions = {}
        for top in (COMPUTATION, COMMUNICATION, MEMORY):
            m = cls <= top
            unions[top] = out["gpu_busy"] if m.all() else overlap(*merged(s[m], e[m])[:2], lo, hi)
        out["compute"] = unions[COMPUTATION]
        out["communication"] = unions[COMMUNICATION] - unions[COMPUTATION]
        out["memory"] = unions[MEMORY] - unions[COMMUNICATION]
        out["other_gpu"] = out["gpu_busy"] - unions[MEMORY]
        return out

    # ------------------------------------------------------------------ report

    def report(self) -> Report:
        delay = int(self.options.get("consecutive_kernel_delay_ns", CONSECUTIVE_KERNEL_DELAY_NS))
        act = self._activities()
        op = self.table("op")
        ranks = sorted(set(np.unique(act["rank"]).tolist()).union(
            *(set(pc.unique(self.table(k)["rank"]).to_pylist()) for k in ("op", "api", "range"))))
        act["sid"] = np.full(len(act["start"]), -1, np.int64)
        op_sid = np.full(op.num_rows, -1, np.int64)
        op_rank = to_np(op["rank"], dtype=np.int32)
        op_start = to_np(op["start_ns"])
        tables, per_rank, base = [], [], 0
        act_of, op_of = rank_rows(act["rank"]), rank_rows(op_rank)
        for r in ranks:
            mine = act_of[r]
            mine = mine[np.argsort(act["start"][mine], kind="stable")]
            sub = {k: v[mine] for k, v in act.items()}
            lo, hi, labels, rule = self._windows(r, sub["launch"], sub["end"])
            if len(lo):  # disjoint and ordered, whatever the ranges were
                hi = np.maximum(hi, lo)
                lo = np.maximum(lo, np.r_[np.iinfo(np.int64).min, np.maximum.accumulate(hi)[:-1]])
                hi = np.maximum(hi, lo)
            per_rank.append({"rank": r, "rule": rule, "steps": len(lo), "gpu_activities": len(sub["start"])})
            if not len(lo):
                continue
            w = window_of(sub["launch"], lo, hi)
            act["sid"][mine[w >= 0]] = base + w[w >= 0]
            on = op_of[r]
            wo = window_of(op_start[on], lo, hi)
            op_sid[on[wo >= 0]] = base + wo[wo >= 0]
            split = self._gpu_split(sub, lo, hi, delay)
            host = self._host_bounds(r)
            per_rank[-1]["after_last_step_ns"] = max(0, max(host[1] if host else 0, int(sub["end"].max(initial=0)))
                                                     - int(hi[-1]))
            n = len(lo)
            no_gpu = np.full(n, not len(sub["start"]))  # no GPU activity at all: GPU columns are null
            tables.append(pa.table({
                "sid": np.arange(base, base + n), "rank": np.full(n, r, np.int32), "step": np.arange(n),
                "label": pa.array(labels, pa.string()), "rule": pa.array([rule] * n, pa.string()),
                "start_ns": lo, "end_ns": hi, "wall_ns": hi - lo,
                **{f"{c}_ns": pa.array(split[c], pa.int64(), mask=no_gpu) for c in ("gpu_busy", "gpu_idle", *COMPONENTS)},
            }))
            base += n
        if not tables:
            return self._empty(per_rank)
        steps = self._tallies(pa.concat_tables(tables), act, op, op_sid)
        steps, findings, stats = self._outliers(steps, op, op_sid)
        summary = self._summary(steps, per_rank, stats)
        return Report(self.name, tables={"steps": steps.drop_columns(["sid"])}, findings=findings,
                      summary=summary, display=DISPLAY)

    def _empty(self, per_rank: list[dict[str, Any]]) -> Report:
        if not per_rank:
            note = "no host events (ops, API calls or ranges): nothing to find steps in"
        else:
            note = ("no steps found: no ProfilerStep#N, stepN or Optimizer.step ranges, "
                    "and the top-level ops do not repeat")
        return Report(self.name, summary={"rule": "none", "steps": 0, "note": note})

    def _tallies(self, steps: pa.Table, act: dict[str, np.ndarray], op: pa.Table, op_sid: np.ndarray) -> pa.Table:
        """Per step: launched kernels/copies/memsets, their GPU time, the top op; ops started."""
        codes, names = name_codes(op["name"])
        row = KeyIndex(to_np(op["rank"], dtype=np.int32), to_np(op["id"])).find(act["rank"], act["op_id"])
        idx = np.where(row >= 0, codes[np.clip(row, 0, None)] if len(codes) else -1, -1)
        acts = pa.table({
            "sid": act["sid"], "kind": act["kind"], "d": act["end"] - act["start"],
            "op": pa.DictionaryArray.from_arrays(pa.array(idx.astype(np.int32), mask=idx < 0), pa.array(names, pa.string())),
        })
        con = sql(steps=steps, acts=acts, ops=pa.table({"sid": op_sid}))
        return con.sql("""
            WITH g AS (SELECT sid, kind, d, CAST(op AS VARCHAR) AS op FROM acts WHERE sid >= 0),
                 t AS (SELECT sid, count(*) FILTER (kind = 0) AS kernels, count(*) FILTER (kind = 1) AS memcpys,
                              count(*) FILTER (kind = 2) AS memsets, sum(d)::BIGINT AS gpu_ns FROM g GROUP BY sid),
                 o AS (SELECT sid, op, sum(d) AS d FROM g WHERE op IS NOT NULL GROUP BY ALL),
                 top AS (SELECT sid, first(op ORDER BY d DESC, op) AS top_op, max(d)::BIGINT AS top_op_gpu_ns
                         FROM o GROUP BY sid),
                 c AS (SELECT sid, count(*) AS cpu_ops FROM ops WHERE sid >= 0 GROUP BY sid)
            SELECT steps.*, coalesce(kernels, 0) AS kernels, coalesce(memcpys, 0) AS memcpys,
                   coalesce(memsets, 0) AS memsets, coalesce(gpu_ns, 0)::BIGINT AS gpu_ns, top_op,
                   top_op_gpu_ns, coalesce(cpu_ops, 0) AS cpu_ops
            FROM steps LEFT JOIN t USING (sid) LEFT JOIN top USING (sid) LEFT JOIN c USING (sid) ORDER BY sid
        """).to_arrow_table()

    # ------------------------------------------------------------------ outliers and findings

    def _outliers(self, steps: pa.Table, op: pa.Table, op_sid: np.ndarray) -> tuple[pa.Table, list[Finding],
                                                                                   dict[int, dict[str, Any]]]:
        share = float(self.options.get("outlier_excess", OUTLIER_EXCESS))
        rank, wall, start = to_np(steps["rank"]), to_np(steps["wall_ns"]), to_np(steps["start_ns"])
        comp = {c: to_np(steps[f"{c}_ns"]) for c in COMPONENTS}
        outlier = np.zeros(len(wall), bool)
        stats: dict[int, dict[str, Any]] = {}
        groups = []
        of = rank_rows(rank)
        for r in of.ranks():
            m = of[r]
            w = wall[m].astype(np.float64)
            med = float(np.median(w))
            stats[r] = {"median_wall_ns": int(round(med)), "mean_wall_ns": int(round(w.mean())),
                        "std_wall_ns": int(round(w.std())), "cv": round(float(w.std() / w.mean()), 4) if w.mean() else 0.0,
                        "min_wall_ns": int(w.min()), "max_wall_ns": int(w.max()), "outliers": 0}
            if len(m) < MIN_STEPS_FOR_OUTLIERS:
                continue
            slow = m[w > med * (1 + share)]
            if not len(slow):
                continue
            outlier[slow] = True
            stats[r]["outliers"] = len(slow)
            first = slow == m[np.argmin(start[m])]  # the rank's first step: its one-time work, on its own
            if steps["gpu_busy_ns"].null_count and not pc.any(pc.is_valid(steps["gpu_busy_ns"].take(pa.array(m)))).as_py():
                # no GPU in this rank: only host time can differ
                groups += [(r, "host", slow[first == alone], med, {}, alone) for alone in (True, False)
                           if (first == alone).any()]
                continue
            exc = np.stack([comp[c][slow] - np.median(comp[c][m]) for c in COMPONENTS])
            dom = exc.argmax(axis=0)
            for ci in np.unique(dom).tolist():
                for alone in (True, False):
                    pick = (dom == ci) & (first == alone)
                    if pick.any():
                        groups.append((r, COMPONENTS[ci], slow[pick], med,
                                       {c: int(round(exc[k][pick].sum())) for k, c in enumerate(COMPONENTS)}, alone))
        steps = steps.append_column("outlier", pa.array(outlier))
        if not groups:
            return steps, [], stats
        explain = differences(self.table("api"), steps, op, op_sid, np.flatnonzero(outlier))
        by_sid = {k: rank_rows(to_np(t["sid"])) for k, t in explain.items()}  # rows of each step, found once
        findings = [outlier_finding(steps, g, explain, by_sid) for g in groups]
        return steps, findings, stats

    @staticmethod
    def _summary(steps: pa.Table, per_rank: list[dict[str, Any]], stats: dict[int, dict[str, Any]]) -> dict[str, Any]:
        for p in per_rank:
            p.update(stats.get(p["rank"], {}))
        rules = sorted({p["rule"] for p in per_rank if p["steps"]})
        wall = to_np(steps["wall_ns"]).astype(np.float64)
        out: dict[str, Any] = {"rule": rules[0] if len(rules) == 1 else "mixed", "steps": steps.num_rows,
                               "ranks": len(per_rank), "median_wall_ns": int(round(float(np.median(wall)))),
                               "mean_wall_ns": int(round(wall.mean())), "std_wall_ns": int(round(wall.std())),
                               "cv": round(float(wall.std() / wall.mean()), 4) if wall.mean() else 0.0,
                               "outliers": int(pc.sum(steps["outlier"].cast(pa.int64())).as_py() or 0),
                               "per_rank": per_rank}
        if not any(p["rule"] == "none" for p in per_rank) and len(per_rank) == 1:
            out["after_last_step_ns"] = per_rank[0].get("after_last_step_ns", 0)
        else:
            out["ranks_without_steps"] = [p["rank"] for p in per_rank if not p["steps"]]
        return out
