"""One line on a Chrome trace that holds nothing the Kineto importer reads.

Chrome's trace format is written by many tools: the PyTorch profiler (Kineto), but also
the pre-Kineto ``torch.autograd.profiler`` (torch < 1.8), TensorFlow and JAX (XLA), ROCm's
rpd2tracing, Chrome itself, uftrace, NCCL's profiler plugin and others.  Their events parse, but none is of a
category pastaprof maps to an event kind, so every report would be empty.  The importer
refuses such a file with the line built here: what the file looks like and what it holds,
and what pastaprof reads.
"""

from __future__ import annotations

from pathlib import Path

import duckdb

# Categories named in the line as what pastaprof reads (CATEGORY_KIND lists them all).
READ_CATEGORIES = "kernel, gpu_memcpy, gpu_memset, cuda_runtime, cpu_op, user_annotation, python_function"

_SAMPLE = "read_json(?, format='array', columns={pid: 'VARCHAR', ph: 'VARCHAR', name: 'VARCHAR', args: 'JSON'})"


def describe(con: duckdb.DuckDBPyConnection, files: list[Path], counts: dict[str, int],
             phases: dict[str, int]) -> str:
    """The reason a trace with events but no readable one is refused (``counts``: events
    per lower-cased category, '' for none; ``phases``: events of mapped categories that
    were not read, by category and why)."""
    total = sum(counts.values())
    what = "a rocmProfileData (rpd2tracing) trace" if counts.get("api_op") else _family(con, files)
    if phases:
        top = sorted(phases.items(), key=lambda kv: -kv[1])[:3]
        held = "its events of Kineto categories are not complete ('X') events with a ts: " + ", ".join(
            f"{_show(k)} {n:,}" for k, n in top)
    else:
        named = sorted(((c, n) for c, n in counts.items() if c), key=lambda kv: -kv[1])
        uncat = counts.get("", 0)
        parts = [f"{_show(c)} ({n:,})" for c, n in named[:5]] + ([f"{len(named) - 5} more"] if len(named) > 5 else [])
        held = ("its categories are " + ", ".join(parts) if parts else "no event has a category")
        if parts and uncat:
            held += f", and {uncat:,} without one"
    return (f"{what} of {total:,} events with none pastaprof reads ({held}); pastaprof reads the PyTorch "
            f"profiler's (Kineto's) complete events of categories {READ_CATEGORIES} and the like")


def _family(con: duckdb.DuckDBPyConnection, files: list[Path]) -> str:
    """Which writer the events look like, from their process ids and process names."""
    try:
        pids, devices = con.execute(f"""
            SELECT count(*) FILTER (lower(pid) IN ('cpu functions', 'cuda functions')),
                   count(*) FILTER (ph = 'M' AND name = 'process_name'
                                    AND regexp_matches(args ->> '$.name', '^/(device|host):'))
            FROM {_SAMPLE}""", [[str(f) for f in files]]).fetchall()[0]
    except duckdb.Error:
        return "a Chrome trace"
    if pids:
        return "a torch.autograd.profiler trace (torch < 1.8, written before Kineto)"
    if devices:
        return "a TensorFlow/JAX (XLA) profiler trace"
    return "a Chrome trace"


def _show(text: str, limit: int = 40) -> str:
    text = "".join(ch if ch.isprintable() else "?" for ch in text)
    return text if len(text) <= limit else text[: limit - 3] + "..."
