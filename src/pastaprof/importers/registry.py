"""Importer discovery through the ``pastaprof.importers`` entry-point group, and dispatch.

pastaprof's own importers are registered in its pyproject exactly like a third
party's would be: one line per importer.  Each is validated as it loads
(importers/base.py ``check_importer``); a broken plugin is skipped with one
warning naming it, never breaking the import of other formats.

Dispatch: every importer sniffs the path (a file or a folder) by content; the
strongest claim wins.  No claim: one InputError line saying what was found.
"""

from __future__ import annotations

import os
import stat
import warnings
from functools import lru_cache
from importlib.metadata import entry_points
from pathlib import Path

from pastaprof.errors import InputError
from pastaprof.importers.base import Claim, Importer, check_importer

GROUP = "pastaprof.importers"
HEAD_BYTES = 64        # bytes read to say what an unclaimed file is
LISTED = 3             # file names listed in a "folder holds nothing" line


@lru_cache(maxsize=1)
def _loaded() -> tuple[tuple[str, type[Importer]], ...]:
    out: dict[str, type[Importer]] = {}
    for ep in entry_points(group=GROUP):
        try:
            cls = check_importer(ep.load(), ep.name)
        except Exception as e:  # a broken third-party plugin must not break pastaprof
            warnings.warn(f"pastaprof: importer plugin {ep.name!r} failed to load: {e}", stacklevel=3)
            continue
        if cls.name in out and out[cls.name] is not cls:
            warnings.warn(f"pastaprof: importer plugin {ep.name!r} reuses the name {cls.name!r} of "
                          f"{out[cls.name].__module__}.{out[cls.name].__qualname__}: skipped", stacklevel=3)
            continue
        out[cls.name] = cls
    return tuple(sorted(out.items()))


def available() -> dict[str, type[Importer]]:
    """Name -> importer class for every installed importer."""
    return dict(_loaded())


def get(name: str) -> Importer:
    """The importer called ``name`` (KeyError naming the installed ones)."""
    cls = available().get(name)
    if cls is None:
        raise KeyError(f"no importer {name!r}; installed: {', '.join(available()) or 'none'}")
    return cls()


def _standalone(cls: type[Importer]) -> bool:
    return cls.import_ranks is not Importer.import_ranks


def _safe_sniff(imp: Importer, path: Path) -> Claim | None:
    try:
        claim = imp.sniff(path)
    except Exception as e:  # noqa: BLE001 - a plugin's bug on one file must not stop the others
        warnings.warn(f"pastaprof: importer {imp.name!r} failed sniffing {path}: {e}", stacklevel=3)
        return None
    return claim if isinstance(claim, Claim) and claim.score > 0 else None


def claims(path: Path) -> list[tuple[Claim, Importer]]:
    """Every standalone importer's claim on ``path``, strongest first."""
    out = []
    for _name, cls in _loaded():
        if not _standalone(cls):
            continue
        imp = cls()
        c = _safe_sniff(imp, path)
        if c is not None:
            out.append((c, imp))
    return sorted(out, key=lambda ci: -ci[0].score)


def importer_for(path: Path) -> tuple[Importer, Claim]:
    """The importer that reads ``path`` (a regular file or a folder): the one with
    the strongest claim.  None, or a tie: one InputError line."""
    found = claims(path)
    if not found:
        raise InputError(path, nothing_read(path))
    best, imp = found[0]
    tied = [c for c, i in found[1:] if c.score == best.score and i.name != imp.name]
    if tied:
        raise InputError(path, f"is claimed by two importers ({imp.name}: {best.why or best.format}; "
                               f"{tied[0].importer}: {tied[0].why or tied[0].format}): pass one file")
    return imp, best


def companions(folder: Path, primary_format: str, files: list[Path]) -> dict[str, tuple[Importer, list[Path]]]:
    """The companion files among ``files`` (of ``folder``) for a ``primary_format``
    import: importer name -> (importer, its files).  A primary importer asks this
    for the files it would otherwise skip."""
    out: dict[str, tuple[Importer, list[Path]]] = {}
    for _name, cls in _loaded():
        if primary_format not in cls.accompanies:
            continue
        imp = cls()
        mine = [f for f in files if _safe_sniff(imp, f) is not None]
        if mine:
            out[imp.name] = (imp, mine)
    return out


def describe(path: Path) -> str:
    """What a file no importer claims looks like, in a few words."""
    try:
        with open(path, "rb", buffering=0) as f:
            head = f.read(HEAD_BYTES)
    except OSError as e:
        return f"cannot be read ({e.strerror})"
    if not head:
        return "an empty file"
    if head.startswith(b"SQLite format 3\x00"):
        return "an SQLite database"
    if head[:1] == b"\x80" and len(head) > 1 and head[1] <= 5:
        return "a Python pickle"
    if head[:4] == b"PK\x03\x04":
        return "a zip archive"
    if head[:4] == b"\x7fELF":
        return "an ELF binary"
    if head[:2] == b"\x1f\x8b" or head.lstrip()[:1] in (b"{", b"["):
        from pastaprof.importers.sniff import sniff

        s = sniff(path)
        return s.why or ("gzip data" if head[:2] == b"\x1f\x8b" else "JSON")
    text = head.decode("utf-8", "replace")
    printable = sum(ch.isprintable() or ch in "\n\r\t" for ch in text)
    return "text" if printable >= 0.9 * len(text) else "binary data"


def nothing_read(path: Path) -> str:
    """The one-line reason no importer reads ``path``."""
    # Kineto, the commonest input, first: a long line is shortened in its middle
    looks = [cls.looks_for for n, cls in sorted(_loaded(), key=lambda nc: nc[0] != "kineto") if _standalone(cls)]
    if not path.is_dir():
        return f"is {describe(path)}, not a trace any importer reads ({', '.join(looks) or 'no importer installed'})"
    try:
        entries = sorted(p for p in path.iterdir() if not p.name.startswith("."))
    except OSError as e:
        raise InputError(path, f"cannot list the folder ({e.strerror})") from None
    files = [p for p in entries if _is_regular(p)]
    wanted = "folder holds no " + ", no ".join(looks) if looks else "no importer is installed"
    if not files:
        return wanted + (" (it is empty)" if not entries else f" (it holds {len(entries)} entries, no regular file)")
    from pastaprof.importers.ranks import show

    shown = "; ".join(f"{show(p.name)}: {describe(p)}" for p in files[:LISTED])
    more = f"; and {len(files) - LISTED} more" if len(files) > LISTED else ""
    return f"{wanted} ({shown}{more})"


def _is_regular(p: Path) -> bool:
    try:
        return stat.S_ISREG(os.stat(p).st_mode)
    except OSError:
        return False
