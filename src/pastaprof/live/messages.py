"""The two ways capture talks to the user: a warning (something went wrong, capture goes
on or stops) and a notice (a status line, printed once by `pastaprof run` at exit)."""

from __future__ import annotations

import os
import sys


def warn(msg: str) -> None:
    try:
        from pastaprof.report.names import terminal_safe  # names in it cannot control the terminal

        sys.stderr.write(f"pastaprof: warning: {terminal_safe(str(msg))}\n")
        sys.stderr.flush()
    except Exception:
        pass


def notice(msg: str) -> None:
    """A status line for the user: printed here, unless `pastaprof run` prints the
    run's status lines itself when the program ends (each once)."""
    if not os.environ.get("PASTAPROF_RUN_PARENT"):
        warn(msg)
