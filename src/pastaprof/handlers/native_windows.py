"""``--ranges`` windows for native programs: applied when the run is stored.

A native program's library records for the whole run (it has no Python session to gate at
the source); its NVTX ranges are in the run like any other, so the windows are the ranges
whose name ``PASTAPROF_RANGES`` selects, and GPU work is kept by the time of its launch call
(matched by correlation id within the process, else its own start) -- the rule a Python
session applies at each flush (live/linking.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from pastaprof.processor.intervals import in_windows
from pastaprof.processor.link import _np, map_keys

UNGATED = ("range", "marker")  # the windows themselves; access_* tables are gated by the sanitizer


def windows(rng: pa.Table | None, config: Any) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends) of the selected ranges, merged where they overlap, in time order."""
    if rng is None or not rng.num_rows:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    names = rng["name"].to_pylist()
    chosen = {n for n in set(names) if n is not None and config.range_selected([n])}
    pick = np.fromiter((n in chosen for n in names), bool, len(names))
    s, e = _np(rng["start_ns"])[pick], _np(rng["end_ns"])[pick]
    e = np.maximum(e, s)
    order = np.argsort(s, kind="stable")
    s, e = s[order], e[order]
    if len(s) < 2:
        return s, e
    reach = np.maximum.accumulate(e)
    new = np.r_[True, s[1:] > reach[:-1]]  # a window starts where no earlier one still runs
    last = np.r_[np.flatnonzero(new)[1:] - 1, len(s) - 1]
    return s[new], reach[last]


def gate(tables: dict[str, pa.Table], config: Any) -> tuple[dict[str, pa.Table], dict[str, int]]:
    """Tables with only the events launched inside a selected range; events left out per kind."""
    if config is None or not getattr(config, "ranges", None):
        return tables, {}
    ws, we = windows(tables.get("range"), config)
    api = tables.get("api")
    launches = ((_np(api["correlation"]), _np(api["start_ns"])) if api is not None and api.num_rows
                and "correlation" in api.column_names else None)
    out: dict[str, pa.Table] = {}
    left_out: dict[str, int] = {}
    for kind, t in tables.items():
        if kind in UNGATED or kind.startswith("access_") or not t.num_rows or "start_ns" not in t.column_names:
            out[kind] = t
            continue
        when = _np(t["start_ns"])
        if kind != "api" and launches is not None and "correlation" in t.column_names:
            launch = map_keys(_np(t["correlation"]), *launches)
            when = np.where(launch >= 0, launch, when)
        keep = in_windows(when, ws, we)
        dropped = len(keep) - int(np.count_nonzero(keep))
        if dropped:
            left_out[kind] = dropped
        out[kind] = t if not dropped else t.filter(pa.array(keep))
    return out, left_out
