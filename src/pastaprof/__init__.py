"""pastaprof: program analysis for GPU workloads (PASTA's design, in Python).

Handlers capture or import events, the processor normalizes them into one
columnar event model, and tools turn them into reports::

    import pastaprof
    run = pastaprof.load("trace.json.gz")          # or a run directory
    run.sql("select name, sum(end_ns - start_ns) from kernel group by 1")
    reports = pastaprof.analyze(run, tools=["kernels", "timeline"])

    with pastaprof.profile(out="runs/a") as prof:   # live capture
        train()

Attributes are imported on first use, so ``import pastaprof`` stays cheap (it
runs at start-up of every profiled process).
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "analyze": "pastaprof.api", "load": "pastaprof.api", "import_trace": "pastaprof.api",
    "example_path": "pastaprof.api", "diff": "pastaprof.report.diff", "print_reports": "pastaprof.report.terminal",
    "profile": "pastaprof.live", "start": "pastaprof.live", "stop": "pastaprof.live", "range": "pastaprof.live",
    "step": "pastaprof.live", "apply_uvm_plan": "pastaprof.live", "track_managed": "pastaprof.live",
    "Run": "pastaprof.store.run",
    "Tool": "pastaprof.tools.base", "Report": "pastaprof.tools.base", "Finding": "pastaprof.tools.base",
    "KINDS": "pastaprof.events.schema", "SCHEMAS": "pastaprof.events.schema",
    "SCHEMA_VERSION": "pastaprof.events.schema",
    "PastaprofError": "pastaprof.errors", "InputError": "pastaprof.errors", "UsageError": "pastaprof.errors",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'pastaprof' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
