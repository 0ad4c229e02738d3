"""critical_path -- what bounds one step: the chain of CPU work, launches, kernels and syncs.

The step is one the steps tool finds (``tools/steps.py``; option ``step``: its index, default the
step of median wall time; option ``rank``, default the first rank with steps).  Its events are
replayed in a small model:

* **host**: the runtime/driver calls of the rank's threads, merged in time order, run one after
  another (PyTorch's forward thread waits while the autograd thread runs backward, so the
  threads that launch GPU work take turns; concurrent launching threads are serialized); before each call, the host works for the time the trace shows
  between it and the previous call: the part after the call's top-level framework op began is
  that op's host work (``aten::linear``, ``autograd::engine::evaluate_function: ...``), the part
  before it is ``host between ops`` (Python, data loading); calls with no op are ``host``;
* **GPU**: each kernel, copy or memset a call launched starts at ``max(call start + launch
  latency, end of the previous activity on its stream)`` and runs for its measured time; the
  latency is the measured one when the activity did not queue, else the step's smallest;
* **syncs**: a synchronize (``cudaStreamSynchronize``, ``cudaDeviceSynchronize``, event
  waits), a blocking copy or a copy call that returned after its copy ended (pageable) returns at ``max(its start + its own cost, end of every activity
  launched so far)`` -- all streams, since the trace does not say which one a call waits on;
  cross-stream event dependencies are not modeled.

Replaying the measured durations reproduces the step (summary ``model_error``).  The critical
path is found by walking back from the step's end through whichever predecessor bound each
event (table ``critical path``: time per op, kernel, launch latency and sync on it; the times sum
to the modeled step).  The *what-if* (table ``what if``) replays the step with one op's host
time, or one kernel name's GPU time, set to zero: ``saved_ns`` is how much shorter the step
would be -- often far less than the removed time, because another chain takes over.

Finding: the largest what-if saving, when it is at least ``MIN_SAVING`` of the step;
``impact_ns`` = that saving times the number of steps (the step is taken as typical).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pastaprof.events.schema import GPU_ACTIVITY_KINDS
from pastaprof.report.diff_names import normalize_kernel_name
from pastaprof.tools._timeline_math import KeyIndex, fmt_ns, name_codes, to_np
from pastaprof.tools.base import Finding, Report, Tool
from pastaprof.tools.cuda_api import BLOCKING_MEMCPY_RE, SYNC_RE, pattern_mask
from pastaprof.tools.steps import Steps

MIN_SAVING = 0.05     # a what-if saving 5% of the step is worth a finding
WHAT_IFS = 6          # candidates of each kind (ops, kernels) replayed
MAX_EVENTS = 200_000  # a step with more calls than this is not replayed
QUEUED_NS = 1_000     # an activity starting within 1 us of its stream's previous end had queued
BETWEEN = "host between ops"


class _Step:
    """One step's events as arrays: host calls (sorted) and the activities they launched."""

    def __init__(self, calls: dict[str, np.ndarray], acts: dict[str, np.ndarray], lo: int, hi: int) -> None:
        self.c, self.a, self.lo, self.hi = calls, acts, lo, hi
        s, e = calls["start"], calls["end"]
        prev = np.r_[lo, e[:-1]]
        self.gap = np.maximum(s - prev, 0)
        # the gap's part before the previous call's op ended is that op's host work, the part
        # after the call's own op began is this op's; the rest the host spent between ops
        prev_end = np.r_[-(1 << 62), calls["op_end"][:-1]]  # sentinels far from int64's ends: no overflow
        self.gap_prev = np.clip(np.minimum(prev_end, s) - prev, 0, self.gap)
        self.gap_op = np.clip(s - np.maximum(prev + self.gap_prev, calls["op_start"]), 0, self.gap - self.gap_prev)
        self.gap_free = self.gap - self.gap_prev - self.gap_op
        self.dur = np.maximum(e - s, 0)
        self.tail = max(0, hi - int(e[-1])) if len(e) else hi - lo
        a = acts
        order = np.lexsort((a["start"], a["stream"]))
        prev_end = np.full(len(order), -(1 << 62))  # not int64 min: start - prev_end must not overflow
        same = a["stream"][order][1:] == a["stream"][order][:-1]
        prev_end[order[1:][same]] = a["end"][order][:-1][same]
        lag = a["start"] - s[a["call"]]
        free = a["start"] - prev_end > QUEUED_NS
        lmin = int(lag[free & (lag >= 0)].min()) if (free & (lag >= 0)).any() else 0
        self.lat = np.where(free, np.maximum(lag, 0), lmin)
        self.adur = np.maximum(a["end"] - a["start"], 0)
        # a waiting call's own cost: its time after the GPU work it waited for had finished
        self.cost = self.dur.copy()
        self.by_call = [[] for _ in range(len(s))]
        for j in np.argsort(a["call"], kind="stable"):
            self.by_call[a["call"][j]].append(int(j))
        ends = np.maximum.accumulate(np.r_[np.iinfo(np.int64).min, _launched_end(a, len(s))])[1:]
        w = calls["waits"]
        self.cost[w] = np.clip(e[w] - np.maximum(s[w], ends[w]), 0, None)

    def replay(self, host_scale: np.ndarray | None = None, act_scale: np.ndarray | None = None,
               path: bool = False, free_scale: float = 1.0) -> tuple[int, list[tuple[str, int, int]]]:
        """Modeled step length; with ``path``, the critical path as (kind, index, ns) segments.
        ``host_scale`` scales each call's op time, ``free_scale`` the host time between ops."""
        if host_scale is None:
            gap = self.gap_free * free_scale + self.gap_op + self.gap_prev
        else:
            gap = self.gap_free * free_scale + self.gap_op * host_scale + self.gap_prev * np.r_[1, host_scale[:-1]]
        dur = self.dur if host_scale is None else np.where(self.c["waits"], self.dur, self.dur * host_scale)
        adur = self.adur if act_scale is None else self.adur * act_scale
        n, m = len(gap), len(adur)
        c_start, c_end = np.zeros(n, np.int64), np.zeros(n, np.int64)
        a_start, a_end = np.zeros(m, np.int64), np.zeros(m, np.int64)
        bound_by = np.full(m, -1, np.int64)   # activity: previous activity on its stream, or -1 (its launch)
        waited = np.full(n, -1, np.int64)     # waiting call: the activity it waited for, or -1
        free: dict[int, tuple[int, int]] = {}  # stream -> (time free, last activity)
        last_end, last_act, t = np.iinfo(np.int64).min, -1, self.lo
        for i in range(n):
            t += int(gap[i])
            c_start[i] = t
            for j in self.by_call[i]:  # what the call launches depends on its start only
                ready = int(c_start[i] + self.lat[j])
                st = int(self.a["stream"][j])
                f, prev = free.get(st, (np.iinfo(np.int64).min, -1))
                if f > ready:
                    a_start[j], bound_by[j] = f, prev
                else:
                    a_start[j] = ready
                a_end[j] = a_start[j] + int(adur[j])
                free[st] = (int(a_end[j]), j)
                if a_end[j] > last_end:
                    last_end, last_act = int(a_end[j]), j
            if self.c["waits"][i]:  # returns its own cost after the GPU work it waits for
                if last_end > t:
                    waited[i], t = last_act, last_end
                t += int(self.cost[i])
            else:
                t += int(dur[i])
            c_end[i] = t
        host_end = t + self.tail
        end = max(host_end, last_end)
        if not path:
            return end - self.lo, []
        return end - self.lo, self._walk(host_end, last_end, last_act, c_start, c_end, a_start, a_end,
                                         bound_by, waited, gap)

    def _host(self, i: int) -> list[tuple[str, int, int]]:
        """The host time before call ``i``: its op's, the previous call's op's, between ops."""
        return [("host", i, int(self.gap_op[i])), ("host", i - 1, int(self.gap_prev[i])),
                ("free", i, int(self.gap_free[i]))]

    def _walk(self, host_end: int, last_end: int, last_act: int, c_start: np.ndarray, c_end: np.ndarray,
              a_start: np.ndarray, a_end: np.ndarray, bound_by: np.ndarray, waited: np.ndarray,
              gap: np.ndarray) -> list[tuple[str, int, int]]:
        seg: list[tuple[str, int, int]] = []
        n = len(c_start)
        if last_end > host_end:
            j, i = last_act, None
        else:
            seg.append(("host_tail", -1, self.tail))
            j, i = None, n - 1
        while True:
            if j is not None:  # on the GPU: the activity, then what it waited for
                p = int(bound_by[j])
                if p >= 0:
                    seg.append(("gpu", j, int(a_end[j] - a_start[j]) + int(a_start[j] - a_end[p])))
                    j = p
                    continue
                call = int(self.a["call"][j])
                seg.append(("gpu", j, int(a_end[j] - a_start[j])))
                seg.append(("launch", call, int(a_start[j] - c_start[call])))
                j, i = None, call - 1
                seg += self._host(call)
                continue
            if i is None or i < 0:
                break
            if waited[i] >= 0:  # the sync returned (its own cost) after the GPU work ended
                seg.append(("sync", i, int(c_end[i] - a_end[waited[i]])))
                j, i = int(waited[i]), None
                continue
            seg.append(("call", i, int(c_end[i] - c_start[i])))
            seg += self._host(i)
            i -= 1
        return seg


def _roots(op: pa.Table) -> np.ndarray:
    """Row of each op's outermost enclosing op (itself when top-level)."""
    ppos = KeyIndex(to_np(op["id"])).find(to_np(op["parent_id"])).astype(np.int64)
    root = np.arange(op.num_rows)
    for _ in range(256):  # depth is bounded; a damaged store's cycle stops here
        up = ppos[root]
        if not (up >= 0).any():
            break
        root = np.where(up >= 0, up, root)
    return root


def _launched_end(a: dict[str, np.ndarray], n_calls: int) -> np.ndarray:
    """Per call: the latest end among the activities launched by it (or int64 min)."""
    out = np.full(n_calls, np.iinfo(np.int64).min)
    np.maximum.at(out, a["call"], a["end"])
    return out


class CriticalPath(Tool):
    name = "critical_path"
    description = "Critical path of one step (CPU op -> launch -> kernel -> sync) and what-if savings per op/kernel"
    consumes = ("kernel", "memcpy", "memset", "api", "op", "range")

    def _step(self) -> tuple[dict[str, Any], Report]:
        steps = Steps(**{k: v for k, v in self.options.items() if k == "consecutive_kernel_delay_ns"})
        steps.info = self.info
        steps._batches = self._batches  # the same events: read, never changed
        return steps.report().tables.get("steps"), steps

    def report(self) -> Report:
        table, _ = self._step()
        if table is None or not table.num_rows:
            return Report(self.name, summary={"note": "no steps found (see the steps tool): no step to follow"})
        ranks = sorted(set(table["rank"].to_pylist()))
        rank = int(self.options.get("rank", ranks[0]))
        mine = table.filter(pc.equal(table["rank"], rank)).to_pylist()
        if not mine:
            return Report(self.name, summary={"note": f"rank {rank} has no steps"})
        order = sorted(range(len(mine)), key=lambda i: (mine[i]["wall_ns"], i))
        idx = int(self.options.get("step", order[(len(order) - 1) // 2]))
        row = mine[max(0, min(idx, len(mine) - 1))]
        built = self._build(rank, int(row["start_ns"]), int(row["end_ns"]))
        if built is None:
            return Report(self.name, summary={"rank": rank, "step": row["label"],
                                              "note": "the step has no runtime calls to follow (CPU-only, or "
                                                      f"more than {MAX_EVENTS} calls)"})
        return self._analyze(built, row, rank, len(mine))

    def _build(self, rank: int, lo: int, hi: int) -> tuple[_Step, dict[str, Any]] | None:
        api = self.table("api")
        api = api.filter(pc.and_(pc.equal(api["rank"], rank), pc.and_(pc.greater_equal(api["start_ns"], lo),
                                                                       pc.less(api["start_ns"], hi))))
        if not api.num_rows or api.num_rows > MAX_EVENTS:
            return None
        api = api.sort_by("start_ns")
        codes, names = name_codes(api["name"])
        waits = (pattern_mask(names, SYNC_RE) | pattern_mask(names, BLOCKING_MEMCPY_RE))[codes]
        calls = {"start": to_np(api["start_ns"]), "end": to_np(api["end_ns"]), "op": to_np(api["op_id"]),
                 "name": codes, "waits": waits}
        op = self.table("op")
        op = op.filter(pc.equal(op["rank"], rank))
        oi = KeyIndex(to_np(op["id"])).find(calls["op"])
        oi = np.where(oi >= 0, _roots(op)[np.maximum(oi, 0)] if op.num_rows else -1, -1)  # the top-level op
        big = 1 << 62  # a sentinel time; differences with real times stay in int64
        calls["op_start"] = np.where(oi >= 0, to_np(op["start_ns"])[np.maximum(oi, 0)] if op.num_rows else 0, big)
        calls["op_end"] = np.where(oi >= 0, to_np(op["end_ns"])[np.maximum(oi, 0)] if op.num_rows else 0, -big)
        index = KeyIndex(to_np(api["correlation"]))
        parts = []
        for kind in GPU_ACTIVITY_KINDS:
            t = self.table(kind)
            t = t.filter(pc.equal(t["rank"], rank))
            call = index.find(to_np(t["correlation"]))
            ok = call >= 0
            if not ok.any():
                continue
            t = t.filter(pa.array(ok))
            kc, kn = name_codes(t["name"])
            norm = np.array([normalize_kernel_name(x) if kind == "kernel" else kind for x in kn], dtype=object)
            parts.append({"start": to_np(t["start_ns"]), "end": to_np(t["end_ns"]), "stream": to_np(t["stream"]),
                          "call": call[ok].astype(np.int64), "name": norm[kc] if len(kc) else norm[:0]})
            if kind != "kernel":  # a copy call that returned after its copy ended waited for it (pageable)
                c = call[ok].astype(np.int64)
                blocked = to_np(t["end_ns"]) <= calls["end"][c]
                calls["waits"][c[blocked]] = True
        if parts:
            acts = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
        else:
            acts = {k: np.zeros(0, np.int64) for k in ("start", "end", "stream", "call")}
            acts["name"] = np.zeros(0, object)
        oc, on = name_codes(op["name"])
        op_names = np.array(on + ["host"], dtype=object)[np.where(oi >= 0, oc[np.maximum(oi, 0)] if len(oc) else -1,
                                                                  len(on))]
        sites = op["call_site"].cast(pa.string()).to_pylist()
        op_site = [sites[k] if k >= 0 else None for k in oi.tolist()]
        return _Step(calls, acts, lo, hi), {"op": op_names, "site": op_site, "api": np.array(names, object)[codes]}

    def _analyze(self, built: tuple[_Step, dict[str, Any]], row: dict[str, Any], rank: int, n_steps: int) -> Report:
        st, meta = built
        measured = max(int(row["end_ns"]), int(st.a["end"].max(initial=row["end_ns"]))) - int(row["start_ns"])
        model, seg = st.replay(path=True)
        on: dict[tuple[str, str], list[int]] = {}
        for kind, i, ns in seg:
            if ns <= 0:
                continue
            if kind in ("host", "call"):
                key = ("cpu", meta["op"][i])
            elif kind == "gpu":
                key = ("gpu", st.a["name"][i])
            elif kind == "host_tail":
                key = ("cpu", "host after the last call")
            elif kind == "free":
                key = ("cpu", BETWEEN)
            else:
                key = (kind, meta["api"][i] if kind == "sync" else "launch latency")
            acc = on.setdefault(key, [0, 0])
            acc[0] += ns
            acc[1] += 1
        path = pa.Table.from_pylist(sorted(
            ({"kind": k, "name": nm, "on_path_ns": v[0], "share": round(v[0] / model, 4) if model else None,
              "segments": v[1]} for (k, nm), v in on.items() if v[0] > 0),
            key=lambda r: (-r["on_path_ns"], r["kind"], r["name"])))
        what_if = self._what_ifs(st, meta, model, path)
        cpu = sum(r["on_path_ns"] for r in path.to_pylist() if r["kind"] == "cpu")
        summary = {"rank": rank, "step": row["label"], "steps": n_steps, "measured_ns": measured, "model_ns": model,
                   "model_error": round(model / measured - 1, 4) if measured else None,
                   "cpu_share": round(cpu / model, 4) if model else None, "calls": len(st.gap),
                   "activities": len(st.adur)}
        findings = []
        best = [r for r in what_if.to_pylist() if r["name"] not in ("host", BETWEEN)][:1]  # a location to open
        if best and model and best[0]["saved_ns"] >= MIN_SAVING * model:
            b = best[0]
            bound = "the host" if summary["cpu_share"] and summary["cpu_share"] >= 0.5 else "the GPU"
            findings.append(Finding(
                "warning" if b["saved_ns"] >= 0.2 * model else "info",
                f"{row['label']} is bound by {bound}: without {b['name']} it would be {fmt_ns(b['saved_ns'])} "
                f"({b['saved_ns'] / model:.0%}) shorter",
                {"impact_ns": b["saved_ns"] * n_steps, "saved_per_step_ns": b["saved_ns"], "removed_ns": b["removed_ns"],
                 "model_step_ns": model, "cpu_share": summary["cpu_share"], "what": b["kind"],
                 "suggestion": ("Make this op's host work cheaper or overlap it (CUDA graphs, torch.compile, "
                                "fewer small ops)" if b["kind"] == "cpu" else "Speed up or overlap this kernel") +
                               ": the critical path runs through it."},
                location=b["call_site"] or b["name"], kind=f"critical path: {b['kind']} {b['name']}"))
        return Report(self.name, tables={"critical path": path, "what if": what_if}, findings=findings,
                      summary=summary)

    @staticmethod
    def _what_ifs(st: _Step, meta: dict[str, Any], model: int, path: pa.Table) -> pa.Table:
        rows = []
        cands = path.to_pylist()
        ops = [r["name"] for r in cands if r["kind"] == "cpu" and r["name"] in set(meta["op"])][:WHAT_IFS]
        kernels = [r["name"] for r in cands if r["kind"] == "gpu"][:WHAT_IFS]
        for name in ops:
            mask = meta["op"] == name
            scale = np.where(mask, 0, 1)
            new, _ = st.replay(host_scale=scale)
            removed = int((st.gap_op * mask).sum() + (st.gap_prev * np.r_[False, mask[:-1]]).sum()
                          + (st.dur * (mask & ~st.c["waits"])).sum())
            site = next((s for s, m in zip(meta["site"], mask) if m and s), None)
            rows.append({"kind": "cpu", "name": name, "removed_ns": removed, "saved_ns": model - new,
                         "call_site": site})
        if any(r["kind"] == "cpu" and r["name"] == BETWEEN for r in cands):
            new, _ = st.replay(free_scale=0.0)
            rows.append({"kind": "cpu", "name": BETWEEN, "removed_ns": int(st.gap_free.sum()), "saved_ns": model - new,
                         "call_site": None})
        for name in kernels:
            mask = st.a["name"] == name
            new, _ = st.replay(act_scale=np.where(mask, 0, 1))
            rows.append({"kind": "gpu", "name": name, "removed_ns": int((st.adur * mask).sum()),
                         "saved_ns": model - new, "call_site": None})
        rows.sort(key=lambda r: (-r["saved_ns"], r["kind"], r["name"]))
        return pa.Table.from_pylist(rows, schema=pa.schema([("kind", pa.string()), ("name", pa.string()),
                                                            ("removed_ns", pa.int64()), ("saved_ns", pa.int64()),
                                                            ("call_site", pa.string())]))
