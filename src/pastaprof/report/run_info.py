"""What `pastaprof info` says of a run that `pastaprof run` recorded: the program, how it ended,
its processes and what the capture could not do or lost.

A run's manifest (run.json) holds all of it, but a user asked "did this capture work?" should
not have to read JSON: a process whose CUPTI did not start, events dropped, a process that died
without its last flush or one still running are each one line here.  Values come from a file
the user may not have written, so every one is checked for its type and nothing here raises.
"""

from __future__ import annotations

import shlex
from typing import Any


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _seconds(v: Any) -> str | None:
    return f"{v:.2f} s" if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and v >= 0 else None


def _ended(program: dict[str, Any], exit_code: Any) -> str:
    sig = program.get("signal")
    if isinstance(sig, str) and sig:
        return f"killed by {sig}"
    code = _int(program.get("exit_code"))
    code = code if code is not None else _int(exit_code)
    return "exit status unknown" if code is None else f"exit {code}"


def _command(m: dict[str, Any]) -> str | None:
    cmd = m.get("command")
    if isinstance(cmd, list) and cmd and all(isinstance(a, str) for a in cmd):
        return shlex.join(cmd)
    return None


def _losses(m: dict[str, Any], program: dict[str, Any]) -> list[str]:
    lines = []
    dropped = _int(m.get("dropped_events"))
    if dropped:
        lines.append(f"{dropped:,} events dropped during capture: counts and totals are low")
    pids = lambda key: [p for p in (program.get(key) or []) if _int(p) is not None]  # noqa: E731
    unflushed, running = pids("unflushed_pids"), pids("running_pids")
    died = [p for p in unflushed if p not in running]
    if died:
        lost = _int(program.get("lost_at_most_ms"))
        bound = f": events of the last {lost:,} ms or less lost" if lost else ""
        lines.append(f"ended without a final flush: pid {', '.join(map(str, died))}{bound}")
    if running:
        lines.append(f"still running when the run was stored: pid {', '.join(map(str, running))} "
                     "(events after its last flush are not in the run)")
    return lines


def _shapes(processes: list[dict[str, Any]]) -> str | None:
    ops = with_shapes = 0
    modes = set()
    for p in processes:
        torch = (p.get("handlers") or {}).get("torch") if isinstance(p.get("handlers"), dict) else None
        s = torch.get("shapes") if isinstance(torch, dict) else None
        if not isinstance(s, dict) or _int(s.get("ops")) is None or _int(s.get("ops_with_shapes")) is None:
            continue
        ops, with_shapes = ops + s["ops"], with_shapes + s["ops_with_shapes"]
        modes.add(str(s.get("mode")))
    if not ops or modes == {"all"}:
        return None
    return f"op shapes: {with_shapes:,} of {ops:,} ops ({'/'.join(sorted(modes))})"


def run_lines(m: dict[str, Any]) -> list[str]:
    """Lines (plain text, not yet made safe for a terminal) on a `pastaprof run` run; none for
    anything else (a trace, an imported run)."""
    if not isinstance(m, dict) or m.get("format") != "pastaprof-live":
        return []
    program = m.get("program") if isinstance(m.get("program"), dict) else {}
    overhead = m.get("capture_overhead") if isinstance(m.get("capture_overhead"), dict) else {}
    processes = [p for p in m.get("processes") or [] if isinstance(p, dict)]
    head = f"program: {_command(m) or '(command not recorded)'}  ->  {_ended(program, m.get('exit_code'))}"
    wall = _seconds(overhead.get("wall_seconds"))
    lines = [head + (f" after {wall}" if wall else "")]
    if processes:
        ranks = sorted({r for p in processes if (r := _int(p.get("rank"))) is not None})
        lines.append(f"processes: {len(processes)} on rank{'s' if len(ranks) != 1 else ''} "
                     f"{', '.join(map(str, ranks)) or '-'}")
    status = m.get("status") if isinstance(m.get("status"), dict) else {}
    lines += [f"{k}: {v}" for k, v in status.items() if isinstance(k, str) and v != "ok"]
    lines += _losses(m, program)
    if shapes := _shapes(processes):
        lines.append(shapes)
    return lines
