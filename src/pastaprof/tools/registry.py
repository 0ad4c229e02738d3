"""Tool discovery through the ``pastaprof.tools`` entry-point group.

pastaprof's own tools are registered in its pyproject exactly like a third
party's would be, so there is one mechanism and one line per tool.
"""

from __future__ import annotations

from importlib.metadata import entry_points

from pastaprof.errors import UsageError
from pastaprof.tools.base import Tool

GROUP = "pastaprof.tools"


def available() -> dict[str, type[Tool]]:
    """Name -> tool class for every installed tool (broken plugins are skipped with a warning)."""
    import warnings

    tools: dict[str, type[Tool]] = {}
    for ep in entry_points(group=GROUP):
        try:
            cls = ep.load()
        except Exception as e:  # a broken third-party plugin must not break pastaprof
            warnings.warn(f"pastaprof: tool plugin {ep.name!r} failed to load: {e}", stacklevel=2)
            continue
        if isinstance(cls, type) and issubclass(cls, Tool):
            tools[cls.name or ep.name] = cls
    return dict(sorted(tools.items()))


#: The tools ``analyze`` and ``pastaprof run`` use when none are named.
DEFAULT_TOOLS = ("steps", "kernels", "ops", "timeline", "cuda_api", "copies", "memory", "gemm")


def resolve(names: list[str] | None, default: tuple[str, ...] = DEFAULT_TOOLS) -> list[type[Tool]]:
    """Tool classes for ``names`` (default set if None); unknown names are a UsageError."""
    tools = available()
    wanted = list(names) if names else [n for n in default if n in tools]
    unknown = [n for n in wanted if n not in tools]
    if unknown:
        raise UsageError(f"unknown tool {', '.join(map(repr, unknown))}; available: {', '.join(tools) or 'none'}")
    return [tools[n] for n in wanted]
