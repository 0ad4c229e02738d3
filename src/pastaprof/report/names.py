"""Names as the terminal shows them: safe (no control sequences) and short (C++ kernel names).

Display only: JSON, Parquet and Perfetto keep the exact names.
"""

from __future__ import annotations

import re
from functools import lru_cache

# C0 controls (ESC, BEL, CR, newline...), DEL, C1 controls (0x9b is a one-byte CSI on some terminals),
# line/paragraph separators and the bidirectional overrides and isolates that reorder what is shown.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _escaped(m: re.Match[str]) -> str:
    c = ord(m.group())
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def terminal_safe(text: str) -> str:
    """``text`` with every control character written out as ``\\xNN`` / ``\\uNNNN``, so a name
    from a trace (kernel, op, path, device) cannot move the cursor, clear the screen, set the
    window title or reorder the line.  Newlines are escaped too: one name, one line."""
    if _UNSAFE.search(text) is None:
        return text
    return _UNSAFE.sub(_escaped, text)


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
