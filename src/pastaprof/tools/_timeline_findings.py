"""The timeline tool's findings: GPU starved or idle, waiting for launches, exposed communication
or memory (a rank's wait for a late peer told apart), launch-bound kernels.  The thresholds are
the constants below; tools/timeline.py defines the quantities they judge.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from pastaprof.tools.base import Finding

STARVED_IDLE_PCT = 50.0                # a rank idle for more than half its span ...
HOST_WAIT_DOMINANT = 0.5               # ... with host_wait >= half of its stream idle time: GPU starved by the host
CRITICAL_IDLE_PCT = 80.0               # idle beyond this makes the starvation finding critical
HOST_WAIT_PCT = 20.0                   # a rank not starved, yet idle waiting for launches this share of its span
LAUNCH_BOUND_SHARE = 0.5               # >= 50% of the kernels with a known launch call are launch-bound ...
LAUNCH_BOUND_MIN = 100                 # ... and at least this many: a finding
NON_COMPUTE_PCT = 25.0                 # exposed communication or memory above 25% of the span: a finding

HOST_WAIT_ADVICE = ("Queue GPU work faster at this site: fewer small ops (torch.compile), CUDA graphs, larger batches, "
                    "and no host syncs inside the loop.")
IDLE_ADVICE = "The streams table and the steps tool show where the gaps are: stream dependencies, syncs or copies."
EXPOSED_ADVICE = {"communication": "Overlap communication with compute (DDP bucket size, FSDP prefetch, async "
                                   "collectives on their own stream).",
                  "memory": "Overlap copies with compute: pinned host memory and non_blocking=True copies on a side "
                            "stream (the copies tool lists them)."}


def timeline_findings(temporal: pa.Table, streams: pa.Table, lb: dict[str, Any], lb_table: pa.Table,
                      host_wait_site: Callable[[int, dict[str, Any]], str | None],
                      peer_waits: Callable[[], dict[int, dict[str, int]]]) -> list[Finding]:
    """The timeline tool's findings (tools/timeline.py says when each fires).  ``host_wait_site(rank,
    evidence)`` names the call site a rank's GPU waited for; ``peer_waits()`` gives each rank's wait
    for late peers in collectives: both are called only where a finding needs them."""
    out: list[Finding] = []
    st = streams.to_pydict()
    multi = temporal.num_rows > 1 and bool(pc.any(pc.greater_equal(temporal["communication_pct"],
                                                                    NON_COMPUTE_PCT)).as_py())
    peer = peer_waits() if multi else {}
    waiting: list[tuple[dict[str, Any], dict[str, int]]] = []
    streams_of: dict[Any, list[int]] = {}
    for i, x in enumerate(st["rank"]):  # each rank's streams, in one pass
        streams_of.setdefault(x, []).append(i)
    for r in temporal.to_pylist():
        rank, where = r["rank"], f"rank {r['rank']}"
        rows = streams_of.get(rank, [])
        waits = {c: sum(st[f"{c}_ns"][i] for i in rows) for c in ("host_wait", "kernel_wait", "other")}
        total_wait = sum(waits.values())
        share = waits["host_wait"] / total_wait if total_wait else 0.0
        host_idle = int(min(waits["host_wait"], r["idle_ns"]))  # streams' waits, at most the rank's idle time
        evidence = {"idle_pct": r["idle_pct"], "idle_ns": r["idle_ns"], "span_ns": r["span_ns"],
                    **{f"streams_{c}_ns": v for c, v in waits.items()},
                    "host_wait_share_of_stream_idle": round(share, 4)}
        host_pct = 100 * host_idle / r["span_ns"] if r["span_ns"] else 0.0
        site = host_wait_site(rank, evidence) if host_pct >= HOST_WAIT_PCT else None
        if r["idle_pct"] <= STARVED_IDLE_PCT and host_pct >= HOST_WAIT_PCT:
            out.append(Finding("warning", f"GPU idle {host_pct:.1f}% waiting for launches",
                               {**evidence, "host_wait_pct": round(host_pct, 2)}, site or where,
                               impact_ns=host_idle, kind="host wait", suggestion=HOST_WAIT_ADVICE))
        if r["idle_pct"] > STARVED_IDLE_PCT:
            if share >= HOST_WAIT_DOMINANT:
                sev = "critical" if r["idle_pct"] >= CRITICAL_IDLE_PCT else "warning"
                out.append(Finding(sev, f"GPU starved by the host: idle {r['idle_pct']:.1f}% of its span, "
                                        f"{share:.0%} of stream idle time waiting for launches", evidence,
                                   site or where,
                                   impact_ns=host_idle, kind="host wait", suggestion=HOST_WAIT_ADVICE))
            else:
                top = max(waits, key=waits.get) if total_wait else "other"
                out.append(Finding("warning", f"GPU idle {r['idle_pct']:.1f}% of its span (mostly {top})",
                                   evidence, where, impact_ns=int(r["idle_ns"]), suggestion=IDLE_ADVICE))
        for label, what in (("communication", "exposed communication (not overlapped with compute)"),
                            ("memory", "copies/memsets not overlapped with compute")):
            w = peer.get(rank, {}) if label == "communication" else {}
            if w.get("attributed_ns") and r["communication_pct"] >= NON_COMPUTE_PCT:
                own = max(0, int(r["communication_ns"]) - w["attributed_ns"])
                if 100 * own / max(r["span_ns"], 1) < NON_COMPUTE_PCT:
                    waiting.append((r, w))  # mostly waiting for a peer: said once for all such ranks
                    continue
                r = {**r, "communication_ns": own, "communication_pct": round(100 * own / r["span_ns"], 2)}
            if r[f"{label}_pct"] >= NON_COMPUTE_PCT:
                out.append(Finding("warning", f"{what}: {r[f'{label}_pct']:.1f}% of the GPU span",
                                   {f"{label}_ns": r[f"{label}_ns"], f"{label}_pct": r[f"{label}_pct"],
                                    "span_ns": r["span_ns"], "compute_pct": r["compute_pct"],
                                    **({"waiting_for_peers_ns": w["attributed_ns"]} if w else {})}, where,
                                   impact_ns=int(r[f"{label}_ns"]), suggestion=EXPOSED_ADVICE[label]))
    if waiting:
        out.append(waiting_finding(waiting))
    if lb["launch_bound_launches"] >= LAUNCH_BOUND_MIN and lb["launch_bound_share"] >= LAUNCH_BOUND_SHARE:
        graphs = (f", {lb['launch_bound_graph_launches']} of them CUDA-graph launches"
                  if lb["launch_bound_graph_launches"] else "")
        out.append(Finding("warning", f"{lb['launch_bound_launches']} of {lb['launches']} kernel launches "
                                      f"({lb['launch_bound_share']:.0%}) run shorter on the GPU than their "
                                      f"launch call{graphs}",
                           {**lb, "top_kernels": lb_table.column("name").to_pylist()[:5]},
                           location=lb_table.column("name")[0].as_py() if lb_table.num_rows else None,
                           impact_ns=lb.get("launch_bound_excess_ns"), kind="launch bound",
                           suggestion="Capture the launch-bound kernels in a CUDA graph or fuse them (torch.compile), "
                                      "or give each launch more work (larger batches)."))
    return out


def waiting_finding(waiting: list[tuple[dict[str, Any], dict[str, int]]]) -> Finding:
    """One finding for the ranks whose exposed communication is mostly waiting for late peers."""
    from collections import Counter

    peers: Counter = Counter()
    for _, w in waiting:
        peers[w["rank"]] += w["rank_ns"]
    top, _ = peers.most_common(1)[0]
    total = sum(w["attributed_ns"] for _, w in waiting)
    ranks = sorted(r["rank"] for r, _ in waiting)
    shown = ", ".join(map(str, ranks[:8])) + (", ..." if len(ranks) > 8 else "")
    evidence = {"ranks": ranks[:64], "waiting_ranks": len(ranks), "waiting_for_rank": top,
                "waiting_ns": total, "waiting_for": {str(k): v for k, v in peers.most_common(8)},
                "exposed_communication_ns": sum(int(r["communication_ns"]) for r, _ in waiting)}
    return Finding("warning", f"{len(ranks)} ranks ({shown}) spend their exposed communication waiting for "
                              f"rank {top} in collectives: its late arrival, not their own communication "
                              "(the ranks tool says why it was late)", evidence, f"rank {top}",
                   impact_ns=total, kind="waiting for a rank",
                   suggestion=f"Find why rank {top} arrives late (the ranks tool's straggler finding): its extra work, "
                              "its data loading or a slower GPU.")
