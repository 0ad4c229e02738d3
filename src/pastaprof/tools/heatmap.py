"""heatmap -- one CTA of one kernel launch, per 32-byte sector and 4-byte word
(PASTA's heatmap_analysis, cuThermo-style).

Input: ``access_heatmap`` rows (processor/access.py ``heatmap()``, raw mode).  Per sector:
accesses, reads, writes, distinct warps and per-word counts; the hottest sectors are
listed, and per object the *word utilization* -- words touched / words moved (8 per
sector) -- shows sectors fetched for one or two words, the pattern cuThermo flags.
"""

from __future__ import annotations

from pastaprof.tools.base import MEMORY_ONLY, Finding, Report, Tool, sql

TOP = 200
LOW_UTILIZATION = 0.25


class Heatmap(Tool):
    name = "heatmap"
    description = "One CTA of one launch: accesses per 32-byte sector and 4-byte word, warps per sector, word utilization"
    consumes = ("access_heatmap",)

    def report(self) -> Report:
        con = sql(h=self.table("access_heatmap"))
        sectors = con.sql(f"""
            SELECT correlation AS launch, cta, object_address, sector_address, accesses, reads, writes, warps,
                   len(list_filter(word_counts, lambda x: x > 0)) AS words_touched, word_counts
            FROM h ORDER BY accesses DESC, sector_address LIMIT {TOP}""").to_arrow_table()
        objects = con.sql("""
            SELECT correlation AS launch, cta, object_address, count(*) AS sectors, sum(accesses)::BIGINT AS accesses,
                   sum(len(list_filter(word_counts, lambda x: x > 0)))::DOUBLE / (8 * count(*)) AS word_utilization,
                   max(warps) AS max_warps_per_sector
            FROM h GROUP BY ALL ORDER BY accesses DESC""").to_arrow_table()
        findings = []
        for o in objects.to_pylist():
            if o["word_utilization"] < LOW_UTILIZATION and o["sectors"] >= 8:
                where = hex(o["object_address"]) if o["object_address"] is not None else "no object"
                findings.append(Finding("info", f"launch {o['launch']} CTA {o['cta']}, object {where}: "
                                                f"{o['word_utilization']:.0%} of the words in its {o['sectors']} sectors "
                                                "are used", o | {"at_stake": MEMORY_ONLY},
                                        location=f"launch {o['launch']} CTA {o['cta']}: object {where}", impact_ns=0,
                                        impact_bytes=int(round(32 * o["sectors"] * (1 - o["word_utilization"]))),
                                        suggestion="Lay out the data this CTA reads so that neighbouring threads "
                                                   "use every word of each 32-byte sector (structure of arrays)."))
        rows = objects.to_pylist()
        summary = {"sectors": sum(r["sectors"] for r in rows), "accesses": sum(r["accesses"] for r in rows),
                   "objects": len(rows)}
        return Report(self.name, tables={"objects": objects, "sectors": sectors}, findings=findings, summary=summary)
