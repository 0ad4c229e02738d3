"""Readable short forms of long C++ kernel names (display only; data keeps full names)."""

from __future__ import annotations

from functools import lru_cache


@lru_cache(maxsize=4096)
def short_kernel_name(name: str, keep_depth: int = 1) -> str:
    """'void at::native::foo<float, Op<...>>(int, char*)' -> 'at::native::foo<float, Op<…>>'.

    Drops a leading 'void ', the parameter list, and template arguments nested
    deeper than ``keep_depth``.
    """
    s = name[5:] if name.startswith("void ") else name
    out: list[str] = []
    depth = 0
    for i, ch in enumerate(s):
        if ch == "(" and depth == 0 and i > 0:
            break  # parameter list of the kernel
        if ch == "<":
            depth += 1
            if depth == keep_depth + 1:
                out.append("<…")
            elif depth <= keep_depth:
                out.append(ch)
            continue
        if ch == ">":
            depth -= 1
            if depth == keep_depth:
                out.append(">")
            elif depth < keep_depth:
                out.append(ch)
            continue
        if depth <= keep_depth:
            out.append(ch)
    short = "".join(out).replace("<…>", "<…>")
    return short or name
