"""timeline -- where the GPU waits: busy/idle per device and stream, why it idles, HTA's temporal breakdown.

Consumes kernel, memcpy, memset (the *GPU activities*), api (the launching host
calls, joined on ``(rank, correlation)``) and sync.  All times are int64 ns;
every quantity is computed with vectorized sweeps (see ``_timeline_math``).

Definitions
-----------
busy / idle (tables ``devices`` and ``streams``)
    span = first activity start to last activity end of the (rank, device) or
    (rank, device, stream); busy = length of the union of the activity intervals
    (touching intervals merge, as HTA's ``merge_kernel_intervals``); idle = span - busy.

idle split (table ``streams``) -- HTA's ``get_idle_time_breakdown``
    Per stream, activities sorted by start; the gap before an activity is its start
    minus the previous end, positive part only.  A gap is
    *host_wait* if the activity's launching API call started strictly after the
    previous end (the host had not even asked for the work yet), else *kernel_wait*
    if gap < ``consecutive_kernel_delay_ns`` (default 30 us: launch latency between
    back-to-back work), else *other*.  One deliberate difference from HTA: "previous
    end" is the running maximum of the earlier ends of the stream rather than the
    end of the single previous row, and negative gaps count 0 (HTA sums them).  This
    makes host_wait + kernel_wait + other == idle exactly; the two agree whenever work
    on a stream does not overlap, which in-order streams guarantee (and the test
    traces confirm).  Activities without a launching call are never host_wait.

temporal breakdown (table ``temporal``) -- HTA's ``get_temporal_breakdown``, per rank
    span = first start to last end of all activities of the rank (all devices and
    streams) plus, as HTA does, sync events that carry a stream (option
    ``include_sync``); idle = span - union(all); compute = union(COMPUTATION);
    non_compute = span - compute - idle.  Kernels are classified by name exactly
    as HTA (COMMUNICATION ``^nccl.*Kernel``, MEMORY ``(^Memcpy)|(^Memset)|(^dma)``,
    OTHER ``(.*(Memcpy)|(Memset))|(.*Sync)``, else COMPUTATION); memcpy/memset events
    are MEMORY by kind (their Kineto names start with Memcpy/Memset, so this agrees
    with HTA) and sync events are OTHER by kind (HTA goes by name: "Stream Sync",
    "Event Sync", "Context Sync" are OTHER there too; only a sync named like
    "Stream Wait Event" would be COMPUTATION in HTA).  Syncs count only here, never
    in the ``devices``/``streams`` tables (HTA's idle breakdown also drops them).
    non_compute is split by priority COMPUTATION > COMMUNICATION > MEMORY > OTHER:
    each instant of non-compute time goes to the highest class active then,
      communication = |U(comp + comm)| - |U(comp)|       (exposed communication)
      memory        = |U(comp + comm + mem)| - |U(comp + comm)|
      other         = |U(all)| - |U(comp + comm + mem)|
    so communication + memory + other == non_compute exactly.  Also reported:
    communication_overlapped = |U(comm)| - communication (comm hidden under compute).
    Percentages are of the span, rounded to 2 decimals like HTA; exact ns are kept.

launch-bound kernels (table ``launch_bound``, top ``top_n`` names by count)
    Judged per launch call (the api row with the kernel's rank and correlation): a call
    that launched one kernel is launch-bound when the kernel is shorter than the call.
    A call that launched several -- ``cudaGraphLaunch``, whose kernels all carry its
    correlation id -- is judged once, on the summed duration of its kernels against the
    call; its kernels share its verdict and split its duration equally in the table's
    ``launch_bound_launch_ns``.  The summary counts ``launches`` (calls with kernels),
    ``graph_launches`` (calls with several) and their launch-bound subsets;
    ``launch_bound_share`` is launch-bound launches / launches.

Findings (thresholds: the constants of ``_timeline_findings``)
    * rank idle > 50% of its span and host_wait >= 50% of the idle time summed over
      its streams: "GPU starved by the host" (critical from 80% idle); idle > 50%
      otherwise: "GPU idle", naming the dominant idle category;
    * exposed communication or memory >= 25% of the span.  On a multi-rank run a rank's time
      waiting in collectives for a late peer (``ranks.waits``: the wait up to the peer's own
      delay) is not its own: the finding fires on the rest, and the ranks whose exposed
      communication is mostly such waits get one finding together, naming the peer (the ranks
      tool says why that peer was late);
    * >= 50% of the kernel launches launch-bound, and at least 100 of them.

Options: ``consecutive_kernel_delay_ns`` (30_000), ``top_n`` (20), ``include_sync`` (True).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pastaprof.tools._by_rank import rank_rows
from pastaprof.tools._timeline_findings import timeline_findings
from pastaprof.tools._timeline_launch import launch_bound_flags, launch_bound_table
from pastaprof.tools._timeline_math import (
    COMMUNICATION,
    COMPUTATION,
    MEMORY,
    OTHER,
    KeyIndex,
    Sweep,
    dense_codes,
    group_sort,
    hta_kernel_class,
    name_codes,
    to_np,
)
from pastaprof.tools.base import Report, Tool

CONSECUTIVE_KERNEL_DELAY_NS = 30_000   # HTA's default consecutive_kernel_delay (30 us)
TOP_N = 20
_NO_LAUNCH = np.iinfo(np.int64).max
_COLUMNS = ("start", "end", "rank", "device", "stream", "lag", "cls", "launch")


def _pct(part: np.ndarray, whole: np.ndarray) -> np.ndarray:
    """100 * part / whole rounded to 2 decimals (HTA's rounding); 0 where whole is 0."""
    part = np.asarray(part, dtype=np.float64)
    whole = np.asarray(whole, dtype=np.float64)
    return np.round(100.0 * np.divide(part, whole, out=np.zeros_like(part), where=whole > 0), 2)


def _rep(codes: np.ndarray, n: int, values: np.ndarray) -> np.ndarray:
    """The value of ``values`` for each group id (any row of the group)."""
    out = np.zeros(n, dtype=np.int64)
    out[codes] = values
    return out


DISPLAY = {  # what the terminal shows; JSON and programs get every column
    "temporal": ["rank", "span_ns", "idle_pct", "compute_pct", "non_compute_pct", "communication_pct", "memory_pct",
                 "other_pct", "communication_overlapped_ns"],
    "devices": ["rank", "device", "span_ns", "busy_ns", "idle_ns", "idle_pct"],
    "streams": ["rank", "device", "stream", "activities", "busy_ns", "idle_ns", "idle_pct", "host_wait_ns",
                "kernel_wait_ns", "other_ns"],
    "launch_bound": ["name", "launches", "launch_bound", "launch_bound_share", "launch_bound_kernel_ns",
                     "launch_bound_launch_ns"],
}

class Timeline(Tool):
    name = "timeline"
    description = ("GPU busy/idle per device and stream, idle causes (host/kernel wait), "
                   "HTA temporal breakdown, launch-bound kernels")
    consumes = ("kernel", "memcpy", "memset", "api", "sync", "op", "collective")
    # op: the call sites of the launches the GPU waits for, where ops are recorded; collective:
    # the process groups of NCCL kernels, to tell a rank's wait for a late peer from its own communication
    optional = ("op", "collective")

    # ------------------------------------------------------------------ inputs

    def _activities(self) -> dict[str, np.ndarray]:
        """GPU activities of the three kinds as NumPy columns (``_COLUMNS``).  ``lag`` is the
        activity start minus its launch call's start (``_NO_LAUNCH`` without one): the call
        started after time t iff start - t > lag.  Also collects the launch-bound counts."""
        api = self.table("api")
        index = KeyIndex(to_np(api["rank"], dtype=np.int32), to_np(api["correlation"]))
        a_start, a_end = to_np(api["start_ns"]), to_np(api["end_ns"])
        parts = []
        self._lb = None
        for kind in ("kernel", "memcpy", "memset"):
            t = self.table(kind)
            if t.num_rows == 0:
                continue
            start, end = to_np(t["start_ns"]), to_np(t["end_ns"])
            if len(end) and (end < start).any():
                end = np.maximum(end, start)  # a negative duration occupies nothing
            rank = to_np(t["rank"], dtype=np.int32)
            launch = index.find(rank, to_np(t["correlation"]))
            has = launch >= 0
            call = launch[has]
            lag = np.full(len(start), _NO_LAUNCH, dtype=np.int64)
            lag[has] = start[has] - a_start[call]
            if kind == "kernel":
                codes, names = name_codes(t["name"])
                cls = np.array([hta_kernel_class(x) for x in names], dtype=np.int8)[codes]
                self._lb = (names, codes) + launch_bound_flags(start, end, launch, a_start, a_end)
            else:
                cls = np.full(len(start), MEMORY, dtype=np.int8)
            parts.append({"start": start, "end": end, "rank": rank, "device": to_np(t["device"], dtype=np.int32),
                          "stream": to_np(t["stream"]), "lag": lag, "cls": cls, "launch": launch})
        if not parts:
            empty = {"start": np.int64, "end": np.int64, "rank": np.int32, "device": np.int32,
                     "stream": np.int64, "lag": np.int64, "cls": np.int8, "launch": np.int64}
            return {k: np.zeros(0, dtype=d) for k, d in empty.items()}
        if len(parts) == 1:
            return parts[0]
        return {k: np.concatenate([p[k] for p in parts]) for k in _COLUMNS}

    def _syncs(self) -> dict[str, np.ndarray]:
        """Sync events that sit on a stream (what HTA's temporal breakdown includes)."""
        t = self.table("sync")
        keep = to_np(t["stream"]) >= 0
        start, end = to_np(t["start_ns"])[keep], to_np(t["end_ns"])[keep]
        return {"start": start, "end": np.maximum(end, start), "rank": to_np(t["rank"], dtype=np.int32)[keep]}

    # ------------------------------------------------------------------ report

    def report(self) -> Report:
        delay = int(self.options.get("consecutive_kernel_delay_ns", CONSECUTIVE_KERNEL_DELAY_NS))
        top_n = int(self.options.get("top_n", TOP_N))
        act = self._activities()
        by_start = np.argsort(act["start"], kind="stable")
        streams = self._streams(act, by_start, delay)
        devices = self._devices(act, by_start)
        temporal = self._temporal(act, by_start, self._syncs() if self.options.get("include_sync", True) else None)
        launch_bound, lb_totals = launch_bound_table(self._lb, top_n)
        summary: dict[str, Any] = {
            "activities": int(len(act["start"])),
            "streams": streams.num_rows,
            "per_rank": [{k: r[k] for k in ("rank", "span_ns", "idle_pct", "compute_pct", "non_compute_pct",
                                            "communication_pct", "memory_pct", "other_pct")}
                         for r in temporal.to_pylist()],
            **lb_totals,
        }
        if not len(act["start"]):  # say why, not a line of zeros
            from pastaprof.tools.kernels import NO_GPU_NOTE
            summary = {"activities": 0, "per_rank": [], "note": NO_GPU_NOTE}
        findings = timeline_findings(temporal, streams, lb_totals, launch_bound, self._host_wait_site,
                                     self._peer_waits)
        return Report(self.name, tables={"devices": devices, "streams": streams, "temporal": temporal,
                                         "launch_bound": launch_bound},
                      findings=findings, summary=summary, display=DISPLAY)

    def _streams(self, act, by_start, delay) -> pa.Table:
        code, n = dense_codes(act["rank"], act["device"], act["stream"])
        o = group_sort(code, by_start)
        sw = Sweep(code[o], act["start"][o], act["end"][o], n)
        gap, _ = sw.gaps()
        pos = gap > 0
        host = gap > act["lag"][o]              # the launch call started after the previous end
        host &= pos
        kern = gap < delay
        kern &= pos
        kern &= ~host
        other = pos & ~host & ~kern
        _, _, span = sw.spans()
        np.maximum(gap, 0, out=gap)
        self._host_gaps = (act["launch"][o][host], gap[host])  # the launch call each host wait waited for
        idle = sw.per_segment(gap)
        cols: dict[str, Any] = {
            "rank": _rep(code, n, act["rank"]), "device": _rep(code, n, act["device"]),
            "stream": _rep(code, n, act["stream"]), "activities": np.bincount(code, minlength=n),
            "span_ns": span, "busy_ns": span - idle, "idle_ns": idle, "idle_pct": _pct(idle, span),
        }
        masks = {"host_wait": host, "kernel_wait": kern, "other": other}
        for label, mask in masks.items():
            cols[f"{label}_ns"] = sw.per_segment(np.where(mask, gap, 0))
        for label, mask in masks.items():
            cols[f"{label}_gaps"] = sw.per_segment(mask)
        return pa.table(cols)

    def _devices(self, act, by_start) -> pa.Table:
        code, n = dense_codes(act["rank"], act["device"])
        o = group_sort(code, by_start)
        sw = Sweep(code[o], act["start"][o], act["end"][o], n)
        del o
        first, last, span = sw.spans()
        busy = sw.union()
        return pa.table({
            "rank": _rep(code, n, act["rank"]), "device": _rep(code, n, act["device"]),
            "activities": np.bincount(code, minlength=n), "first_ns": first, "last_ns": last,
            "span_ns": span, "busy_ns": busy, "idle_ns": span - busy, "busy_pct": _pct(busy, span),
            "idle_pct": _pct(span - busy, span),
        })

    def _temporal(self, act, by_start, syncs: dict[str, np.ndarray] | None) -> pa.Table:
        start, end, rank, cls = act["start"], act["end"], act["rank"], act["cls"]
        if syncs is not None and len(syncs["start"]):
            start = np.concatenate([start, syncs["start"]])
            end = np.concatenate([end, syncs["end"]])
            rank = np.concatenate([rank, syncs["rank"]])
            cls = np.concatenate([cls, np.full(len(syncs["start"]), OTHER, dtype=np.int8)])
            by_start = np.argsort(start, kind="stable")
        code, n = dense_codes(rank)
        o = group_sort(code, by_start)
        sw = Sweep(code[o], start[o], end[o], n)
        c = cls[o]
        del o
        _, _, span = sw.spans()
        busy = sw.union()
        # Unions of the nested sets comp <= comp+comm <= comp+comm+mem <= all; a set with
        # as many rows as the next larger one is that set (no second sweep).
        unions: dict[int, np.ndarray] = {}
        prev_count, prev_union = len(c), busy
        for top in (MEMORY, COMMUNICATION, COMPUTATION):
            mask = c <= top
            count = int(mask.sum())
            if count != prev_count:
                prev_count, prev_union = count, sw.union(mask)
            unions[top] = prev_union
        u_comp = unions[COMPUTATION]
        comm_mask = c == COMMUNICATION
        u_comm = sw.union(comm_mask) if comm_mask.any() else np.zeros(n, np.int64)
        idle = span - busy
        non_compute = span - u_comp - idle
        comm = unions[COMMUNICATION] - u_comp
        mem = unions[MEMORY] - unions[COMMUNICATION]
        other = busy - unions[MEMORY]
        return pa.table({
            "rank": _rep(code, n, rank), "span_ns": span, "idle_ns": idle, "compute_ns": u_comp,
            "non_compute_ns": non_compute, "communication_ns": comm, "memory_ns": mem, "other_ns": other,
            "communication_overlapped_ns": u_comm - comm,
            "idle_pct": _pct(idle, span), "compute_pct": _pct(u_comp, span), "non_compute_pct": _pct(non_compute, span),
            "communication_pct": _pct(comm, span), "memory_pct": _pct(mem, span), "other_pct": _pct(other, span),
        })

    # ------------------------------------------------------------------ findings

    def _host_wait_site(self, rank: int, evidence: dict[str, Any]) -> str | None:
        """'rank R: <call site>' of the ops whose launches rank R's GPU waited for longest (summed
        host-wait gaps; the share goes to ``evidence``), or None where no launch is linked to an op
        with a call site."""
        launch, gap = getattr(self, "_host_gaps", (np.zeros(0, np.int64), np.zeros(0, np.int64)))
        api, op = self.table("api"), self.table("op")
        keep = launch >= 0
        if not keep.any() or op.num_rows == 0:
            return None
        api_rank, api_op, index, roots = self._op_index(api, op)  # once, not once per rank
        memo = getattr(self, "_waits_by_rank", None)
        if memo is None or memo[0] is not api_rank or memo[1] is not launch:  # grouped by rank once, not per rank
            memo = (api_rank, launch, launch[keep], gap[keep], rank_rows(api_rank[launch[keep]]), None)
            self._waits_by_rank = memo
        _, _, launch, gap, of_rank, _ = memo
        mine = of_rank[rank]
        launch, gap = launch[mine], gap[mine]
        row = index.find(np.full(len(launch), rank, np.int32), api_op[launch])
        linked = row >= 0
        if not linked.any():
            return None

        row, gap = row[linked], gap[linked]
        sites_of = memo[5]
        if sites_of is None:  # one array: a take from the op table's chunks per rank would copy them all each time
            sites_of = op["call_site"].combine_chunks()
            self._waits_by_rank = memo = memo[:5] + (sites_of,)
        site = pc.coalesce(sites_of.take(pa.array(row)).cast(pa.string()),
                           sites_of.take(pa.array(roots()[row])).cast(pa.string()))
        valid = pc.is_valid(site).to_numpy(zero_copy_only=False)
        if not valid.any():
            return None
        site = site.filter(pa.array(valid))
        codes, sites = name_codes(site if isinstance(site, pa.ChunkedArray) else pa.chunked_array([site]))
        per_site = np.bincount(codes, weights=gap[valid], minlength=len(sites))
        top = int(np.argmax(per_site))
        evidence["top_call_site_host_wait_ns"] = int(round(per_site[top]))
        return f"rank {rank}: {sites[top]}"

    def _op_index(self, api: pa.Table, op: pa.Table) -> tuple:
        """(api rank, api op_id, KeyIndex of ops by (rank, id), lazy root_ops) for these tables,
        computed once for all ranks (per rank it cost ranks x ops on a 1,024-rank job)."""
        hit = getattr(self, "_op_index_memo", None)
        if hit is not None and hit[0] is api and hit[1] is op:
            return hit[2]
        from pastaprof.tools.cuda_api import root_ops  # not at import: cuda_api imports steps, steps this module

        memo: dict[str, np.ndarray] = {}

        def roots() -> np.ndarray:
            if "roots" not in memo:
                memo["roots"] = root_ops(op)
            return memo["roots"]

        out = (to_np(api["rank"], dtype=np.int32), to_np(api["op_id"]),
               KeyIndex(to_np(op["rank"], dtype=np.int32), to_np(op["id"])), roots)
        self._op_index_memo = (api, op, out)
        return out

    def _peer_waits(self) -> dict[int, dict[str, int]]:
        from pastaprof.tools.ranks.waits import waited_for  # not at import: it imports the steps tool

        return waited_for(self.table("kernel"), self.table("collective"))
