"""Errors that pastaprof reports to users as one line (exit code 2)."""

from __future__ import annotations

from pathlib import Path


class PastaprofError(Exception):
    """Base of all errors shown to users as a single line, without a traceback."""


class InputError(PastaprofError):
    """A file or directory given to pastaprof cannot be read as what it should be."""

    def __init__(self, path: Path | str, problem: str) -> None:
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{path}: {problem}")


class UsageError(PastaprofError):
    """Bad flags, tool names, or environment values."""


class OutputError(PastaprofError):
    """An output pastaprof was asked to write (a run directory, a JSON or trace file) cannot be written."""

    def __init__(self, path: Path | str, problem: str) -> None:
        self.path = str(path)
        self.problem = problem
        super().__init__(f"cannot write {path}: {problem}")
