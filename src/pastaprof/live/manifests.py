"""Each process's part of a run's manifest: ``shards/rank-R-pid-P.json``.

Written at start, at flushes, and at stop (each to a temporary name, then renamed), and
merged by compaction (store/compact.py) into ``run.json``'s ``processes``: what was
recorded (events per kind), by which handlers (each handler's ``stats()``), what was
lost, how the process ended, what capture cost.

A mixin of ``Session``.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from typing import Any

from pastaprof.events.schema import SCHEMA_VERSION
from pastaprof.handlers.base import Handler, Summarized
from pastaprof.live.messages import notice as _notice
from pastaprof.live.messages import warn as _warn

SHARDS = "shards"


def handler_stats(h: Any) -> dict[str, Any]:
    """A handler's row of the manifest's handler table.  Objects that are not Handler
    subclasses but drain like one (appended to ``session.handlers`` by hand) give the
    standard counters."""
    if isinstance(h, Handler):
        try:
            return h.stats()
        except Exception as e:  # noqa: BLE001 -- its counters are not worth the manifest
            return {**Handler.stats(h), "error": f"stats(): {type(e).__name__}: {e}"}
    return {"records": h.records, "dropped": h.dropped, "sampled_out": h.sampled_out,
            "kernels_seen": h.kernels_seen, "reattached": 0, "mechanism": "python", "buffers": None,
            "gate_changes": None, "gate_seconds": 0.0}


def _summary(h: Summarized) -> dict[str, Any] | None:
    try:
        return h.summary()
    except Exception as e:  # noqa: BLE001 -- one handler's summary must not cost the manifest
        return {"error": f"{type(e).__name__}: {e}"}


class Manifests:
    def _late_status(self, final: bool) -> None:
        """Status lines handlers found after start (a final one is also shown once)."""
        for h in list(self.handlers):
            if not isinstance(h, Handler):
                continue
            try:
                lines = h.late_status(final)
            except Exception:  # noqa: BLE001 -- a status line is not worth a failed manifest
                continue
            for key, line in lines.items():
                if final and self.status.get(key) != line:
                    _notice(line)
                self.status[key] = line

    def _write_meta(self, stop_t0: float | None = None) -> None:
        """This process's part of the manifest (merged by compaction).  ``stop_t0``: from
        stop(), whose stop_seconds is taken here, after everything but the JSON's encoding and
        write (~0.1 ms; the manifest is one small file)."""
        handlers = {h.name: handler_stats(h) for h in list(self.handlers)}
        self._late_status(final=False)
        dropped = sum(h["dropped"] for h in handlers.values())
        if dropped:
            by = ", ".join(f"{k} {v['dropped']}" for k, v in handlers.items() if v["dropped"])
            why = ("; op rows past 16x PASTAPROF_BUFFER_MB wait for no flush" if handlers.get("torch", {}).get("dropped")
                   else "")
            self.status["dropped"] = f"{dropped} events dropped: the capture buffers were full ({by}{why})"
        summaries = {h.name: _summary(h) for h in list(self.handlers) if isinstance(h, Summarized)}
        meta = {
            "schema_version": SCHEMA_VERSION, "rank": self.rank, "pid": self.pid, "first_part": self.first_part,
            "host": socket.gethostname(),
            "argv": sys.argv, "started_ns": self.started_ns, "updated_ns": time.time_ns(),
            "status": self.status, "events": self.events, "filtered_out": self.filtered_out,
            "filtered_by_kind": self.filtered_by_kind,
            "handlers": handlers, "dropped_events": dropped,
            "capture_overhead": {"flush_seconds": round(self.flush_seconds, 6),
                                 "stop_seconds": round(self.stop_seconds, 6),
                                 "stop_handlers_seconds": round(self.stop_handlers_seconds, 6),
                                 "final_flush_seconds": round(self.final_flush_seconds, 6),
                                 "final_flush_phases": self.final_flush_phases,
                                 "stop_join_seconds": round(self.stop_join_seconds, 6),
                                 "bounds": self.bounds(), "deadline_flushes": self.deadline_flushes,
                                 "starved_flushes": self.starved_flushes, "max_pending_rows": self.max_pending_rows,
                                 "longest_flush_ms": round(self.longest_flush_s * 1000, 1),
                                 "raised_flushes": self.raised_flushes, "nice_lowered": self.nice_lowered,
                                 "flushed_through_ns": self.flushed_through_ns},
            "config": self.config.to_env(), "steps_seen": self.step, "versions": _versions(),
            "relink_needed": self._relink_needed or not self._stopped, "devices": _devices(),
            # pastaprof's own summarized handlers keep their top-level keys (run.json processes[])
            "uvm_plan": summaries.get("uvm_plan"), "sanitizer": summaries.get("sanitizer"),
            "summaries": summaries,
        }
        if stop_t0 is not None:
            self.stop_seconds = time.perf_counter() - stop_t0
            meta["capture_overhead"]["stop_seconds"] = round(self.stop_seconds, 6)
        path = self.out / SHARDS / self._meta_name
        tmp = path.with_name(f".{path.name}.{threading.get_ident()}.tmp")  # flushes may overlap
        try:
            tmp.write_text(json.dumps(meta, default=str), encoding="utf-8")
            os.replace(tmp, path)
        except OSError as e:
            _warn(f"cannot write {path}: {e}")


_DEVICES: dict[int, list[dict[str, Any]]] = {}  # per process (a forked child has no CUDA): found once, kept,
                                                 # as every manifest write (each flush, stop) asks


def _devices() -> list[dict[str, Any]]:
    """GPU names and memory from torch, if this process initialized CUDA (no NVML start-up)."""
    if os.getpid() in _DEVICES:
        return _DEVICES[os.getpid()]
    torch = sys.modules.get("torch")
    try:
        if torch is None or not torch.cuda.is_initialized():
            return []
        out = []
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            out.append({"id": i, "name": p.name, "totalGlobalMem": int(p.total_memory)})
        _DEVICES[os.getpid()] = out
        return out
    except Exception:
        return []


def _versions() -> dict[str, str]:
    out = {"python": sys.version.split()[0]}
    torch = sys.modules.get("torch")
    if torch is not None:
        out["torch"] = getattr(torch, "__version__", "?")
        cuda = getattr(getattr(torch, "version", None), "cuda", None)
        if cuda:
            out["cuda"] = cuda
    return out
