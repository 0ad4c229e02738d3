"""``pastaprof diff BASE NEW`` and ``pastaprof.diff(base, new)``: what got slower, faster, new, gone.

Two runs (any mix of Kineto traces, folders of per-rank traces, run directories and loaded
Runs) are compared per step (the ``steps`` tool's table), per kernel, copy, op, module and
call site (see ``diff_collect`` for the kinds of entries), and by their findings.

Normalization: when both runs have steps, every time is the **mean per step** (what the run
spent inside its steps, divided by its step count; per step and rank with several ranks),
so a 3-step base and a 5-step new run compare fairly; otherwise both are **totals**.  The
result says which (``normalization``, ``normalization_note``).

Matching: kernels by :func:`~pastaprof.report.diff_names.normalize_kernel_name`, ops by
name (``ProfilerStep#N`` as one), modules by path, call sites by ``file(line): function``.
What is left unmatched on both sides is then paired by family, only one to one: one base
kernel and one new kernel that differ only in template arguments, one call site whose line
moved (entry ``match`` = ``family``).  Findings match by ``id`` when they have one, else by
tool, kind of title (numbers left out) and location.

Gate (``--fail-above PCT``): the largest added time among regressions, new entries and the
mean step wall time, as a share of the base's step time (per step) or of its total time
(first to last event, summed over ranks); above PCT the command exits 3.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from pastaprof.errors import UsageError
from pastaprof.report.diff_collect import ENTITY_KINDS, STEP_COLUMNS, Agg, Side, open_side
from pastaprof.report.diff_names import call_site_family, normalize_kernel_name
from pastaprof.store.run import Run

JSON_FORMAT_VERSION = 1
EXIT_REGRESSION = 3
_ORDER = {k: i for i, k in enumerate(ENTITY_KINDS)}
ENTRY_SCHEMA = pa.schema([
    ("kind", pa.string()), ("name", pa.string()), ("base_ns", pa.float64()), ("new_ns", pa.float64()),
    ("delta_ns", pa.float64()), ("ratio", pa.float64()), ("base_total_ns", pa.int64()),
    ("new_total_ns", pa.int64()), ("base_count", pa.int64()), ("new_count", pa.int64()),
    ("match", pa.string()), ("base_name", pa.string()), ("new_name", pa.string()),
])
STEP_SCHEMA = pa.schema([("name", pa.string()), ("base_ns", pa.float64()), ("new_ns", pa.float64()),
                         ("delta_ns", pa.float64()), ("ratio", pa.float64())])
FINDING_SCHEMA = pa.schema([("tool", pa.string()), ("severity", pa.string()), ("title", pa.string()),
                            ("location", pa.string()), ("key", pa.string())])


@dataclass
class Diff:
    """What ``pastaprof.diff`` returns.  Entry tables (``regressions``, ``improvements``, ``new``,
    ``vanished``) have ENTRY_SCHEMA's columns: ``base_ns``/``new_ns``/``delta_ns`` normalized
    (see ``normalization``), ``*_total_ns`` and ``*_count`` as counted in each run."""

    regressions: pa.Table
    improvements: pa.Table
    new: pa.Table
    vanished: pa.Table
    steps: pa.Table
    findings_resolved: pa.Table
    findings_introduced: pa.Table
    normalization: str                   # "per step" or "total"
    normalization_note: str
    base_time_ns: float                  # the gate's denominator: mean base step, or base total time
    sources: dict[str, dict[str, Any]] = field(default_factory=dict)
    unchanged: int = 0

    def worst(self) -> dict[str, Any] | None:
        """The largest added time (regression, new entry or step wall time) and its share (%) of
        ``base_time_ns``; None when nothing was added."""
        best: dict[str, Any] | None = None
        cands = self.regressions.slice(0, 1).to_pylist() + self.new.slice(0, 1).to_pylist()
        cands += [{"kind": "step", "name": r["name"], "delta_ns": r["delta_ns"]}
                  for r in self.steps.to_pylist() if r["name"] == "wall"]
        for r in cands:
            if r["delta_ns"] is not None and r["delta_ns"] > 0 and (best is None or r["delta_ns"] > best["delta_ns"]):
                best = {"kind": r["kind"], "name": r["name"], "delta_ns": r["delta_ns"],
                        "shown_name": r.get("new_name") or r.get("base_name") or r["name"]}
        if best is not None:
            best["share_pct"] = 100 * best["delta_ns"] / self.base_time_ns if self.base_time_ns else math.inf
        return best

    def exceeds(self, pct: float) -> bool:
        """Whether the worst added time is more than ``pct`` percent of the base time."""
        w = self.worst()
        return w is not None and w["share_pct"] > pct

    def to_dict(self, fail_above: float | None = None) -> dict[str, Any]:
        """The JSON document of ``pastaprof diff --json``."""
        doc: dict[str, Any] = {
            "format_version": JSON_FORMAT_VERSION, "sources": self.sources,
            "normalization": self.normalization, "normalization_note": self.normalization_note,
            "regressions": _rows(self.regressions), "improvements": _rows(self.improvements),
            "new": _rows(self.new), "vanished": _rows(self.vanished),
            "findings": {"resolved": self.findings_resolved.to_pylist(),
                         "introduced": self.findings_introduced.to_pylist()},
            "steps": {"normalization": self.normalization,
                      "base_steps": self.sources.get("base", {}).get("steps", 0),
                      "new_steps": self.sources.get("new", {}).get("steps", 0),
                      "rows": _rows(self.steps)},
            "unchanged": self.unchanged,
        }
        worst = self.worst()
        gate: dict[str, Any] = {"base_time_ns": _num(self.base_time_ns), "worst": _clean(worst)}
        if fail_above is not None:
            gate["fail_above_pct"] = fail_above
            gate["exceeded"] = worst is not None and worst["share_pct"] > fail_above
        doc["gate"] = gate
        return doc


def _num(v: Any) -> Any:
    if isinstance(v, float):
        if not math.isfinite(v):
            return None
        return int(v) if v.is_integer() and abs(v) < 2**63 else round(v, 3)
    return v


def _clean(d: dict[str, Any] | None) -> dict[str, Any] | None:
    if d is None:
        return None
    return {k: (round(v, 6) if k == "share_pct" and math.isfinite(v) else _num(v)) for k, v in d.items()}


def _rows(t: pa.Table) -> list[dict[str, Any]]:
    out = []
    for r in t.to_pylist():
        out.append({k: (round(v, 6) if k == "ratio" and isinstance(v, float) else _num(v)) for k, v in r.items()})
    return out


def _family(kind: str, a: Agg) -> str | None:
    if kind == "kernel":
        return normalize_kernel_name(a.name, keep_templates=False)
    if kind in ("call_site", "call_site_gpu"):
        return call_site_family(a.name)
    return None


def _pairs(kind: str, base: dict[str, Agg], new: dict[str, Agg]) -> list[tuple[str, Agg | None, Agg | None, str]]:
    """(name, base Agg, new Agg, match) for every key: by key, then by family one to one."""
    out = [(k, base[k], new[k], "name") for k in base.keys() & new.keys()]
    left_b = {k: a for k, a in base.items() if k not in new}
    left_n = {k: a for k, a in new.items() if k not in base}
    fam_b: dict[str, list[str]] = {}
    fam_n: dict[str, list[str]] = {}
    for left, fam in ((left_b, fam_b), (left_n, fam_n)):
        for k, a in left.items():
            f = _family(kind, a)
            if f is not None:
                fam.setdefault(f, []).append(k)
    for f in fam_b.keys() & fam_n.keys():
        if len(fam_b[f]) == 1 and len(fam_n[f]) == 1:
            kb, kn = fam_b[f][0], fam_n[f][0]
            out.append((f, left_b.pop(kb), left_n.pop(kn), "family"))
    out += [(k, a, None, "name") for k, a in left_b.items()]
    out += [(k, None, a, "name") for k, a in left_n.items()]
    return out


def _entry(kind: str, name: str, b: Agg | None, n: Agg | None, match: str, bdiv: int, ndiv: int) -> dict[str, Any]:
    bt, nt = (b.total if b else 0), (n.total if n else 0)
    bns, nns = bt / bdiv, nt / ndiv
    delta = (nt * bdiv - bt * ndiv) / (bdiv * ndiv)  # exact integers, one rounding: equal changes sort as ties
    return {"kind": kind, "name": name, "base_ns": bns, "new_ns": nns, "delta_ns": delta,
            "ratio": nns / bns if b and bns else None, "base_total_ns": bt, "new_total_ns": nt,
            "base_count": b.count if b else 0, "new_count": n.count if n else 0, "match": match,
            "base_name": b.name if b else None, "new_name": n.name if n else None}


def _table(rows: list[dict[str, Any]], key: Any) -> pa.Table:
    rows.sort(key=key)
    return pa.Table.from_pylist(rows, schema=ENTRY_SCHEMA)


def _normalization(b: Side, n: Side) -> tuple[bool, str]:
    per_step = bool(b.n_steps and n.n_steps)
    if per_step:
        unit = "step and rank" if max(b.ranks, n.ranks) > 1 else "step"
        return True, f"mean per {unit} ({b.n_steps} base, {n.n_steps} new steps; work outside steps not counted)"
    missing = " and ".join(w for w, s in (("base", b), ("new", n)) if not s.n_steps)
    return False, f"totals: {missing} {'has' if ' and ' not in missing else 'have'} no steps"


def compare(b: Side, n: Side) -> Diff:
    """The diff of two loaded sides."""
    per_step, note = _normalization(b, n)
    bdiv, ndiv = (b.n_steps, n.n_steps) if per_step else (1, 1)
    bt = b.totals(per_step)
    nt = bt if n is b else n.totals(per_step)
    reg, imp, new, gone, same = [], [], [], [], 0
    for kind in ENTITY_KINDS:
        for name, x, y, match in _pairs(kind, bt[kind], nt[kind]):
            e = _entry(kind, name, x, y, match, bdiv, ndiv)
            if x is None:
                new.append(e)
            elif y is None:
                gone.append(e)
            elif e["delta_ns"] > 0:
                reg.append(e)
            elif e["delta_ns"] < 0:
                imp.append(e)
            else:
                same += 1
    steps = []
    if per_step:
        bm, nm = b.step_means(), n.step_means()
        for c in STEP_COLUMNS:
            steps.append({"name": c, "base_ns": bm[c], "new_ns": nm[c], "delta_ns": nm[c] - bm[c],
                          "ratio": nm[c] / bm[c] if bm[c] else None})
    base_time = b.step_means()["wall"] if per_step else float(b.span_ns)
    new_keys = {f["key"] for f in n.findings}
    base_keys = {f["key"] for f in b.findings}

    def fs(findings: list[dict[str, Any]], other: set[str]) -> pa.Table:
        seen: dict[str, dict[str, Any]] = {}
        for f in findings:
            if f["key"] not in other and f["key"] not in seen:
                seen[f["key"]] = {c: (None if f.get(c) is None else str(f.get(c))) for c in FINDING_SCHEMA.names}
        return pa.Table.from_pylist(list(seen.values()), schema=FINDING_SCHEMA)

    def order(e: dict[str, Any]) -> tuple:
        return _ORDER[e["kind"]], e["name"]

    return Diff(
        regressions=_table(reg, lambda e: (-e["delta_ns"], *order(e))),
        improvements=_table(imp, lambda e: (e["delta_ns"], *order(e))),
        new=_table(new, lambda e: (-e["new_ns"], *order(e))),
        vanished=_table(gone, lambda e: (-e["base_ns"], *order(e))),
        steps=pa.Table.from_pylist(steps, schema=STEP_SCHEMA),
        findings_resolved=fs(b.findings, new_keys), findings_introduced=fs(n.findings, base_keys),
        normalization="per step" if per_step else "total", normalization_note=note,
        base_time_ns=base_time, unchanged=same,
        sources={w: {"source": s.source, "steps": s.n_steps, "rule": s.rule, "ranks": s.ranks,
                     "total_time_ns": s.span_ns} for w, s in (("base", b), ("new", n))},
    )


def _same_source(a: Any, b: Any) -> bool:
    if isinstance(a, Run) or isinstance(b, Run):
        return a is b
    try:
        return Path(a).resolve() == Path(b).resolve()
    except (OSError, RuntimeError, ValueError):
        return False


def diff(base: str | Path | Run, new: str | Path | Run, tools: Sequence[str] | None = None,
         ranks: Sequence[int] | None = None) -> Diff:
    """Compare two runs or traces (paths or loaded Runs).  ``tools``: the tools whose findings
    are compared (default: kernels, ops, timeline, memory, steps; ``steps`` always runs)."""
    b = open_side(base, tools, ranks)
    n = b if _same_source(base, new) else open_side(new, tools, ranks)
    return compare(b, n)


def diff_main(base: Path, new: Path, json_out: Path | None, fail_above: float | None, rows: int,
              quiet: bool) -> int:
    """The ``pastaprof diff`` command: terminal tables, ``--json``, the exit code (0, or 3 above
    ``--fail-above``)."""
    import sys

    import orjson

    from pastaprof.report.diff_terminal import gate_line, print_diff
    from pastaprof.store.outputs import check_not_input, check_output_file, is_stdout, write_output

    if fail_above is not None and not (math.isfinite(fail_above) and fail_above >= 0):
        raise UsageError(f"--fail-above takes a percentage >= 0, not {fail_above}")
    if json_out is not None:
        check_not_input(json_out, (base, new))
        check_output_file(json_out)  # before the analysis, not after it
    d = diff(base, new)
    if not quiet:
        print_diff(d, max_rows=rows, stderr=is_stdout(json_out), fail_above=fail_above)
    if json_out is not None:
        data = orjson.dumps(d.to_dict(fail_above), option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY)
        write_output(json_out, data + b"\n")
    if fail_above is not None and d.exceeds(fail_above):
        if quiet:
            sys.stderr.write(gate_line(d, fail_above) + "\n")
        return EXIT_REGRESSION
    return 0
