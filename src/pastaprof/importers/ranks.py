"""Which rank each trace file of a folder holds, and how sure we are of it.

Sources, strongest first: the trace's ``distributedInfo.rank``; a ``rank-N`` in
the file name; the process that wrote it (host and pid, from the trace's
``host_name`` header or a ``tensorboard_trace_handler`` name like
``host_1234.1700000000123.pt.trace.json``).  Files that say nothing about rank
or process get ranks by file order -- a guess, said in a note, never silent.

Several files of one rank (or of one process) are consecutive captures of it
(a profiler ``schedule`` writes one file per cycle): they are read as one rank,
in time order, with a note; if their time ranges overlap they cannot be
captures of one process, and the import stops with one line.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pastaprof.errors import InputError
from pastaprof.importers.sniff import Sniff

RANK_MAX = 2**31 - 1  # ranks are int32 in the event schema
_RANK_RE = re.compile(r"(?<![a-z])rank[-_]?(\d+)", re.IGNORECASE)
# tensorboard_trace_handler: f"{hostname}_{pid}.{time_ns}.pt.trace.json[.gz]" (older torch: time in ms)
_TB_RE = re.compile(r"^(?P<host>.+)_(?P<pid>\d{1,10})\.(?P<t>\d{10,20})\.pt\.trace\.json(?:\.gz)?$")
LIST_MAX = 3  # names listed in one note line before "and N more"
#: The words of the note on files whose rank is a guess (dropped once every such file turned out
#: to state its rank after all: a distributedInfo past the first bytes).
GUESS_NOTE = "no rank (no distributedInfo, no rank-N in the name)"


@dataclass
class FileRank:
    """One trace file's rank and where it comes from (``source``: distributedInfo,
    file name, process, file order, single trace; ``guess``: not stated by the file)."""

    path: Path
    rank: int
    source: str
    guess: bool
    host: str | None = None
    pid: int | None = None
    order: tuple = field(default=())  # time-order key among the files of one rank

    def describe(self) -> dict[str, Any]:
        return {"rank": self.rank, "from": self.source, "guess": self.guess, "host": self.host, "pid": self.pid}


def show(name: str) -> str:
    """A file name fit for one terminal line (control characters escaped)."""
    return name if name.isprintable() else ascii(name)


def names(paths: list[Path]) -> str:
    shown = [show(p.name) for p in paths[:LIST_MAX]]
    more = len(paths) - LIST_MAX
    return ", ".join(shown) + (f" and {more} more" if more > 0 else "")


def check_rank(value: Any, where: str, path: Path) -> int:
    """``value`` as a rank, or one InputError line saying why it is none."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(path, f"{where} is {_short(value)}: not a rank (ranks are integers 0..{RANK_MAX})")
    if not 0 <= value <= RANK_MAX:
        raise InputError(path, f"{where} is {_short(value)}: out of range (ranks are 0..{RANK_MAX})")
    return value


def _short(value: Any) -> str:
    try:
        text = json.dumps(value, ensure_ascii=True)
    except (TypeError, ValueError):
        text = type(value).__name__
    return text if len(text) <= 40 else text[:37] + "..."


def rank_in_header(meta: dict[str, Any], path: Path) -> int | None:
    """``distributedInfo.rank`` (None: absent), checked against its ``world_size``."""
    dist = meta.get("distributedInfo")
    if dist is None:
        return None
    if not isinstance(dist, dict):
        raise InputError(path, f"distributedInfo is {_short(dist)}: not an object")
    if dist.get("rank") is None:
        return None
    rank = check_rank(dist["rank"], "distributedInfo.rank", path)
    size = dist.get("world_size")
    if isinstance(size, int) and not isinstance(size, bool) and 0 < size <= rank:
        raise InputError(path, f"distributedInfo.rank is {rank}, not below its world_size {size}")
    return rank


def rank_from_name(path: Path) -> int | None:
    """The N of ``rank-N`` / ``rank_N`` / ``rankN`` in the file name (None: none)."""
    m = _RANK_RE.search(path.name)
    if m is None:
        return None
    digits = m.group(1).lstrip("0") or "0"
    if len(digits) > 10 or int(digits) > RANK_MAX:
        shown = digits if len(digits) <= 20 else digits[:17] + "..."
        raise InputError(path, f"rank {shown} in the file name is out of range (ranks are 0..{RANK_MAX})")
    return int(digits)


def _process(path: Path, s: Sniff) -> tuple[str | None, int | None, int | None]:
    """(host, pid, time) of the process that wrote the file, as far as known."""
    tb = _TB_RE.match(path.name)
    host = s.header.get("host_name")
    host = host if isinstance(host, str) and host else (tb.group("host") if tb else None)
    pid = int(tb.group("pid")) if tb else s.pid
    return host, pid, int(tb.group("t")) if tb else None


def plan_ranks(files: list[Path], sniffs: list[Sniff]) -> tuple[list[FileRank], list[str]]:
    """Each file's rank (in yield order: by rank, then time) and the note lines that
    say what was guessed or merged."""
    notes: list[str] = []
    if len(files) == 1:
        f, s = files[0], sniffs[0]
        host, pid, _t = _process(f, s)
        rank, source = _stated(f, s, notes)
        return [FileRank(f, 0 if rank is None else rank, source or "single trace", False, host, pid)], notes
    plan: list[FileRank | None] = []
    by_process: dict[tuple[str, int], int] = {}
    for f, s in zip(files, sniffs):
        host, pid, t = _process(f, s)
        rank, source = _stated(f, s, notes)
        # time order: the trace's first events, else the handler's name time, else the name
        order = (s.first_ts if s.first_ts is not None else float("inf"), t if t is not None else -1, f.name)
        if rank is None:
            plan.append(FileRank(f, -1, "", True, host, pid, order))
            continue
        plan.append(FileRank(f, rank, source, False, host, pid, order))
        if host is not None and pid is not None:
            by_process.setdefault((host, pid), rank)
    _guess(plan, by_process, notes)
    out = sorted(plan, key=lambda e: (e.rank, e.order))
    _cycles_note(out, notes)
    return out, notes


def _stated(f: Path, s: Sniff, notes: list[str]) -> tuple[int | None, str]:
    """The rank the file itself states (distributedInfo, else its name)."""
    dist, named = rank_in_header(s.header, f), rank_from_name(f)
    if dist is not None:
        if named is not None and named != dist:
            notes.append(f"{show(f.name)}: distributedInfo says rank {dist}, the file name says {named}: "
                         f"read as rank {dist}")
        return dist, "distributedInfo"
    return (named, "file name") if named is not None else (None, "")


def _guess(plan: list, by_process: dict[tuple[str, int], int], notes: list[str]) -> None:
    """Ranks for the files that state none: the rank of their process when another
    file names it, else the next free rank, one per process (or per file when
    the process is unknown), by file order."""
    taken = {e.rank for e in plan if not e.guess}
    free = (r for r in range(RANK_MAX + 1) if r not in taken)
    by_file_order: list[FileRank] = []
    for e in plan:
        if not e.guess:
            continue
        key = (e.host, e.pid) if e.host is not None and e.pid is not None else None
        if key is not None and key in by_process:
            e.rank, e.source = by_process[key], "process"
            continue
        e.rank = next(free)
        if key is not None:
            by_process[key] = e.rank
            e.source = "process"
        else:
            e.source = "file order"
            by_file_order.append(e)
    guessed = [e for e in plan if e.guess]
    if not guessed:
        return
    ranks = sorted({e.rank for e in guessed})
    if len(ranks) > 1 or taken:
        how = "by host and pid" if not by_file_order else \
            "by file order" if len(by_file_order) == len(guessed) else "by host and pid, else by file order"
        pids = sorted({e.pid for e in by_file_order if e.pid is not None})
        pid_note = f"; pids {', '.join(map(str, pids[:LIST_MAX]))}{' ...' if len(pids) > LIST_MAX else ''}" \
            if len(pids) > 1 else ""
        notes.append(f"{len(guessed)} trace{'s state' if len(guessed) > 1 else ' states'} {GUESS_NOTE}: "
                     f"{names([e.path for e in guessed])} read as rank{'s' if len(ranks) > 1 else ''} "
                     f"{_span(ranks)} {how}, a guess{pid_note}; if they are separate runs, analyze each on its own")


def _span(ranks: list[int]) -> str:
    if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}-{ranks[-1]}"
    return ", ".join(map(str, ranks[:8])) + (" ..." if len(ranks) > 8 else "")


def _cycles_note(plan: list[FileRank], notes: list[str]) -> None:
    """One line when some rank comes from several files (consecutive captures)."""
    groups: dict[int, list[FileRank]] = {}
    for e in plan:
        groups.setdefault(e.rank, []).append(e)
    multi = {r: g for r, g in groups.items() if len(g) > 1}
    if not multi:
        return
    if len(multi) == 1:
        (rank, g), = multi.items()
        e = g[0]
        who = f"host {show(e.host)}, pid {e.pid}" if e.source == "process" else f"{g[0].source} rank {rank}"
        notes.append(f"{names([x.path for x in g])} are {len(g)} captures of one process ({who}): "
                     f"read as rank {rank}, in time order")
    else:
        counts = sorted({len(g) for g in multi.values()})
        notes.append(f"{len(multi)} ranks come from several captures each ({'-'.join(map(str, counts))} files, "
                     f"e.g. {names([x.path for x in next(iter(multi.values()))])}): each read as one rank, "
                     f"in time order")


def check_overlap(entry: FileRank, start_ns: int | None, end_ns: int | None,
                  earlier: dict[int, list[tuple[int, int, Path]]]) -> None:
    """Stop when two captures of one rank overlap in time: then they are not
    consecutive captures of one process (a copy of a file, or two jobs)."""
    if start_ns is None or end_ns is None:
        return
    for s, e, other in earlier.get(entry.rank, []):
        if start_ns < e and s < end_ns:
            raise InputError(entry.path, f"is rank {entry.rank} ({entry.source}) like {show(other.name)}, and the "
                                         "two overlap in time (a copy? two jobs?): pass one of them")
    earlier.setdefault(entry.rank, []).append((start_ns, end_ns, entry.path))
