"""Names as the terminal shows them: safe (no control sequences) and short (C++ kernel names).

Display only: JSON, Parquet and Perfetto keep the exact names.
"""

from __future__ import annotations

import re
from functools import lru_cache

# C0 controls (ESC, BEL, CR, newline...), DEL, C1 controls (0x9b is a one-byte CSI on some terminals),
# line/paragraph separators, the bidirectional overrides and isolates that reorder what is shown, and
# the invisible format characters that hide text in a cell (zero-width spaces and joiners, soft
# hyphen, word joiner, BOM, interlinear annotations, tag characters).
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\xad\u061c\u180e\u200b-\u200f\u2028-\u202e\u2060-\u206f"
                     "\ufeff\ufff9-\ufffb\U000e0000-\U000e007f]")


def _escaped(m: re.Match[str]) -> str:
    c = ord(m.group())
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}" if c < 0x10000 else f"\\U{c:08x}"


def terminal_safe(text: str) -> str:
    """``text`` with every control character written out as ``\\xNN`` / ``\\uNNNN``, so a name
    from a trace (kernel, op, path, device) cannot move the cursor, clear the screen, set the
    window title or reorder the line.  Newlines are escaped too: one name, one line."""
    if _UNSAFE.search(text) is None:
        return text
    return _UNSAFE.sub(_escaped, text)


def _strip_parens(s: str) -> str:
    """``s`` without any parenthesized group (parameter lists, ``(anonymous namespace)``,
    ``operator()``): brackets are balanced, so nested groups go whole."""
    out: list[str] = []
    depth = 0
    for ch in s:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth = max(depth - 1, 0)
        elif depth == 0:
            out.append(ch)
    return "".join(out)


def _collapse_templates(s: str, keep_depth: int) -> str:
    """Template arguments nested deeper than ``keep_depth`` written as ``…``."""
    out: list[str] = []
    depth = 0
    for ch in s:
        if ch == "<":
            depth += 1
            if depth <= keep_depth + 1:
                out.append(ch if depth <= keep_depth else "<…")
            continue
        if ch == ">":
            depth -= 1
            if depth < keep_depth + 1:
                out.append(ch)
            continue
        if depth <= keep_depth:
            out.append(ch)
    return "".join(out)


_ANON = re.compile(r"\(anonymous namespace\)::")
_LAMBDA = re.compile(r"::\{lambda#?\d*\}|::operator(?: const)?\b|::\{unnamed type#?\d*\}")
_OPERATOR = re.compile(r"::operator(?: const)?\b")
_QUALIFIER = re.compile(r"(?<![\w:])(?:~?[A-Za-z_]\w*::)+(?=[A-Za-z_~{])")
_SPACES = re.compile(r"\s+")


def _looks_like_cpp(name: str) -> bool:
    """A C++ symbol (kernel) rather than an op (``aten::mm``), a path or a sentence."""
    return name.startswith("void ") or (("<" in name or name.endswith(")")) and "::" in name)


@lru_cache(maxsize=4096)
def short_kernel_name(name: str, keep_depth: int = 1, lambdas: bool = False) -> str:
    """'void at::native::foo<float, Op<...>>(int, char*)' -> 'foo<float, Op<…>>'.

    What identifies a kernel is its function name and its first template arguments (the
    functor it runs: ``vectorized_elementwise_kernel<4, AUnaryFunctor<…>, array<…>>``); what
    is shared by most kernels is their namespaces and parameter lists.  So: drop 'void ',
    every parenthesized group (parameter lists, ``(anonymous namespace)``, lambda signatures),
    lambda scopes, every namespace/class qualifier, and template arguments nested deeper than
    ``keep_depth``.  The result always starts with an identifier: never a bare namespace.
    Names that are not C++ symbols (ops such as ``aten::mm``) come back as they are.
    ``lambdas`` keeps lambda scopes (``impl<…>::{lambda#2}``), for kernels that differ only there.
    """
    if not _looks_like_cpp(name):
        return name
    s = name[5:] if name.startswith("void ") else name
    s = _ANON.sub("", s)
    s = _strip_parens(s)
    s = (_OPERATOR if lambdas else _LAMBDA).sub("", s)
    s = _QUALIFIER.sub("", s)
    s = _collapse_templates(s, keep_depth)
    s = _SPACES.sub(" ", s).replace("> >", ">>").replace("> >", ">").strip(" ,:")
    return s if s and (s[0].isalnum() or s[0] in "_~") else name


def short_names(names: list[str], keep_depth: int = 1, max_depth: int = 3) -> list[str]:
    """Each name shortened, keeping deeper template arguments for names that would
    otherwise collide with a different name (``reduce_kernel<512, 1, ReduceOp<…>>`` for
    two reductions that differ only inside ``ReduceOp``)."""
    out = [short_kernel_name(n, keep_depth) for n in names]
    for depth in range(keep_depth + 1, max_depth + 1):
        owners: dict[str, set[str]] = {}
        for full, short in zip(names, out):
            owners.setdefault(short, set()).add(full)
        clashes = {s for s, fulls in owners.items() if len(fulls) > 1}
        if not clashes:
            break
        out = [short_kernel_name(full, depth) if short in clashes else short for full, short in zip(names, out)]
    else:
        owners = {}
        for full, short in zip(names, out):
            owners.setdefault(short, set()).add(full)
        clashes = {s for s, fulls in owners.items() if len(fulls) > 1}
        out = [short_kernel_name(full, max_depth, lambdas=True) if short in clashes else short
               for full, short in zip(names, out)]
    return out
