"""sequences -- being written (placeholder so the registered entry point loads)."""

from __future__ import annotations

from pastaprof.tools.base import Report, Tool


class Sequences(Tool):
    name = "sequences"
    description = "(in progress)"
    consumes = ("kernel",)

    def report(self) -> Report:
        return Report(self.name, summary={"note": "not available yet"})
