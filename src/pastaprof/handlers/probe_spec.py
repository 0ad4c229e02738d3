"""``--probe SPEC``: what to probe, checked before the program starts, and the bpftrace program.

A SPEC is one of

* ``LIB:FUNCTION`` -- a uprobe at the function's entry and a uretprobe at its return, so each
  call is one event with its entry and return times (``libc.so.6:malloc``,
  ``libcuda.so:cuLaunchKernel``, ``/opt/app/libfoo.so:foo``);
* ``usdt:BINARY:PROVIDER:PROBE`` -- a USDT (``<sys/sdt.h>``) probe of a program or library:
  each firing is one instant event;

optionally followed by ``:args=N``: the first N integer arguments of each call (0-6) are
recorded.  ``LIB`` and ``BINARY`` are a path, or a name found in the dynamic linker's cache
(``ldconfig -p``: ``libc.so.6``; ``libcuda.so`` also finds ``libcuda.so.1``); a ``BINARY``
without a slash may also be a program on ``PATH``.

Everything a spec names goes into bpftrace's program text, so names are held to the
characters libraries, paths and C symbols use: a spec bpftrace could read as something else
is refused with one line, before the program starts.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from dataclasses import dataclass

MAX_ARGS = 6
_SYMBOL = re.compile(r"^[A-Za-z_][A-Za-z0-9_.@$]*$")
_PATH = re.compile(r"^[A-Za-z0-9_./+@=,-]+$")
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class ProbeSpec:
    """One probe: ``kind`` is ``uprobe`` (a function's entry and return) or ``usdt``."""

    text: str  # as asked, without ``:args=N`` (the events' name)
    kind: str
    lib: str  # the library or binary's resolved path
    function: str  # the function, or PROVIDER:PROBE for USDT
    nargs: int = 0


def parse_specs(value: str) -> tuple[ProbeSpec, ...]:
    """PASTAPROF_PROBE (specs separated by ``;`` or new lines) -> the probes; a bad one is a
    ValueError saying which and why."""
    parts = [p.strip() for p in re.split(r"[;\n]", value) if p.strip()]
    if not parts:
        raise ValueError("no probe given (LIB:FUNCTION or usdt:BINARY:PROVIDER:PROBE)")
    specs = tuple(parse_spec(p) for p in parts)
    seen: set[tuple[str, str]] = set()
    for s in specs:
        if (s.lib, s.function) in seen:
            raise ValueError(f"probe {s.text!r} is given twice")
        seen.add((s.lib, s.function))
    return specs


def parse_spec(text: str) -> ProbeSpec:
    """One SPEC -> ProbeSpec (its library resolved), else ValueError naming the spec."""
    fields = text.split(":")
    nargs = 0
    if len(fields) > 1 and fields[-1].startswith("args="):
        raw = fields.pop()[5:]
        if not raw.isdigit() or not 0 <= int(raw) <= MAX_ARGS:
            raise ValueError(f"probe {text!r}: args= takes 0 to {MAX_ARGS}, not {raw!r}")
        nargs = int(raw)
    name = ":".join(fields)
    if fields[0] == "usdt":
        if len(fields) != 4 or not all(fields[1:]):
            raise ValueError(f"probe {text!r}: expected usdt:BINARY:PROVIDER:PROBE")
        _, binary, provider, probe = fields
        for what, v in (("provider", provider), ("probe", probe)):
            if not _IDENT.match(v):
                raise ValueError(f"probe {text!r}: the {what} {v!r} is not a C identifier")
        path = resolve(binary, text, program=True)
        notes = usdt_probes(path)
        if notes is not None and (provider, probe) not in notes:
            raise ValueError(f"probe {text!r}: {path} has no USDT probe {provider}:{probe}"
                             + (f" (it has {', '.join(sorted(f'{a}:{b}' for a, b in notes)[:5])})" if notes else ""))
        return ProbeSpec(name, "usdt", path, f"{provider}:{probe}", nargs)
    if len(fields) != 2 or not all(fields):
        raise ValueError(f"probe {text!r}: expected LIB:FUNCTION (libc.so.6:malloc) or usdt:BINARY:PROVIDER:PROBE")
    lib, function = fields
    if not _SYMBOL.match(function):
        raise ValueError(f"probe {text!r}: {function!r} is not a function name")
    path = resolve(lib, text)
    symbols = defined_symbols(path)
    if symbols is not None and function not in symbols:
        raise ValueError(f"probe {text!r}: {path} defines no function {function!r}")
    return ProbeSpec(name, "uprobe", path, function, nargs)


@functools.lru_cache(maxsize=64)
def defined_symbols(path: str) -> frozenset[str] | None:
    """The functions a library or program defines (dynamic and, unless stripped, static
    symbols: ``nm``), without symbol versions; None where nm is missing or fails (bpftrace
    then finds out as it attaches)."""
    nm = shutil.which("nm")
    if nm is None:
        return None
    names: set[str] = set()
    ok = False
    for flags in (["-D", "--defined-only"], ["--defined-only"]):
        try:
            r = subprocess.run([nm, *flags, path], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.SubprocessError):
            continue
        if r.returncode == 0:
            ok = True
            names.update(ln.split()[-1].split("@")[0] for ln in r.stdout.splitlines() if len(ln.split()) >= 3)
    return frozenset(names) if ok else None


@functools.lru_cache(maxsize=64)
def usdt_probes(path: str) -> frozenset[tuple[str, str]] | None:
    """(provider, name) of the USDT probes in a binary's ``.note.stapsdt`` (``readelf -n``);
    None where readelf is missing or fails."""
    readelf = shutil.which("readelf")
    if readelf is None:
        return None
    try:
        r = subprocess.run([readelf, "-n", "--wide", path], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    if r.returncode != 0:
        return None
    found = re.findall(r"Provider: (\S+)\s+Name: (\S+)", r.stdout)
    return frozenset(found)


def resolve(lib: str, text: str, program: bool = False) -> str:
    """A library (or, with ``program``, a program) by path, linker-cache name or PATH -> its
    real path; ValueError where it is not found or its path cannot be put in a probe."""
    path: str | None = None
    if "/" in lib:
        path = lib if os.path.isfile(lib) else None
    else:
        path = linker_cache().get(lib) or next((p for n, p in sorted(linker_cache().items())
                                               if n.startswith(lib + ".")), None)
        if path is None and program:
            path = shutil.which(lib)
    if path is None:
        where = "no such file" if "/" in lib else "not in the dynamic linker's cache (ldconfig -p)" + \
            (" nor on PATH" if program else "") + "; give its path"
        raise ValueError(f"probe {text!r}: {lib!r}: {where}")
    real = os.path.realpath(path)
    if not _PATH.match(real):
        raise ValueError(f"probe {text!r}: the path {real!r} has characters a probe cannot name")
    if not os.access(real, os.R_OK):
        raise ValueError(f"probe {text!r}: {real!r} is not readable")
    return real


@functools.lru_cache(maxsize=1)
def linker_cache() -> dict[str, str]:
    """Library name -> path of this machine's architecture, from ``ldconfig -p``."""
    exe = shutil.which("ldconfig") or ("/sbin/ldconfig" if os.path.exists("/sbin/ldconfig") else None)
    if exe is None:
        return {}
    try:
        out = subprocess.run([exe, "-p"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    arch = {"x86_64": "x86-64", "aarch64": "AArch64"}.get(os.uname().machine, "")
    found: dict[str, str] = {}
    for line in out.splitlines():
        m = re.match(r"^\s+(\S+) \(([^)]*)\) => (\S+)$", line)
        if m and (not arch or arch in m.group(2)) and m.group(1) not in found:
            found[m.group(1)] = m.group(3)
    return found


# ---- the bpftrace program ------------------------------------------------------------------

ANCESTRY_DEPTH = 24  # parent links walked to tell whether a process descends from the root


def script(specs: tuple[ProbeSpec, ...], root_pid: int, calibration_tid: int, libc: str,
           include_root: bool = True) -> str:
    """bpftrace's program: a ready line, clock calibration, one pair of probes (or one USDT
    probe) per spec.  Calls are recorded only in the root process and its descendants (a
    process's membership is decided on its first probed call by walking its parents, then
    kept in ``@in``; bpftrace itself is left out; without ``include_root`` only the root's
    descendants are).  Lines:

    ``P,<probe>,<pid>,<tid>,<entry ns>,<return ns>,<arg0>..<arg5>,<return value>`` per call;
    ``C,<ns>`` per calibration call (libc getppid() by the calibrating thread); at the end
    ``@n[<pid>, <probe>]: <calls>``, the calls counted in the kernel (events the perf ring
    could not hold are counted there too)."""
    lines = ['BEGIN { printf("R,%llu\\n", nsecs); }',
             f"uprobe:{libc}:getppid /tid == {calibration_tid}/ {{ printf(\"C,%llu\\n\", nsecs); }}"]
    member = _membership(root_pid, include_root)
    for i, s in enumerate(specs):
        args = ",".join(f"(int64)arg{j}" if j < s.nargs else "0" for j in range(MAX_ARGS))
        if s.kind == "usdt":
            lines.append(f"usdt:{s.lib}:{s.function} {{ {member} if (@in[pid] == 1) {{ "
                         f"$now = nsecs; printf(\"P,{i},%d,%d,%llu,%llu,%ld,%ld,%ld,%ld,%ld,%ld,0\\n\", pid, tid, "
                         f"$now, $now, {args}); @n[pid, {i}] = count(); }} }}")
            continue
        saves = " ".join(f"@a{j}[tid, {i}] = (int64)arg{j};" for j in range(s.nargs))
        lines.append(f"uprobe:{s.lib}:{s.function} {{ {member} if (@in[pid] == 1) {{ "
                     f"@s[tid, {i}] = nsecs; {saves} }} }}")
        got = ",".join(f"@a{j}[tid, {i}]" if j < s.nargs else "0" for j in range(MAX_ARGS))
        drop = " ".join(f"delete(@a{j}[tid, {i}]);" for j in range(s.nargs))
        lines.append(f"uretprobe:{s.lib}:{s.function} /@s[tid, {i}]/ {{ "
                     f"printf(\"P,{i},%d,%d,%llu,%llu,%ld,%ld,%ld,%ld,%ld,%ld,%ld\\n\", pid, tid, @s[tid, {i}], nsecs, "
                     f"{got}, (int64)retval); @n[pid, {i}] = count(); delete(@s[tid, {i}]); {drop} }}")
    uprobes = [s for s in specs if s.kind == "uprobe"]
    maps = ["@n", "@in"] + (["@s"] if uprobes else []) + [f"@a{j}" for j in range(MAX_ARGS)
                                                           if any(s.nargs > j for s in uprobes)]
    lines.append("END { print(@n); " + " ".join(f"clear({m});" for m in maps) + " }")
    return "\n".join(lines) + "\n"


def _membership(root_pid: int, include_root: bool) -> str:
    """bpftrace statements setting ``@in[pid]`` (1: of the run, 2: not) on a process's first call."""
    up = "" if include_root else " $t = $t->real_parent;"
    return (f"if (@in[pid] == 0) {{ @in[pid] = 2; if (comm != \"bpftrace\") {{ $t = (struct task_struct *)curtask;{up} $i = 0; "
            f"while ($i < {ANCESTRY_DEPTH}) {{ if ($t->tgid == {root_pid}) {{ @in[pid] = 1; break; }} "
            f"if ($t->tgid <= 1) {{ break; }} $t = $t->real_parent; $i++; }} }} }}")
