"""Handler discovery through the ``pastaprof.handlers`` entry-point group.

pastaprof's own handlers are registered in its pyproject exactly like a third party's
would be: one line per handler.  Each is validated as it registers (handlers/base.py's
contract: a name, known event kinds, the methods); a handler that fails to load or to
validate is left out with one warning naming it, and capture goes on with the others.

``pastaprof run`` loads the handlers only where a handler setting (a PASTAPROF_* variable
outside live/config.py's own) is there to check before the program starts -- their modules
load pyarrow and numpy, ~0.3 s the program would wait for -- and then hands the list to
the program's processes (``PASTAPROF_FOUND_HANDLERS``), so they do not scan the installed
distributions again.  Otherwise each captured process discovers them as its session starts.
"""

from __future__ import annotations

import importlib
import json
import os
from collections.abc import Mapping
from typing import Any

from pastaprof.errors import UsageError
from pastaprof.handlers.base import Handler, Setting

GROUP = "pastaprof.handlers"
FOUND_ENV = "PASTAPROF_FOUND_HANDLERS"  # set by `pastaprof run`: [[name, "module:attr"], ...]
_NAME_OK = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_")

_cache: dict[str, type[Handler]] | None = None


class HandlerError(UsageError):
    """A handler plugin that breaks the contract (the message names it)."""


def validate(cls: Any, ep_name: str = "") -> type[Handler]:
    """``cls`` if it keeps the handler contract, else HandlerError naming the plugin."""
    from pastaprof.events.schema import KINDS

    label = ep_name or getattr(cls, "__qualname__", repr(cls))
    if not isinstance(cls, type) or not issubclass(cls, Handler):
        raise HandlerError(f"handler plugin {label!r}: {cls!r} is not a pastaprof.handlers.base.Handler subclass")
    name = cls.name
    if not name or not isinstance(name, str) or not set(name) <= _NAME_OK:
        raise HandlerError(f"handler plugin {label!r}: name {name!r} must be lower-case letters, digits and _")
    if ep_name and ep_name != name:
        raise HandlerError(f"handler plugin {label!r}: registered as {ep_name!r} but named {name!r}")
    kinds = cls.kinds
    if not isinstance(kinds, tuple) or not kinds:
        raise HandlerError(f"handler plugin {label!r}: kinds must be a non-empty tuple of event kinds")
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        raise HandlerError(f"handler plugin {label!r}: unknown event kind {unknown[0]!r} "
                           f"(known: {', '.join(KINDS)})")
    if cls.drain is Handler.drain:
        raise HandlerError(f"handler plugin {label!r}: it does not implement drain()")
    for meth in ("create", "start", "drain", "stop", "stats"):
        if not callable(getattr(cls, meth, None)):
            raise HandlerError(f"handler plugin {label!r}: {meth} is not a method")
    settings = cls.settings
    if not isinstance(settings, tuple) or not all(isinstance(s, Setting) for s in settings):
        raise HandlerError(f"handler plugin {label!r}: settings must be a tuple of handlers.base.Setting")
    if not isinstance(cls.order, int):
        raise HandlerError(f"handler plugin {label!r}: order must be an integer")
    return cls


def _warn(msg: str) -> None:
    from pastaprof.live.messages import warn

    warn(msg)


def _entries() -> list[tuple[str, str]]:
    """(name, "module:attr") of the registered handlers: from the launcher, else scanned."""
    found = os.environ.get(FOUND_ENV)
    if found:
        try:
            pairs = json.loads(found)
        except ValueError:
            pairs = None
        if isinstance(pairs, list) and all(isinstance(p, list) and len(p) == 2 and all(isinstance(x, str) for x in p)
                                           for p in pairs):
            return [(n, v) for n, v in pairs]
        # not what the launcher writes: scan instead
    from importlib.metadata import entry_points

    return sorted((ep.name, ep.value) for ep in entry_points(group=GROUP))


def _load(value: str) -> Any:
    module, _, attr = value.partition(":")
    obj: Any = importlib.import_module(module.strip())
    for part in attr.strip().split(".") if attr.strip() else ():
        obj = getattr(obj, part)
    return obj


def available(refresh: bool = False) -> dict[str, type[Handler]]:
    """Name -> handler class of every registered handler that loads and validates, in start
    order; each broken one is left out with one warning naming it."""
    global _cache
    if _cache is not None and not refresh:
        return _cache
    handlers: dict[str, type[Handler]] = {}
    for name, value in _entries():
        try:
            cls = validate(_load(value), name)
        except Exception as e:  # a broken third-party handler must not break capture
            why = str(e) if isinstance(e, HandlerError) else f"handler plugin {name!r} failed to load: " \
                f"{type(e).__name__}: {e}"
            _warn(f"{why}; capture goes on without it")
            continue
        if name in handlers and handlers[name] is not cls:
            _warn(f"handler plugin {name!r} is registered twice; the first one is used")
            continue
        handlers[name] = cls
    _cache = dict(sorted(handlers.items(), key=lambda kv: (kv[1].order, kv[0])))
    return _cache


def loaded() -> bool:
    """Whether this process has discovered the handlers already."""
    return _cache is not None


def entries_for_children() -> str:
    """The list the launcher hands to the program's processes (FOUND_ENV)."""
    return json.dumps([[n, f"{c.__module__}:{c.__qualname__}"] for n, c in available().items()])


def settings() -> dict[str, tuple[str, Setting]]:
    """Variable name (without the prefix) -> (handler name, Setting) of every handler."""
    out: dict[str, tuple[str, Setting]] = {}
    for hname, cls in available().items():
        for s in cls.settings:
            out.setdefault(s.name, (hname, s))
    return out


def check_settings(env: Mapping[str, str]) -> dict[str, str]:
    """Every handler setting present in ``env`` (PASTAPROF_* variables) validated: the first
    bad one is a UsageError (exit 2, before the program starts).  Returns those set (name
    without the prefix -> value)."""
    found: dict[str, str] = {}
    for _h, s in settings().values():
        value = env.get(s.env)
        if value not in (None, ""):
            s.validate(value)
            found[s.name] = value
    return found


def describe() -> list[dict[str, Any]]:
    """One row per handler (the ``pastaprof handlers`` listing, docs/handlers.md)."""
    return [{"name": n, "kinds": list(c.kinds), "native_library": c.native_library, "order": c.order,
             "starts_on_import": c.starts_on_import, "settings": [s.env for s in c.settings],
             "capabilities": [cap for cap, base in _CAPS if issubclass(c, base)],
             "module": c.__module__}
            for n, c in available().items()]


def _caps() -> tuple[tuple[str, type], ...]:
    from pastaprof.handlers.base import Gated, RangeAware, Summarized

    return (("gated", Gated), ("range_aware", RangeAware), ("summarized", Summarized))


_CAPS = _caps()


def forget() -> None:
    """Discover again at the next call (tests install plugins at run time)."""
    global _cache
    _cache = None
