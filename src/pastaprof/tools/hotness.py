"""hotness -- PASTA's hot_analysis / time_hotness: which objects and which of their pages
take the accesses, over all launches.

Input: ``access_summary`` with per-page histograms.  Per object (address, size): launches
that touched it, lane accesses, pages touched and the hottest page; per (object, page):
accesses summed over launches (the heat map's rows, hottest first).
"""

from __future__ import annotations

from pastaprof.tools.base import Report, Tool, sql

TOP_PAGES = 1000


class Hotness(Tool):
    name = "hotness"
    description = "Per object and page, over launches: accesses, launches touching, hottest pages (PASTA hot_analysis)"
    consumes = ("access_summary",)

    def report(self) -> Report:
        con = sql(s=self.table("access_summary"))
        pages = con.sql(f"""
            WITH e AS (SELECT rank, object_address, object_bytes, page_bytes, correlation,
                              unnest(page_counts) AS n, generate_subscripts(page_counts, 1) - 1 AS page
                       FROM s WHERE object_address IS NOT NULL)
            SELECT rank, object_address, object_bytes, page_bytes, page, sum(n)::BIGINT AS accesses,
                   count(DISTINCT correlation) FILTER (WHERE n > 0) AS launches
            FROM e GROUP BY ALL HAVING sum(n) > 0 ORDER BY accesses DESC, object_address, page LIMIT {TOP_PAGES}
        """).to_arrow_table()
        objects = con.sql("""
            WITH e AS (SELECT rank, object_address, object_bytes, correlation, coalesce(reads, 0) + coalesce(writes, 0) AS a, page_bytes,
                              len(list_filter(page_counts, lambda x: x > 0)) AS pages_touched,
                              list_position(page_counts, list_max(page_counts)) - 1 AS hot_page,
                              list_max(page_counts) AS hot_page_accesses
                       FROM s WHERE object_address IS NOT NULL)
            SELECT rank, object_address, object_bytes, count(DISTINCT correlation) AS launches,
                   coalesce(sum(a), 0)::BIGINT AS accesses, max(pages_touched) AS max_pages_touched, any_value(page_bytes) AS page_bytes,
                   arg_max(hot_page, hot_page_accesses) AS hottest_page
            FROM e GROUP BY rank, object_address, object_bytes ORDER BY accesses DESC
        """).to_arrow_table()
        rows = objects.to_pylist()
        summary = {"objects": len(rows), "accesses": sum(r["accesses"] for r in rows),
                   "hottest_object": hex(rows[0]["object_address"]) if rows else None,
                   "hottest_object_share": round(rows[0]["accesses"] / max(1, sum(r["accesses"] for r in rows)), 4)
                   if rows else None}
        return Report(self.name, tables={"objects": objects, "pages": pages}, summary=summary)
