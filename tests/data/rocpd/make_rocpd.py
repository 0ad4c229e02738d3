"""Build the schema-built rocpd databases of this folder (python make_rocpd.py [OUT]).

No real rocprofv3 database could be found in public repositories (they are binary, and the
ones that exist were not in the searchable corpus), and this project has no AMD GPU.  These
files follow the rocpd table layout that ROCm/rocm-systems publishes for each schema version
(projects/rocprofiler-sdk/source/share/rocprofiler-sdk-rocpd/, versions.yml): per-process
tables ``rocpd_<name><uuid>`` (rows keyed by ``(id, guid)``), the ``rocpd_<name>`` views over
them and ``rocpd_metadata`` with ``schema_version``.  The DDL below is written from those
column lists (not copied): 3.0.0, and 3.0.3 (graph ids on dispatches and copies,
``sample_id`` on PMC events).  ``minimal`` is a 3.0.0 file without the optional columns
(``tid``, ``stream_id``, agents' ``type_index``) and without the ``rocpd_<name>`` views,
to exercise column probing and the uuid-table fallback.

* ``single_3.0.0.db``, ``single_3.0.3.db``, ``minimal_3.0.0.db``: one process each, two GPUs.
* ``job/``: 12 processes of one job (one file each, ``RANK`` in their environment): more
  files than SQLite's ATTACH limit of 10.
"""

from __future__ import annotations

import json
import random
import sqlite3
import sys
from pathlib import Path

COLUMNS: dict[str, str] = {  # logical table -> columns (the types rocpd declares)
    "metadata": "id INTEGER PRIMARY KEY, tag TEXT, value TEXT",
    "string": "id INTEGER PRIMARY KEY, guid TEXT, string TEXT",
    "info_node": "id INTEGER PRIMARY KEY, guid TEXT, hash BIGINT, machine_id TEXT, system_name TEXT, hostname TEXT, "
                 "release TEXT, version TEXT, hardware_name TEXT, domain_name TEXT",
    "info_process": "id INTEGER PRIMARY KEY, guid TEXT, nid INTEGER, ppid INTEGER, pid INTEGER, init BIGINT, fini BIGINT, "
                    "start BIGINT, \"end\" BIGINT, command TEXT, environment JSONB, extdata JSONB",
    "info_thread": "id INTEGER PRIMARY KEY, guid TEXT, nid INTEGER, ppid INTEGER, pid INTEGER, tid INTEGER, name TEXT, "
                   "start BIGINT, \"end\" BIGINT, extdata JSONB",
    "info_agent": "id INTEGER PRIMARY KEY, guid TEXT, nid INTEGER, pid INTEGER, type TEXT, absolute_index INTEGER, "
                  "logical_index INTEGER, type_index INTEGER, uuid INTEGER, name TEXT, model_name TEXT, "
                  "vendor_name TEXT, product_name TEXT, user_name TEXT, extdata JSONB",
    "info_queue": "id INTEGER PRIMARY KEY, guid TEXT, nid INTEGER, pid INTEGER, name TEXT, extdata JSONB",
    "info_stream": "id INTEGER PRIMARY KEY, guid TEXT, nid INTEGER, pid INTEGER, name TEXT, extdata JSONB",
    "info_code_object": "id INTEGER PRIMARY KEY, guid TEXT, nid INTEGER, pid INTEGER, agent_id INTEGER, uri TEXT, "
                        "load_base BIGINT, load_size BIGINT, load_delta BIGINT, storage_type TEXT, extdata JSONB",
    "info_kernel_symbol": "id INTEGER PRIMARY KEY, guid TEXT, nid INTEGER, pid INTEGER, code_object_id INTEGER, "
                          "kernel_name TEXT, display_name TEXT, kernel_object INTEGER, kernarg_segment_size INTEGER, "
                          "kernarg_segment_alignment INTEGER, group_segment_size INTEGER, "
                          "private_segment_size INTEGER, sgpr_count INTEGER, arch_vgpr_count INTEGER, "
                          "accum_vgpr_count INTEGER, extdata JSONB",
    "event": "id INTEGER PRIMARY KEY, guid TEXT, category_id INTEGER, stack_id INTEGER, parent_stack_id INTEGER, "
             "correlation_id INTEGER, call_stack JSONB, line_info JSONB, extdata JSONB",
    "region": "id INTEGER PRIMARY KEY, guid TEXT, nid INTEGER, pid INTEGER, tid INTEGER, start BIGINT, \"end\" BIGINT, "
              "name_id INTEGER, event_id INTEGER, extdata JSONB",
    "kernel_dispatch": "id INTEGER PRIMARY KEY, guid TEXT, nid INTEGER, pid INTEGER, tid INTEGER, agent_id INTEGER, "
                       "kernel_id INTEGER, dispatch_id INTEGER, queue_id INTEGER, stream_id INTEGER, start BIGINT, "
                       "\"end\" BIGINT, private_segment_size INTEGER, group_segment_size INTEGER, "
                       "workgroup_size_x INTEGER, workgroup_size_y INTEGER, workgroup_size_z INTEGER, "
                       "grid_size_x INTEGER, grid_size_y INTEGER, grid_size_z INTEGER, region_name_id INTEGER, "
                       "event_id INTEGER, extdata JSONB",
    "memory_copy": "id INTEGER PRIMARY KEY, guid TEXT, nid INTEGER, pid INTEGER, tid INTEGER, start BIGINT, \"end\" BIGINT, "
                   "name_id INTEGER, dst_agent_id INTEGER, dst_address INTEGER, src_agent_id INTEGER, "
                   "src_address INTEGER, size INTEGER, queue_id INTEGER, stream_id INTEGER, region_name_id INTEGER, "
                   "event_id INTEGER, extdata JSONB",
    "memory_allocate": "id INTEGER PRIMARY KEY, guid TEXT, nid INTEGER, pid INTEGER, tid INTEGER, agent_id INTEGER, type TEXT, "
                       "level TEXT, start BIGINT, \"end\" BIGINT, address INTEGER, size INTEGER, queue_id INTEGER, "
                       "stream_id INTEGER, event_id INTEGER, extdata JSONB",
    "pmc_event": "id INTEGER PRIMARY KEY, guid TEXT, event_id INTEGER, pmc_id INTEGER, value REAL, extdata JSONB",
}
ADDED = {"3.0.3": {"kernel_dispatch": "graph_exec_id INTEGER, graph_node_id INTEGER",
                   "memory_copy": "graph_exec_id INTEGER, graph_node_id INTEGER",
                   "pmc_event": "sample_id INTEGER, xcc INTEGER, shader_engine INTEGER, instance INTEGER"}}
OPTIONAL = {"kernel_dispatch": ("tid", "stream_id"), "memory_copy": ("stream_id",), "info_agent": ("type_index",)}
T0 = 1_000_000_000_000


class Db:
    def __init__(self, path: Path, version: str, pid: int, rank: int | None, uuid: str, minimal: bool = False) -> None:
        path.unlink(missing_ok=True)
        self.con = sqlite3.connect(path)
        self.con.execute("PRAGMA page_size = 512")  # small files: most tables hold a few rows
        self.uuid, self.guid, self.version, self.minimal = uuid, f"guid-{uuid}", version, minimal
        self.cols: dict[str, list[str]] = {}
        for table, cols in COLUMNS.items():
            extra = ADDED.get(version, {}).get(table)
            spec = cols + (", " + extra if extra else "")
            if minimal:
                spec = ", ".join(c for c in spec.split(", ") if c.split()[0].strip('"') not in OPTIONAL.get(table, ()))
            self.cols[table] = [c.split()[0].strip('"') for c in spec.split(", ")]
            self.con.execute(f'CREATE TABLE "rocpd_{table}{uuid}" ({spec})')
            if not minimal:
                self.con.execute(f'CREATE VIEW "rocpd_{table}" AS SELECT * FROM "rocpd_{table}{uuid}"')
        self.ids: dict[str, int] = {}
        self.strings: dict[str, int] = {}
        self.put("metadata", tag="schema_version", value=version)
        self.put("metadata", tag="uuid", value=uuid)
        self.put("metadata", tag="guid", value=self.guid)
        env = {"HOME": "/root"} | ({"RANK": str(rank)} if rank is not None else {})
        self.put("info_node", hash=7, machine_id="m", hostname="mi300-node")
        self.proc = self.put("info_process", nid=1, pid=pid, environment=json.dumps(env), command="python train.py")
        self.threads = [self.put("info_thread", nid=1, pid=self.proc, tid=pid + k) for k in range(2)]
        self.cpu = self.put("info_agent", nid=1, pid=self.proc, type="CPU", absolute_index=0, logical_index=0,
                            type_index=0, name="AMD EPYC")
        self.gpus = [self.put("info_agent", nid=1, pid=self.proc, type="GPU", absolute_index=1 + g, logical_index=1 + g,
                              type_index=g, name="gfx942", product_name="AMD Instinct MI300X") for g in range(2)]
        self.queue = self.put("info_queue", nid=1, pid=self.proc, name="queue 0")
        self.stream = self.put("info_stream", nid=1, pid=self.proc, name="stream 0")
        co = self.put("info_code_object", nid=1, pid=self.proc, agent_id=self.gpus[0], uri="file:///model.co")
        self.kernels = [self.put("info_kernel_symbol", nid=1, pid=self.proc, code_object_id=co, kernel_name=f"_Z{k}v",
                                 display_name=name, arch_vgpr_count=32 + k, group_segment_size=0)
                        for k, name in enumerate(["gemm_kernel", "elementwise_add", "reduce_sum"])]

    def put(self, table: str, **kw) -> int:
        self.ids[table] = self.ids.get(table, 0) + 1
        kw = {"id": self.ids[table], **({"guid": self.guid} if table != "metadata" else {}), **kw}
        kw = {k: v for k, v in kw.items() if k in self.cols[table]}
        names = ", ".join(f'"{k}"' for k in kw)
        self.con.execute(f'INSERT INTO "rocpd_{table}{self.uuid}" ({names}) VALUES ({", ".join("?" * len(kw))})',
                         list(kw.values()))
        return self.ids[table]

    def s(self, text: str) -> int:
        if text not in self.strings:
            self.strings[text] = self.put("string", string=text)
        return self.strings[text]

    def event(self, category: str, corr: int | None) -> int:
        return self.put("event", category_id=self.s(category), correlation_id=corr)


def fill(db: Db, rng: random.Random, steps: int = 3) -> None:
    t, corr = T0 + rng.randrange(10**6), 0
    tid = db.threads[0]
    region = lambda name, cat, dur, c=None: db.put(  # noqa: E731
        "region", nid=1, pid=db.proc, tid=tid, start=t, end=t + dur, name_id=db.s(name), event_id=db.event(cat, c))
    for step in range(steps):
        mstart = t
        for k in range(4):
            corr += 1
            region("hipLaunchKernel", "HIP_RUNTIME_API", 4000, corr)
            kern = db.kernels[k % 3]
            g = db.gpus[k % 2]
            start = t + 10_000 + rng.randrange(1000)
            db.put("kernel_dispatch", nid=1, pid=db.proc, tid=tid, agent_id=g, kernel_id=kern, dispatch_id=corr,
                   queue_id=db.queue, stream_id=db.stream, start=start, end=start + 20_000 + 1000 * k,
                   workgroup_size_x=256, workgroup_size_y=1, workgroup_size_z=1, grid_size_x=65536 + 256 * k - 1,
                   grid_size_y=1, grid_size_z=1, group_segment_size=1024 * k, private_segment_size=0,
                   region_name_id=db.s("hipLaunchKernel"), event_id=db.event("KERNEL_DISPATCH", corr),
                   graph_exec_id=None, graph_node_id=None)
            t += 5000
        for name, src, dst in (("MEMORY_COPY_HOST_TO_DEVICE", db.cpu, db.gpus[0]),
                               ("MEMORY_COPY_DEVICE_TO_HOST", db.gpus[0], db.cpu),
                               ("MEMORY_COPY_DEVICE_TO_DEVICE", db.gpus[0], db.gpus[0]),
                               ("MEMORY_COPY_DEVICE_TO_DEVICE", db.gpus[0], db.gpus[1])):
            corr += 1
            region("hipMemcpyAsync", "HIP_RUNTIME_API", 3000, corr)
            db.put("memory_copy", nid=1, pid=db.proc, tid=tid, start=t + 8000, end=t + 9000 + rng.randrange(500),
                   name_id=db.s(name), dst_agent_id=dst, dst_address=0x7F00_0000_0000 + corr, src_agent_id=src,
                   src_address=0x7E00_0000_0000 + corr, size=(1 << 20) * (1 + step), queue_id=db.queue,
                   stream_id=db.stream, event_id=db.event("MEMORY_COPY", corr))
            t += 4000
        corr += 1
        region("hipMalloc", "HIP_RUNTIME_API", 2000, corr)
        addr = 0x7D00_0000_0000 + step * (1 << 24)
        db.put("memory_allocate", nid=1, pid=db.proc, tid=tid, agent_id=db.gpus[0], type="ALLOC", level="REAL",
               start=t, end=t + 1000, address=addr, size=(8 << 20), event_id=db.event("MEMORY_ALLOCATION", corr))
        db.put("memory_allocate", nid=1, pid=db.proc, tid=tid, agent_id=None, type="FREE", level="REAL",
               start=t + 3000, end=t + 3500, address=addr, size=0, event_id=db.event("MEMORY_ALLOCATION", corr + 1))
        db.put("memory_allocate", nid=1, pid=db.proc, tid=tid, agent_id=db.gpus[1], type="ALLOC", level="SCRATCH",
               start=t + 4000, end=t + 4100, address=None, size=1 << 16, event_id=db.event("SCRATCH_MEMORY", None))
        corr += 1
        region("hsa_signal_wait_scacquire", "HSA_CORE_API", 1500, corr)
        t += 6000
        corr += 1
        region("hipDeviceSynchronize", "HIP_RUNTIME_API", 40_000, corr)
        t += 50_000
        db.put("region", nid=1, pid=db.proc, tid=tid, start=mstart, end=t, name_id=db.s(f"train_step_{step}"),
               event_id=db.event("MARKER_CORE_API", None))
        db.put("region", nid=1, pid=db.proc, tid=tid, start=t, end=t + 10, name_id=db.s("roctxNameOsThread"),
               event_id=db.event("MARKER_NAME_API", None))
        t += 1000
    for k in range(5):
        db.put("pmc_event", event_id=k + 1, pmc_id=1, value=float(k))
    db.con.commit()
    db.con.execute("VACUUM")
    db.con.close()


def build(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name, version, minimal in (("single_3.0.0", "3.0.0", False), ("single_3.0.3", "3.0.3", False),
                                   ("minimal_3.0.0", "3.0.0", True)):
        fill(Db(out / f"{name}.db", version, 4242, None, f"_{name.replace('.', '')}00aa", minimal), random.Random(name))
    job = out / "job"
    job.mkdir(exist_ok=True)
    for r in range(12):
        pid = 5000 + (7 * r) % 12  # pid order is not rank order
        fill(Db(job / f"mi300-node_{pid}_results.db", "3.0.3", pid, r, f"_{r:04d}beef"), random.Random(r), steps=2)


if __name__ == "__main__":
    build(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent)
