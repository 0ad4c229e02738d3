"""working_set -- PASTA's app_analysis: per kernel launch, how much of what is allocated
it actually touches.

Input: ``access_summary`` (per launch x object, from the GPU or CPU access reducer).
Per launch: lane accesses, objects touched, **working set** (bytes of the objects it
touched, PASTA's measure), **touched bytes** (pages it touched x page size, a tighter
measure), **footprint** (bytes of all objects live at the launch) and accesses that fell
in no live object (reported, never credited to a neighbour).  Per kernel name: the same,
summed over its launches, with the largest working set.

Coverage (``access_launch``, from the sanitizer handler): what the patches cannot see lane
by lane -- TMA / bulk copies and warpgroup MMAs (Hopper GEMMs load their operands that
way) -- is counted per kernel and reported as **uncovered**: such a kernel's accesses
and working set are lower bounds, never silently complete.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pastaprof.tools.base import DATA_NOTE, MEMORY_ONLY, Finding, Report, Tool, sql

if TYPE_CHECKING:
    import duckdb
    import pyarrow as pa

LOW_SHARE = 0.1   # a kernel touching < 10% of what is live (and >= 1 GiB live) is worth a look
LOW_MIN_FOOTPRINT = 1 << 30


class WorkingSet(Tool):
    name = "working_set"
    description = "Per kernel launch: accesses, objects touched, working-set bytes vs footprint (PASTA app_analysis)"
    consumes = ("access_summary", "access_launch")

    def report(self) -> Report:
        s = self.table("access_summary")
        con = sql(s=s)
        launches = con.sql("""
            SELECT rank, correlation AS launch, any_value(CAST(name AS VARCHAR)) AS kernel,
                   sum(reads + writes)::BIGINT AS accesses,
                   count(object_address)::BIGINT AS objects,
                   coalesce(sum(object_bytes), 0)::BIGINT AS working_set_bytes,
                   coalesce(sum(CASE WHEN object_address IS NOT NULL
                                     THEN len(list_filter(page_counts, lambda x: x > 0)) * page_bytes END), 0)::BIGINT
                       AS touched_bytes,
                   max(live_bytes)::BIGINT AS footprint_bytes,
                   coalesce(sum(CASE WHEN object_address IS NULL THEN reads + writes END), 0)::BIGINT AS unattributed,
                   sum(sectors)::BIGINT AS sectors
            FROM s GROUP BY rank, correlation ORDER BY rank, correlation""").to_arrow_table()
        con.register("l", launches)
        kernels = con.sql("""
            SELECT kernel, count(*) AS launches, sum(accesses)::BIGINT AS accesses,
                   max(working_set_bytes)::BIGINT AS max_working_set_bytes,
                   max(touched_bytes)::BIGINT AS max_touched_bytes, max(footprint_bytes)::BIGINT AS max_footprint_bytes,
                   sum(unattributed)::BIGINT AS unattributed
            FROM l GROUP BY kernel ORDER BY accesses DESC""").to_arrow_table()
        coverage = self._coverage(con)
        findings = []
        for k in coverage.to_pylist():
            if k["uncovered_bulk_copies"] or k["uncovered_wgmma"]:
                findings.append(Finding(
                    "warning", f"{k['kernel']}: {k['uncovered_wgmma']} warpgroup MMAs and {k['uncovered_bulk_copies']} "
                               "bulk/TMA copies are not seen lane by lane: its global loads through them are not "
                               "counted (uncovered; accesses and working set are lower bounds)",
                    k | {"at_stake": DATA_NOTE}, location=k["kernel"], impact_ns=0,
                    suggestion="Read this kernel's accesses and working set as lower bounds; its tensor-core "
                               "and TMA traffic is not counted."))
        for k in kernels.to_pylist():
            fp = k["max_footprint_bytes"] or 0
            if fp >= LOW_MIN_FOOTPRINT and k["max_working_set_bytes"] < LOW_SHARE * fp:
                findings.append(Finding("info", f"{k['kernel']}: touches {k['max_working_set_bytes'] / fp:.1%} of the "
                                                f"{fp / 2**30:.1f} GiB live at its launches",
                                        k | {"at_stake": MEMORY_ONLY}, location=k["kernel"], impact_ns=0,
                                        impact_bytes=int(fp - k["max_working_set_bytes"]),
                                        suggestion="Free or offload what this kernel does not touch if memory is "
                                                   "short: most of what is live at its launches is idle."))
            if k["unattributed"]:
                findings.append(Finding("info", f"{k['kernel']}: {k['unattributed']} accesses outside every live "
                                                "object (unattributed, not guessed)", k | {"at_stake": DATA_NOTE},
                                        location=k["kernel"], impact_ns=0,
                                        suggestion="Record allocations from the program's start (and its own "
                                                   "allocators) so these accesses can be attributed."))
        tot = launches.to_pylist()
        summary = {"launches": len(tot), "accesses": sum(r["accesses"] for r in tot),
                   "max_working_set_bytes": max((r["working_set_bytes"] for r in tot), default=0),
                   "max_footprint_bytes": max((r["footprint_bytes"] or 0 for r in tot), default=0),
                   "unattributed": sum(r["unattributed"] for r in tot),
                   "uncovered_kernels": sum(1 for k in coverage.to_pylist()
                                            if k["uncovered_bulk_copies"] or k["uncovered_wgmma"])}
        return Report(self.name, tables={"kernels": kernels, "launches": launches, "coverage": coverage},
                      findings=findings, summary=summary)

    def _coverage(self, con: duckdb.DuckDBPyConnection) -> pa.Table:
        """Per kernel: instrumented launches and what was not attributed or not seen."""
        con.register("a", self.table("access_launch"))
        return con.sql("""
            SELECT * FROM (
            SELECT CAST(name AS VARCHAR) AS kernel, count(*) AS launches,
                   coalesce(sum(lanes), 0)::BIGINT AS global_lanes,
                   coalesce(sum(uncovered_wgmma), 0)::BIGINT AS uncovered_wgmma,
                   coalesce(sum(uncovered_bulk_copies), 0)::BIGINT AS uncovered_bulk_copies,
                   coalesce(sum(unattributed_lanes), 0)::BIGINT AS unattributed_lanes,
                   coalesce(sum(shared_lanes), 0)::BIGINT AS shared_lanes,
                   coalesce(sum(local_lanes), 0)::BIGINT AS local_lanes,
                   coalesce(sum(async_copy_lanes), 0)::BIGINT AS async_copy_lanes,
                   coalesce(sum(pc_dropped + page_dropped), 0)::BIGINT AS dropped_in_tables,
                   coalesce(sum(raw_requests - raw_stored), 0)::BIGINT AS raw_requests_dropped
            FROM a GROUP BY 1) ORDER BY uncovered_wgmma + uncovered_bulk_copies DESC, global_lanes DESC""").to_arrow_table()
