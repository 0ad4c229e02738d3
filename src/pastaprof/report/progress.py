"""Progress of a long import and analysis, on stderr.

A trace of at least ``PROGRESS_MIN_BYTES`` gets a progress reporter: a callable that the
importer calls with the bytes it has read, and a :meth:`Phases.phase` that the engine and the
command call when the work moves on (reading the trace, running the tools, writing the report).
On a terminal that is a rich bar whose description names the phase; when stderr is not a
terminal (a CI log, a file) each phase is one plain line with the seconds since the start, so
a log shows where a long run spent its time.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

PROGRESS_MIN_BYTES = 32 << 20  # imports above 32 MB report their progress


class Phases:
    """``self(n)``: n more bytes read; ``phase(name)``: the work moved on to ``name``."""

    def __init__(self, advance: Callable[[int], None] | None = None,
                 describe: Callable[[str], None] | None = None, stream: TextIO | None = None) -> None:
        self._advance, self._describe, self._stream = advance, describe, stream
        self._t0 = time.monotonic()

    def __call__(self, n: int) -> None:
        if self._advance is not None:
            self._advance(n)

    def phase(self, name: str) -> None:
        if self._describe is not None:
            self._describe(name)
        if self._stream is not None:
            from pastaprof.report.names import terminal_safe

            try:
                print(f"pastaprof: {terminal_safe(name)} ({time.monotonic() - self._t0:.1f} s)",
                      file=self._stream, flush=True)
            except (BrokenPipeError, ValueError):  # stderr went away: progress is not worth failing for
                self._stream = None


def phase(progress: Any, name: str) -> None:
    """Tell ``progress`` (a :class:`Phases`, a plain byte callback or None) that ``name`` begins."""
    say = getattr(progress, "phase", None)
    if say is not None:
        say(name)


def input_bytes(path: Path) -> tuple[int, bool]:
    """The bytes of a trace file or of the files of a folder, and whether any is gzipped."""
    try:
        files = [path] if path.is_file() else [p for p in path.iterdir() if p.is_file()] if path.is_dir() else []
        return sum(p.stat().st_size for p in files), any(p.name.endswith(".gz") for p in files)
    except OSError:
        return 0, False


@contextmanager
def progress_for(path: Path, quiet: bool) -> Iterator[Phases | None]:
    """The progress reporter of a command reading ``path``: None for small inputs or ``quiet``."""
    size, gz = input_bytes(path)
    if quiet or size < PROGRESS_MIN_BYTES:
        yield None
        return
    if not sys.stderr.isatty():
        phases = Phases(stream=sys.stderr)
        phases.phase(f"reading {path.name} ({size / 1e6:.0f} MB{' compressed' if gz else ''})")
        yield phases
        phases.phase("done")
        return
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeElapsedColumn, TransferSpeedColumn

    from pastaprof.report.terminal import markup_safe

    with Progress("[progress.description]{task.description}", BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                  TimeElapsedColumn(), console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(f"reading {markup_safe(path.name)}", total=None if gz else size)
        yield Phases(lambda n: bar.advance(task, n),
                     lambda name: bar.update(task, description=markup_safe(name)))
