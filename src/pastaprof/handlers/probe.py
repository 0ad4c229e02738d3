"""eBPF probes on any library: ``pastaprof run --probe SPEC`` (uprobes and USDT, through bpftrace).

Where no vendor API reaches -- a library's own functions, MPI or NCCL calls, the host side
of a stall -- a uprobe/uretprobe pair on the function records each call (entry and return
times, pid/tid, the first integer arguments asked for, the return value) and a USDT probe
each firing, as events of the ``probe`` kind.  SPECs: handlers/probe_spec.py.

How (handlers/probe_session.py): the first captured process (the program's top Python
process) starts one bpftrace with a generated program (probe_spec.script) that records calls
of that process and of every process descending from it (its C children too); the processes
below it see ``_PASTAPROF_PROBE_ROOT`` and start none. bpftrace writes one CSV line per call
to a file outside the run; each drain parses the lines added since the last one in bulk
(``pyarrow.csv``: no Python object per event) into Arrow columns. bpftrace's clock is the
kernel's monotonic clock; it is converted to the run's epoch clock by calibration at start:
the starting thread calls ``getppid()`` (probed) between two ``time.time_ns()`` reads.

Calls made by pastaprof's own threads in the process (the flush and spill threads: their
pyarrow work calls malloc) are left out.  Where eBPF cannot be used (bpftrace missing, not
root, no BTF, a sandbox) the handler says so in one status line and the program runs
unprobed.
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from pastaprof.handlers.base import Handler, HandlerContext, Setting

if TYPE_CHECKING:
    from pastaprof.handlers.probe_session import BpftraceSession
    from pastaprof.handlers.probe_spec import ProbeSpec

ROOT_ENV = "_PASTAPROF_PROBE_ROOT"  # the pid whose bpftrace records this process


def _check(value: str) -> None:
    from pastaprof.handlers.probe_spec import parse_specs

    parse_specs(value)


class ProbeHandler(Handler):
    """The ``probe`` kind: calls of probed functions and USDT firings, recorded by bpftrace."""

    name = "probe"
    kinds = ("probe",)
    settings = (Setting("PROBE", "eBPF probes, ';'-separated: LIB:FUNCTION or usdt:BINARY:PROVIDER:PROBE, "
                                 "each optionally :args=N (run --probe)", _check),)
    order = 200  # last: pastaprof's own start-up work before it is not counted as the program's
    mechanism = "ebpf (bpftrace)"

    def __init__(self, specs: tuple[ProbeSpec, ...], rank: int) -> None:
        self.specs = specs
        self.rank = rank
        self.session: BpftraceSession | None = None

    @classmethod
    def create(cls, ctx: HandlerContext) -> ProbeHandler | None:
        value = ctx.config.setting("PROBE")
        if not value:
            return None
        root = os.environ.get(ROOT_ENV)
        if root and root != str(os.getpid()):
            return None  # an ancestor's bpftrace records this process
        from pastaprof.handlers.probe_spec import parse_specs

        return cls(parse_specs(value), ctx.rank)

    def start(self) -> None:
        from pastaprof.handlers.probe_session import BpftraceSession, ProbeError, unavailable

        why = unavailable()
        if why:
            self.status = f"probes off: {why}; the program runs unprobed"
            return
        try:
            self.session = BpftraceSession(self.specs, os.getpid(), self.rank, include_root=True)
            self.session.start()
        except ProbeError as e:
            self.session = None
            self.status = f"probes off: {e}; the program runs unprobed"
            return
        os.environ[ROOT_ENV] = str(os.getpid())  # inherited by the program's children: they start none

    def drain(self) -> dict[str, pa.Table]:
        if self.session is None:
            return {}
        t = self.session.read(own_tids=_own_threads())
        self.records += t.num_rows
        self.dropped = self.session.lost + self.session.missing()
        return {"probe": t} if t.num_rows else {}

    def stop(self) -> None:
        if self.session is not None:
            self.session.stop()

    def stats(self) -> dict[str, Any]:
        s = self.session
        return {**super().stats(), "probes": [p.text for p in self.specs], "calls_counted": s.calls() if s else {},
                "clock_offset_ns": s.offset_ns if s else None, "clock_uncertainty_ns": s.offset_error_ns if s else None}


def _own_threads() -> set[int]:
    """Native ids of pastaprof's threads in this process (live/threads.py), and this one
    (the flush thread drains)."""
    from pastaprof.live import threads

    return {threading.get_native_id()} | threads.native_ids()
