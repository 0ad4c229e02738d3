"""pastaprof: program analysis for GPU workloads (PASTA's design, in Python).

Handlers capture or import events, the processor normalizes them into one
columnar event model, and tools turn them into reports::

    import pastaprof
    run = pastaprof.load("trace.json.gz")          # or a run directory
    run.sql("select name, sum(end_ns - start_ns) from kernel group by 1")
    reports = pastaprof.analyze(run, tools=["kernels", "timeline"])
"""

from __future__ import annotations

from pastaprof.api import analyze, example_path, import_trace, load
from pastaprof.errors import InputError, PastaprofError, UsageError
from pastaprof.events.schema import KINDS, SCHEMA_VERSION, SCHEMAS
from pastaprof.store.run import Run
from pastaprof.tools.base import Finding, Report, Tool

__version__ = "0.1.0"

__all__ = [
    "KINDS", "SCHEMAS", "SCHEMA_VERSION", "Finding", "InputError", "PastaprofError", "Report", "Run", "Tool",
    "UsageError", "__version__", "analyze", "example_path", "import_trace", "load",
]
