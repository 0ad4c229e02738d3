"""Importers turn foreign traces into pastaprof events, one rank at a time."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

from pastaprof.errors import InputError
from pastaprof.importers.kineto import CATEGORY_KIND, IGNORED_CATEGORIES, import_file

TRACE_SUFFIXES = (".json", ".json.gz")
_RANK_RE = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)


def trace_files(path: Path) -> list[Path]:
    """The trace files behind ``path`` (a file, or a folder of per-rank files)."""
    if not path.exists():
        raise InputError(path, "no such file or directory")
    if path.is_file():
        return [path]
    files = sorted(p for p in path.iterdir() if p.is_file() and p.name.endswith(TRACE_SUFFIXES))
    if not files:
        raise InputError(path, "folder holds no .json or .json.gz trace files")
    return files


def rank_from_name(path: Path) -> int | None:
    m = _RANK_RE.search(path.name)
    return int(m.group(1)) if m else None


def iter_ranks(
    path: Path, ranks: list[int] | None = None, progress: Callable[[int], None] | None = None,
    kinds: set[str] | None = None,
) -> Iterator[tuple[int, dict[str, pa.Table], dict[str, Any]]]:
    """Yield (rank, raw tables, metadata) per trace file.  The rank comes from the
    trace's ``distributedInfo``, else from the file name (``rank-3``), else the
    file's position in the folder.  ``kinds``: import only these (None: all)."""
    files = trace_files(path)
    seen: set[int] = set()
    for i, f in enumerate(files):
        hint = rank_from_name(f)
        tables, meta = import_file(f, progress=progress, kinds=kinds)
        dist = meta.get("distributedInfo")
        if isinstance(dist, dict) and isinstance(dist.get("rank"), int):
            rank = dist["rank"]
        elif hint is not None:
            rank = hint
        else:
            rank = i if len(files) > 1 else 0
        if rank in seen:
            raise InputError(f, f"rank {rank} appears in more than one trace file")
        seen.add(rank)
        if rank != meta["rank"]:
            tables = {k: _set_rank(t, rank) for k, t in tables.items()}
            meta["rank"] = rank
        if ranks is not None and rank not in ranks:
            continue
        yield rank, tables, meta


def _set_rank(t: pa.Table, rank: int) -> pa.Table:
    i = t.schema.get_field_index("rank")
    return t.set_column(i, "rank", pa.array([rank] * t.num_rows, pa.int32())) if i >= 0 else t


def manifest_for(path: Path, metas: list[dict[str, Any]]) -> dict[str, Any]:
    """A run manifest describing an imported trace (or folder of per-rank traces)."""
    first = metas[0] if metas else {}
    unknown: dict[str, int] = {}
    for m in metas:
        for cat, n in m.get("category_counts", {}).items():
            if cat not in CATEGORY_KIND and cat not in IGNORED_CATEGORIES and cat != "":
                unknown[cat] = unknown.get(cat, 0) + n
    devices = first.get("deviceProperties") or []
    return {
        "source": str(path),
        "format": "kineto",
        "command": None,
        "host": None,
        "devices": devices if isinstance(devices, list) else [],
        "versions": {k: first.get(k) for k in ("cuda_driver_version", "cuda_runtime_version", "cupti_version",
                                                "roctracer_version", "hip_runtime_version") if k in first},
        "ranks": sorted(m["rank"] for m in metas),
        "clock": {"domain": "unix_epoch_ns",
                  "anchors": {str(m["rank"]): {"baseTimeNanoseconds": m.get("baseTimeNanoseconds")} for m in metas}},
        "capture_overhead": None,
        "dropped_events": None,
        "category_counts": {str(m["rank"]): m.get("category_counts", {}) for m in metas},
        "unknown_categories": unknown,
        "trace_bytes": sum(m.get("bytes", 0) for m in metas),
    }
