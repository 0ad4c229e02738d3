"""coalescing -- 32-byte sectors per warp request, per PC: the hottest uncoalesced memory
instructions and their kernel.

Input: ``access_pc`` (per launch x PC).  Per (kernel, PC): requests, lanes, bytes, sectors,
sectors per request, and the *ideal* sectors per request (the request's bytes / 32,
rounded up).  A PC whose requests move at least ``EXCESS`` times the ideal sectors and
that carries at least ``MIN_SHARE`` of all sectors is a finding, with the sectors it
would save if coalesced.
"""

from __future__ import annotations

from pastaprof.tools.base import MEMORY_ONLY, Finding, Report, Tool, sql

EXCESS = 2.0
MIN_SHARE = 0.01


class Coalescing(Tool):
    name = "coalescing"
    description = "Sectors per warp request per PC; the hottest uncoalesced memory instructions and their kernel"
    consumes = ("access_pc",)

    def report(self) -> Report:
        con = sql(p=self.table("access_pc"))
        pcs = con.sql("""
            SELECT CAST(name AS VARCHAR) AS kernel, pc, any_value(CAST(source AS VARCHAR)) AS source,
                   sum(requests)::BIGINT AS requests, sum(lanes)::BIGINT AS lanes,
                   sum(bytes)::BIGINT AS bytes, sum(sectors)::BIGINT AS sectors,
                   sum(sectors) / sum(requests) AS sectors_per_request,
                   ceil(sum(bytes) / sum(requests) / 32.0) AS ideal_sectors_per_request
            FROM p GROUP BY kernel, pc ORDER BY sectors DESC""").to_arrow_table()
        rows = pcs.to_pylist()
        total = sum(r["sectors"] for r in rows) or 1
        findings = []
        for r in rows:
            ideal = max(r["ideal_sectors_per_request"] or 1, 1)
            if r["sectors_per_request"] >= EXCESS * ideal and r["sectors"] >= MIN_SHARE * total:
                saved = int(r["sectors"] - ideal * r["requests"])
                at = f" ({r['source']})" if r["source"] else ""
                findings.append(Finding("warning" if r["sectors"] >= 0.1 * total else "info",
                                        f"{r['kernel']} pc {hex(r['pc'])}{at}: {r['sectors_per_request']:.1f} sectors per "
                                        f"request (ideal {ideal:.0f}); coalescing saves {saved} sectors "
                                        f"({saved * 32} B)", {**r, "sectors_saved": saved, "at_stake": MEMORY_ONLY},
                                        impact_ns=0, impact_bytes=saved * 32,
                                        location=r["source"] or f"{r['kernel']}+{hex(r['pc'])}",
                                        suggestion="Make neighbouring threads of a warp read neighbouring addresses "
                                                   "(index by threadIdx.x along the contiguous dimension)."))
        summary = {"pcs": len(rows), "requests": sum(r["requests"] for r in rows), "sectors": sum(r["sectors"] for r in rows),
                   "sectors_per_request": round(sum(r["sectors"] for r in rows) / max(1, sum(r["requests"] for r in rows)), 3)}
        return Report(self.name, tables={"pcs": pcs}, findings=findings, summary=summary)
