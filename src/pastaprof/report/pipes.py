"""A reader that closed its end of the output (``pastaprof analyze | head``).

Kept apart from the terminal report (rich, the tools' tables, pyarrow): the CLI reads it at
every command's start and end, and ``pastaprof run`` must not have imported pyarrow or numpy
(whose threads would not block the signals it takes) before it blocks them.
"""

from __future__ import annotations

import os

_READER_GONE: list[int] = []  # the descriptors whose reader went away


def reader_gone() -> bool:
    """Whether a report's reader closed its end (the CLI ends as a tool killed by SIGPIPE)."""
    return bool(_READER_GONE)


def silence(fd: int = 1) -> None:
    """The reader of ``fd`` went away: what is still printed there goes to /dev/null, so that
    the command finishes its files (``--json``, ``-o``) and no flush at exit fails."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)
    _READER_GONE.append(fd)
