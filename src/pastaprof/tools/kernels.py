"""kernels -- PASTA's app_metric/code_check: where GPU time goes, per kernel name.

Per kernel name: launches, total/mean/median/p99 duration, share of GPU time,
grid and block shapes; memcpy/memset counts and bytes by direction.  Findings
flag kernels that dominate GPU time and many tiny kernels (launch overhead).
"""

from __future__ import annotations

import pyarrow as pa

from pastaprof.tools.base import NO_ESTIMATE, Finding, Report, Tool, sql

DOMINANT_SHARE = 0.25      # a kernel name taking >= 25% of GPU activity time (kernels, copies, memsets) is worth a look
TINY_KERNEL_NS = 5_000     # kernels under 5 us are dominated by launch overhead ...
NO_GPU_NOTE = "no GPU kernels, copies or memsets in this run (a CPU-only trace?)"
TINY_SHARE = 0.5           # ... when they are at least half of the launches (a share: the same for 1 or 57 steps)


class Kernels(Tool):
    name = "kernels"
    description = "Per kernel: launches, total/mean/median/p99 time, GPU-time share, grid/block; copies by direction"
    consumes = ("kernel", "memcpy", "memset")

    def report(self) -> Report:
        con = sql(kernel=self.table("kernel"), memcpy=self.table("memcpy"), memset=self.table("memset"))
        per_kernel = con.sql("""
            WITH k AS (SELECT CAST(name AS VARCHAR) AS name, end_ns - start_ns AS d,
                              format('{}x{}x{}', grid_x, grid_y, grid_z) AS grid,
                              format('{}x{}x{}', block_x, block_y, block_z) AS block FROM kernel),
                 tot AS (SELECT sum(d) AS t FROM k),
                 shapes AS (SELECT name, grid, block, count(*) AS c FROM k GROUP BY ALL),
                 common AS (SELECT name, first(grid ORDER BY c DESC, grid, block) AS grid,
                                   first(block ORDER BY c DESC, grid, block) AS block,
                                   count(DISTINCT grid) AS distinct_grids FROM shapes GROUP BY name)
            SELECT name, count(*) AS launches, sum(d)::BIGINT AS total_ns, avg(d) AS mean_ns,
                   quantile_disc(d, 0.5) AS median_ns, quantile_disc(d, 0.99) AS p99_ns,
                   sum(d) / NULLIF((SELECT t FROM tot), 0) AS share,
                   any_value(common.grid) AS grid, any_value(common.block) AS block,
                   any_value(common.distinct_grids) AS distinct_grids
            FROM k JOIN common USING (name) GROUP BY name ORDER BY total_ns DESC, name
        """).to_arrow_table()
        copies = con.sql("""
            SELECT 'memcpy' AS kind, CAST(direction AS VARCHAR) AS direction, count(*) AS count,
                   sum(bytes)::BIGINT AS bytes, sum(end_ns - start_ns)::BIGINT AS total_ns FROM memcpy GROUP BY 2
            UNION ALL
            SELECT 'memset', 'device', count(*), sum(bytes)::BIGINT, sum(end_ns - start_ns)::BIGINT FROM memset HAVING count(*) > 0
            ORDER BY kind, direction
        """).to_arrow_table()
        totals = con.execute("""
            SELECT (SELECT count(*) FROM kernel) AS kernels,
                   (SELECT coalesce(sum(end_ns - start_ns), 0) FROM kernel) AS kernel_ns,
                   (SELECT count(*) FROM memcpy) AS memcpys,
                   (SELECT coalesce(sum(bytes), 0) FROM memcpy) AS memcpy_bytes,
                   (SELECT count(*) FROM memset) AS memsets
        """).fetchall()[0]
        summary = dict(zip(["kernels", "kernel_ns", "memcpys", "memcpy_bytes", "memsets"], [int(v) for v in totals]))
        summary["distinct_kernels"] = per_kernel.num_rows
        if not (summary["kernels"] or summary["memcpys"] or summary["memsets"]):  # say why, not zeros
            return Report(self.name, tables={"kernels": per_kernel, "copies": copies},
                          summary={"kernels": 0, "note": NO_GPU_NOTE})
        return Report(self.name, tables={"kernels": per_kernel, "copies": copies},
                      findings=self._findings(per_kernel, summary), summary=summary)

    def _findings(self, per_kernel: pa.Table, summary: dict) -> list[Finding]:
        """A kernel taking DOMINANT_SHARE of all GPU activity time (copies and memsets count: a
        kernel is no hotspot of a GPU busy with copies), and many tiny kernels.  Both point at
        where time goes, not at a cause with a time to win: ``impact_ns`` 0 (``NO_ESTIMATE``)."""
        out: list[Finding] = []
        con = sql(memcpy=self.table("memcpy"), memset=self.table("memset"))
        copy_ns = con.execute("SELECT (SELECT coalesce(sum(end_ns - start_ns), 0) FROM memcpy)"
                              " + (SELECT coalesce(sum(end_ns - start_ns), 0) FROM memset)").fetchall()[0][0]
        gpu_ns = summary["kernel_ns"] + int(copy_ns)
        for r in per_kernel.slice(0, 5).to_pylist():
            share = r["total_ns"] / gpu_ns if gpu_ns else 0.0
            if share >= DOMINANT_SHARE:
                out.append(Finding("warning", f"one kernel takes {share:.0%} of GPU activity time",
                                   {"launches": r["launches"], "total_ns": r["total_ns"], "share": round(share, 4),
                                    "share_of_kernel_time": round(r["share"], 4), "mean_ns": round(r["mean_ns"], 1),
                                    "at_stake": NO_ESTIMATE,
                                    "suggestion": "Look at this kernel first: its shapes, dtype and the op that "
                                                  "launches it (ops and gemm tools)."},
                                   location=r["name"], kind="dominant kernel", impact_ns=0))
        tiny = sql(k=per_kernel).execute(
            f"SELECT sum(launches), sum(total_ns), arg_max(name, launches) FROM k WHERE median_ns < {TINY_KERNEL_NS}"
        ).fetchall()[0]
        share = tiny[0] / summary["kernels"] if tiny[0] and summary["kernels"] else 0.0
        if share >= TINY_SHARE:
            out.append(Finding("info", f"{share:.0%} of kernel launches are of kernels with median under "
                                       f"{TINY_KERNEL_NS // 1000} us",
                               {"launches": int(tiny[0]), "total_ns": int(tiny[1]), "share_of_launches": round(share, 4),
                                "at_stake": NO_ESTIMATE,
                                "suggestion": "Fuse these small kernels (torch.compile) or capture them in a CUDA "
                                              "graph: their launches cost more than their work."},
                               location=tiny[2], kind="many small kernels", impact_ns=0))
        return out
