"""ranks -- across ranks: clock alignment, matched collectives, stragglers and why, imbalance, what-if.

A :class:`~pastaprof.tools.base.PerRankTool`: :meth:`Ranks.map_rank` reduces one rank's events
to small summaries (:mod:`.summaries`), :meth:`Ranks.combine` works on the summaries of all ranks
only (:mod:`.analysis`, :mod:`.stragglers`, :mod:`.replay`, :mod:`.findings`), so the local and
the distributed engine give the same report.  See docs/ranks.md.

Tables: ``stragglers`` (one row per straggler or slow-link event), ``per_rank`` (step times,
waits and whom for, own exposed communication, overlap), ``collectives`` (one row per matched
collective: last rank, wait caused, transfer, bus bandwidth), ``clocks`` (offset and error
bound per rank), ``critical_path`` (the chain of work and transfers that bounds the job),
``what_if`` (the job's time saved if a rank were as fast as the median).  Details:
``arrivals`` (per collective and rank).

Options: ``min_delay_ns`` (100_000), ``delay_share`` (0.05 of the median step), ``link_share``
(0.5 of the usual transfer), ``consecutive_kernel_delay_ns`` (the steps tool's).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from pastaprof.tools.base import PerRankTool, Report
from pastaprof.tools.ranks import analysis, findings, replay, stragglers, summaries

DISPLAY = {
    "stragglers": ["step", "rank", "cause", "delay_ns", "impact_ns", "waiting_ranks", "grew"],
    "per_rank": ["rank", "steps", "median_wall_ns", "median_compute_ns", "exposed_comm_ns", "waiting_for_straggler_ns",
                 "waiting_for", "own_exposed_comm_ns", "comm_overlap_pct", "last_arrivals"],
    "collectives": ["step", "kind", "seq", "ranks", "last_rank", "delay_ns", "wait_ns", "transfer_ns", "busbw_gbps"],
    "clocks": ["rank", "offset_ns", "error_bound_ns", "anchor_collectives"],
    "critical_path": ["step", "rank", "segment", "collective", "ns"],
    "what_if": ["rank", "saved_ns", "saved_pct"],
}


class Ranks(PerRankTool):
    name = "ranks"
    description = ("Across ranks: clock offsets, collectives matched (arrival, wait, transfer, bus bandwidth), "
                   "stragglers and their cause, imbalance, critical path and what-if")
    consumes = ("kernel", "memcpy", "memset", "api", "op", "range", "collective")

    def map_rank(self, rank: int, tables: dict[str, pa.Table]) -> dict[str, pa.Table]:
        from pastaprof.events.schema import empty

        full = {k: tables[k] if k in tables else empty(k) for k in self.consumes}
        return summaries.map_rank(rank, full, self.options)

    def combine(self, summaries_: dict[int, dict[str, pa.Table]]) -> Report:
        ranks = sorted(summaries_)
        if len(ranks) < 2:
            which = f" (rank {ranks[0]})" if ranks else ""
            return Report(self.name, summary={"ranks": len(ranks),
                                              "note": f"the ranks tool needs at least 2 ranks; this run has "
                                                      f"{len(ranks)}{which}"})
        job = analysis.build(summaries_)
        events, threshold = stragglers.stragglers(job, self.options)
        links = stragglers.slow_links(job, self.options)
        labels = {x for x in job.steps["label"].to_pylist() if x is not None}
        found, consistent = findings.straggler_findings(events, len(labels))
        found += findings.link_findings(links)
        imb = findings.imbalance_finding(job, consistent)
        if imb is not None:
            found.append(imb)
        tables = {"stragglers": _events_table(events + links), "per_rank": stragglers.per_rank(job, events),
                  "collectives": analysis.instance_table(job), "clocks": analysis.clock_table(job),
                  "critical_path": replay.critical_path(job), "what_if": replay.what_if(job)}
        summary = _summary(job, events, links, threshold, tables)
        return Report(self.name, tables=tables, findings=found, summary=summary,
                      details={"arrivals": analysis.arrivals_table(job)}, display=DISPLAY)


def _events_table(events: list[dict[str, Any]]) -> pa.Table:
    return pa.table({
        "step": pa.array([e["step"] for e in events], pa.string()),
        "rank": pa.array([e["rank"] for e in events], pa.int32()),
        "cause": pa.array([e["cause"] for e in events], pa.string()),
        "delay_ns": pa.array([e["delay_ns"] for e in events], pa.int64()),
        "impact_ns": pa.array([e["impact_ns"] for e in events], pa.int64()),
        "waiting_ranks": pa.array([e.get("waiting_ranks") for e in events], pa.int64()),
        "collectives": pa.array([e["collectives"] for e in events], pa.int64()),
        "grew": pa.array(["; ".join(f"{g['name']} +{g['excess_ns']}" for g in e.get("grew", []))
                          for e in events], pa.string()),
    })


def _summary(job: analysis.Job, events: list, links: list, threshold: float, tables: dict) -> dict[str, Any]:
    clocks = tables["clocks"]
    bound = [b for b in clocks["error_bound_ns"].to_pylist() if b is not None]
    off = [abs(o) for o in clocks["offset_ns"].to_pylist()]
    wi = tables["what_if"]
    out: dict[str, Any] = {
        "ranks": len(job.ranks), "collectives": int(job.n_inst),
        "matched_collectives": int((job.members >= 2).sum()) if job.n_inst else 0,
        "unaligned_ranks": [r for r, a in zip(job.ranks, job.aligned) if not a],
        "max_offset_ns": int(max(off)) if off else 0, "max_error_bound_ns": int(max(bound)) if bound else None,
        "stragglers": len(events), "slow_links": len(links), "straggler_threshold_ns": int(threshold),
        "wait_ns": int(np.sum(job.wait)) if len(job.wait) else 0,
        "wait_for_stragglers_ns": int(sum(e["impact_ns"] for e in events)),
    }
    if wi.num_rows:
        out["what_if_best"] = {"rank": wi["rank"][0].as_py(), "saved_ns": wi["saved_ns"][0].as_py(),
                               "saved_pct": wi["saved_pct"][0].as_py()}
    incomplete = int(((job.members >= 2) & (job.members < _group_sizes(job))).sum()) if job.n_inst else 0
    if incomplete:
        out["partial_collectives"] = incomplete  # a rank subset: some members' traces are not here
    return out


def _group_sizes(job: analysis.Job) -> np.ndarray:
    sizes = job.coll["group_size"].to_pylist()
    return np.array([sizes[r] if sizes[r] is not None else job.members[m] for m, r in enumerate(job.last_row)])
