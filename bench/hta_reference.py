#!/usr/bin/env python3
"""Reference numbers from HolisticTraceAnalysis (HTA) for checking `pastaprof timeline`.

This script is NOT part of pastaprof and does not import it. It must be run with a
Python that has HTA installed (kept outside the repo, e.g. /work/htaenv):

    python3.11 -m venv /work/htaenv
    /work/htaenv/bin/pip install torch==2.13.0 holistictraceanalysis   # HTA 0.5.0
    /work/htaenv/bin/python bench/hta_reference.py /work/shared/data/traces/*.json.gz \
        -o tests/data/hta_reference.json

For every trace file (.json or .json.gz Kineto trace) it copies the file into its own
temporary directory (HTA analyses a *directory* of per-rank traces), builds
`hta.trace_analysis.TraceAnalysis(trace_dir=...)` and records:

* `temporal_breakdown`: the rows of `TraceAnalysis.get_temporal_breakdown(visualize=False)`
  exactly as HTA returns them (times in trace time units = microseconds; percentages
  rounded by HTA to 2 decimals), plus unrounded fractions derived from those values;
* `idle_time_breakdown`: rows of `TraceAnalysis.get_idle_time_breakdown(ranks=[r],
  visualize=False, show_idle_interval_stats=True, consecutive_kernel_delay=D)` (HTA
  rounds the whole frame to 2 decimals), and the idle-interval statistics;
* `exact_recomputation_ns_derived` (per trace): HTA's temporal-breakdown definition redone
  with exact decimal arithmetic in integer ns (no HTA involved; a check of the definition
  and a tolerance-free target; matches hta_ns_precision to float noise).
* `diagnostics`: numbers recomputed with HTA's own helpers (`get_kernel_type`,
  `merge_kernel_intervals`) on the same rows HTA uses, to explain non_compute_time.
  These are NOT returned by an HTA API; they are labelled as derived.

Each trace is analysed in two modes:

* `hta_default`: HTA as shipped. HTA rounds float ("ns-resolution") timestamps inward to
  whole microseconds at parse time: ts := ceil(ts), end := floor(ts + dur), dur := end - ts.
* `hta_ns_precision`: the same with HTA_DISABLE_NS_ROUNDING=1 (HTA's own switch), so
  times are fractional microseconds at the trace's full precision.

If an HTA call fails on a trace, that call's key holds {"error": "...", "traceback_tail": [...]}
instead (e.g. HTA 0.5.0's `assert non_compute_time >= 0` in hta_default mode, when rounding
turns a sub-microsecond event into a negative duration).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import logging
import math
import os
import re
import shutil
import sys
import tempfile
import traceback
from typing import Any

import numpy as np
import pandas as pd

NS_ROUNDING_ENV = "HTA_DISABLE_NS_ROUNDING"
MODES = {"hta_default": "0", "hta_ns_precision": "1"}


# ---------------------------------------------------------------- helpers


def _plain(x: Any) -> Any:
    """numpy/pandas scalars -> JSON-able Python values (NaN -> None)."""
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (np.floating, float)):
        f = float(x)
        return None if math.isnan(f) else f
    if isinstance(x, np.bool_):
        return bool(x)
    return x


def _records(df: pd.DataFrame) -> list[dict[str, Any]]:
    return [_plain(r) for r in df.to_dict("records")]


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        # keep the messages that change what HTA computes; drop timing chatter
        if re.search(r"rank|ProfilerStep|iteration|Rounding|error", msg, re.I) and not re.search(
            r"seconds", msg
        ):
            self.messages.append(msg)


def _load_raw(path: str) -> dict[str, Any]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as fh:
        return json.loads(fh.read())


def _trace_facts(path: str) -> dict[str, Any]:
    raw = _load_raw(path)
    events = raw.get("traceEvents", [])
    steps = sorted(
        {e["name"] for e in events if isinstance(e.get("name"), str) and e["name"].startswith("ProfilerStep")}
    )
    dist = raw.get("distributedInfo")
    with open(path, "rb") as fh:
        sha = hashlib.sha256(fh.read()).hexdigest()
    return {
        "file": os.path.basename(path),
        "sha256": sha,
        "distributedInfo_rank": (dist or {}).get("rank") if isinstance(dist, dict) else None,
        "profiler_steps": steps,
    }


# ---------------------------------------------------------------- exact recomputation

_COMM_RE = re.compile(r"^nccl.*Kernel")  # hta/utils/utils.py NCCL_KERNEL_RE
_MEM_RE = re.compile(r"(^Memcpy)|(^Memset)|(^dma)")  # MEMORY_KERNEL_RE
_NONCOMP_RE = re.compile(r"(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)")  # NCCL_COMPUTE_KERNEL_RE


def _hta_kernel_type(name: str) -> str:
    if _COMM_RE.match(name):
        return "COMMUNICATION"
    if _MEM_RE.match(name):
        return "MEMORY"
    return "OTHER" if _NONCOMP_RE.match(name) else "COMPUTATION"


def _union_len(iv: list[Any]) -> Any:
    tot, cur_s, cur_e = 0, None, None
    for s, e in sorted(iv):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                tot += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        tot += cur_e - cur_s
    return tot


def exact_temporal(path: str) -> dict[str, Any]:
    """HTA's get_temporal_breakdown definition (no ns rounding) recomputed with exact
    decimal arithmetic on the raw JSON, in integer ns. DERIVED, not an HTA output.
    Only valid when HTA does no ProfilerStep filtering (fewer than 2 ProfilerStep names)."""
    from decimal import Decimal

    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as fh:
        raw = json.loads(fh.read(), parse_float=Decimal)
    evs = raw.get("traceEvents", [])
    steps = {e.get("name") for e in evs if str(e.get("name", "")).startswith("ProfilerStep")}
    if len(steps) >= 2:
        return {"skipped": "trace has >=2 ProfilerStep names; HTA drops the last step's GPU work"}
    iv, comp = [], []
    for e in evs:
        if e.get("dur") is None or e.get("cat") is None or e.get("cat") == "Trace":
            continue
        try:
            stream = int((e.get("args") or {}).get("stream", -1))
        except (TypeError, ValueError):
            stream = -1
        if stream == -1:
            continue
        s = int(Decimal(e["ts"]) * 1000)
        d = int(Decimal(e["dur"]) * 1000)
        iv.append((s, s + d))
        if _hta_kernel_type(str(e.get("name"))) == "COMPUTATION":
            comp.append((s, s + d))
    if not iv:
        return {"error": "no events with a stream"}
    span = max(x[1] for x in iv) - min(x[0] for x in iv)
    busy = _union_len(iv)
    c = _union_len(comp)
    return {
        "kernel_time_ns": span,
        "idle_time_ns": span - busy,
        "compute_time_ns": c,
        "non_compute_time_ns": busy - c,
        "n_rows": len(iv),
    }


# ---------------------------------------------------------------- analysis


def _diagnostics(t: Any) -> dict[str, Any]:
    """Recompute the pieces of get_temporal_breakdown with HTA's helpers (derived)."""
    from hta.utils.utils import get_kernel_type, merge_kernel_intervals

    sym = t.symbol_table.get_sym_table()
    out: dict[str, Any] = {}
    for rank, df in t.traces.items():
        g = df[df["stream"].ne(-1)].copy()  # the rows get_temporal_breakdown uses
        g["kernel_type"] = g["name"].map(lambda i: get_kernel_type(sym[i]))
        g["cat_s"] = g["cat"].map(lambda i: sym[i])
        per_type: dict[str, Any] = {}
        for kt, sub in g.groupby("kernel_type"):
            m = merge_kernel_intervals(sub.copy())
            per_type[kt] = {
                "count": int(len(sub)),
                "sum_dur": _plain(sub["dur"].sum()),
                "union_time": _plain(m["end"].sum() - m["ts"].sum()),
            }
        allm = merge_kernel_intervals(g.copy())
        out[str(rank)] = {
            "n_gpu_rows": int(len(g)),
            "rows_by_cat": {k: int(v) for k, v in g["cat_s"].value_counts().items()},
            "streams": sorted(int(s) for s in g["stream"].unique()),
            "first_gpu_ts": _plain(allm["ts"].min()) if len(allm) else None,
            "last_gpu_end": _plain(allm["end"].max()) if len(allm) else None,
            "busy_union_time": _plain(allm["end"].sum() - allm["ts"].sum()),
            "n_negative_dur_rows": int((g["dur"] < 0).sum()),
            "n_zero_dur_rows": int((g["dur"] == 0).sum()),
            "by_kernel_type": per_type,
        }
    return out


def analyse_one(path: str, mode_env: str, consecutive_kernel_delay: int) -> dict[str, Any]:
    from hta.trace_analysis import TraceAnalysis

    os.environ[NS_ROUNDING_ENV] = mode_env
    cap = _Capture()
    hta_logger = logging.getLogger("hta")
    hta_logger.addHandler(cap)
    tmp = tempfile.mkdtemp(prefix="hta_ref_")
    try:
        shutil.copy(path, os.path.join(tmp, os.path.basename(path)))
        res: dict[str, Any] = {}

        def attempt(key: str, fn: Any) -> None:
            # each HTA call separately: one failing (e.g. an assert) keeps the others
            try:
                fn()
            except Exception as exc:
                where = traceback.extract_tb(exc.__traceback__)[-1]
                detail = str(exc) or f"{where.line} ({os.path.basename(where.filename)}:{where.lineno})"
                res[key] = {
                    "error": f"{type(exc).__name__}: {detail}",
                    "traceback_tail": traceback.format_exc().strip().splitlines()[-4:],
                }

        state: dict[str, Any] = {}

        def load() -> None:
            state["ta"] = TraceAnalysis(trace_dir=tmp)
            res["hta_ranks"] = [int(r) for r in sorted(state["ta"].t.traces.keys())]

        def temporal() -> None:
            tb = state["ta"].get_temporal_breakdown(visualize=False)
            res["temporal_breakdown"] = _records(tb)
            res["temporal_breakdown_fractions_derived"] = [
                {
                    "rank": int(r["rank"]),
                    "idle": r["idle_time(us)"] / r["kernel_time(us)"],
                    "compute": r["compute_time(us)"] / r["kernel_time(us)"],
                    "non_compute": r["non_compute_time(us)"] / r["kernel_time(us)"],
                }
                for r in res["temporal_breakdown"]
            ]

        def idle_bd() -> None:
            idle, stats = state["ta"].get_idle_time_breakdown(
                ranks=res["hta_ranks"],
                visualize=False,
                show_idle_interval_stats=True,
                consecutive_kernel_delay=consecutive_kernel_delay,
            )
            res["idle_time_breakdown"] = _records(idle)
            if stats is not None:
                s = stats.reset_index().rename(columns={"index": "idle_category"})
                res["idle_interval_stats"] = _records(s)

        def diag() -> None:
            res["diagnostics"] = _diagnostics(state["ta"].t)

        attempt("load", load)
        if "ta" in state:
            attempt("temporal_breakdown", temporal)
            attempt("idle_time_breakdown", idle_bd)
            attempt("diagnostics", diag)
        res["hta_warnings"] = list(dict.fromkeys(cap.messages))
        return res
    finally:
        hta_logger.removeHandler(cap)
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("traces", nargs="+", help="Kineto trace files (.json or .json.gz)")
    ap.add_argument("-o", "--output", help="write JSON here (default: stdout)")
    ap.add_argument(
        "--consecutive-kernel-delay",
        type=int,
        default=30,
        help="HTA's threshold for 'kernel_wait' (compared with gaps in trace units = us; HTA default 30)",
    )
    ap.add_argument("--mode", choices=["both", *MODES], default="both")
    ap.add_argument("-v", "--verbose", action="store_true", help="let HTA's own log lines through to stderr")
    args = ap.parse_args(argv)

    import hta
    from hta.version import __version_tuple__

    if not args.verbose:
        for h in logging.getLogger("hta").handlers:
            h.setLevel(logging.CRITICAL + 1)

    modes = MODES if args.mode == "both" else {args.mode: MODES[args.mode]}
    saved_env = os.environ.get(NS_ROUNDING_ENV)
    out: dict[str, Any] = {
        "meta": {
            "hta_version": ".".join(map(str, __version_tuple__)),
            "hta_path": os.path.dirname(hta.__file__),
            "pandas_version": pd.__version__,
            "python": sys.version.split()[0],
            "time_unit": "us (Kineto trace units); hta_default: integer us after HTA's inward rounding",
            "consecutive_kernel_delay": args.consecutive_kernel_delay,
            "generated_by": "bench/hta_reference.py",
        },
        "traces": {},
    }
    try:
        for path in args.traces:
            entry = _trace_facts(path)
            try:
                entry["exact_recomputation_ns_derived"] = exact_temporal(path)
            except Exception as exc:
                entry["exact_recomputation_ns_derived"] = {"error": f"{type(exc).__name__}: {exc}"}
            for name, env in modes.items():
                entry[name] = analyse_one(path, env, args.consecutive_kernel_delay)
            out["traces"][entry["file"]] = entry
    finally:
        if saved_env is None:
            os.environ.pop(NS_ROUNDING_ENV, None)
        else:
            os.environ[NS_ROUNDING_ENV] = saved_env

    text = json.dumps(out, indent=2, sort_keys=False) + "\n"
    if args.output:
        with open(args.output, "w") as fh:
            fh.write(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
