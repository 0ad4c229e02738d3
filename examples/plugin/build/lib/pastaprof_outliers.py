"""A complete pastaprof tool: kernel launches far slower than usual for their kernel."""

import duckdb

from pastaprof import Finding, Report, Tool


class KernelOutliers(Tool):
    name = "kernel_outliers"
    description = "Kernel launches slower than 3x the median launch of the same kernel"
    consumes = ("kernel",)

    def report(self) -> Report:
        factor = float(self.options.get("factor", 3.0))
        con = duckdb.connect()
        con.register("kernel", self.table("kernel"))
        slow = con.sql(f"""
            WITH k AS (SELECT name::VARCHAR AS name, end_ns - start_ns AS ns FROM kernel),
                 m AS (SELECT name, median(ns) AS median_ns FROM k GROUP BY name)
            SELECT name, count(*) AS slow_launches, max(ns) AS worst_ns, any_value(median_ns) AS median_ns
            FROM k JOIN m USING (name) WHERE ns > {factor} * median_ns
            GROUP BY name ORDER BY worst_ns DESC, name""").to_arrow_table()
        findings = [Finding("warning", f"{r['slow_launches']} launches over {factor:g}x their median",
                            {"worst_ns": r["worst_ns"], "median_ns": r["median_ns"]}, location=r["name"])
                    for r in slow.slice(0, 3).to_pylist()]
        total = sum(slow["slow_launches"].to_pylist())
        return Report(self.name, tables={"outliers": slow}, findings=findings, summary={"slow_launches": total})
