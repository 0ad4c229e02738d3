"""The tool contract: declare the kinds you consume, receive batches, return a Report.

A tool never knows whether it runs live (batches arrive while the program
runs) or offline (batches are replayed from a run store or an imported trace):
the processor calls ``on_batch`` with Arrow ``RecordBatch`` objects of the
kinds listed in ``consumes``, then ``report()`` once.  The default
``on_batch`` keeps the batches so ``self.table(kind)`` returns everything seen
so far -- enough for most tools; streaming tools override ``on_batch``.

Third-party tools register a class in the ``pastaprof.tools`` entry-point group.
"""

from __future__ import annotations

import hashlib
import math
import numbers
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import pyarrow as pa

from pastaprof.events.schema import schema

if TYPE_CHECKING:
    import duckdb

Severity = Literal["info", "warning", "critical"]


SEVERITY_RANK = {"critical": 0, "warning": 1, "info": 2}
#: ``evidence["at_stake"]`` of a finding with ``impact_ns`` 0: why no time is at stake.
NO_ESTIMATE = "where time goes; no saving estimated"
DATA_NOTE = "a note on the data; no time at stake"
MEMORY_ONLY = "memory, not time: impact_bytes is what is at stake"
#: Numbers that name something (rank 1, cuda:0, stream 7) stay in a finding's kind key;
#: the others are measurements, which change from run to run.
_NAMING = r"(?:\b(?:rank|device|stream|gpu|node) |\b[a-z]+:)-?\d+\b"
_NUMBERS = re.compile(rf"({_NAMING})|[-+]?\d[\d,.]*%?")
_MEASURED_LIST = re.compile(r"\([^()]*#[^()]*\)")  # "(iteration #, iteration #)": how many varies
_LINE_OR_ADDRESS = re.compile(r"\(\d+\)(?=:)|(?:[_@+.$]|\b)0x[0-9a-fA-F]+\b")  # train.py(12): step, 0x7f..


@dataclass
class Finding:
    """One machine-readable conclusion: what, how bad, the numbers behind it, where.

    ``impact_ns`` is the time at stake (computed from events), which orders findings across tools;
    a finding that only says where time goes (a hotspot) or notes the data's quality has 0 and
    says so in ``evidence["at_stake"]`` (``NO_ESTIMATE``, ``DATA_NOTE``).  It stays None only when
    a tool forgot it (the tests check every tool's findings).  ``impact_bytes`` is the memory at
    stake of a finding measured in bytes (None for the others).  ``suggestion`` is one sentence on
    what to do about it (a tool may give it as ``evidence["suggestion"]``; it is lifted from there).
    ``id`` names the finding's kind and location, stable across runs of the same program: a short hash of the tool, the
    ``kind`` key (by default the title with its measured numbers and lists taken out) and
    the location (without line numbers and addresses, which move between versions).
    """

    severity: Severity
    title: str
    evidence: dict[str, Any] = field(default_factory=dict)
    location: str | None = None
    tool: str = ""
    impact_ns: int | None = None
    kind: str | None = None
    suggestion: str | None = None
    impact_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.suggestion is None and isinstance(self.evidence.get("suggestion"), str):
            self.suggestion = self.evidence["suggestion"]
        if self.impact_ns is None:  # tools that put the time at stake in their evidence
            v = self.evidence.get("impact_ns")
            if isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v):  # NumPy too
                self.impact_ns = int(v)

    @property
    def id(self) -> str:
        if self.kind is not None:
            key = self.kind
        else:
            key = _MEASURED_LIST.sub("(…)", _NUMBERS.sub(lambda m: m.group(1) or "#", self.title))
            key = " ".join(key.split())
        where = _LINE_OR_ADDRESS.sub("", self.location or "")  # the same site after edits moved its line
        text = "\x1f".join((self.tool, key, where))
        return hashlib.sha1(text.encode("utf-8", "surrogatepass")).hexdigest()[:12]

    def sort_key(self) -> tuple[int, int, int, int]:
        """Largest impact first, findings without one last, then by severity, then by bytes at stake."""
        return (self.impact_ns is None, -(self.impact_ns or 0), SEVERITY_RANK.get(self.severity, 3),
                -(self.impact_bytes or 0))

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "tool": self.tool, "severity": self.severity, "title": self.title,
                "impact_ns": self.impact_ns, "impact_bytes": self.impact_bytes, "evidence": self.evidence, "location": self.location,
                "suggestion": self.suggestion}


def ordered_findings(reports: list[Report]) -> list[Finding]:
    """Every report's findings in one list, by impact (see ``Finding.sort_key``); stable."""
    return sorted((f for r in reports for f in r.findings), key=Finding.sort_key)


@dataclass
class Report:
    """A tool's result: titled tables (shown), findings, headline numbers, and
    ``details``: large per-event tables kept for programs, never printed."""

    tool: str
    tables: dict[str, pa.Table] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    details: dict[str, pa.Table] = field(default_factory=dict)
    #: What the terminal shows: table name -> columns (empty list: all columns).
    #: When empty, every table in ``tables`` is shown whole.  JSON always has all.
    display: dict[str, list[str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for f in self.findings:
            f.tool = f.tool or self.tool

    def __repr__(self) -> str:
        tables = ", ".join(f"{name}: {t.num_rows} rows" for name, t in self.tables.items())
        return (f"Report(tool={self.tool!r}, tables={len(self.tables)} [{tables}], "
                f"findings={len(self.findings)}, summary keys={list(self.summary)})")


@dataclass
class RunInfo:
    """What a tool may know about the run besides its events (from the manifest)."""

    manifest: dict[str, Any] = field(default_factory=dict)

    @property
    def devices(self) -> list[dict[str, Any]]:
        return list(self.manifest.get("devices", []))


def sql(**tables: pa.Table) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection with each table registered under its keyword's name.  DuckDB is
    imported here, not when a tool module is: capture resolves the tools named for the
    report inside the profiled program, which should not pay for DuckDB."""
    import duckdb

    con = duckdb.connect()
    for name, table in tables.items():
        con.register(name, table)
    return con


class Tool:
    """Base class of every analysis tool.  Subclasses set ``name``, ``description``
    and ``consumes`` and implement ``report``."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    consumes: ClassVar[tuple[str, ...]] = ()
    #: Kinds in ``consumes`` the tool uses when a run has them but that are no reason to
    #: capture them: a handler with a cost of its own (the sanitizer, UVM counters) starts
    #: only for tools that need its kinds, not for ones that merely read them.
    optional: ClassVar[tuple[str, ...]] = ()

    def __init__(self, **options: Any) -> None:
        self.options = options
        self.info = RunInfo()
        self._batches: dict[str, list[pa.RecordBatch]] = {k: [] for k in self.consumes}

    def begin(self, info: RunInfo) -> None:
        """Called once before the first batch."""
        self.info = info

    def on_batch(self, kind: str, batch: pa.RecordBatch) -> None:
        """Receive events of a consumed kind.  Default: keep them for ``table``."""
        self._batches[kind].append(batch)

    def table(self, kind: str) -> pa.Table:
        """All batches of ``kind`` received so far, as one table (the same object until another
        batch arrives: tools call this in per-rank loops, and a job has thousands of batches)."""
        batches = self._batches.get(kind, [])
        if not batches:
            return schema(kind).empty_table()
        cache = self.__dict__.setdefault("_table_cache", {})
        hit = cache.get(kind)
        if hit is not None and hit[0] == len(batches) and hit[1] is batches[-1]:
            return hit[2]
        t = pa.Table.from_batches(batches)
        cache[kind] = (len(batches), batches[-1], t)
        return t

    def report(self) -> Report:
        raise NotImplementedError


class PerRankTool(Tool):
    """A tool whose work splits by rank: :meth:`map_rank` sees one rank's events and returns
    small summary tables; :meth:`combine` turns every rank's summaries into the Report.

    Why: a job of 1,024 ranks must analyze in bounded memory, and on a cluster each rank's map
    runs on the worker that holds its shard (``analyze --engine dask``).  Because the map sees
    nothing but its rank's tables and the combine nothing but the summaries, the local and the
    distributed engine give the same answer.  The default ``report`` here maps the ranks of
    the batches received so far, one at a time, then combines.
    """

    def map_rank(self, rank: int, tables: dict[str, pa.Table]) -> dict[str, pa.Table]:
        """Summaries of one rank (tables of a few rows per step, kernel or collective)."""
        raise NotImplementedError

    def combine(self, summaries: dict[int, dict[str, pa.Table]]) -> Report:
        """The Report, from ``{rank: map_rank(rank, ...)}`` of every rank."""
        raise NotImplementedError

    def report(self) -> Report:
        import pyarrow.compute as pc

        tables = {kind: self.table(kind) for kind in self.consumes}
        ranks = sorted({int(r) for t in tables.values() if t.num_rows for r in pc.unique(t["rank"]).to_pylist()})
        summaries = {}
        for rank in ranks:
            mine = {k: t.filter(pc.equal(t["rank"], rank)) for k, t in tables.items()}
            summaries[rank] = self.map_rank(rank, mine)
        return self.combine(summaries)
