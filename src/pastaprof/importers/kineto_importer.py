"""The Kineto importer: PyTorch profiler / Chrome traces, a file or a folder of per-rank files.

A folder may hold several ranks, several captures of one rank (a profiler
``schedule`` writes one file per cycle) and files that are no Kineto trace (an
execution trace, a config): see importers/ranks.py for how ranks are read, and
:func:`scan` for what is skipped.  Files another importer declares as Kineto
*companions* (importers/base.py ``accompanies``) are handed to it, rank by rank,
instead of being skipped.  What was guessed, merged or skipped is said in note
lines and recorded in the run's manifest.
"""

from __future__ import annotations

import errno
import os
import stat
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from pastaprof.errors import InputError
from pastaprof.importers.base import FALLBACK, LIKELY, Claim, Importer, Note, Progress, RankTables
from pastaprof.importers.kineto import CATEGORY_KIND, IGNORED_CATEGORIES, import_file, unread_note
from pastaprof.importers.ranks import GUESS_NOTE, FileRank, check_overlap, plan_ranks, rank_in_header, show
from pastaprof.importers.sniff import Sniff, sniff

TRACE_SUFFIXES = (".json", ".json.gz")
FORMAT = "kineto"
# Containers that are certainly no JSON: left to other importers (or to "nothing reads it").
_FOREIGN_MAGIC = (b"SQLite format 3\x00", b"PK\x03\x04", b"\x7fELF")


def stderr_note(msg: str) -> None:
    try:
        sys.stderr.write(f"pastaprof: note: {msg}\n")
    except (AttributeError, OSError, ValueError):  # no stderr, or a closed one: the manifest keeps the note
        pass


def _candidates(folder: Path) -> tuple[list[Path], dict[str, str]]:
    """The folder's entries named like traces: the regular files (through a link too), and the
    others (name -> what it is: a FIFO, a link to a device, a dangling link...), which are never
    opened -- a FIFO would block, /dev/zero never ends."""
    try:
        named = sorted(p for p in folder.iterdir() if p.name.endswith(TRACE_SUFFIXES))
    except OSError as e:
        raise InputError(folder, f"cannot list the folder ({e.strerror})") from None
    files, others = [], {}
    for p in named:
        why = _not_a_file(p)
        if why:
            others[p.name] = why
        else:
            files.append(p)
    return files, others


def _not_a_file(p: Path) -> str | None:
    """What ``p`` is when it is no regular file (after links), else None."""
    from pastaprof.store.safe_read import describe_mode

    link = os.path.islink(p)
    try:
        mode = os.stat(p).st_mode
    except OSError as e:
        if not link:
            return f"cannot be read ({e.strerror})"
        return {errno.ENOENT: "a dangling link", errno.ELOOP: "a symbolic link loop"}.get(
            e.errno, f"a link that cannot be followed ({e.strerror})")
    if stat.S_ISREG(mode):
        return None
    return f"a link to {describe_mode(mode)}" if link else describe_mode(mode)


def _links_out(folder: Path, files: list[Path]) -> str | None:
    """The note naming the traces read through a link out of ``folder``."""
    root = folder.resolve()
    out = [p for p in files if p.is_symlink() and not p.resolve().is_relative_to(root)]
    if not out:
        return None
    shown = ", ".join(f"{show(p.name)} -> {show(str(p.resolve()))}" for p in out[:3])
    more = f" and {len(out) - 3} more" if len(out) > 3 else ""
    return f"read {len(out)} trace{'s' if len(out) > 1 else ''} through a link out of the folder: {shown}{more}"


def scan(path: Path) -> tuple[list[Path], list[Sniff], dict[str, str]]:
    """The trace files behind ``path`` (a file, or a folder of per-rank files), what
    their first bytes say, and the folder's files that are skipped (name -> why):
    hidden files, execution traces and other JSON, recognized by content."""
    if not path.exists():
        raise InputError(path, "no such file or directory")
    if not path.is_dir():  # a regular file, else one line saying what it is (safe_read)
        from pastaprof.store.safe_read import check_trace_file

        f = check_trace_file(path)
        s = sniff(f)
        if s.kind == "et":
            raise InputError(path, f"is {s.why}, not a Kineto trace")
        return [f], [s], {}
    candidates, others = _candidates(path)
    files, sniffs, skipped = [], [], {n: w for n, w in others.items() if not n.startswith(".")}
    for p in candidates:
        if p.name.startswith("."):
            skipped[p.name] = "a hidden file"
            continue
        s = sniff(p)
        if s.kind != "trace":
            skipped[p.name] = s.why
            continue
        files.append(p)
        sniffs.append(s)
    if not files:
        if skipped:
            raise InputError(path, f"folder holds no Kineto trace ({_skipped(skipped)})")
        raise InputError(path, "folder holds no .json or .json.gz trace files")
    return files, sniffs, skipped


def _skipped(skipped: dict[str, str]) -> str:
    """'a.json: why; b.json: why' (three at most, then how many more)."""
    more = f"; and {len(skipped) - 3} more" if len(skipped) > 3 else ""
    return "; ".join(f"{show(n)}: {w}" for n, w in list(skipped.items())[:3]) + more


def _skipped_note(skipped: dict[str, str]) -> str:
    n = len(skipped)
    return f"skipped {n} file{'s that are' if n > 1 else ' that is'} no Kineto trace ({_skipped(skipped)})"


def _head(path: Path) -> bytes:
    try:
        with open(path, "rb", buffering=0) as f:
            return f.read(16)
    except OSError:
        return b""


class KinetoImporter(Importer):
    """PyTorch profiler (Kineto) Chrome-trace JSON, CUDA and ROCm flavours, plain or gzip."""

    name = "kineto"
    description = "PyTorch profiler / Kineto Chrome traces (.json, .json.gz), a file or a folder of ranks"
    formats = (FORMAT,)
    looks_for = ".json or .json.gz trace files"

    def sniff(self, path: Path) -> Claim | None:
        if path.is_dir():
            weak = None
            for p in _candidates(path)[0]:
                if p.name.startswith("."):
                    continue
                if sniff(p).kind == "trace":
                    return Claim(self.name, FORMAT, LIKELY, why="a folder of Kineto traces")
                weak = Claim(self.name, FORMAT, FALLBACK, why="a folder of JSON files")
            return weak
        head = _head(path)
        if head.startswith(_FOREIGN_MAGIC) or (head[:1] == b"\x80" and len(head) > 1 and head[1] <= 5):
            return None
        s = sniff(path)
        if s.kind == "et":
            return None
        if s.kind == "trace" and (head[:2] == b"\x1f\x8b" or head.lstrip()[:1] in (b"{", b"[")):
            return Claim(self.name, FORMAT, LIKELY, why="a Kineto trace")
        # Not recognised: read as Kineto all the same, whose error names the problem in one line.
        return Claim(self.name, FORMAT, FALLBACK, why=s.why or "not JSON")

    def import_ranks(self, path: Path, ranks: list[int] | None = None, *, progress: Progress | None = None,
                     kinds: set[str] | None = None, note: Note | None = None) -> Iterator[RankTables]:
        """Yield (rank, raw tables, metadata) per trace file, by rank and, within a rank,
        in time order (several files of one rank: consecutive captures; each is linked on
        its own, its op ids after the earlier files': processor/link.py ``RankLinker``).
        Ranks: see importers/ranks.py."""
        note = note or stderr_note
        files, sniffs, skipped = scan(path)
        attach = _companions(path, skipped) if path.is_dir() else {}
        entries, notes = plan_ranks(files, sniffs)
        decided = {f: s.decided for f, s in zip(files, sniffs)}
        if skipped:
            notes.insert(0, _skipped_note(skipped))
        linked = _links_out(path, files) if path.is_dir() else None
        if linked:
            notes.insert(0, linked)
        for name, (_imp, cfiles) in attach.items():
            notes.append(f"{len(cfiles)} file{'s' if len(cfiles) > 1 else ''} read by the {name} importer "
                         f"beside the Kineto traces: {', '.join(show(f.name) for f in cfiles[:3])}"
                         + (" ..." if len(cfiles) > 3 else ""))
        shared = {"notes": notes, "skipped": skipped,
                  "companions": {n: [f.name for f in fs] for n, (_i, fs) in attach.items()}}
        earlier: dict[int, list[tuple[int, int, Path]]] = {}
        yielded, seen = False, []
        for entry in entries:
            if ranks is not None and entry.rank not in ranks and decided[entry.path]:
                continue
            tables, meta = import_file(entry.path, rank=entry.rank, progress=progress, kinds=kinds)
            _late_rank(entry, meta, notes if len(entries) > 1 else [])
            if ranks is not None and entry.rank not in ranks:
                continue
            unread = unread_note(meta)  # what the file holds that no tool will see, in one line
            if unread:
                notes.append(f"{show(entry.path.name)}: {unread}")
            start, end = _time_range(tables)
            check_overlap(entry, start, end, earlier)
            if entry.rank != meta["rank"]:
                tables = {k: _set_rank(t, entry.rank) for k, t in tables.items()}
            meta["rank"] = entry.rank
            meta["file"] = entry.path.name
            meta["rank_source"] = entry.describe() | {"start_ns": start, "end_ns": end}
            meta["plan"] = shared
            for imp, cfiles in attach.values():
                tables = imp.attach(entry.rank, tables, cfiles, meta)
            yielded = True
            seen.append({"rank": entry.rank, "deviceProperties": meta.get("deviceProperties")})
            yield entry.rank, tables, meta
        if entries and not any(e.guess for e in entries):  # every guess was corrected by a late distributedInfo
            notes[:] = [line for line in notes if GUESS_NOTE not in line]
        shared["device_names_by_rank"] = by_rank = _devices_by_rank(seen)
        if by_rank:
            notes.append(_devices_note(by_rank, seen[0]["rank"]))
        if yielded:  # said once everything was read: a refusal stays one line
            for line in notes:
                note(line)

    def manifest_fields(self, path: Path, metas: list[dict[str, Any]]) -> dict[str, Any]:
        return manifest_for(path, metas)


def _companions(folder: Path, skipped: dict[str, str]) -> dict:
    """Skipped files another importer reads as Kineto companions (taken off ``skipped``)."""
    from pastaprof.importers.registry import companions

    regular = [folder / n for n in skipped if not n.startswith(".") and _not_a_file(folder / n) is None]
    found = companions(folder, FORMAT, regular)
    for _imp, files in found.values():
        for f in files:
            skipped.pop(f.name, None)
    return found


def _late_rank(entry: FileRank, meta: dict[str, Any], notes: list[str]) -> None:
    """A ``distributedInfo`` the first bytes did not show (after the events, or
    behind a header too large to sniff) is the file's rank all the same."""
    if entry.source == "distributedInfo":
        return
    rank = rank_in_header(meta, entry.path)
    if rank is None or rank == entry.rank:
        return
    notes.append(f"{show(entry.path.name)}: distributedInfo, found past the first bytes, says rank {rank}: "
                 f"read as rank {rank}, not {entry.rank}")
    entry.rank, entry.source, entry.guess = rank, "distributedInfo", False


def _time_range(tables: dict[str, pa.Table]) -> tuple[int | None, int | None]:
    starts = [pc.min(t["start_ns"]).as_py() for t in tables.values() if t.num_rows and "start_ns" in t.column_names]
    ends = [pc.max(t["end_ns"]).as_py() for t in tables.values() if t.num_rows and "end_ns" in t.column_names]
    starts, ends = [s for s in starts if s is not None], [e for e in ends if e is not None]
    return (min(starts) if starts else None), (max(ends) if ends else None)


def _set_rank(t: pa.Table, rank: int) -> pa.Table:
    i = t.schema.get_field_index("rank")
    return t.set_column(i, "rank", pa.array([rank] * t.num_rows, pa.int32())) if i >= 0 else t


def _devices_note(by_rank: dict[str, list[str]], first: int) -> str:
    shown = "; ".join(f"rank {r}: {', '.join(names)}" for r, names in list(by_rank.items())[:4])
    return (f"the ranks' traces name different devices ({shown}{'; ...' if len(by_rank) > 4 else ''}): "
            f"the run's devices are rank {first}'s")


def _devices_by_rank(metas: list[dict[str, Any]]) -> dict[str, list[str]]:
    """Each rank's device names, where the ranks' traces do not all name the same ones ({} if they do)."""
    names: dict[str, list[str]] = {}
    for m in metas:
        d = m.get("deviceProperties")
        if isinstance(d, list) and d:
            names.setdefault(str(m["rank"]), sorted({str(x.get("name")) for x in d if isinstance(x, dict)}))
    return names if len({tuple(v) for v in names.values()}) > 1 else {}


def manifest_for(path: Path, metas: list[dict[str, Any]]) -> dict[str, Any]:
    """A run manifest describing an imported trace (or folder of per-rank traces).
    ``rank_source`` says, per file, which rank it was read as and why
    (``guess``: the file does not state it); ``notes``: what was guessed, merged
    or skipped, as printed on import."""
    first = metas[0] if metas else {}
    unknown: dict[str, int] = {}
    counts: dict[str, dict[str, int]] = {}
    anchors: dict[str, dict[str, Any]] = {}
    for m in metas:
        per_rank = counts.setdefault(str(m["rank"]), {})
        for cat, n in m.get("category_counts", {}).items():
            per_rank[cat] = per_rank.get(cat, 0) + n
            if cat not in CATEGORY_KIND and cat not in IGNORED_CATEGORIES and cat != "":
                unknown[cat] = unknown.get(cat, 0) + n
        anchors.setdefault(str(m["rank"]), {"baseTimeNanoseconds": m.get("baseTimeNanoseconds")})
    devices = first.get("deviceProperties") or []
    plan = first.get("plan") or {}
    version = first.get("schemaVersion")
    return {
        "source": str(path),
        "format": FORMAT,
        "format_version": str(version) if isinstance(version, (int, str)) and not isinstance(version, bool) else None,
        "command": None,
        "host": None,
        "devices": devices if isinstance(devices, list) else [],
        "versions": {k: first.get(k) for k in ("cuda_driver_version", "cuda_runtime_version", "cupti_version",
                                                "roctracer_version", "hip_runtime_version") if k in first},
        "ranks": sorted({m["rank"] for m in metas}),
        "rank_source": {m["file"]: m["rank_source"] for m in metas if "file" in m and "rank_source" in m},
        "notes": list(plan.get("notes", [])),
        "device_names_by_rank": plan.get("device_names_by_rank") or None,  # import_ranks found them
        "skipped": dict(plan.get("skipped", {})),
        "companions": dict(plan.get("companions", {})),
        "clock": {"domain": "unix_epoch_ns", "anchors": anchors},
        "capture_overhead": None,
        "dropped_events": None,
        "category_counts": counts,
        "unknown_categories": unknown,
        "trace_bytes": sum(m.get("bytes", 0) for m in metas),
    }
