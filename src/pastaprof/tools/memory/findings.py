"""The memory tool's findings and summary, and the live-at-peak bytes per category."""

from __future__ import annotations

from collections import defaultdict

import pyarrow as pa
import pyarrow.compute as pc

from pastaprof.tools._memory_patterns import device_label
from pastaprof.tools.base import DATA_NOTE, MEMORY_ONLY, Finding
from pastaprof.tools.memory.common import GPU_TYPES, fmt, group

WARN_BYTES = 16 << 20       # never-freed severity thresholds
CRITICAL_BYTES = 1 << 30
CAPACITY_SHARE = 0.9        # reserved peak this close to device memory is a warning
FRAG_MIN_BYTES = 256 << 20  # reserved-but-unallocated at the peak worth a finding ...
FRAG_SHARE = 0.2            # ... when it is also this share of what is reserved


def device_findings(dev_rows: list[dict], never: pa.Table, leaks: list[dict]) -> list[Finding]:
    """Leaks (growth per step), never-freed blocks, reserved memory near capacity, fragmentation
    and replay mismatches, per device."""
    out: list[Finding] = []
    keys = zip(*(never[c].to_pylist() for c in ("rank", "device", "device_type")), strict=True)
    first_site: dict[tuple, int] = {}
    for i, key in enumerate(keys):  # never_freed is sorted by bytes: a device's first row is its top site
        first_site.setdefault(key, i)
    for lk in leaks:
        top = lk["sites"][0] if lk["sites"] else {}
        where = " @ ".join(x for x in (top.get("op_name"), top.get("call_site")) if x) or None
        sev = "critical" if lk["total_growth_bytes"] >= CRITICAL_BYTES else "warning"
        out.append(Finding(sev, f"{lk['device']}: memory grows {fmt(lk['growth_bytes_per_step'])} per step "
                                f"over {lk['steps']} steps", dict(lk) | {"at_stake": MEMORY_ONLY}, location=where or lk["device"],
                           impact_ns=0, impact_bytes=int(lk["total_growth_bytes"]),
                           suggestion="Free what this site allocates each step, or stop holding references to it "
                                      "across steps (lists of losses, cached tensors)."))
    for d in dev_rows:
        nb = d["never_freed_bytes"]
        name = device_label(d['device_type'], d['device'])
        if nb > 0:
            top = never.slice(first_site[(d["rank"], d["device"], d["device_type"])], 1).to_pylist()[0]
            sev = "critical" if nb >= CRITICAL_BYTES else "warning" if nb >= WARN_BYTES else "info"
            out.append(Finding(sev, f"{name}: {fmt(nb)} in {d['never_freed_blocks']} blocks allocated during the "
                                    "trace still live at its end",
                               {"rank": d["rank"], "bytes": nb, "blocks": d["never_freed_blocks"],
                                "top_site_bytes": top["bytes"], "top_site_blocks": top["blocks"], "at_stake": MEMORY_ONLY},
                               impact_ns=0, impact_bytes=int(nb),
                               location=" @ ".join(x for x in (top["op_name"], top["call_site"]) if x) or name,
                               suggestion="Check that these blocks are meant to outlive the trace (weights, caches), "
                                          "else release them."))
        cap = d["device_memory_bytes"]
        if cap and d["max_reserved_bytes"] >= CAPACITY_SHARE * cap:
            out.append(Finding("warning", f"{name}: allocator reserved {d['max_reserved_bytes'] / cap:.0%} of device memory",
                               {"max_reserved_bytes": d["max_reserved_bytes"], "device_memory_bytes": cap,
                                "peak_bytes": d["peak_bytes"], "at_stake": MEMORY_ONLY}, location=name,
                               impact_ns=0, impact_bytes=int(d["max_reserved_bytes"]),
                               suggestion="Lower the peak (smaller batch, activation checkpointing) before the "
                                          "allocator runs out of device memory."))
        unalloc = d["reserved_at_peak"] - d["peak_bytes"]
        if d["reserved_at_peak"] > 0 and unalloc >= FRAG_MIN_BYTES and unalloc >= FRAG_SHARE * d["reserved_at_peak"]:
            out.append(Finding("warning", f"{name}: {fmt(unalloc)} reserved but not allocated at the peak "
                                          f"({unalloc / d['reserved_at_peak']:.0%} of reserved): fragmentation",
                               {"rank": d["rank"], "reserved_at_peak": d["reserved_at_peak"],
                                "peak_bytes": d["peak_bytes"], "bytes_saveable": unalloc, "at_stake": MEMORY_ONLY},
                               location=name, impact_ns=0, impact_bytes=int(unalloc),
                               suggestion="Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, which lets the "
                                          "allocator return it."))
        if d["mismatched_events"]:
            out.append(Finding("info", f"{name}: {d['mismatched_events']} events disagree with the allocator's total "
                                       "(events missing or out of order)", {"rank": d["rank"], "at_stake": DATA_NOTE},
                               location=name, impact_ns=0,
                               suggestion="Record the whole run with memory events on; the replay is unsure here."))
    return out


def oom_findings(rng: pa.Table, blocks: pa.Table) -> list[Finding]:
    """One critical finding per out-of-memory event (a memory snapshot's ``oom`` entries
    arrive as ranges of domain ``oom``): what was allocated then, and the largest site."""
    if not rng.num_rows or "domain" not in rng.column_names:
        return []
    out = []
    for r in rng.filter(pc.fill_null(pc.equal(rng["domain"].cast(pa.string()), "oom"), False)).to_pylist():
        t = r["start_ns"]
        live = blocks.filter(pc.and_(pc.and_(pc.equal(blocks["rank"], r["rank"]), pc.equal(blocks["device"], r["device"] or 0)),
                                     pc.and_(pc.fill_null(pc.less_equal(blocks["alloc_ns"], t), True),
                                             pc.fill_null(pc.greater(blocks["free_ns"], t), True))))
        sites = group(live, ["op_name", "call_site"], ["bytes"]).slice(0, 1).to_pylist()
        top = sites[0] if sites else {}
        total = int(pc.sum(live["bytes"]).as_py() or 0)
        out.append(Finding("critical", f"{r['name']}; {fmt(total)} was allocated then, in {live.num_rows} blocks",
                           {"rank": r["rank"], "time_ns": t, "allocated_bytes": total, "blocks": live.num_rows,
                            "top_site_bytes": top.get("bytes"), "at_stake": MEMORY_ONLY},
                           impact_ns=0, impact_bytes=total,
                           location=" @ ".join(x for x in (top.get("op_name"), top.get("call_site")) if x)
                           or f"rank {r['rank']} device {r['device'] or 0}",
                           suggestion="Lower what this site holds at that moment (smaller batch, activation "
                                      "checkpointing) or free it earlier."))
    return out


def peak_by_category(live: pa.Table, dev_rows: list[dict]) -> pa.Table:
    """Bytes live at each device's peak per category; memory the allocator held from before
    the trace and never freed in it (no block of its own) is added to ``before_trace``, so
    each device's rows sum to its peak."""
    keys = ["rank", "device", "device_type", "category"]
    rows = {tuple(r[k] for k in keys): r for r in group(live, keys, ["bytes"]).to_pylist()}
    seen: dict[tuple, list[int]] = {}
    for k, r in rows.items():  # each device's categories, in one pass (not a scan of all rows per device)
        seen.setdefault(k[:3], []).append(r["bytes"])
    for d in dev_rows:
        dk = (d["rank"], d["device"], d["device_type"])
        unseen = d["peak_bytes"] - sum(seen.get(dk, []))
        if unseen:
            r = rows.setdefault((*dk, "before_trace"), dict(zip(keys, (*dk, "before_trace"))) | {"bytes": 0, "blocks": 0})
            r["bytes"] += unseen
    out = sorted(rows.values(), key=lambda r: (r["rank"], r["device_type"] != "cuda", r["device"], -r["bytes"]))
    if not out:  # no device has a peak (no alloc at all): the same columns, no rows
        return pa.table({"rank": pa.array([], pa.int64()), "device": pa.array([], pa.int64()),
                         "device_type": pa.array([], pa.string()), "category": pa.array([], pa.string()),
                         "bytes": pa.array([], pa.int64()), "blocks": pa.array([], pa.int64())})
    return pa.Table.from_pylist(out)


def summarize(dev_rows: list[dict], leaks: list[dict], step_rows: list[dict]) -> dict:
    """The report's summary: totals over the devices, and the figures of the device with the
    highest peak (GPUs first)."""
    gpu = [d for d in dev_rows if d["device_type"] in GPU_TYPES] or dev_rows
    main = max(gpu, key=lambda d: d["peak_bytes"]) if gpu else defaultdict(lambda: None)
    return {
        "devices": len(dev_rows),
        "alloc_events": sum(d["alloc_events"] for d in dev_rows),
        "free_events": sum(d["free_events"] for d in dev_rows),
        "peak_device": device_label(main['device_type'], main['device']), "peak_rank": main["rank"],
        "peak_bytes": main["peak_bytes"], "peak_ns": main["peak_ns"],
        "peak_replayed_bytes": main["peak_replayed_bytes"], "pretrace_offset_bytes": main["pretrace_offset_bytes"],
        "live_at_peak_bytes": main["live_at_peak_bytes"], "max_reserved_bytes": main["max_reserved_bytes"],
        "never_freed_bytes": sum(d["never_freed_bytes"] for d in dev_rows),
        "never_freed_blocks": sum(d["never_freed_blocks"] for d in dev_rows),
        "steps": len({(r["rank"], r["step"]) for r in step_rows}),
        "leak_bytes_per_step": max((lk["growth_bytes_per_step"] for lk in leaks), default=0),
    }
