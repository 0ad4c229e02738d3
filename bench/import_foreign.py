"""Import speed of the rocpd, memory-snapshot and execution-trace importers.

    python bench/import_foreign.py [--kernels 1000000] [--entries 200000]

* rocpd: a schema-built 3.0.3 database (tests/data/rocpd/make_rocpd.py's layout) grown
  inside SQLite to N kernel dispatches, N hipLaunchKernel regions (one correlation each) and
  N/4 copies; timed: the importer's read of all kinds + the processor's link.
* memory snapshot: a pickle of M trace entries (alloc/free pairs with 6-frame stacks) read
  through the restricted unpickler, mapped, linked.
* execution trace: the real H200 ET replicated to ~100k nodes.

Prints one line per format: rows, seconds, rows/s, peak RSS.
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
import pickle
import resource
import shutil
import sqlite3
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _maker():
    spec = importlib.util.spec_from_file_location("make_rocpd", ROOT / "tests/data/rocpd/make_rocpd.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def grow_rocpd(path: Path, n: int) -> None:
    shutil.copy(ROOT / "tests/data/rocpd/single_3.0.3.db", path)
    con = sqlite3.connect(path)
    (meta,) = con.execute("SELECT name FROM sqlite_master WHERE name LIKE 'rocpd_metadata_%'").fetchone()
    u = meta[len("rocpd_metadata"):]
    ev0 = con.execute(f"SELECT max(id) FROM rocpd_event{u}").fetchone()[0]
    launch = con.execute(f"SELECT id FROM rocpd_string{u} WHERE string = 'hipLaunchKernel'").fetchone()[0]
    cat = con.execute(f"SELECT id FROM rocpd_string{u} WHERE string = 'HIP_RUNTIME_API'").fetchone()[0]
    seq = f"WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < {n}) "
    con.execute(f"INSERT INTO rocpd_event{u} (id, guid, category_id, correlation_id) {seq}"
                f"SELECT {ev0} + i, 'guid-{u}', {cat}, 100000 + i FROM s UNION ALL "
                f"SELECT {ev0} + {n} + i, 'guid-{u}', {cat}, 100000 + i FROM s")
    con.execute(f"INSERT INTO rocpd_region{u} (id, guid, nid, pid, tid, start, \"end\", name_id, event_id) {seq}"
                f"SELECT 1000 + i, 'guid-{u}', 1, 1, 1, 2000000000000 + i * 1000, 2000000000000 + i * 1000 + 400, "
                f"{launch}, {ev0} + i FROM s")
    con.execute(f"INSERT INTO rocpd_kernel_dispatch{u} (id, guid, nid, pid, tid, agent_id, kernel_id, dispatch_id, "
                f"queue_id, stream_id, start, \"end\", workgroup_size_x, workgroup_size_y, workgroup_size_z, "
                f"grid_size_x, grid_size_y, grid_size_z, group_segment_size, event_id) {seq}"
                f"SELECT 1000 + i, 'guid-{u}', 1, 1, 1, 2 + i % 2, 1 + i % 3, i, 1, 1, 2000000000000 + i * 1000 + 500, "
                f"2000000000000 + i * 1000 + 900, 256, 1, 1, 65536, 1, 1, 0, {ev0} + {n} + i FROM s")
    con.commit()
    con.close()


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def bench_rocpd(n: int, tmp: Path) -> None:
    from pastaprof.importers.rocpd import RocpdImporter
    from pastaprof.processor.link import link_rank

    db = tmp / "big.db"
    grow_rocpd(db, n)
    t0 = time.perf_counter()
    rows = 0
    for _rank, tables, _meta in RocpdImporter().import_ranks(db):
        linked = link_rank(tables)
        rows = sum(t.num_rows for t in linked.values())
    dt = time.perf_counter() - t0
    print(f"rocpd: {n:,} kernels + {n:,} API calls ({rows:,} rows) in {dt:.2f} s = "
          f"{n / dt:,.0f} kernels/s; peak RSS {_rss_mb():.0f} MB")


def bench_snapshot(m: int, tmp: Path) -> None:
    from pastaprof.importers.memory_snapshot import safe_load, snapshot_tables
    from pastaprof.processor.link import link_rank

    frames = [{"filename": f"/x/site-packages/torch/f{k}.py", "line": k, "name": f"fn{k}"} for k in range(5)]
    frames = [{"filename": "/u/train.py", "line": 7, "name": "step"}, *frames]
    trace = []
    for i in range(m // 2):
        e = {"addr": 0x7F0000000000 + (i % 5000) * 4096, "size": 4096, "stream": 0, "time_us": 10 + i // 3,
             "frames": frames}
        trace += [{"action": "alloc", **e}, {"action": "free_completed", **e}]
    p = tmp / "big.pickle"
    p.write_bytes(pickle.dumps({"segments": [], "device_traces": [trace]}, protocol=4))
    t0 = time.perf_counter()
    tables, _ = snapshot_tables(safe_load(p), p)
    link_rank(tables)
    dt = time.perf_counter() - t0
    print(f"memory_snapshot: {m:,} trace entries ({p.stat().st_size >> 20} MiB pickle) in {dt:.2f} s = "
          f"{m / dt:,.0f} entries/s; peak RSS {_rss_mb():.0f} MB")


def bench_et(tmp: Path, copies: int = 400) -> None:
    from pastaprof.importers.execution_trace import ExecutionTraceImporter

    doc = json.loads(gzip.decompress((ROOT / "tests/data/recorded/et_beside_kineto/rank-0.et.json.gz").read_bytes()))
    base = [n for n in doc["nodes"] if n["id"] > 2]
    nodes = list(doc["nodes"])
    for c in range(1, copies):
        off = c * 100000
        nodes += [{**n, "id": n["id"] + off, "ctrl_deps": n["ctrl_deps"] + off if n["ctrl_deps"] > 2 else n["ctrl_deps"]}
                  for n in base]
    p = tmp / "big.et.json"
    p.write_text(json.dumps({**doc, "nodes": nodes}))
    t0 = time.perf_counter()
    ((_r, tables, _m),) = list(ExecutionTraceImporter().import_ranks(p))
    dt = time.perf_counter() - t0
    n = tables["op"].num_rows
    print(f"execution_trace: {n:,} ops ({p.stat().st_size >> 20} MiB JSON) in {dt:.2f} s = {n / dt:,.0f} ops/s; "
          f"peak RSS {_rss_mb():.0f} MB")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kernels", type=int, default=1_000_000)
    ap.add_argument("--entries", type=int, default=200_000)
    ap.add_argument("--only", default="rocpd,snapshot,et")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        if "rocpd" in a.only:
            bench_rocpd(a.kernels, tmp)
        if "snapshot" in a.only:
            bench_snapshot(a.entries, tmp)
        if "et" in a.only:
            bench_et(tmp)


if __name__ == "__main__":
    main()
