"""``pastaprof run -- python -E/-I/-S ...``: the interpreter flags that keep the bootstrap out.

Capture starts in every Python process through the bootstrap's ``sitecustomize`` found on
PYTHONPATH.  ``-E`` (ignore PYTHON* variables) and ``-I`` (isolated: implies ``-E``) make
Python skip PYTHONPATH, and ``-S`` skips ``site``, which imports sitecustomize: such a process
runs uncaptured.  No other route exists that leaves the program as it is (rewriting the
command line would change its ``sys.argv``/``sys.orig_argv`` and its ``__main__``), so the
launcher says so: one status line at exit and an entry for the process in run.json.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

_PYTHON = re.compile(r"python(\d+(\.\d+)*)?[dmtu]*(\.exe)?")
_WITH_VALUE = frozenset("WXQ")  # short options that take a value (attached or next)
_LONG_WITH_VALUE = frozenset(("--check-hash-based-pycs",))
_WHY = {"E": "ignores PYTHONPATH", "I": "(isolated mode) ignores PYTHONPATH", "S": "skips site and sitecustomize"}


def interpreter_flags(command: list[str]) -> set[str]:
    """The single-letter options given to a Python interpreter command (empty if the command
    is not a Python interpreter)."""
    if not command or not _PYTHON.fullmatch(os.path.basename(command[0])):
        return set()
    flags: set[str] = set()
    args = iter(command[1:])
    for a in args:
        if a == "--" or a == "-" or not a.startswith("-"):
            break  # the script (or stdin): what follows is the program's
        if a.startswith("--"):
            if a in _LONG_WITH_VALUE:
                next(args, None)
            continue
        body = a[1:]
        for i, ch in enumerate(body):
            if ch in "cm":  # -c CMD / -m MOD end the interpreter's options
                flags.add(ch)
                return flags
            if ch in _WITH_VALUE:
                if i == len(body) - 1:
                    next(args, None)
                break
            flags.add(ch)
    return flags


def uncaptured_reason(command: list[str]) -> str | None:
    """Why this command's Python will not load the bootstrap, or None."""
    flags = interpreter_flags(command)
    hit = [f for f in "ISE" if f in flags]
    if not hit:
        return None
    f = hit[0]
    return (f"python -{f} {_WHY[f]}, so pastaprof's start-up hook did not load and this process ran uncaptured "
            f"(run it without -{f}, or start capture inside it with pastaprof.profile())")


def note_uncaptured(run_dir: Path, command: list[str], pid: int) -> None:
    """Record the program's process as uncaptured when its interpreter flags kept the bootstrap
    out (and it wrote no record of its own): its run.json entry and status line say why."""
    why = uncaptured_reason(command)
    if why is None:
        return
    shards = Path(run_dir) / "shards"
    meta = shards / f"rank-0-pid-{int(pid)}.json"
    try:
        if meta.exists():
            return
        shards.mkdir(parents=True, exist_ok=True)
        tmp = shards / f".{meta.name}.tmp"
        tmp.write_text(json.dumps({"rank": 0, "pid": int(pid), "argv": list(command), "events": {},
                                   "status": {"capture": why}, "relink_needed": False}), encoding="utf-8")
        os.replace(tmp, meta)
    except OSError:
        pass
