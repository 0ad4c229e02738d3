"""The ranks tool's findings: stragglers, slow links, consistently slow ranks, compute imbalance.

* one finding per straggler event (``evidence``: rank, step, delay_ns, cause, grew, impact_ns =
  the wait it caused on the other ranks), except a rank that straggles in at least
  ``CONSISTENT_SHARE`` of the steps (and ``CONSISTENT_MIN_STEPS``): one "consistently slow"
  finding for it, its events listed;
* one finding per slow-link event;
* compute imbalance: the busiest rank of a step computes ``IMBALANCE_SHARE`` more than the
  median rank in the median step, and no single rank is the busiest in most steps (different
  shapes or sequence lengths per rank, not one slow GPU).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

import numpy as np

from pastaprof.tools._timeline_math import fmt_ns
from pastaprof.tools.base import Finding
from pastaprof.tools.ranks.analysis import Job

CONSISTENT_SHARE = 0.5
CONSISTENT_MIN_STEPS = 3
IMBALANCE_SHARE = 0.05


def _grew_text(ev: dict[str, Any]) -> str:
    if not ev.get("grew"):
        return ""
    g = ev["grew"][0]
    return f" ({g['name'][:60]} +{fmt_ns(g['excess_ns'])})"


STRAGGLER_ADVICE = ("Look at what this rank did before the collective that the others did not (the cause above): "
                    "data loading, host work or a longer kernel.")


def straggler_findings(events: list[dict[str, Any]], n_steps: int) -> tuple[list[Finding], set[int]]:
    per_rank: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        per_rank[e["rank"]].append(e)
    consistent = {r for r, evs in per_rank.items()
                  if n_steps >= CONSISTENT_MIN_STEPS and len(evs) >= max(CONSISTENT_MIN_STEPS, CONSISTENT_SHARE * n_steps)}
    out = []
    for e in events:
        if e["rank"] in consistent:
            continue
        sev = "warning" if e["delay_ns"] >= 1_000_000 else "info"
        title = (f"rank {e['rank']} arrived {fmt_ns(e['delay_ns'])} late at the collectives of {e['step']}, "
                 f"{e['cause']}{_grew_text(e)}: {e['waiting_ranks']} ranks waited for it "
                 f"({fmt_ns(e['impact_ns'])} in total)")
        out.append(Finding(sev, title, dict(e), f"rank {e['rank']}: {e['step']}", kind="straggler",
                           suggestion=STRAGGLER_ADVICE))
    for r in sorted(consistent):
        evs = per_rank[r]
        delay = int(np.median([e["delay_ns"] for e in evs]))
        cause = Counter(e["cause"] for e in evs).most_common(1)[0][0]
        impact = sum(e["impact_ns"] for e in evs)
        evidence = {"rank": r, "steps": [e["step"] for e in evs][:20], "step_count": len(evs), "delay_ns": delay,
                    "cause": cause, "impact_ns": impact, "total_delay_ns": sum(e["delay_ns"] for e in evs),
                    "grew": evs[0].get("grew", [])}
        title = (f"rank {r} is consistently slow: last to arrive in {len(evs)} of {n_steps} steps, "
                 f"{fmt_ns(delay)} late per step (median), {cause}: the other ranks waited {fmt_ns(impact)}")
        out.append(Finding("warning", title, evidence, f"rank {r}", kind="consistently slow rank",
                           suggestion=f"Compare rank {r} with the others (its host, GPU, data shard): it is late in "
                                      "most steps, so the cause is its own, not chance."))
    return out, consistent


def link_findings(events: list[dict[str, Any]]) -> list[Finding]:
    out = []
    for e in events:
        who = f"rank {e['rank']}'s link" if e["rank"] is not None else f"the link of one of ranks {e['ranks']}"
        title = (f"collectives of {e['step']} transferred {fmt_ns(e['extra_transfer_ns'])} longer than usual "
                 f"({e['collectives']} collectives, usual {fmt_ns(e['usual_transfer_ns'])}): {who} is slow, "
                 f"no rank arrived late")
        where = f"rank {e['rank']}: {e['step']}" if e["rank"] is not None else str(e["step"])
        out.append(Finding("warning", title, dict(e), where, kind="slow link",
                           suggestion="Check this link (NCCL_DEBUG=INFO shows the transport; nvidia-smi topo -m the "
                                      "topology) and whether other jobs share it."))
    return out


def imbalance_finding(job: Job, consistent: set[int]) -> Finding | None:
    """Compute imbalance across ranks (see the module docstring), or None."""
    rows = job.steps.select(["rank", "label", "compute_ns"]).to_pylist()
    by_step: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for r in rows:
        by_step[r["label"]].append((r["compute_ns"], r["rank"]))
    per_step = []
    for label, vals in by_step.items():
        if len(vals) < 2:
            continue
        comp = np.array([v for v, _ in vals], np.float64)
        med = float(np.median(comp))
        top = max(vals)
        if med > 0:
            per_step.append({"step": label, "rank": top[1], "compute_ns": int(top[0]), "median_compute_ns": int(med),
                             "spread": (top[0] - med) / med})
    if len(per_step) < 2:  # "the busiest rank changes" needs steps to compare
        return None
    spread = float(np.median([p["spread"] for p in per_step]))
    slowest = Counter(p["rank"] for p in per_step)
    rank, times = slowest.most_common(1)[0]
    if spread < IMBALANCE_SHARE or times > len(per_step) / 2 or rank in consistent:
        return None
    impact = int(sum(p["compute_ns"] - p["median_compute_ns"] for p in per_step))
    for p in per_step:
        p["spread"] = round(p["spread"], 4)
    names = ", ".join(str(r) for r, _ in slowest.most_common(5))
    title = (f"compute differs across ranks: in the median step the busiest rank computes {spread:.0%} more than "
             f"the median rank, and the busiest rank changes (ranks {names}): unequal shapes or sequence lengths")
    evidence = {"median_spread": round(spread, 4), "steps": len(per_step), "impact_ns": impact,
                "slowest_ranks": dict(slowest.most_common(10)), "per_step": per_step[:20]}
    return Finding("warning", title, evidence, "compute imbalance", kind="compute imbalance",
                   suggestion="Give the ranks equal work per step: bucket or pad sequences to equal lengths, or "
                              "balance the shards.")
