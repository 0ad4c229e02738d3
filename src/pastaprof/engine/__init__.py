"""Engines: where the per-rank map of an analysis runs (this process, or a Dask cluster).

``analyze --engine local`` (the default) and ``--engine dask`` run the same map and combine
(engine/mapcombine.py); see docs/scale.md.
"""

from __future__ import annotations

ENGINES = ("local", "dask")


def check_engine(engine: str, scheduler: str | None) -> None:
    """One UsageError line for an engine that cannot run here, before anything is read."""
    from pastaprof.errors import UsageError

    if engine not in ENGINES:
        raise UsageError(f"unknown engine {engine!r}; available: {', '.join(ENGINES)}")
    if scheduler is not None and engine != "dask":
        raise UsageError("--scheduler needs --engine dask")
    if engine == "dask":
        try:
            import distributed  # noqa: F401
        except ImportError:
            raise UsageError("--engine dask needs Dask distributed: pip install 'pastaprof[dask]'") from None
