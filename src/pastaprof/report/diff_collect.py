"""One side of a diff: a run's time per kernel, copy, op, module and call site, and its findings.

Times are summed over ranks, from the event tables themselves (not from the tools' capped
tables), vectorized: one ``bincount`` per kind over name codes, Python work only per
distinct name.  With ``per_step`` only what happened inside the steps the ``steps`` tool
found is counted -- GPU work by the start of the call that launched it (its own start when
no call is known), ops by their start -- so a mean per step is what one step costs.

Kinds of entries (each keyed so it matches across runs, see ``diff_names``):

``kernel``, ``memcpy``, ``memset``
    GPU time by normalized kernel name / copy name.
``op_gpu``, ``module_gpu``, ``call_site_gpu``
    GPU time of the work an op launched itself, by op name, by the op's module, by its call site.
``op``
    host time of the op (inclusive of the ops it calls), by op name.
``module``, ``call_site``
    host time of top-level ops (depth 0: nested ops are inside them), by module / call site.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pastaprof.errors import InputError
from pastaprof.events.schema import GPU_ACTIVITY_KINDS
from pastaprof.report.diff_names import finding_key, normalize_kernel_name, op_key
from pastaprof.store.run import Run
from pastaprof.tools._timeline_math import KeyIndex, name_codes, to_np, window_of

ENTITY_KINDS = ("kernel", "memcpy", "memset", "op_gpu", "op", "module_gpu", "module", "call_site_gpu", "call_site")
FINDING_TOOLS = ("kernels", "ops", "timeline", "memory", "steps")
STEP_COLUMNS = ("wall", "gpu_busy", "gpu_idle", "host_wait", "kernel_wait", "other_idle", "compute",
                "communication", "memory", "other_gpu")
NO_MODULE = "(no module)"
_SPAN_KINDS = ("op", "api", "range", *GPU_ACTIVITY_KINDS)


@dataclass
class Agg:
    """One entry of one side: summed ns, event count, and ns per original name under the key."""

    total: int = 0
    count: int = 0
    names: dict[str, int] = field(default_factory=dict)

    @property
    def name(self) -> str:
        """The original name that took most of the time (ties: the first in order)."""
        return min(self.names.items(), key=lambda kv: (-kv[1], kv[0]))[0] if self.names else ""


Totals = dict[str, dict[str, Agg]]  # kind -> key -> Agg


def _add(into: dict[str, Agg], codes: np.ndarray, ns: np.ndarray, names: list[str],
         key: Callable[[str], str]) -> None:
    """Sum ``ns`` per name code, then per key of the name (one Python step per distinct name)."""
    if len(codes) == 0:
        return
    total = np.bincount(codes, weights=ns.astype(np.float64), minlength=len(names))
    count = np.bincount(codes, minlength=len(names))
    for i in np.flatnonzero(count).tolist():
        a = into.setdefault(key(names[i]), Agg())
        t = int(round(float(total[i])))
        a.total += t
        a.count += int(count[i])
        a.names[names[i]] = a.names.get(names[i], 0) + t


def _codes(col: pa.ChunkedArray) -> tuple[np.ndarray, list[str], np.ndarray]:
    """Name codes, distinct names and a validity mask of a (dictionary) string column."""
    codes, names = name_codes(col)
    valid = np.asarray(pc.is_valid(col).to_numpy(zero_copy_only=False), bool) if len(col) else np.zeros(0, bool)
    return codes, names, valid


def check_source(path: Path) -> None:
    """A folder that mixes a run directory with trace files is refused: which one to compare
    would be a guess (``load`` reads a run directory's run.json and ignores traces beside it,
    and reads a folder's traces and ignores run directories in it)."""
    from pastaprof.api import is_run_dir
    from pastaprof.importers import TRACE_SUFFIXES
    from pastaprof.importers.ranks import show
    from pastaprof.store.writer import MANIFEST

    try:
        if not path.is_dir():
            return
        entries = sorted(os.scandir(path), key=lambda e: e.name)
        traces = [e.name for e in entries if e.name.endswith(TRACE_SUFFIXES) and e.name != MANIFEST
                  and not e.name.startswith(".") and e.is_file()]
        runs = [e.name for e in entries if e.is_dir() and is_run_dir(Path(e.path))]
        here = is_run_dir(path)
    except OSError:
        return  # what cannot be read here, loading it names precisely (a link loop, permissions)
    if here and traces:
        raise InputError(path, f"holds a run (run.json) and a trace ({show(traces[0])}): give the run "
                               "directory or a trace, not both in one folder")
    if runs and traces:
        raise InputError(path, f"holds traces ({show(traces[0])}) and a run directory ({show(runs[0])}/): "
                               "give one of them")
    if runs and not here:
        raise InputError(path, f"holds run directories ({show(runs[0])}/), not one run: give one of them")


@dataclass
class Side:
    """A loaded run with what the diff needs from it."""

    source: str
    run: Run
    findings: list[dict[str, Any]]
    steps: pa.Table | None          # the steps tool's table (None: no steps found)
    rule: str
    span_ns: int                    # sum over ranks of the time from first to last event
    _windows: dict[int, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)

    @property
    def n_steps(self) -> int:
        """Step rows: steps x ranks that have them."""
        return 0 if self.steps is None else self.steps.num_rows

    @property
    def ranks(self) -> int:
        return len(self.run.ranks)

    def step_means(self) -> dict[str, float]:
        """Mean per step row of the step table's time columns (null GPU columns count as 0)."""
        if not self.n_steps:
            return {}
        assert self.steps is not None
        out = {}
        for c in STEP_COLUMNS:
            col = self.steps[f"{c}_ns"]
            out[c] = float(pc.sum(pc.fill_null(col, 0)).as_py() or 0) / self.n_steps
        return out

    def in_steps(self, rank: np.ndarray, t: np.ndarray) -> np.ndarray:
        """Whether each (rank, time) falls inside one of the rank's steps."""
        keep = np.zeros(len(t), bool)
        for r, (lo, hi) in self._windows.items():
            m = np.flatnonzero(rank == r)
            if len(m):
                keep[m] = window_of(t[m], lo, hi) >= 0
        return keep

    def totals(self, per_step: bool) -> Totals:
        """Every entry kind's Agg per key; inside the steps only with ``per_step``."""
        out: Totals = {k: {} for k in ENTITY_KINDS}
        run = self.run
        op = run.table("op")
        o_rank, o_start, o_end = to_np(op["rank"], dtype=np.int32), to_np(op["start_ns"]), to_np(op["end_ns"])
        o_name, o_names, _ = _codes(op["name"])
        o_mod, o_mods, o_mod_ok = _codes(op["module"])
        o_site, o_sites, o_site_ok = _codes(op["call_site"])
        mods = [m if ok else NO_MODULE for m, ok in zip(o_mods, self._valid_names(o_mod, o_mod_ok, len(o_mods)))]
        o_index = KeyIndex(o_rank, to_np(op["id"]))
        api = run.table("api")
        a_index = KeyIndex(to_np(api["rank"], dtype=np.int32), to_np(api["correlation"]))
        a_start = to_np(api["start_ns"])
        for kind in GPU_ACTIVITY_KINDS:
            t = run.table(kind)
            if not t.num_rows:
                continue
            start, rank = to_np(t["start_ns"]), to_np(t["rank"], dtype=np.int32)
            ns = np.maximum(to_np(t["end_ns"]) - start, 0)
            call = a_index.find(rank, to_np(t["correlation"]))
            launch = np.where(call >= 0, a_start[np.maximum(call, 0)] if len(a_start) else start, start)
            keep = self.in_steps(rank, launch) if per_step else np.ones(len(start), bool)
            codes, names = name_codes(t["name"])
            _add(out[kind], codes[keep], ns[keep], names, normalize_kernel_name if kind == "kernel" else str)
            row = o_index.find(rank, to_np(t["op_id"]))
            att = keep & (row >= 0)
            r = row[att]
            _add(out["op_gpu"], o_name[r], ns[att], o_names, op_key)
            _add(out["module_gpu"], o_mod[r], ns[att], mods, str)
            ok = o_site_ok[r]
            _add(out["call_site_gpu"], o_site[r][ok], ns[att][ok], o_sites, str)
        if op.num_rows:
            keep = self.in_steps(o_rank, o_start) if per_step else np.ones(op.num_rows, bool)
            cpu = np.maximum(o_end - o_start, 0)
            _add(out["op"], o_name[keep], cpu[keep], o_names, op_key)
            top = keep & (to_np(op["depth"], fill=0) == 0)
            _add(out["module"], o_mod[top], cpu[top], mods, str)
            site = top & o_site_ok
            _add(out["call_site"], o_site[site], cpu[site], o_sites, str)
        return out

    @staticmethod
    def _valid_names(codes: np.ndarray, valid: np.ndarray, n: int) -> list[bool]:
        """Per distinct name: whether any row with that code is a real (non-null) value."""
        seen = np.zeros(n, bool)
        seen[codes[valid]] = True
        return seen.tolist()


def _span_ns(run: Run) -> int:
    """Sum over ranks of last end - first start (host and GPU events): a run's total time."""
    lo: dict[int, int] = {}
    hi: dict[int, int] = {}
    for kind in _SPAN_KINDS:
        t = run.table(kind)
        if not t.num_rows:
            continue
        g = t.group_by("rank", use_threads=False).aggregate([("start_ns", "min"), ("end_ns", "max")])
        for r, a, b in zip(g["rank"].to_pylist(), g["start_ns_min"].to_pylist(), g["end_ns_max"].to_pylist()):
            if a is None or b is None:
                continue
            lo[r] = min(lo.get(r, a), a)
            hi[r] = max(hi.get(r, b), b)
    return sum(max(0, hi[r] - lo[r]) for r in lo)


def open_side(source: str | Path | Run, tools: Sequence[str] | None = None,
              ranks: Sequence[int] | None = None) -> Side:
    """Load ``source`` (a trace, a folder of per-rank traces, a run directory or a Run) and run
    the finding tools (and ``steps``) on it."""
    from pastaprof.api import analyze, load

    if isinstance(source, Run):
        run = source if ranks is None else source.select_ranks(list(ranks))
        label = str(run.path or run.manifest.get("source") or "run")
    else:
        path = Path(source)
        check_source(path)
        run = load(path, ranks=ranks)
        label = str(source)
    wanted = list(tools) if tools is not None else list(FINDING_TOOLS)
    if "steps" not in wanted:
        wanted.append("steps")
    reports = analyze(run, tools=wanted)
    findings = []
    for rep in reports:
        for f in rep.findings:
            d = f.to_dict()
            if getattr(f, "id", None) is not None:
                d["id"] = f.id  # type: ignore[attr-defined]
            d["key"] = finding_key(d)
            findings.append(d)
    steps_rep = next(r for r in reports if r.tool == "steps")
    table = steps_rep.tables.get("steps")
    side = Side(label, run, findings, table if table is not None and table.num_rows else None,
                str(steps_rep.summary.get("rule", "none")), _span_ns(run))
    if side.steps is not None:
        s = side.steps.sort_by([("rank", "ascending"), ("start_ns", "ascending")])
        for r in pc.unique(s["rank"]).to_pylist():
            m = s.filter(pc.equal(s["rank"], r))
            side._windows[r] = (to_np(m["start_ns"]), to_np(m["end_ns"]))
    return side
