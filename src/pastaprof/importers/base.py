"""The importer interface: what a reader of a foreign trace format provides.

An importer is one class (one file) registered by one line in the
``pastaprof.importers`` entry-point group (see importers/registry.py).  It
recognises its inputs by CONTENT (``sniff``), never by name alone, and yields a
run's events one rank at a time as *raw tables* -- per-kind Arrow tables the
processor links and conforms (the contract is in docs/events.md, "Writing an
importer").  pastaprof's own Kineto and Nsight Systems importers are registered
exactly like a third party's would be.

A *companion* is a file that only adds to another format's events (a PyTorch
execution trace beside its Kineto trace): an importer that names the formats it
``accompanies`` and implements ``attach`` is handed those files by the primary
importer, rank by rank, instead of their being skipped.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pyarrow as pa

#: (rank, raw tables by kind, importer metadata for ``manifest_fields``)
RankTables = tuple[int, dict[str, pa.Table], dict[str, Any]]
Note = Callable[[str], None]
Progress = Callable[[int], None]

#: How sure a claim is.  The strongest claim on a path wins; a tie between two
#: importers is refused (the user passes one file).
STRONG = 100   # the content is unmistakably this format (a schema table, a magic header)
LIKELY = 50    # the content looks like this format (the right top-level keys)
FALLBACK = 1   # not recognised, but this importer gives the best one-line error for it

NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,31}$")


@dataclass(frozen=True)
class Claim:
    """An importer's answer to "is this yours?".  ``format``/``version``: what the
    content says it is (``version`` None where the format states none); ``why``:
    in words, for messages (``"an Nsight Systems SQLite export, schema 3.25.0"``)."""

    importer: str
    format: str
    score: int = LIKELY
    version: str | None = None
    why: str = ""


class Importer:
    """Base class of importers.  Subclasses set ``name`` (lower-case, unique),
    ``formats`` (the format names their manifests use), ``looks_for`` (what a
    folder would hold, for the "nothing to import" message: ``".sqlite Nsight
    Systems exports"``) and implement ``sniff``, ``import_ranks`` and
    ``manifest_fields``.  Instances hold no state between calls."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    formats: ClassVar[tuple[str, ...]] = ()
    looks_for: ClassVar[str] = ""
    #: formats whose folders this importer's files may accompany (see ``attach``)
    accompanies: ClassVar[tuple[str, ...]] = ()

    def sniff(self, path: Path) -> Claim | None:
        """Whether ``path`` (a regular file or a folder) is this importer's, judged
        from its content (a few KB of it: sniffing every importer on every file of a
        folder must stay cheap).  Never raises for foreign or damaged input."""
        raise NotImplementedError

    def import_ranks(self, path: Path, ranks: list[int] | None = None, *, progress: Progress | None = None,
                     kinds: set[str] | None = None, note: Note | None = None) -> Iterator[RankTables]:
        """Yield (rank, raw tables, metadata) per rank, ranks in ascending order.
        ``ranks``: only these (None: all); ``kinds``: only these event kinds are
        needed (None: all; an importer may give more); ``note``: where note lines
        go (what was guessed, merged or skipped), said once the input is read.
        Bad input: raise InputError with one line."""
        raise NotImplementedError

    def manifest_fields(self, path: Path, metas: list[dict[str, Any]]) -> dict[str, Any]:
        """The run manifest's fields for an import of ``path`` whose ranks yielded
        ``metas``: at least ``format`` and ``format_version``; see
        docs/events.md for the other fields tools read (devices, clock, notes)."""
        raise NotImplementedError

    def attach(self, rank: int, tables: dict[str, pa.Table], files: list[Path],
               meta: dict[str, Any]) -> dict[str, pa.Table]:
        """For a companion importer: add what ``files`` (the companion files of the
        folder, as claimed by this importer's ``sniff``) say to one rank's raw
        ``tables`` of the primary format; ``meta`` is the primary importer's
        metadata of that rank (file name, pid, host).  Returns the new tables."""
        raise NotImplementedError


def check_importer(obj: Any, plugin: str) -> type[Importer]:
    """``obj`` if it is a usable importer class, else ValueError naming ``plugin``
    and what is wrong (a broken plugin must say which one it is)."""
    if not (isinstance(obj, type) and issubclass(obj, Importer)):
        raise ValueError(f"importer plugin {plugin!r} is {obj!r}, not a subclass of pastaprof.importers.base.Importer")
    if not isinstance(obj.name, str) or not NAME_RE.match(obj.name):
        raise ValueError(f"importer plugin {plugin!r}: name {obj.name!r} is not a lower-case identifier "
                         "(a-z, 0-9, _; at most 32)")
    if not obj.formats or not all(isinstance(f, str) and f for f in obj.formats):
        raise ValueError(f"importer plugin {plugin!r}: formats must name at least one format")
    if not isinstance(obj.looks_for, str) or not obj.looks_for:
        raise ValueError(f"importer plugin {plugin!r}: looks_for must say what it reads")
    required = ["sniff"] if obj.accompanies and obj.import_ranks is Importer.import_ranks else \
        ["sniff", "import_ranks", "manifest_fields"]
    if obj.accompanies:
        required.append("attach")
    missing = [m for m in required if getattr(obj, m) is getattr(Importer, m)]
    if missing:
        raise ValueError(f"importer plugin {plugin!r} does not implement {', '.join(missing)}")
    return obj
