"""uvm_advisor -- which unified-memory allocation faults where, and a plan that fixes it.

Input: CUPTI unified-memory counter records (kind ``uvm``: migrations with their cause,
GPU and CPU page faults, thrashing, remote maps), managed allocations (kind ``alloc`` /
``free`` with ``memory_kind`` managed, from CUPTI MEMORY2), kernels (what ran when a GPU
fault was taken), ops and user ranges (the program points a plan can name).

Attribution (vectorized): each record's address is looked up among the managed
allocations live at its time (sorted bases, ``searchsorted``, both ends checked);
records that fall in no allocation are counted as unattributed, never guessed.
GPU-side records (GPU faults, HtoD migrations) are placed at the kernel running on
their device at that time and, through the kernel's op, at the innermost user range
around the launch; CPU faults and DtoH migrations at the host op/range at that time.

Rules, per (allocation, program point), first match wins:

=================================  ==========================================================
evidence                           plan action
=================================  ==========================================================
migrations caused by eviction      ``oversubscribed``: chunk the working set or shrink it
thrashing records                  ``advise`` SetPreferredLocation=device + SetAccessedBy=cpu
GPU touches far less than moves   ``advise`` SetPreferredLocation=cpu + SetAccessedBy=device
(needs an access run, below)       (pin on the CPU, map to the GPU), instead of prefetches
GPU faults that moved data         ``prefetch`` to the device before the point
coherence DtoH (data brought       ``prefetch`` to the CPU before the point (CPU faults
back by CPU faults)                alone are first touches: nothing to prefetch)
read-only GPU faults on an         additionally ``advise`` SetReadMostly
allocation the CPU reads too and
does not write after the GPU
first touched it
=================================  ==========================================================

GPU faults that moved nothing are first touches (pages populated on the GPU): no prefetch.
A point must be a user range (``range:NAME``); faults outside every range are reported
as a finding (wrap that code in ``pastaprof.range``), not planned.

Pin or migrate: unified-memory counters cannot tell how much of each page a kernel
uses -- a kernel reading one float per 4 KiB page and one reading every byte fault
alike.  An **access run** of the same program (``pastaprof run -t working_set``: issue D's
instruction-level counts) can: given one (``--access-run DIR``), the advisor compares,
per allocation, the bytes the GPU would pull over the interconnect if the pages stayed
on the CPU (32-byte sectors touched, re-reads included: ``sectors x 32``) with the bytes
migrated in the unified-memory run.  When the former is at most a quarter of the latter
(``REMOTE_SHARE``), the allocation is pinned on the CPU and mapped to the GPU.  Both runs
name allocations by call site and ordinal, so they are matched across runs.

Each action carries its evidence (faults, bytes, causes) and an estimated saving: the
time of the fault-driven migrations it would remove (sum of their durations), which
prefetching replaces by one bulk copy.  Allocations are named by where they were
made (call site or op, plus ordinal and size), not by address, so a plan can be
matched against another run of the same program.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pastaprof.processor.intervals import innermost_enclosing
from pastaprof.processor.link import map_keys
from pastaprof.tools._ranges import host_ranges
from pastaprof.tools.base import DATA_NOTE, Finding, Report, Tool
from pastaprof.tools.memory import _i64, _str

PLAN_SCHEMA = "pastaprof-uvm-plan/1"
NEVER = np.iinfo(np.int64).max
GPU_SIDE = ("gpu_page_fault", "htod")
CPU_SIDE = ("cpu_page_fault", "dtoh")
REMOTE_SHARE = 0.25      # pin on the CPU when GPU sector traffic <= this share of the bytes migrated


def _addr(col) -> np.ndarray:
    """Addresses (uint64 columns) as int64: user-space virtual addresses are below 2**63."""
    return np.asarray(pc.fill_null(col, 0).to_numpy(zero_copy_only=False), dtype=np.uint64).astype(np.int64)


class UvmAdvisor(Tool):
    name = "uvm_advisor"
    description = "Unified-memory faults and migrations per allocation and program point; a prefetch/advise plan"
    consumes = ("uvm", "alloc", "free", "kernel", "op", "range")

    def __init__(self, access_run: str | None = None, **options: Any) -> None:
        super().__init__(access_run=access_run, **options)
        self.access_run = access_run

    # ------------------------------------------------------------------ allocations
    def _allocations(self) -> pa.Table:
        """Managed allocations with their lifetime and a run-independent name."""
        a, f = self.table("alloc"), self.table("free")
        if a.num_rows:
            a = a.filter(pc.fill_null(pc.match_substring(a["memory_kind"].cast(pa.string()), "managed"), False))
        if a.num_rows == 0:
            return pa.table({"alloc_id": pa.array([], pa.int64())})
        a = a.sort_by("start_ns")
        # A managed allocation seen twice -- named by its call site (the plan registry's
        # cupy / cuda-bindings hooks) and by CUPTI's MEMORY2 record -- keeps the named row.
        named = pc.is_valid(a["name"]).to_numpy(zero_copy_only=False)
        if named.any() and not named.all():
            nb = set(_addr(a.filter(pa.array(named))["address"]).tolist())
            dup = ~named & np.isin(_addr(a["address"]), list(nb))
            a = a.filter(pa.array(~dup))
            named = named[~dup]
        base, size, t0 = _addr(a["address"]), _i64(a["bytes"], 0), _i64(a["start_ns"])
        t1 = np.full(len(base), NEVER)
        if f.num_rows:  # a free at the same address after the alloc ends it
            fb, ft = _addr(f["address"]), _i64(f["start_ns"]).copy()
            for i in np.argsort(t0, kind="stable"):
                later = np.flatnonzero((fb == base[i]) & (ft >= t0[i]))
                if len(later):
                    j = later[np.argmin(ft[later])]
                    t1[i] = ft[j]
                    ft[j] = -1  # used
        site = self._sites_at(_i64(a["pid"]), _i64(a["tid"]), t0)
        names = a["name"].cast(pa.string()).to_pylist()
        site = [nm if ok and nm else s for nm, ok, s in zip(names, named, site)]
        ordinal = np.zeros(len(base), np.int64)
        seen: dict[str, int] = {}
        for i, s in enumerate(site):
            ordinal[i] = seen.get(s, 0)
            seen[s] = ordinal[i] + 1
        names = [f"{s}#{o} ({sz} B)" for s, o, sz in zip(site, ordinal, size)]
        return pa.table({"alloc_id": np.arange(len(base)), "name": names, "site": site, "ordinal": ordinal,
                         "address": base, "bytes": size, "alloc_ns": t0, "free_ns": t1,
                         "device": _i64(a["device"])})

    def _sites_at(self, pid: np.ndarray, tid: np.ndarray, t: np.ndarray) -> list[str]:
        """Call site (else op name) of the innermost op around each time on any host thread."""
        ops = self.table("op")
        if ops.num_rows == 0 or len(t) == 0:
            return ["?"] * len(t)
        g = np.zeros(ops.num_rows, np.int64)
        hit = innermost_enclosing(g, _i64(ops["start_ns"]), _i64(ops["end_ns"]), np.zeros(len(t), np.int64), t)
        site, name = _str(ops["call_site"]), _str(ops["name"])
        return [(site[h] or name[h]) if h >= 0 else "?" for h in hit]

    # ------------------------------------------------------------------ attribution
    def _attribute(self, uvm: pa.Table, allocs: pa.Table) -> np.ndarray:
        """Allocation index per uvm record, or -1 (no managed allocation live there)."""
        n = uvm.num_rows
        if allocs.num_rows == 0 or n == 0:
            return np.full(n, -1)
        base, size = _i64(allocs["address"]), _i64(allocs["bytes"])
        t0, t1 = _i64(allocs["alloc_ns"]), _i64(allocs["free_ns"])
        order = np.argsort(base, kind="stable")
        b_sorted = base[order]
        addr, t = _addr(uvm["address"]), _i64(uvm["start_ns"])
        out = np.full(n, -1)
        # Address reuse: several allocations may share a base over time; try each candidate
        # with the same base (few in practice) and keep the one live at the record's time.
        pos = np.searchsorted(b_sorted, addr, side="right") - 1
        most_per_base = int(np.unique(b_sorted, return_counts=True)[1].max())
        for back in range(most_per_base):
            k = pos - back
            ok = (k >= 0) & (out < 0)
            idx = order[np.clip(k, 0, None)]
            ok &= (addr >= base[idx]) & (addr < base[idx] + size[idx]) & (t >= t0[idx]) & (t < t1[idx])
            out[ok] = idx[ok]
        return out

    def _points(self, uvm: pa.Table) -> tuple[np.ndarray, np.ndarray]:
        """(program point name, kernel name) per record: GPU-side records at the kernel running
        then (its op's user range, else op, else kernel); CPU-side at the host op/range."""
        n = uvm.num_rows
        kinds = _str(uvm["uvm_kind"])
        t = _i64(uvm["start_ns"])
        point = np.full(n, "", dtype=object)
        kname = np.full(n, "", dtype=object)
        k = self.table("kernel")
        ops, rng = self.table("op"), self.table("range")
        user = host_ranges(rng)

        def host_point(times: np.ndarray) -> np.ndarray:
            outp = np.full(len(times), "", dtype=object)
            z = np.zeros(len(times), np.int64)
            if user.num_rows:   # labels per range (few), taken per record
                h = innermost_enclosing(np.zeros(user.num_rows, np.int64), _i64(user["start_ns"]), _i64(user["end_ns"]),
                                        z, times)
                labels = np.array([f"range:{n}" for n in _str(user["name"])], dtype=object)
                outp = np.where(h >= 0, labels[np.clip(h, 0, None)], outp)
            if ops.num_rows:
                top = ops.filter(pc.fill_null(pc.equal(ops["depth"], 0), True))
                h = innermost_enclosing(np.zeros(top.num_rows, np.int64), _i64(top["start_ns"]), _i64(top["end_ns"]),
                                        z, times)
                names, sites = _str(top["name"]), _str(top["call_site"])
                used = np.unique(h[h >= 0])     # label only the ops some record falls in
                labels = np.full(top.num_rows, "", dtype=object)
                labels[used] = [f"op:{names[x]}@{sites[x]}" if sites[x] else f"op:{names[x]}" for x in used]
                outp = np.where((outp == "") & (h >= 0), labels[np.clip(h, 0, None)], outp)
            return outp

        gpu = np.isin(kinds, GPU_SIDE)
        if gpu.any() and k.num_rows:
            ks, ke = _i64(k["start_ns"]), _i64(k["end_ns"])
            h = innermost_enclosing(np.zeros(k.num_rows, np.int64), ks, ke, np.zeros(int(gpu.sum()), np.int64), t[gpu])
            names = _str(k["name"])
            kname[gpu] = np.where(h >= 0, names[np.clip(h, 0, None)], "")
            # the kernel's launch time places it in the host program
            launch = ks.copy()
            if "op_id" in k.column_names and ops.num_rows:
                op_start = map_keys(_i64(k["op_id"]), _i64(ops["id"]), _i64(ops["start_ns"]))
                launch = np.where(op_start >= 0, op_start, ks)
            pts = host_point(launch[np.clip(h, 0, None)])
            pts = np.where(h >= 0, pts, "")
            klabels = np.full(len(names), "", dtype=object)
            used = np.unique(h[h >= 0])
            klabels[used] = [f"kernel:{names[x]}" for x in used]
            pts = np.where((pts == "") & (h >= 0), klabels[np.clip(h, 0, None)], pts)
            point[gpu] = pts
        cpu = ~gpu
        if cpu.any():
            point[cpu] = host_point(t[cpu])
        point = np.where(point == "", "unknown", point)
        return point, kname

    # ------------------------------------------------------------------ access evidence
    def _gpu_traffic(self, allocs: pa.Table) -> dict[int, dict[str, int]]:
        """Per allocation of this run: the GPU's 32-byte sector traffic to it in the access
        run (matched by name: call site + ordinal + size), or {} without an access run."""
        if not self.access_run or allocs.num_rows == 0:
            return {}
        from pastaprof.api import load

        other = load(self.access_run)
        helper = UvmAdvisor()
        for kind in ("alloc", "free", "op"):
            for batch in other.table(kind).to_batches():
                helper.on_batch(kind, batch)
        theirs = helper._allocations()
        acc = other.table("access_summary")
        if theirs.num_rows == 0 or acc.num_rows == 0:
            return {}
        acc = acc.filter(pc.is_valid(acc["object_address"]))
        per = pa.table({"address": _addr(acc["object_address"]), "sectors": _i64(acc["sectors"], 0)}).group_by(
            "address", use_threads=False).aggregate([("sectors", "sum"), ("sectors", "count")])
        sec = dict(zip(_i64(per["address"]).tolist(), zip(_i64(per["sectors_sum"]).tolist(),
                                                            _i64(per["sectors_count"]).tolist())))
        named = {n: sec[a] for a, n in zip(_i64(theirs["address"]).tolist(), theirs["name"].to_pylist()) if a in sec}
        return {i: {"gpu_sector_bytes": 32 * named[n][0], "launches": named[n][1]}
                for i, n in zip(_i64(allocs["alloc_id"]).tolist(), allocs["name"].to_pylist()) if n in named}

    # ------------------------------------------------------------------ report
    def report(self) -> Report:
        uvm = self.table("uvm")
        allocs = self._allocations()
        tables: dict[str, pa.Table] = {"allocations": allocs}
        if uvm.num_rows == 0:
            return Report(self.name, tables=tables, summary={"records": 0, "allocations": allocs.num_rows,
                                                             "actions": 0})
        uvm = uvm.sort_by("start_ns")
        aidx = self._attribute(uvm, allocs)
        allocs = self._devices_from_migrations(allocs, uvm, aidx)
        tables["allocations"] = allocs
        point, kname = self._points(uvm)
        kinds, cause = _str(uvm["uvm_kind"]), _str(uvm["cause"])
        nbytes, count = _i64(uvm["bytes"], 0), _i64(uvm["count"], 0)
        dur = np.clip(_i64(uvm["end_ns"]) - _i64(uvm["start_ns"]), 0, None)
        rec = pa.table({"alloc_id": aidx, "point": point, "kernel": kname, "uvm_kind": kinds, "cause": cause,
                        "bytes": nbytes, "count": count, "duration_ns": dur, "start_ns": _i64(uvm["start_ns"])})
        details = {"records": rec}  # one row per unified-memory record, attributed
        plan, findings, per_point = self._plan(rec, allocs)
        tables["by_allocation_and_point"] = per_point
        # pa.array infers the struct type from every action (from_pylist would use the first only)
        tables["plan"] = (pa.Table.from_struct_array(pa.array(plan["actions"])) if plan["actions"]
                          else pa.table({"action": pa.array([], pa.string())}))
        unattributed = int((aidx < 0).sum())
        if unattributed:
            findings.append(Finding("info", f"{unattributed} of {len(aidx)} unified-memory records fall in no managed "
                                            "allocation known to the capture (allocated before it, or not by cudaMallocManaged)",
                                    {"records": unattributed, "at_stake": DATA_NOTE}, location="unified memory records",
                                    impact_ns=0, suggestion="Start the capture before the program allocates its managed "
                                                            "memory, so every record can be attributed."))
        summary = {"records": len(aidx), "unattributed": unattributed, "allocations": allocs.num_rows,
                   "gpu_faults": int(count[kinds == "gpu_page_fault"].sum()),
                   "cpu_faults": int(count[kinds == "cpu_page_fault"].sum()),
                   "htod_bytes": int(nbytes[kinds == "htod"].sum()), "dtoh_bytes": int(nbytes[kinds == "dtoh"].sum()),
                   "actions": len(plan["actions"]),
                   "estimated_saving_ns": int(sum(a["estimated_saving_ns"] for a in plan["actions"]))}
        return Report(self.name, tables=tables, findings=findings, summary=summary, details=details,
                      display={"by_allocation_and_point": ["alloc_id", "point", "gpu_faults", "cpu_faults",
                                                           "htod_coherence_bytes", "dtoh_coherence_bytes",
                                                           "thrashing_bytes", "eviction_bytes"],
                               "plan": ["allocation", "action", "to", "before", "estimated_saving_ns"],
                               "allocations": ["alloc_id", "name", "bytes"]})

    @staticmethod
    def _devices_from_migrations(allocs: pa.Table, uvm: pa.Table, aidx: np.ndarray) -> pa.Table:
        """An allocation whose record has no device (the registry's hooks and managed
        MEMORY2 records do not say) takes the GPU its pages migrated to (HtoD destination,
        else DtoH source), so a plan never names device -1."""
        if allocs.num_rows == 0 or "device" not in allocs.column_names:
            return allocs
        dev = _i64(allocs["device"]).copy()
        if not (dev < 0).any():
            return allocs
        kinds = _str(uvm["uvm_kind"])
        dst, src = _i64(uvm["dst_device"]), _i64(uvm["src_device"])
        gpu = np.where(kinds == "htod", dst, np.where(kinds == "dtoh", src, -1))
        for i in np.flatnonzero(dev < 0):
            cand = gpu[(aidx == i) & (gpu >= 0)]
            dev[i] = int(np.bincount(cand).argmax()) if len(cand) else 0
        return allocs.set_column(allocs.schema.get_field_index("device"), "device", pa.array(dev))

    def _plan(self, rec: pa.Table, allocs: pa.Table) -> tuple[dict[str, Any], list[Finding], pa.Table]:
        att = rec.filter(pc.greater_equal(rec["alloc_id"], 0))
        kinds, cause = _str(att["uvm_kind"]), _str(att["cause"])
        cols = _fault_columns(att, kinds, cause)
        sums = [k for k in cols if k not in ("alloc_id", "point", "first_ns")]
        g = pa.table(cols).group_by(["alloc_id", "point"], use_threads=False).aggregate(
            [(k, "sum") for k in sums] + [("first_ns", "min")])
        g = g.rename_columns([c.removesuffix("_sum").replace("first_ns_min", "first_ns") for c in g.column_names])
        g = g.sort_by([("first_ns", "ascending")])
        arows = {r["alloc_id"]: r for r in allocs.to_pylist()}
        traits = _alloc_traits(g, cols, kinds, cause, _i64(att["bytes"], 0))
        traffic = self._gpu_traffic(allocs)
        migrated = traits["migrated"]
        pinned = {a for a, tr in traffic.items() if migrated.get(a, 0) > 0
                  and tr["gpu_sector_bytes"] <= REMOTE_SHARE * migrated[a]}
        actions: list[dict[str, Any]] = []
        findings: list[Finding] = []
        done: set[int] = set()
        for r in g.to_pylist():
            al = arows[r["alloc_id"]]
            target = {"allocation": al["name"], "site": al["site"], "ordinal": al["ordinal"], "bytes": al["bytes"],
                      "point": r["point"]}
            if r["alloc_id"] in pinned:
                if r["alloc_id"] not in done:
                    done.add(r["alloc_id"])
                    _pin(g, r["alloc_id"], al, target, traffic[r["alloc_id"]], migrated[r["alloc_id"]], actions,
                         findings)
                continue
            act = _row_action(r, al)
            if act is None:
                continue
            act = {**target, **act, "evidence": {k: r[k] for k in sums if r[k]}}
            if act["action"] == "prefetch" and not str(r["point"]).startswith("range:"):
                findings.append(Finding("info", f"{al['name']}: {act['action']} to {act['to']} would help, but its "
                                                "faults are outside every range: wrap that code in pastaprof.range(...) "
                                                "to give the plan a point", act, location=al["site"] or al["name"],
                                        impact_ns=int(act["estimated_saving_ns"]),
                                        suggestion="Wrap the code that touches it in pastaprof.range(...), then run "
                                                   "the advisor again for a plan."))
                continue
            actions.append(act)
            a = r["alloc_id"]
            if act["action"] == "prefetch" and act["to"] != "cpu" and a in traits["cpu_reads"] \
                    and a not in traits["gpu_writes"] and a not in traits["rewritten"]:
                actions.append({**target, "action": "advise", "advice": ["SetReadMostly"],
                                "location": f"device:{al['device']}", "estimated_saving_ns": 0,
                                "evidence": {"gpu_faults_read_only": r["gpu_faults"], "cpu_reads": True}})
            sev = "warning" if act["estimated_saving_ns"] >= 1_000_000 else "info"
            what = act["action"] + (f" to {act['to']}" if "to" in act else "")
            findings.append(Finding(sev, f"{al['name']}: {what} before {r['point']} "
                                         f"(saves ~{act['estimated_saving_ns'] / 1e6:.2f} ms of fault-driven migration)",
                                    act, location=al["site"] or al["name"], impact_ns=int(act["estimated_saving_ns"]),
                                    suggestion=_OVERSUBSCRIBED if act["action"] == "oversubscribed" else _PLAN_ADVICE))
        plan = {"schema": PLAN_SCHEMA, "actions": actions}
        return plan, findings, g


_OVERSUBSCRIBED = "Process the allocation in chunks that fit device memory, or shrink it: its pages are evicted."
_PLAN_ADVICE = ("Apply the plan: write it with analyze --uvm-plan FILE and run the program with "
                "pastaprof run --apply-uvm-plan FILE, or make the same cudaMemPrefetchAsync/cudaMemAdvise calls there.")


def _fault_columns(att: pa.Table, kinds: np.ndarray, cause: np.ndarray) -> dict[str, Any]:
    """Per attributed UVM record: its faults, bytes and migration time by what caused them."""
    b, c, d = _i64(att["bytes"], 0), _i64(att["count"], 0), _i64(att["duration_ns"], 0)
    return {
        "alloc_id": _i64(att["alloc_id"]), "point": _str(att["point"]),
        "gpu_faults": np.where(kinds == "gpu_page_fault", c, 0),
        "gpu_faults_write": np.where((kinds == "gpu_page_fault") & (cause != "read"), c, 0),
        "cpu_faults": np.where(kinds == "cpu_page_fault", c, 0),
        "cpu_read_faults": np.where((kinds == "cpu_page_fault") & (cause == "read"), c, 0),
        "htod_coherence_bytes": np.where((kinds == "htod") & (cause == "coherence"), b, 0),
        "htod_prefetch_bytes": np.where((kinds == "htod") & (cause == "prefetch"), b, 0),
        "htod_user_bytes": np.where((kinds == "htod") & (cause == "user"), b, 0),
        "dtoh_coherence_bytes": np.where((kinds == "dtoh") & (cause == "coherence"), b, 0),
        "eviction_bytes": np.where(np.isin(kinds, ("htod", "dtoh", "dtod")) & (cause == "eviction"), b, 0),
        "thrashing_bytes": np.where(kinds == "thrashing", b, 0),
        "gpu_fault_migration_ns": np.where((kinds == "htod") & np.isin(cause, ("coherence", "prefetch")), d, 0),
        "cpu_fault_migration_ns": np.where((kinds == "dtoh") & (cause == "coherence"), d, 0),
        "first_ns": _i64(att["start_ns"]),
    }


def _alloc_traits(g: pa.Table, cols: dict[str, Any], kinds: np.ndarray, cause: np.ndarray,
                  b: np.ndarray) -> dict[str, Any]:
    """Per allocation: does the CPU read it (CPU faults), does the GPU ever write it, is it
    rewritten by the CPU after the GPU first touched it (read-only duplicates would be
    invalidated and rebuilt every time: measured on the H200, 11x slower than no advice; writes
    before that are initialization, which SetReadMostly is made for), bytes migrated."""
    cpu_reads = {a for a, f in zip(_i64(g["alloc_id"]).tolist(), _i64(g["cpu_read_faults"]).tolist()) if f}
    gpu_writes = {a for a, f in zip(_i64(g["alloc_id"]).tolist(), _i64(g["gpu_faults_write"]).tolist()) if f}
    aid, t = cols["alloc_id"], cols["first_ns"]
    is_gpu = kinds == "gpu_page_fault"
    first_gpu = {a: int(t[is_gpu & (aid == a)].min()) for a in np.unique(aid[is_gpu]).tolist()}
    cpu_w = (kinds == "cpu_page_fault") & (cause == "write")
    rewritten = {a for a, tw in zip(aid[cpu_w].tolist(), t[cpu_w].tolist()) if a in first_gpu and tw > first_gpu[a]}
    moved = np.isin(kinds, ("htod", "dtoh")) & (cause != "eviction")
    per_alloc = np.bincount(aid[moved], weights=b[moved]) if moved.any() else np.zeros(0)
    migrated = {a: int(v) for a, v in enumerate(per_alloc.tolist()) if v}
    return {"cpu_reads": cpu_reads, "gpu_writes": gpu_writes, "rewritten": rewritten, "migrated": migrated}


def _pin(g: pa.Table, alloc_id: int, al: dict[str, Any], target: dict[str, Any], tr: dict[str, Any], migrated: int,
         actions: list[dict[str, Any]], findings: list[Finding]) -> None:
    """An allocation the GPU touches less of than migrates: pin it on the CPU, map it to the GPU."""
    mine = g.filter(pc.equal(g["alloc_id"], alloc_id))
    saving = int(pc.sum(mine["gpu_fault_migration_ns"]).as_py() + pc.sum(mine["cpu_fault_migration_ns"]).as_py())
    act = {**target, "point": "allocation", "action": "advise",
           "advice": ["SetPreferredLocation", "SetAccessedBy"], "location": "cpu",
           "accessed_by": f"device:{al['device']}", "estimated_saving_ns": saving,
           "evidence": {"bytes_migrated": migrated, **tr}}
    actions.append(act)
    findings.append(Finding("warning" if saving >= 1_000_000 else "info",
                            f"{al['name']}: pin on the CPU and map to the GPU -- the GPU touches "
                            f"{tr['gpu_sector_bytes'] / 2**20:.1f} MiB of it (sectors, access run) where "
                            f"{migrated / 2**20:.1f} MiB migrated (saves ~{saving / 1e6:.2f} ms)",
                            act, location=al["site"] or al["name"], impact_ns=saving, suggestion=_PLAN_ADVICE))


def _row_action(r: dict[str, Any], al: dict[str, Any]) -> dict[str, Any] | None:
    """What one (allocation, point) group of faults asks for, or None."""
    # GPU faults that moved no data populated fresh pages on the GPU (first touch)
    gpu_side = r["htod_coherence_bytes"] + r["htod_prefetch_bytes"] > 0
    # CPU faults alone are first touches (nothing to bring back); data migrated back is not
    cpu_side = r["dtoh_coherence_bytes"] > 0
    both = r["gpu_fault_migration_ns"] + r["cpu_fault_migration_ns"]
    if r["eviction_bytes"]:
        return {"action": "oversubscribed", "advice": ["chunk the working set or shrink it"],
                "estimated_saving_ns": both}
    if r["thrashing_bytes"]:
        return {"action": "advise", "advice": ["SetPreferredLocation", "SetAccessedBy"],
                "location": f"device:{al['device']}", "accessed_by": "cpu", "estimated_saving_ns": both}
    if gpu_side:
        return {"action": "prefetch", "to": f"device:{al['device']}", "before": r["point"],
                "estimated_saving_ns": r["gpu_fault_migration_ns"]}
    if cpu_side:
        return {"action": "prefetch", "to": "cpu", "before": r["point"], "estimated_saving_ns": r["cpu_fault_migration_ns"]}
    return None


def plan_of(report: Report) -> dict[str, Any]:
    """The plan of a uvm_advisor report as a JSON-able dict (keys without a value dropped)."""

    def clean(x: Any) -> Any:
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items() if v is not None}
        if isinstance(x, list):
            return [clean(v) for v in x]
        return x

    plan = report.tables.get("plan")
    rows = plan.to_pylist() if plan is not None else []  # no plan table: no unified-memory records
    return {"schema": PLAN_SCHEMA, "actions": [clean(a) for a in rows if a.get("action")]}


def write_plan(report: Report, path: str) -> None:
    """Write the plan as JSON (the input of applying it in a later run)."""
    from pastaprof.store.outputs import write_output

    write_output(path, (json.dumps(plan_of(report), indent=1) + "\n").encode())
