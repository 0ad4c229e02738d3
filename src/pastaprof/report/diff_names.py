"""Keys that match one thing across two runs: kernels, call sites, op names, findings.

Two recordings of the same program name the same kernel differently in ways that say
nothing about what it computes: the demangler's spelling (``> >`` or ``>>``, ``3ul`` or
``3``), anonymous namespaces, addresses baked into a name (``_0x7f3a...``), the counter a
compiler appends (``triton_poi_fused_add_0`` / ``_3``), clone and code-object suffixes
(``[clone .kd]``), lambda numbering and launch-bound template arguments (block size,
vector width: ``<128, 4, ...>``).  :func:`normalize_kernel_name` removes exactly those, so
the key still tells one functor from another.  With ``keep_templates=False`` it drops
the template arguments too: the kernel's *family*, which the diff uses only to pair one
unmatched base kernel with one unmatched new kernel of that family (a kernel whose
template arguments changed, e.g. another dtype or another torch version's ``Array``).
"""

from __future__ import annotations

import re
from functools import lru_cache

_WS = re.compile(r"\s+")
_ANON = re.compile(r"\(anonymous namespace\)::|\{anonymous\}::|`anonymous namespace'::|"
                   r"anonymous_namespace\{[^{}]*\}::")
_SUFFIX = re.compile(r"(?:\s*\[clone [^\]]*\]|\.kd|\.cold|\.part\.\d+|\.constprop\.\d+|\.isra\.\d+)$")
_HEX = re.compile(r"(?:[_@+.$]|\b)0x[0-9a-fA-F]+\b")
_INT_LITERAL = re.compile(r"\b(\d+)(?:ull|ul|ll|u|l)\b", re.IGNORECASE)
_NUM_ARG = re.compile(r"(?<=[<,])-?\d+(?=[,>])")   # a template argument that is a number
_LAMBDA_NO = re.compile(r"#\d+\}")                  # {lambda(float)#2}
_CLANG_LAMBDA = re.compile(r"\$_\d+")               # $_12
_TRAILING_NO = re.compile(r"(?:_\d+)+$")             # triton_poi_fused_add_0
_PUNCT_SPACE = re.compile(r"\s*([<>,*&(){}])\s*")
_LINE = re.compile(r"\((\d+)\)(?=:)")                # file.py(12): fn
_NUMBER = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?(?:\s*(?:%|x|ns|us|ms|s|[KMGT]i?B|B)(?![A-Za-z]))?")
_PARENS = re.compile(r"\([^()]*#[^()]*\)")


_BRACKET = re.compile(r"[<>{}(]")


def _strip_params(s: str) -> str:
    """``ns::kernel<...>(int, float*)`` -> ``ns::kernel<...>``: the parameter list is the first
    ``(`` outside template arguments and braces (``operator()`` is part of a name).  The regex
    visits only the brackets, so a long name costs one C scan, not a Python step per character."""
    depth = 0
    for m in _BRACKET.finditer(s):
        ch, i = m.group(), m.start()
        if ch in "<{":
            depth += 1
        elif ch in ">}":
            depth = max(0, depth - 1)
        elif depth == 0 and i > 0 and not (s.endswith("operator", 0, i) and s.startswith("()", i)):
            return s[:i]
    return s


def _strip_templates(s: str) -> str:
    """Everything inside template brackets removed (``a<b<c>>::d<e>`` -> ``a::d``)."""
    out: list[str] = []
    depth = 0
    last = 0
    for m in re.finditer(r"[<>]", s):
        if m.group() == "<":
            if depth == 0:
                out.append(s[last:m.start()])
            depth += 1
        elif depth:
            depth -= 1
            if depth == 0:
                last = m.end()
    if depth == 0:
        out.append(s[last:])
    return "".join(out)


@lru_cache(maxsize=4096)
def normalize_kernel_name(name: str, keep_templates: bool = True) -> str:
    """The key that matches one kernel across runs (see the module docstring).

    ``'void at::native::(anonymous namespace)::foo<float, 4u>(float*, int)'`` and
    ``'void at::native::foo<float, 8>(float*, int) [clone .kd]'`` both become
    ``'at::native::foo<float,N>'``; with ``keep_templates=False``, ``'at::native::foo'``.
    """
    s = _WS.sub(" ", name).strip()
    while True:
        t = _SUFFIX.sub("", s)
        if t == s:
            break
        s = t
    s = _ANON.sub("", s)
    if s.startswith("void "):
        s = s[5:]
    s = _strip_params(s)
    s = _HEX.sub("", s)
    s = _PUNCT_SPACE.sub(r"\1", s)
    s = _INT_LITERAL.sub(r"\1", s)
    s = _LAMBDA_NO.sub("#}", s)
    s = _CLANG_LAMBDA.sub("$_", s)
    s = _NUM_ARG.sub("N", s)
    if not keep_templates:
        s = _strip_templates(s)
    head, lt, rest = s.partition("<")
    head = _TRAILING_NO.sub("", head) or head
    s = head + lt + rest
    return s or name


def call_site_family(site: str) -> str:
    """``'train.py(12): step'`` -> ``'train.py: step'``: the site after edits moved its line."""
    return _LINE.sub("", site)


def op_key(name: str) -> str:
    """``'ProfilerStep#3'`` -> ``'ProfilerStep#N'``: one op across steps and runs."""
    return re.sub(r"#\d+$", "#N", name)


def finding_key(f: dict) -> str:
    """A finding's identity across runs: its ``id`` when it has one, else tool, the kind of its
    title (numbers, units and the lists in parentheses left out) and its location (line
    numbers and addresses left out)."""
    if f.get("id") not in (None, ""):
        return f"id:{f['id']}"
    title = _NUMBER.sub("#", str(f.get("title") or ""))
    title = _PARENS.sub("(…)", title)
    loc = f.get("location")
    loc = "" if loc is None else _HEX.sub("", call_site_family(_WS.sub(" ", str(loc)).strip()))
    return f"{f.get('tool', '')} | {title} | {loc}"
