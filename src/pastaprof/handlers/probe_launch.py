"""eBPF probes of programs with no Python in them: the launcher's side (``pastaprof run --probe
SPEC -- ./app``).

A native program runs no pastaprof session, so the probe handler (handlers/probe.py), which
starts with a program's first Python process, never starts in it.  For such a command
``pastaprof run`` itself starts the bpftrace session before the program (``launch_hook``),
recording its descendants (not ``pastaprof run``), and after the program ended turns what
was recorded into the run's ``probe`` parts and a shard of its own (``finish_hook``), before
the run is compacted -- the hooks of handlers/native_program.py, for probes.  A Python
process the native program starts sees ``_PASTAPROF_PROBE_ROOT`` and starts no second one.

Events are one Parquet part per recorded process (``probe/rank-R-pid-P-part-00000.parquet``;
R: the process's rank from the launcher's environment, else 0).  A failure is one line and
the program runs, or its run is stored, without probes.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from pastaprof.handlers.native_program import is_python_command, write_shard
from pastaprof.handlers.probe import ROOT_ENV
from pastaprof.handlers.probe_session import BpftraceSession, ProbeError, unavailable
from pastaprof.handlers.probe_spec import parse_specs
from pastaprof.live.config import current_rank

ENV = "PASTAPROF_PROBE"


def launch_hook(env: dict[str, str], command: list[str], config: Any = None) -> BpftraceSession | None:
    """Before a program that is not Python starts: its probes attached (bpftrace ready), or
    None (no --probe, a Python program: its session probes, or one line said why not)."""
    value = env.get(ENV, "")
    if not value or is_python_command(command):
        return None
    why = unavailable()
    if why:
        _note(f"probes off: {why}; the program runs unprobed")
        return None
    try:
        session = BpftraceSession(parse_specs(value), os.getpid(), current_rank(env), include_root=False)
        session.start()
    except (ProbeError, ValueError, OSError) as e:
        _note(f"probes off: {e}; the program runs unprobed")
        return None
    env[ROOT_ENV] = str(os.getpid())  # the program's Python processes start no bpftrace of their own
    return session


def finish_hook(session: BpftraceSession | None, run_dir: Path) -> dict[str, int]:
    """After the program ended, before compaction: the recorded calls -> parts, and a shard
    for the manifest.  Returns calls per recorded pid."""
    if session is None:
        return {}
    try:
        return _store(session, run_dir)
    except Exception as e:  # noqa: BLE001 -- the rest of the run is stored
        _note(f"warning: probe events not stored: {type(e).__name__}: {e}")
        return {}
    finally:
        session.close()


def _store(session: BpftraceSession, run_dir: Path) -> dict[str, int]:
    import numpy as np
    import pyarrow as pa

    from pastaprof.events.schema import SCHEMA_VERSION, conform
    from pastaprof.store.parts import write_part

    session.stop()
    t = session.read(final=True)
    pids = t["pid"].to_numpy()
    out: dict[str, int] = {}
    for pid in np.unique(pids):
        part = t.filter(pa.array(pids == pid))
        write_part(run_dir / "probe" / f"rank-{session.rank}-pid-{int(pid)}-part-00000.parquet",
                   conform("probe", part))
        out[str(int(pid))] = part.num_rows
    dropped = session.lost + session.missing()
    status = {"probe": "ok" if not dropped else f"probes: {dropped} calls not recorded (bpftrace's ring was full)"}
    shard = {"schema_version": SCHEMA_VERSION, "rank": session.rank, "pid": os.getpid(), "argv": sys.argv,
             "started_ns": None, "status": status, "events": {"probe": t.num_rows} if t.num_rows else {},
             "handlers": {"probe": {"records": t.num_rows, "dropped": dropped, "mechanism": "ebpf (bpftrace)",
                                    "probes": [s.text for s in session.specs], "calls_counted": session.calls(),
                                    "clock_offset_ns": session.offset_ns,
                                    "clock_uncertainty_ns": session.offset_error_ns, "pids": out}},
             "dropped_events": dropped, "relink_needed": False,
             "capture_overhead": {"flush_seconds": 0.0, "stop_seconds": 0.0}}
    write_shard(run_dir, session.rank, os.getpid(), shard)
    return out


def _note(line: str) -> None:
    sys.stderr.write(f"pastaprof: {line}\n")
