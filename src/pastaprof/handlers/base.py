"""The contract between the live session and an event source (a *handler*).

A handler is one class in one file plus one line in the ``pastaprof.handlers``
entry-point group (handlers/registry.py validates it when it registers).  The
session (live/session.py) talks to every handler only through this contract:

* ``create(ctx)``: make one for this process, or ``None`` when it is not wanted (the
  kinds it produces are consumed by no chosen tool, its setting is off, no GPU ...);
* ``start()``; ``drain()`` -> ``{kind: pyarrow Table}`` (or an iterable of ``(kind,
  Table | RecordBatch)`` pairs), called by the flush thread every ``PASTAPROF_FLUSH_MS``
  and once more after ``stop()``; ``stop()``; ``stats()`` -> the counters the run's
  manifest shows for it (``run.json`` ``processes[].handlers[name]``);
* class attributes: ``name``, ``kinds`` (event kinds of events/schema.py it emits),
  ``settings`` (the ``PASTAPROF_*`` variables it adds: validated before the program
  starts, a bad value is exit 2), ``native_library`` (the native library it needs, by
  its ``pastaprof.native.load`` name), ``order`` (start order: lower first), ``starts_on_import``
  (a module whose import starts it, for handlers that hook a framework only if the program
  uses it).

Optional capabilities, as mixins the session tests with ``isinstance``:

* :class:`Gated`: honours the capture windows (ranges, steps) at the source -- the session
  calls ``set_gate(open)`` as windows open and close, so nothing is recorded between them;
* :class:`RangeAware`: told when a ``pastaprof.range`` is entered or left;
* :class:`Summarized`: keeps a summary (``summary()`` -> dict, in the manifest under
  ``summaries``) besides, or instead of, events.

The profiled program is never harmed: an exception from ``drain`` loses that handler's
events of one flush (one warning), never the others'; one from ``create``/``start`` is one
warning and the handler is left out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from pastaprof.errors import UsageError

if TYPE_CHECKING:
    import pyarrow as pa

    from pastaprof.live.config import CaptureConfig

    Drained = Mapping[str, pa.Table] | Iterable[tuple[str, pa.Table | pa.RecordBatch]]

ENV_PREFIX = "PASTAPROF_"


@dataclass(frozen=True)
class Setting:
    """A ``PASTAPROF_<name>`` variable a handler reads.  ``check(value)`` raises ValueError
    (or UsageError) with the reason when the value is bad; it runs in ``pastaprof run``
    before the program starts and in ``pastaprof.start()``."""

    name: str
    help: str
    check: Callable[[str], Any] | None = None

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name

    def validate(self, value: str) -> None:
        if self.check is None or value == "":
            return
        try:
            self.check(value)
        except UsageError:
            raise
        except (ValueError, TypeError) as e:
            raise UsageError(f"{self.env}={value!r}: {e}") from None


def integer(lo: int | None = None, hi: int | None = None) -> Callable[[str], int]:
    """A Setting check: an integer within [lo, hi]."""

    def check(value: str) -> int:
        try:
            v = int(value)
        except ValueError:
            raise ValueError("expected an integer") from None
        if lo is not None and hi is not None and not lo <= v <= hi:
            raise ValueError(f"must be {lo} to {hi}")
        if lo is not None and v < lo:
            raise ValueError(f"must be {lo} or more")
        if hi is not None and v > hi:
            raise ValueError(f"must be {hi} or less")
        return v

    return check


def boolean(value: str) -> bool:
    """A Setting check: 0/1, true/false, yes/no, on/off."""
    v = value.lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off"):
        return False
    raise ValueError("expected 0 or 1")


class HandlerContext(Protocol):
    """What a handler may read of the session that creates it (live/session.py)."""

    config: CaptureConfig
    rank: int
    pid: int
    out: Path
    gpu: bool  # False in forked children: CUDA cannot be used after fork
    status: dict[str, str]  # one line per concern, shown at the end of `pastaprof run`
    consumed: set[str]  # event kinds the chosen tools (live, and PASTAPROF_TOOLS) consume

    def wants(self, kind: str) -> bool:
        """Whether a chosen tool consumes this event kind."""
        ...

    def handler(self, name: str) -> Handler | None:
        """The started handler of that name, if any (a handler started after it may use it)."""
        ...


class Handler:
    """Base class of event sources; subclasses set ``name`` and ``kinds`` and implement
    ``drain`` (and usually ``start``/``stop``)."""

    name: ClassVar[str] = ""
    kinds: ClassVar[tuple[str, ...]] = ()
    settings: ClassVar[tuple[Setting, ...]] = ()
    native_library: ClassVar[str | None] = None
    order: ClassVar[int] = 100
    starts_on_import: ClassVar[str | None] = None

    # counters of the manifest (stats()); handlers update them as they record
    records: int = 0
    dropped: int = 0
    sampled_out: int = 0
    kernels_seen: int = 0
    mechanism: str = "python"
    status: str | None = None  # why this handler records nothing (None: recording)
    #: with a ``status`` after start (it records nothing), stay in the manifest's handler table
    #: (CUPTI, PyTorch: their absence is itself the news) instead of being left out
    listed_when_unavailable: ClassVar[bool] = False
    #: whether the run's status table has a line for it ("ok" or why it records nothing)
    status_line: ClassVar[bool] = True

    @classmethod
    def create(cls, ctx: HandlerContext) -> Handler | None:
        """One handler for this process, or None where it is not wanted.  The default makes
        one when a chosen tool consumes one of its kinds, or no tool is chosen at all."""
        names = ctx.config.tools
        if names and not any(ctx.wants(k) for k in cls.kinds):
            return None
        return cls()  # type: ignore[call-arg]

    def start(self) -> None:
        """Begin recording (the session calls this once, right after create)."""

    def drain(self) -> Drained:
        """Events recorded since the last drain, by kind."""
        raise NotImplementedError

    def stop(self) -> None:
        """Stop recording; the session drains once more afterwards."""

    def start_notes(self) -> dict[str, str]:
        """Status lines about how it started (a fallback mechanism, ...), shown once."""
        return {}

    def before_drain(self, final: bool) -> None:
        """Called by the flush thread before each drain (``final``: the one after stop)."""

    def stats(self) -> dict[str, Any]:
        """The counters of the manifest's handler table (``run.json`` processes[].handlers)."""
        return {"records": self.records, "dropped": self.dropped, "sampled_out": self.sampled_out,
                "kernels_seen": self.kernels_seen, "reattached": 0, "mechanism": self.mechanism,
                "buffers": None, "gate_changes": None, "gate_seconds": 0.0}

    def late_status(self, final: bool) -> dict[str, str]:
        """Status lines found after start (at each manifest write; ``final``: at stop)."""
        return {}


class Gated:
    """Capability: recording is switched at the source as capture windows open and close."""

    #: the session's gate reaches this handler only once the first step or selected range
    #: ended (until then it records everything and the store gates: op signatures, call
    #: sites and module paths are then met outside the first window)
    gated_once_armed: ClassVar[bool] = False
    #: the gate is what this handler instruments, not an optimization: PASTAPROF_OFF=gate
    #: (the store alone gates) does not switch it off
    gate_is_instrumentation: ClassVar[bool] = False

    def set_gate(self, open_: bool) -> None:
        raise NotImplementedError


class RangeAware:
    """Capability: told of ``pastaprof.range`` (and NVTX ranges the session sees) entered/left."""

    def range_begin(self, name: str) -> None:
        pass

    def range_end(self, name: str) -> None:
        pass


class Summarized:
    """Capability: keeps a summary for the manifest (``summaries[name]``)."""

    def summary(self) -> dict[str, Any]:
        raise NotImplementedError
