"""ops -- DL workload characterization: framework ops and the GPU work they cause.

Per op name (and rolled up per module and per call site where the trace knows
them): calls, CPU time inclusive (``cpu_ns``) and self (``self_cpu_ns``: the op's
time minus that of the ops directly nested in it on its thread, so summing
``self_cpu_ns`` over ops never counts a nanosecond twice), GPU time of the
kernels/copies the op itself launched (``self_gpu_ns``) and of everything
launched inside it (``gpu_ns``), kernels per call, dominant kernel, the most
common input shapes, and the launch-to-start delay of the GPU work the op
launched (``launch_delay_ns``: mean of activity start minus the start of its
launching runtime call, matched by correlation; large values mean the work
queued behind earlier work, small ones that the GPU was waiting for the host).

GPU work is attributed to the innermost op that launched it (``op_id``), so
summing ``self_gpu_ns`` over all ops gives exactly the linked GPU time; the
inclusive ``gpu_ns`` adds the GPU time of descendant ops.
"""

from __future__ import annotations

from typing import Any

import duckdb
import numpy as np
import pyarrow as pa

from pastaprof.tools._by_rank import rank_rows
from pastaprof.tools._codes import find_keys
from pastaprof.tools._timeline_math import name_codes
from pastaprof.tools.base import DATA_NOTE, NO_ESTIMATE, Finding, Report, Tool, sql

UNATTRIBUTED_WARN_SHARE = 0.05   # >5% of GPU time not linked to any op is worth a warning


def _inclusive(depth: np.ndarray, ppos: np.ndarray, self_gpu: np.ndarray) -> np.ndarray:
    """Per op: its own GPU time plus that of all its descendants (``ppos``: the row of each
    op's parent, -1 for none; parents are on the op's own rank)."""
    total = self_gpu.astype(np.int64).copy()
    # Push sums upwards one level at a time, deepest first (vectorized per level).
    for d in np.unique(depth[depth > 0])[::-1]:
        rows = np.nonzero((depth == d) & (ppos >= 0))[0]
        np.add.at(total, ppos[rows], total[rows])
    return total


def _self_cpu(ppos: np.ndarray, cpu: np.ndarray) -> np.ndarray:
    """Per op: its CPU time minus that of the ops directly nested in it (never below 0)."""
    child = np.zeros(len(cpu), np.int64)
    ok = ppos >= 0
    np.add.at(child, ppos[ok], cpu[ok])
    return np.maximum(cpu - child, 0)


def _launch_delays(kernel: pa.Table, api: pa.Table) -> pa.Table:
    """Per kernel launch with a known runtime call: rank, op_id, start minus the call's start."""
    from pastaprof.tools._timeline_math import KeyIndex, to_np

    row = KeyIndex(to_np(api["rank"], dtype=np.int32), to_np(api["correlation"])).find(
        to_np(kernel["rank"], dtype=np.int32), to_np(kernel["correlation"]))
    ok = row >= 0
    start = to_np(kernel["start_ns"])[ok]
    delay = start - to_np(api["start_ns"])[row[ok]]
    return pa.table({"rank": to_np(kernel["rank"], dtype=np.int32)[ok], "op_id": to_np(kernel["op_id"])[ok],
                     "delay": delay})


class Ops(Tool):
    name = "ops"
    description = "Per framework op and module: calls, CPU time, GPU time of launched kernels, dominant kernel, shapes"
    consumes = ("op", "kernel", "memcpy", "memset", "api")

    def report(self) -> Report:
        op = self.table("op")
        con = sql(k=self.table("kernel"), c=self.table("memcpy"), s=self.table("memset"),
                  lag=_launch_delays(self.table("kernel"), self.table("api")))
        con.execute("""
            CREATE TEMP TABLE gpu AS
            SELECT rank, op_id, CAST(name AS VARCHAR) AS kname, end_ns - start_ns AS d FROM k
            UNION ALL SELECT rank, op_id, CAST(name AS VARCHAR), end_ns - start_ns FROM c
            UNION ALL SELECT rank, op_id, CAST(name AS VARCHAR), end_ns - start_ns FROM s
        """)
        ops = _per_op_table(op, _attribute(con, op))
        con.register("ops_raw", ops)
        con.execute("CREATE TEMP VIEW ops AS SELECT * REPLACE (CAST(name AS VARCHAR) AS name, "
                    "CAST(module AS VARCHAR) AS module, CAST(call_site AS VARCHAR) AS call_site) FROM ops_raw")
        by_name = _by_name(con)
        by_module, by_module_type, by_site = _rollups(con)
        totals = con.execute("""
            SELECT (SELECT coalesce(sum(d), 0) FROM gpu)::BIGINT,
                   (SELECT coalesce(sum(d), 0) FROM gpu WHERE op_id IS NOT NULL)::BIGINT,
                   (SELECT count(*) FROM ops),
                   (SELECT count(input_shapes) FROM ops WHERE NOT is_backward),
                   (SELECT count(*) FROM ops WHERE NOT is_backward)
        """).fetchall()[0]
        summary = {"ops": int(totals[2]), "gpu_ns": int(totals[0]), "attributed_gpu_ns": int(totals[1]),
                   "attributed_share": round(totals[1] / totals[0], 4) if totals[0] else None,
                   "distinct_ops": by_name.num_rows,
                   # shapes of some forward ops only: `pastaprof run --shapes sample` (the default)
                   "forward_ops_with_shapes": int(totals[3]),
                   "shapes": "none" if not totals[3] else "sampled" if totals[3] < totals[4] else "all"}
        findings = _findings(totals, summary, by_name)
        tables = {"ops": by_name, "module types": by_module_type, "modules": by_module, "call sites": by_site}
        if not any(self.table(k).num_rows for k in ("kernel", "memcpy", "memset")):
            # a CPU-only run: its GPU columns are null (not zeros that read as ops launching nothing),
            # so the terminal and the page leave them out; the summary says why
            tables = {name: _without_gpu(t) for name, t in tables.items()}
            summary = {"ops": summary["ops"], "note": "no GPU activity in this run: CPU times only",
                       **{k: v for k, v in summary.items() if k not in ("ops", "gpu_ns", "attributed_gpu_ns",
                                                                        "attributed_share")}}
        return Report(self.name, tables=tables, findings=findings, summary=summary, details={"per op": ops})


GPU_COLUMNS = ("self_gpu_ns", "gpu_ns", "kernels", "kernels_per_call", "dominant_kernel", "launch_delay_ns",
               "max_launch_delay_ns", "backward_gpu_ns")


def _without_gpu(t: pa.Table) -> pa.Table:
    """``t`` with its GPU columns (``GPU_COLUMNS``) all null, of the same types."""
    for c in GPU_COLUMNS:
        if c in t.column_names:
            i = t.schema.get_field_index(c)
            t = t.set_column(i, t.schema.field(i), pa.nulls(t.num_rows, t.schema.field(i).type))
    return t


def _attribute(con: duckdb.DuckDBPyConnection, op: pa.Table) -> dict[str, np.ndarray]:
    """Per op row: the GPU time and launches of the work it launched itself (``gpu`` rows whose
    (rank, op_id) is the op), that plus its descendants', its launch delays, and its parent's row."""
    per_op = con.sql(
        "SELECT rank, op_id, sum(d)::BIGINT AS gpu_ns, count(*) AS launches FROM gpu WHERE op_id IS NOT NULL GROUP BY ALL"
    ).to_arrow_table()
    per_op_lag = con.sql(
        "SELECT rank, op_id, sum(delay)::BIGINT AS d, count(*) AS n, max(delay)::BIGINT AS mx FROM lag "
        "WHERE op_id >= 0 GROUP BY ALL"
    ).to_arrow_table()
    self_gpu = np.zeros(op.num_rows, dtype=np.int64)
    self_launch = np.zeros(op.num_rows, dtype=np.int64)
    incl = np.zeros(op.num_rows, dtype=np.int64)
    lag_sum = np.zeros(op.num_rows, dtype=np.int64)
    lag_n = np.zeros(op.num_rows, dtype=np.int64)
    lag_max = np.full(op.num_rows, -1, dtype=np.int64)
    ppos = np.full(op.num_rows, -1, dtype=np.int64)
    if op.num_rows:
        # by search (or arithmetic on consecutive ids), not an array indexed by id: ids are
        # data (a damaged store's op id of 3.6e17 asked numpy for 2.5 EiB)
        def col(t: pa.Table, name: str) -> np.ndarray:
            return np.asarray(t[name].to_numpy(zero_copy_only=False))

        ranks = col(op, "rank")
        all_ids = np.asarray(op["id"].fill_null(-1).to_numpy(zero_copy_only=False), dtype=np.int64)
        by_rank, gpu_of, lag_of = rank_rows(ranks), rank_rows(col(per_op, "rank")), rank_rows(col(per_op_lag, "rank"))
        gpu_oid, lag_oid = col(per_op, "op_id").astype(np.int64), col(per_op_lag, "op_id").astype(np.int64)
        gpu_cols = {"gpu_ns": col(per_op, "gpu_ns"), "launches": col(per_op, "launches")}
        lag_cols = {c: col(per_op_lag, c) for c in ("d", "n", "mx")}
        parent = np.asarray(op["parent_id"].fill_null(-1).to_numpy(zero_copy_only=False), dtype=np.int64)
        for r in by_rank.ranks():
            rows = by_rank[r]
            ids = all_ids[rows]
            ppos[rows] = find_keys(parent[rows], ids, rows)  # the row of each op's parent, or -1
            m = gpu_of[r]
            pos = find_keys(gpu_oid[m], ids, np.arange(len(rows), dtype=np.int64))
            ok = pos >= 0
            at = rows[pos[ok]]
            self_gpu[at] = gpu_cols["gpu_ns"][m][ok]
            self_launch[at] = gpu_cols["launches"][m][ok]
            m = lag_of[r]
            pos = find_keys(lag_oid[m], ids, np.arange(len(rows), dtype=np.int64))
            ok = pos >= 0
            at = rows[pos[ok]]
            for arr, c in ((lag_sum, "d"), (lag_n, "n"), (lag_max, "mx")):
                arr[at] = lag_cols[c][m][ok]
        depth = np.asarray(op["depth"].fill_null(0).to_numpy(zero_copy_only=False), dtype=np.int64)
        incl = _inclusive(depth, ppos, self_gpu)
    return {"self_gpu": self_gpu, "self_launch": self_launch, "incl": incl, "lag_sum": lag_sum, "lag_n": lag_n,
            "lag_max": lag_max, "ppos": ppos}


def _per_op_table(op: pa.Table, a: dict[str, np.ndarray]) -> pa.Table:
    """One row per op (the report's ``per op`` details): its columns plus CPU, self CPU, GPU and
    launch-delay figures."""
    cpu = (np.asarray(op["end_ns"]) - np.asarray(op["start_ns"])).astype(np.int64) if op.num_rows \
        else np.zeros(0, np.int64)
    return pa.table({
        # names stay dictionary-encoded (1.2 M ops as strings were ~0.5 GB more at the peak);
        # the ops view (Ops.report) reads them as VARCHAR
        "rank": op["rank"], "id": op["id"], "name": op["name"],
        "module": op["module"], "call_site": op["call_site"],
        "is_backward": op["is_backward"], "depth": op["depth"], "input_shapes": op["input_shapes"],
        "cpu_ns": pa.array(cpu, pa.int64()), "self_cpu_ns": pa.array(_self_cpu(a["ppos"], cpu), pa.int64()),
        "self_gpu_ns": pa.array(a["self_gpu"]), "gpu_ns": pa.array(a["incl"]),
        "self_launches": pa.array(a["self_launch"]),
        "launch_delay_sum_ns": pa.array(a["lag_sum"]), "delayed_launches": pa.array(a["lag_n"]),
        "max_launch_delay_ns": pa.array(a["lag_max"], mask=a["lag_max"] < 0),
        "module_top": pa.array(_module_top(op["module"], a["ppos"])),
    })


def _module_top(module: pa.ChunkedArray, ppos: np.ndarray) -> np.ndarray:
    """Per op: whether its parent op is of another module (or it has none): the ops whose
    inclusive time sums to the module's without counting a nested op of it twice."""
    if len(ppos) == 0:
        return np.zeros(0, bool)
    codes, _names = name_codes(module)  # no module: one code of its own
    has = ppos >= 0
    top = ~has
    top[has] = codes[ppos[has]] != codes[has]
    return top


def _by_name(con: duckdb.DuckDBPyConnection) -> pa.Table:
    """The ``ops`` table: per op name, calls, CPU and GPU times, kernels, dominant kernel, shapes."""
    dominant = """
        dom AS (SELECT o.name AS op_name, g.kname, sum(g.d) AS d FROM gpu g JOIN ops o
                ON g.op_id = o.id AND g.rank = o.rank GROUP BY ALL),
        domk AS (SELECT op_name, first(kname ORDER BY d DESC, kname) AS dominant_kernel, max(d)::BIGINT AS dominant_ns
                 FROM dom GROUP BY 1)"""
    by_name = con.sql(f"""
        WITH {dominant.strip()},
        shape_counts AS (SELECT name, input_shapes, count(*) AS c FROM ops
                         WHERE input_shapes IS NOT NULL GROUP BY ALL),
        shapes AS (SELECT name, first(input_shapes ORDER BY c DESC, input_shapes) AS shapes
                   FROM shape_counts GROUP BY 1),
        per_name AS (  -- ops aggregated by name first: the joins below see one row per name, not per op
            SELECT name, count(*) AS calls, sum(cpu_ns)::BIGINT AS cpu_ns, sum(self_cpu_ns)::BIGINT AS self_cpu_ns,
                   sum(self_gpu_ns)::BIGINT AS self_gpu_ns, sum(gpu_ns)::BIGINT AS gpu_ns,
                   sum(self_launches)::BIGINT AS kernels, round(sum(self_launches) / count(*), 2) AS kernels_per_call,
                   bool_or(is_backward) AS backward,
                   (sum(launch_delay_sum_ns) / NULLIF(sum(delayed_launches), 0))::BIGINT AS launch_delay_ns,
                   max(max_launch_delay_ns) AS max_launch_delay_ns
            FROM ops GROUP BY name)
        SELECT o.name, o.calls, o.cpu_ns, o.self_cpu_ns, o.self_gpu_ns, o.gpu_ns, o.kernels, o.kernels_per_call,
               domk.dominant_kernel, shapes.shapes AS input_shapes, o.backward, o.launch_delay_ns,
               o.max_launch_delay_ns
        FROM per_name o LEFT JOIN domk ON domk.op_name = o.name LEFT JOIN shapes ON shapes.name = o.name
        ORDER BY o.self_gpu_ns DESC, o.cpu_ns DESC, o.name  -- ties by name: the same order every run
    """).to_arrow_table()
    return by_name


def _rollups(con: duckdb.DuckDBPyConnection) -> tuple[pa.Table, pa.Table, pa.Table]:
    """The ``modules``, ``module types`` and ``call sites`` tables."""
    by_module = con.sql("""
        SELECT coalesce(module, '(no module)') AS module, count(*) AS ops,
               sum(self_gpu_ns)::BIGINT AS gpu_ns, sum(CASE WHEN module_top THEN cpu_ns ELSE 0 END)::BIGINT AS cpu_ns,
               sum(self_cpu_ns)::BIGINT AS self_cpu_ns,
               sum(CASE WHEN is_backward THEN self_gpu_ns ELSE 0 END)::BIGINT AS backward_gpu_ns
        FROM ops GROUP BY 1 ORDER BY gpu_ns DESC, module
    """).to_arrow_table()
    # The same module class across instances (all 12 GPT2Block_k as "GPT2Block"):
    # which kind of layer costs the most, whatever its depth in the model.
    by_module_type = con.sql("""
        SELECT coalesce(regexp_replace(regexp_extract(module, '[^/]+$'), '_[0-9]+$', ''), '(no module)')
                   AS module_type,
               count(DISTINCT module) AS instances, sum(ops)::BIGINT AS ops, sum(gpu_ns)::BIGINT AS gpu_ns,
               sum(backward_gpu_ns)::BIGINT AS backward_gpu_ns
        FROM (SELECT module, count(*) AS ops, sum(self_gpu_ns) AS gpu_ns,
                     sum(CASE WHEN is_backward THEN self_gpu_ns ELSE 0 END) AS backward_gpu_ns
              FROM ops GROUP BY module)  -- per distinct module first: the regexes run once per module
        GROUP BY 1 ORDER BY gpu_ns DESC, module_type
    """).to_arrow_table()
    by_site = con.sql("""
        SELECT call_site, count(*) AS ops, sum(self_gpu_ns)::BIGINT AS gpu_ns, sum(self_cpu_ns)::BIGINT AS self_cpu_ns,
               (sum(launch_delay_sum_ns) / NULLIF(sum(delayed_launches), 0))::BIGINT AS launch_delay_ns
        FROM ops WHERE call_site IS NOT NULL GROUP BY 1
        ORDER BY greatest(sum(self_gpu_ns), sum(self_cpu_ns)) DESC, call_site LIMIT 50
    """).to_arrow_table()
    return by_module, by_module_type, by_site


def _findings(totals: tuple, summary: dict[str, Any], by_name: pa.Table) -> list[Finding]:
    """Unattributed GPU time, sampled shapes, the op that launches the most GPU time."""
    findings = []
    if totals[0] and 1 - totals[1] / totals[0] > UNATTRIBUTED_WARN_SHARE:
        findings.append(Finding("warning", "GPU time not attributed to any framework op",
                                {"unattributed_ns": int(totals[0] - totals[1]),
                                 "share": round(1 - totals[1] / totals[0], 4), "at_stake": DATA_NOTE},
                                location="GPU work without a launching op", impact_ns=0, suggestion="Record with the profiler's CPU activity (or pastaprof run) so each kernel's "
                                           "launch can be tied to its op."))
    if summary["shapes"] == "sampled":
        findings.append(Finding("info", "input shapes are from a sample of the calls",
                                {"forward_ops_with_shapes": int(totals[3]), "forward_ops": int(totals[4]),
                                 "hint": "pastaprof run --shapes all records every op's", "at_stake": DATA_NOTE},
                                location="op input shapes", impact_ns=0, suggestion="Run again with pastaprof run --shapes all for every call's shapes."))
    if by_name.num_rows:
        top = by_name.slice(0, 1).to_pylist()[0]
        if totals[0] and top["self_gpu_ns"]:
            findings.append(Finding("info", f"{top['name']} launches the most GPU time",
                                    {"gpu_ns": top["self_gpu_ns"], "calls": top["calls"],
                                     "share": round(top["self_gpu_ns"] / totals[0], 4), "at_stake": NO_ESTIMATE},
                                    location=top["dominant_kernel"], impact_ns=0,
                                    suggestion="Start with this op: the gemm tool judges its shapes and kernels, the "
                                               "ops table its launch delay."))
    return findings
