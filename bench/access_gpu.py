"""Issue D on the GPU: fidelity of the sanitizer handler, GPU vs CPU reduction, tool cost.

    python bench/access_gpu.py [--out DIR] [--n N] [--big N]

1. Fidelity (asserts): bench/access_apps.py ``known`` under ``pastaprof run -t
   working_set,coalescing`` with ``--process gpu`` and again with ``--process cpu``:
   vector add = 2N reads + N writes (N per input, N on the output), copy = N + N,
   strided reads = min(32, 4 S) sectors per request; the two paths agree row for row
   (reads, writes, bytes, sectors, page histograms).  PyTorch ``a + b``: bytes per
   tensor = 4N, attributed to tensors (the caching allocator's blocks).
2. Reduction speed: the same vector add at ``--big`` elements, GPU path vs CPU path.
   GPU path time = the instrumented launch (kernel with the reduction inside, sync,
   summary copy); CPU path = the instrumented launch in raw mode (kernel storing records,
   sync, copy of the records) + the NumPy reduction.  Target: >= 1000x.
4. Launches that are not selected: the same workloads with the sanitizer attached but no
   launch selected -- outside every range (``--ranges never``: modules unpatched, the
   default, and kept patched with PASTAPROF_SAN_UNPATCH=0) and with a kernel regex that
   matches nothing (patched, the patches see a null pointer) -- vs bare; and steps timed
   1.2 s after a selected window closed (modules unpatched again, ``modules_unpatched``).
3. Counting tools' cost (working_set, hotness, --process gpu) vs bare, wall time of the
   measured region: an elementwise suite and a ResNet-50 forward.  Target: <= 20x.  The
   warm-up step before it is selected too and reported apart: modules are patched at
   their first launch inside a window (a one-time cost, like loading them).
   Also GEMM coverage: TMA / wgmma instructions reported as uncovered.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pastaprof

HERE = Path(__file__).resolve().parent
APPS = HERE / "access_apps.py"


def app(name: str, out: Path, tag: str, extra: list[str], pp: list[str] | None,
        env: dict | None = None) -> tuple[dict, Path | None]:
    js = out / f"{tag}.json"
    run_dir = out / f"run-{tag}" if pp is not None else None
    cmd = [sys.executable, str(APPS), name, *extra, "--json", str(js)]
    if pp is not None:
        cmd = [sys.executable, "-m", "pastaprof.cli", "run", "-o", str(run_dir), "--force", *pp, "--", *cmd]
    r = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **(env or {})})
    (out / f"{tag}.stderr.txt").write_text(r.stderr)
    if r.returncode != 0:
        raise RuntimeError(f"{tag} failed ({r.returncode}): {r.stderr[-3000:]}")
    info = json.loads(js.read_text())
    info["pastaprof_lines"] = [ln for ln in r.stderr.splitlines() if ln.startswith("pastaprof")][-6:]
    return info, run_dir


def fidelity(out: Path, n: int) -> dict:
    import numpy as np

    res: dict = {}
    rows = {}
    for proc in ("gpu", "cpu"):
        tools = "working_set,coalescing" + (",heatmap" if proc == "cpu" else "")
        info, rd = app("known", out, f"known-{proc}", ["--n", str(n)], ["-t", tools, "--process", proc])
        run = pastaprof.load(rd)
        if proc == "gpu":
            rows_src = run.sql("SELECT DISTINCT CAST(p.source AS VARCHAR) FROM access_pc p JOIN access_launch l "
                               "USING (correlation) WHERE l.name = 'strided' AND p.source IS NOT NULL").fetchall()
        if proc == "cpu":  # CTA 0 of vadd: 256 threads read a, b and write c, one float each
            res["heatmap_vadd_cta0"] = run.sql(
                "SELECT count(*), min(accesses), max(accesses), sum(reads), sum(writes), max(warps) "
                "FROM access_heatmap h JOIN access_launch l USING (correlation) WHERE l.name = 'vadd'").fetchall()
        rows[proc] = run.sql(
            "SELECT a.name, l.correlation, CAST(a.object_kind AS VARCHAR) AS kind, a.object_address, a.object_bytes,"
            " a.reads, a.writes, a.bytes_read, a.bytes_written, a.sectors, a.page_counts "
            "FROM access_summary a JOIN access_launch l USING (correlation) "
            "WHERE a.name IN ('vadd', 'copy', 'strided', 'reverse', 'halves') "
            "ORDER BY l.correlation, a.object_address").fetchall()
        res[f"launch_{proc}"] = run.sql("SELECT CAST(name AS VARCHAR), requests, lanes, unattributed_lanes, raw_requests,"
                                        " raw_stored, device_bytes FROM access_launch ORDER BY correlation").fetchall()
        res[f"manifest_{proc}"] = {k: run.manifest["processes"][0].get(k) for k in ("sanitizer", "status")}
        res[f"kernels_{proc}"] = run.table("kernel").num_rows
        addr = {v[0]: k for k, v in info["arrays"].items()}  # each run has its own addresses
        rows[proc] = [(r[0], addr.get(r[3], r[3]), *r[5:10], r[10]) for r in rows[proc]]
    g = [r[:7] for r in rows["gpu"]]
    c = [r[:7] for r in rows["cpu"]]
    res["gpu_rows"], res["cpu_rows"] = g, c
    res["paths_agree"] = g == c and [r[7] for r in rows["gpu"]] == [r[7] for r in rows["cpu"]]
    # analytical checks on the GPU path
    res["pastaprof_lines"] = info["pastaprof_lines"]

    def one(name, arr, i=0):
        m = [r for r in g if r[0] == name and r[1] == arr]
        return m[i] if i < len(m) else (name, arr, -1, -1, -1, -1, -1)
    checks = {
        "vadd a reads = N": one("vadd", "a")[2] == n, "vadd b reads = N": one("vadd", "b")[2] == n,
        "vadd c writes = N": one("vadd", "c")[3] == n and one("vadd", "c")[2] == 0,
        "vadd sectors a = N/8": one("vadd", "a")[6] == n // 8,
        "copy reads a = N, writes out = N": one("copy", "a")[2] == n and one("copy", "out")[3] == n,
        "reverse reads a = N, N/8 sectors; writes out = N": one("reverse", "a")[2] == n
        and one("reverse", "a")[6] == n // 8 and one("reverse", "out")[3] == n,
        "halves reads a = b = N/2, N/16 sectors each": all(one("halves", k)[2] == n // 2
                                                           and one("halves", k)[6] == n // 16 for k in ("a", "b")),
    }
    # coalescing's source lines (module images kept by the sanitizer tool, DWARF line table)
    from access_apps import KERNELS

    load_line = KERNELS.splitlines().index("  if (i < m) out[i] = x[i * s];") + 1
    res["strided_sources"] = sorted({str(r[0]) for r in rows_src})
    checks[f"strided's PCs name source line {load_line}"] = any(s.endswith(f":{load_line}") for s in res["strided_sources"])
    checks["heatmap vadd CTA 0: 96 sectors x 8 accesses, 512 reads + 256 writes, 1 warp per sector"] = \
        res.get("heatmap_vadd_cta0") == [(96, 8, 8, 512, 256, 1)]
    for i, s in enumerate(info["strides"]):
        r = one("strided", "x", i)
        checks[f"strided S={s} sectors = (N/32)*min(32,4S)"] = r[6] == (n // 32) * min(32, 4 * s) and r[2] == n
    res["checks"] = checks
    # PyTorch tensors
    info, rd = app("torch_add", out, "torch-add", ["--n", str(n)], ["-t", "working_set", "--ranges", "measure"])
    run = pastaprof.load(rd)
    t = run.sql("SELECT object_address, CAST(object_kind AS VARCHAR), bytes_read, bytes_written, reads, writes "
                "FROM access_summary WHERE object_address IS NOT NULL").fetchall()
    by = {r[0]: r for r in t}
    arr = info["arrays"]
    res["torch_add"] = {k: by.get(v[0]) for k, v in arr.items()}
    checks["torch a+b: 4N bytes read from each input tensor, 4N written"] = all(
        by.get(arr[k][0]) is not None and by[arr[k][0]][1] == "tensor" and by[arr[k][0]][2] == 4 * n for k in ("a", "b")) \
        and by.get(arr["c"][0]) is not None and by[arr["c"][0]][3] == 4 * n
    res["all_ok"] = all(checks.values()) and res["paths_agree"]
    _ = np
    return res


def speed(out: Path, big: int) -> dict:
    res = {}
    for proc in ("gpu", "cpu"):
        info, rd = app("known", out, f"big-{proc}", ["--n", str(big)],
                       ["-t", "working_set", "--process", proc, "--ranges", "vadd"])
        run = pastaprof.load(rd)
        lr = run.sql("SELECT end_ns - start_ns, requests, lanes, raw_requests, raw_stored, device_bytes "
                     "FROM access_launch WHERE name = 'vadd'").fetchall()
        san = run.manifest["processes"][0].get("sanitizer") or {}
        res[proc] = {"launch_ns": lr[0][0] if lr else None, "launch": lr, "sanitizer": san, "region_s": info["seconds"],
                     "pastaprof_lines": info["pastaprof_lines"]}
    g, c = res["gpu"], res["cpu"]
    if g["launch_ns"] and c["launch_ns"]:
        cpu_total = c["launch_ns"] / 1e9 + c["sanitizer"].get("cpu_reduce_seconds", 0)
        res["gpu_path_s"] = g["launch_ns"] / 1e9
        res["cpu_path_s"] = cpu_total
        res["speedup"] = cpu_total / res["gpu_path_s"]
    return res


# Variants of the counting run, each measured against the same bare runs: the default
# (16 SM shards of counters), one shard (every warp on the same counters, as before the
# sharding), with the per-PC table (off by default here since the seventh session: no tool
# of this run reads access_pc), and 4 KiB hotness pages (PASTA's size: 16x the page
# counters of the default 64 KiB to zero and copy back per launch).
COST_VARIANTS = {"one_shard": {"PASTAPROF_SAN_SHARDS": "1"}, "with_pc_table": {"PASTAPROF_SAN_PCS": "4096"},
                 "pages_4k": {"PASTAPROF_PAGE": "4096"}}
HOST_TIMES = ("launches_instrumented", "setup_seconds", "wait_seconds", "readback_seconds", "page_copy_seconds")


COST_WORKLOADS = {"elementwise": ["--n", str(1 << 24), "--iters", "10"], "resnet50": ["--iters", "1"],
                  "gemm": ["--iters", "3"]}


def cost(out: Path, repeat: int, workloads: list[str] | None = None, variants_of: list[str] | None = None) -> dict:
    res = {}
    tools_args = ["-t", "working_set,hotness", "--ranges", "warmup,measure"]
    for name in workloads or list(COST_WORKLOADS):
        extra = COST_WORKLOADS[name]
        bare, tools, wbare, wtools = [], [], [], []
        variants: dict[str, list[float]] = {v: [] for v in (variants_of if variants_of is not None else COST_VARIANTS)}
        host: dict[str, dict] = {}  # per variant: the sanitizer's own host times, last round
        for i in range(repeat):
            info = app(name, out, f"{name}-bare-{i}", extra, None)[0]
            bare.append(info["seconds"])
            wbare.append(info["warmup_seconds"])
            # the warm-up step is selected too: modules are patched at their first launch in a
            # window, a one-time cost reported apart from the steady state (the measured region)
            info, rd = app(name, out, f"{name}-pp-{i}", extra, tools_args)
            tools.append(info["seconds"])
            wtools.append(info["warmup_seconds"])
            host["default"] = sanitizer_stats(rd, *HOST_TIMES)
            for v in variants:
                vi, vrd = app(name, out, f"{name}-{v}-{i}", extra, tools_args, COST_VARIANTS[v])
                variants[v].append(vi["seconds"])
                host[v] = sanitizer_stats(vrd, *HOST_TIMES)
        run = pastaprof.load(rd)
        cov = run.sql("SELECT count(*), sum(requests), sum(uncovered_bulk_copies), sum(uncovered_wgmma), "
                      "sum(unattributed_lanes), max(device_bytes) FROM access_launch").fetchall()[0]
        worst = run.sql("SELECT CAST(name AS VARCHAR), unattributed_lanes, lanes, unattributed_sample FROM access_launch "
                        "WHERE unattributed_lanes > 0 ORDER BY unattributed_lanes DESC LIMIT 4").fetchall()
        span = run.sql("SELECT count(*), min(object_address), max(object_address + object_bytes) FROM access_summary "
                       "WHERE object_address IS NOT NULL").fetchall()
        res[name] = {"unattributed_worst": [(n[:80], u, ln, hex(a or 0)) for n, u, ln, a in worst],
                     "attributed_span": [(c, hex(lo or 0), hex(hi or 0)) for c, lo, hi in span],
                     "bare_s": sorted(bare)[len(bare) // 2], "tools_s": sorted(tools)[len(tools) // 2],
                     "launches_requests_tma_wgmma_unattributed_devbytes": cov,
                     "sanitizer": run.manifest["processes"][0].get("sanitizer"),
                     "host_time_of_instrumented_launches": host}
        res[name]["x"] = res[name]["tools_s"] / res[name]["bare_s"]
        res[name]["first_step_bare_s"], res[name]["first_step_tools_s"] = min(wbare), min(wtools)
        for v, secs in variants.items():
            res[name][f"x_{v}"] = sorted(secs)[len(secs) // 2] / res[name]["bare_s"]
    return res


def sanitizer_stats(run_dir: Path, *keys: str) -> dict:
    """Counters the sanitizer handler wrote into a run's manifest."""
    san = pastaprof.load(run_dir).manifest["processes"][0].get("sanitizer") or {}
    return {k: san.get(k) for k in keys}


def unselected(out: Path, repeat: int) -> dict:
    configs = {"bare": (None, None), "outside_ranges_unpatched": (["-t", "working_set", "--ranges", "never"], None),
               "outside_ranges_patched": (["-t", "working_set", "--ranges", "never"], {"PASTAPROF_SAN_UNPATCH": "0"}),
               "kernel_regex_no_match": (["-t", "working_set", "--kernels", "^no_such_kernel$"], None)}
    res = {}
    for name, extra in (("elementwise", ["--n", str(1 << 24), "--iters", "10"]), ("resnet50", ["--iters", "3"])):
        times: dict = {k: [] for k in configs}
        san = {}
        for i in range(repeat):
            for k, (pp, env) in configs.items():
                info, rd = app(name, out, f"{name}-{k}-{i}", extra, pp, env)
                times[k].append(info["seconds"])
                if rd is not None:
                    san[k] = sanitizer_stats(rd, "launches_seen", "launches_instrumented", "modules_unpatched",
                                             "modules_repatched")
        med = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
        res[name] = {"seconds": med, "x_bare": {k: round(v / med["bare"], 3) for k, v in med.items()},
                     "sanitizer": san}
        # after a window: one selected region, then (gate closed > 1 s) the same steps unpatched
        w = {}
        for k, pp in (("bare", None), ("after_window", ["-t", "working_set", "--ranges", "measure"])):
            info, rd = app(name, out, f"{name}-window-{k}", [*extra, "--after-window"], pp)
            w[k] = info["after_window_seconds"]
            if rd is not None:
                w["sanitizer"] = sanitizer_stats(rd, "launches_instrumented", "modules_unpatched", "modules_repatched")
        w["x_bare"] = round(w["after_window"] / w["bare"], 3)
        res[name]["after_window"] = w
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT") or tempfile.mkdtemp())
    ap.add_argument("--n", type=int, default=1 << 16)
    ap.add_argument("--big", type=int, default=1 << 22)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--parts", default="fidelity,speed,cost,unselected")
    ap.add_argument("--cost-workloads", default=",".join(COST_WORKLOADS), help="of: " + ",".join(COST_WORKLOADS))
    ap.add_argument("--cost-variants", default=",".join(COST_VARIANTS), help="of: " + ",".join(COST_VARIANTS))
    a = ap.parse_args()
    workloads = [w for w in a.cost_workloads.split(",") if w]
    variants = [v for v in a.cost_variants.split(",") if v]
    for w in workloads:
        if w not in COST_WORKLOADS:
            ap.error(f"unknown cost workload {w!r}")
    for v in variants:
        if v not in COST_VARIANTS:
            ap.error(f"unknown cost variant {v!r}")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    res = {}
    for part in a.parts.split(","):
        try:
            res[part] = {"fidelity": lambda: fidelity(out, a.n), "speed": lambda: speed(out, a.big),
                         "cost": lambda: cost(out, a.repeat, workloads, variants), "unselected": lambda: unselected(out, a.repeat)}[part]()
        except Exception as e:  # report and go on to the next part
            res[part] = {"error": f"{type(e).__name__}: {e}"[-3000:]}
        print(json.dumps({part: res[part]}, indent=1, default=str), flush=True)
    (out / "access_gpu.json").write_text(json.dumps(res, indent=1, default=str))


if __name__ == "__main__":
    main()
