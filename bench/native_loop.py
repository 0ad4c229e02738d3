"""The launch-bound native loop under ``pastaprof run``, per process and per CPU placement.

``scripts/gpu_native_check.py`` (part loop) gives one time per fresh process.  On the lent
machines those times are bimodal (the same variant 0.45 s in one process, 0.65 s in the next),
which three or five rounds cannot average away.  This benchmark asks where that comes from:

* each process runs the loop R times (``empty_loop N R``): a slow process that stays slow is a
  placement of the process, a slow repetition inside a fast process is the host's noise;
* each variant runs on several CPU sets (``--cpusets``): ``local`` the GPU's NUMA-local CPUs,
  ``cores`` one hardware thread of each of those cores (no SMT sibling shared), ``two`` two CPUs
  of different cores, ``one`` a single CPU (every thread shares it);
* each process prints its threads' CPU time (``PP_LOOP_THREADS=1``): which thread besides the
  program's own was busy (CUPTI's worker, pastaprof's flusher);
* one kernel-records run gives the GPU's side: the kernels' median duration and the median gap
  between consecutive kernel starts (a gap far above the duration: the host is the bottleneck).

* ``--no-aslr`` runs every process with address-space randomization off (``setarch -R``): if the
  two speeds follow where the process's memory lands, they go away with it.

Besides the median of all repetitions, each variant's per-process medians are summarized: the
median process and the best one, each against bare's.

    python3 bench/native_loop.py EMPTY_LOOP [--rounds 3] [--repeats 5] [--n 100000]
        [--variants bare,kernel,default] [--cpusets local,cores,one] [--no-aslr] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from host_cpus import gpu_local_cpus  # noqa: E402

KN = "PASTAPROF_NATIVE_"
VARIANTS: dict[str, dict[str, str] | None] = {
    "bare": None,
    "kernel": {KN + "KINDS": "kernel"},
    "kernel+api": {KN + "KINDS": "kernel,api"},
    "default": {},
    "default+hybrid": {KN + "API_MECHANISM": "hybrid"},
    "default+activity": {KN + "API_MECHANISM": "activity"},
    "default-no-flush": {KN + "FLUSH_MS": "0"},
    "default-no-preload": {KN + "PRELOAD": "0"},
}


def cpusets(names: list[str]) -> dict[str, list[int]]:
    local = sorted(gpu_local_cpus() or os.sched_getaffinity(0))
    cores: dict[str, int] = {}
    for c in local:
        try:
            sib = Path(f"/sys/devices/system/cpu/cpu{c}/topology/thread_siblings_list").read_text().strip()
        except OSError:
            sib = str(c)
        cores.setdefault(sib, c)
    one_per_core = sorted(cores.values())
    sets = {"local": local, "cores": one_per_core, "two": one_per_core[:2], "one": local[:1]}
    return {n: sets[n] for n in names}


def loop_times(stdout: str) -> list[float]:
    return [float(m) for m in re.findall(r"empty kernels in ([0-9.]+) s", stdout)]


def threads(stdout: str) -> list[tuple[str, int, int]]:
    return [(m[0], int(m[1]), int(m[2])) for m in re.findall(r"thread \d+ (.+?) cpu_ticks (\d+) last_cpu (\d+)", stdout)]


NO_ASLR: list[str] = []  # ["setarch", machine, "-R"] with --no-aslr


def run_one(exe: str, n: int, repeats: int, env_extra: dict[str, str] | None, cpus: list[int],
            out: Path) -> dict[str, object]:
    env = {**os.environ, "PP_LOOP_THREADS": "1"}
    prog = [*NO_ASLR, "taskset", "-c", ",".join(map(str, cpus)), exe, str(n), str(repeats)]
    if env_extra is None:
        cmd = prog
    else:
        env.update(env_extra)
        shutil.rmtree(out, ignore_errors=True)
        cmd = [*NO_ASLR, "taskset", "-c", ",".join(map(str, cpus)), sys.executable, "-m", "pastaprof.cli", "run",
               "--out", str(out), "--", exe, str(n), str(repeats)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    t = loop_times(r.stdout)
    if len(t) != repeats:
        return {"error": (r.stdout + r.stderr)[-400:], "times": t}
    return {"times": t, "threads": threads(r.stdout)}


def per_process(procs: list[dict[str, object]]) -> list[float]:
    """Each process's median repetition: a process's speed, one number per process."""
    return [statistics.median(p["times"]) for p in procs if "error" not in p and p["times"]]


def gpu_side(run: Path) -> dict[str, float]:
    """Median kernel duration and median gap between consecutive kernel starts, in us."""
    import duckdb

    files = [str(f) for f in (run / "kernel").glob("*.parquet")]
    if not files:
        return {}
    q = (f"select median(end_ns - start_ns) / 1e3, median(gap) / 1e3 from (select end_ns, start_ns, "
         f"start_ns - lag(start_ns) over (order by start_ns) as gap from read_parquet({files!r}))")
    dur, gap = duckdb.connect().execute(q).fetchone()
    return {"kernel_us": dur, "start_gap_us": gap}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("exe")
    ap.add_argument("--n", type=int, default=100000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--variants", default="bare,kernel,default")
    ap.add_argument("--cpusets", default="local,cores,one")
    ap.add_argument("--no-aslr", action="store_true")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    if a.no_aslr:
        NO_ASLR[:] = ["setarch", os.uname().machine, "-R"]
    names = a.variants.split(",")
    bad = [v for v in names if v not in VARIANTS]
    if bad or not Path(a.exe).exists():
        print(f"native_loop: unknown variants {bad} or no {a.exe}", file=sys.stderr)
        return 2
    sets = cpusets(a.cpusets.split(","))
    work = Path(tempfile.mkdtemp(prefix="pp-native-loop-"))
    res: dict[str, dict[str, list[dict[str, object]]]] = {s: {v: [] for v in names} for s in sets}
    for _ in range(a.rounds):  # interleaved: the host drifts between minutes
        for s, cpus in sets.items():
            for v in names:
                res[s][v].append(run_one(a.exe, a.n, a.repeats, VARIANTS[v], cpus, work / "run"))
    side = {}
    if "kernel" in names:
        run_one(a.exe, a.n, 1, VARIANTS["kernel"], sets[next(iter(sets))], work / "run")
        side = gpu_side(work / "run")
    print(f"empty_loop {a.n} x {a.repeats} repetitions per process, {a.rounds} processes per variant and CPU set")
    if side:
        print(f"GPU side (kernel records, one process): kernel {side['kernel_us']:.2f} us, "
              f"gap between kernel starts {side['start_gap_us']:.2f} us")
    for s, cpus in sets.items():
        bare = statistics.median(t for p in res[s].get("bare", []) for t in p["times"]) if "bare" in names else None
        bare_procs = per_process(res[s].get("bare", []))
        print(f"\nCPU set {s} ({len(cpus)} CPUs: {','.join(map(str, cpus[:8]))}{'...' if len(cpus) > 8 else ''})"
              f"{', ASLR off' if NO_ASLR else ''}")
        print(f"{'variant':<18} {'first':>7} {'all':>7} {'x bare':>7} {'med proc':>8} {'x':>6} {'best':>7} {'x':>6}"
              "  per process: repetitions (s)")
        for v in names:
            procs = res[s][v]
            ok = [p for p in procs if "error" not in p]
            if not ok:
                print(f"{v:<18} failed: {procs[0].get('error')}")
                continue
            first = statistics.median(p["times"][0] for p in ok)
            every = statistics.median(t for p in ok for t in p["times"])
            ratio = f"{every / bare:7.3f}" if bare else "      -"
            procs_s = per_process(ok)
            med, best = statistics.median(procs_s), min(procs_s)
            vs = (f"{med / statistics.median(bare_procs):6.3f} {best:7.4f} {best / min(bare_procs):6.3f}"
                  if bare_procs else f"{'-':>6} {best:7.4f} {'-':>6}")
            rows = " | ".join(" ".join(f"{t:.3f}" for t in p["times"]) for p in ok)
            print(f"{v:<18} {first:7.4f} {every:7.4f} {ratio} {med:8.4f} {vs}  {rows}")
            busy = sorted(ok[-1]["threads"], key=lambda x: -x[1])[:4]
            print(f"{'':<18} threads (cpu ticks, last cpu): " + ", ".join(f"{nm} {tk} @{c}" for nm, tk, c in busy))
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "native_loop.json").write_text(json.dumps({"sets": sets, "gpu_side": side, "results": res}, indent=1))
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
