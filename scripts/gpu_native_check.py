"""The GPU checks of native-program capture (scripts/gpu-native runs this on the H200).

Builds examples/native/*.cu with nvcc, runs them bare and under ``pastaprof run``, and checks
what the run stored against independent counts: the program's own (vecadd prints its
launches, copies and NVTX ranges), ``ncu``'s list of kernels (cuBLAS / cuFFT), and the exit
codes and output of the bare runs.  Prints one line per check and writes results.json.

    python3 scripts/gpu_native_check.py OUT [--parts build,vecadd,libs,loop,exits,procs,sanitizer,uvm,python]
        [--loop-rounds 3] [--loop-variants kernel,default,best,...]

Part loop prints a table (median loop time, ratio to bare, per variant of CUPTI kinds and
PASTAPROF_NATIVE_* knobs) and keeps every time in results.json ("loop").
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EX = ROOT / "examples" / "native"
RESULTS: dict[str, object] = {}
FAILED: list[str] = []


def check(name: str, ok: bool, detail: str) -> None:
    print(f"{'ok  ' if ok else 'FAIL'} {name}: {detail}", flush=True)
    RESULTS[name] = {"ok": ok, "detail": detail}
    if not ok:
        FAILED.append(name)


def sh(cmd: list[str], timeout: int = 300, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


def pastaprof_run(out: Path, cmd: list[str], extra_env: dict[str, str] | None = None, flags: list[str] | None = None,
                  timeout: int = 300) -> subprocess.CompletedProcess:
    shutil.rmtree(out, ignore_errors=True)
    env = {**os.environ, **(extra_env or {})}
    return sh([sys.executable, "-m", "pastaprof.cli", "run", "--out", str(out), *(flags or []), "--", *cmd],
              timeout=timeout, env=env)


def rows(run: Path, kind: str, where: str = "") -> int:
    import duckdb

    files = list((run / kind).glob("*.parquet"))
    if not files:
        return 0
    return duckdb.connect().execute(f"select count(*) from read_parquet({[str(f) for f in files]!r}) {where}"
                                    ).fetchone()[0]


NEEDS = {"vecadd": "vecadd", "harness": "vecadd", "exits": "vecadd", "procs": "vecadd", "sanitizer": "vecadd", "libs": "blas_fft",
         "loop": "empty_loop", "uvm": "uvm"}


def build(bdir: Path, parts: list[str]) -> dict[str, Path]:
    """The examples the parts run (blas_fft links cuBLAS and cuFFT: tens of seconds), or all with part build only."""
    bdir.mkdir(parents=True, exist_ok=True)
    want = {NEEDS[p] for p in parts if p in NEEDS} or set(NEEDS.values())
    out = {}
    for name, libs in (("vecadd", []), ("empty_loop", []), ("uvm", []), ("blas_fft", ["-lcublas", "-lcufft"])):
        if name not in want:
            continue
        exe = bdir / name
        r = sh(["nvcc", "-O2", "-arch=sm_90", "-o", str(exe), str(EX / f"{name}.cu"), *libs], timeout=240)
        check(f"build {name}", r.returncode == 0, (r.stderr.strip().splitlines() or ["built"])[-1][:200])
        out[name] = exe
    return out


def part_vecadd(exe: dict[str, Path], out: Path) -> None:
    bare = sh([str(exe["vecadd"]), "50"])
    r = pastaprof_run(out / "vecadd", [str(exe["vecadd"]), "50"])
    run = out / "vecadd"
    check("vecadd output and exit unchanged", (r.returncode, r.stdout) == (bare.returncode, bare.stdout),
          f"bare {bare.returncode} {bare.stdout.strip()!r}; run {r.returncode}; stderr {r.stderr.strip()[-300:]!r}")
    k = rows(run, "kernel")
    check("vecadd kernels == program's count", k == 50, f"{k} stored, program launched 50")
    m = rows(run, "memcpy")
    h2d = rows(run, "memcpy", "where direction = 'HtoD'")
    check("vecadd copies", (m, h2d) == (3, 2), f"{m} memcpy ({h2d} HtoD), program made 2 HtoD + 1 DtoH")
    rg = rows(run, "range", "where domain = 'nvtx'")
    check("vecadd NVTX ranges", rg == 5, f"{rg} ranges of domain nvtx, program pushed 5")
    api = rows(run, "api", "where name like 'cudaLaunchKernel%'")
    check("vecadd launch calls", api == 50, f"{api} cudaLaunchKernel rows")
    al = rows(run, "alloc")
    check("vecadd allocations", al >= 3, f"{al} alloc rows (3 cudaMalloc)")
    grid = rows(run, "kernel", "where grid_x = 4096 and block_x = 256 and name like 'vecadd%'")
    check("vecadd grid/block/name", grid == 50, f"{grid} kernels with grid 4096, block 256, name vecadd(...)")
    # API calls and syncs through CUPTI callbacks, copies/memsets/allocations/NVTX kinds enabled at their
    # first call (native/inject_callbacks.c): the same rows as the activity mechanism's, first copy and
    # first allocation included
    mech = [(p.get("handlers") or {}).get("native", {}).get("api_mechanism") for p in _processes(run)]
    check("vecadd API mechanism", mech == ["callbacks"], f"processes' api_mechanism {mech}")
    j = joined(run)
    check("vecadd kernels joined to their launch call", j == 50, f"{j} of 50 kernels share a cudaLaunchKernel row's "
          "correlation id")
    pastaprof_run(out / "vecadd-act", [str(exe["vecadd"]), "50"], {KN + "API_MECHANISM": "activity"})
    same = {}
    for kind, where in (("kernel", ""), ("memcpy", ""), ("alloc", ""), ("free", ""), ("range", ""),
                        ("api", "where name like 'cudaLaunchKernel%'"), ("api", "where name like 'cudaMemcpy%'"),
                        ("api", "where name like 'cudaMalloc%'")):
        same[f"{kind} {where}".strip()] = (rows(run, kind, where), rows(out / "vecadd-act", kind, where))
    check("vecadd callbacks == activity rows", all(a == b for a, b in same.values()),
          "; ".join(f"{k}: {a} vs {b}" for k, (a, b) in same.items()))
    ncu = ncu_kernels([str(exe["vecadd"]), "50"])
    check("vecadd kernels == ncu", ncu == 50, f"ncu lists {ncu}")
    a = sh([sys.executable, "-m", "pastaprof.cli", "analyze", str(run), "-t", "kernels"])
    check("tools on a native run", a.returncode == 0 and "vecadd" in a.stdout, (a.stdout + a.stderr)[-300:])
    RESULTS["vecadd_report"] = a.stdout[-3000:]
    # sampling and the kernel regex, in the library
    pastaprof_run(out / "vecadd-s", [str(exe["vecadd"]), "50"], flags=["--sample", "5"])
    k = rows(out / "vecadd-s", "kernel")
    check("--sample 5", k == 10, f"{k} kernels stored of 50")
    pastaprof_run(out / "vecadd-k", [str(exe["vecadd"]), "50"], flags=["--kernels", "^nomatch"])
    k = rows(out / "vecadd-k", "kernel")
    check("--kernels ^nomatch", k == 0, f"{k} kernels stored")


def joined(run: Path) -> int:
    """Kernels whose correlation id is a cudaLaunchKernel row's."""
    import duckdb

    k, a = ([str(f) for f in (run / kind).glob("*.parquet")] for kind in ("kernel", "api"))
    if not k or not a:
        return 0
    return duckdb.connect().execute(f"select count(*) from read_parquet({k!r}) where correlation in (select "
                                    f"correlation from read_parquet({a!r}) where name like 'cudaLaunchKernel%')"
                                    ).fetchone()[0]


def ncu_kernels(cmd: list[str]) -> int | None:
    if shutil.which("ncu") is None:
        return None
    r = sh(["ncu", "--clock-control", "none", "--csv", "--metrics", "gpu__time_duration.sum", *cmd], timeout=400)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith('"') and "gpu__time_duration.sum" in ln]
    return len(lines) if r.returncode == 0 else None


def part_libs(exe: dict[str, Path], out: Path) -> None:
    bare = sh([str(exe["blas_fft"]), "20"])
    r = pastaprof_run(out / "libs", [str(exe["blas_fft"]), "20"])
    check("cublas/cufft output unchanged", (r.returncode, r.stdout) == (bare.returncode, bare.stdout),
          f"{bare.stdout.strip()!r}; stderr {r.stderr.strip()[-300:]!r}")
    k = rows(out / "libs", "kernel")
    ncu = ncu_kernels([str(exe["blas_fft"]), "20"])
    check("cublas/cufft kernels == ncu", k == ncu and k > 0, f"{k} stored, ncu lists {ncu}")


KN = "PASTAPROF_NATIVE_"
DEFAULT_KINDS = "kernel,memcpy,memset,sync,memory,marker,api"
# What each CUPTI part and knob costs the launch-bound loop (the library's own switches;
# native/inject_cupti.c documents the knobs).  The loop makes kernel and launch-call records
# only (and two cudaDeviceSynchronize), so with the default (callback) mechanism "kernel+<kind>"
# shows what a kind costs as the library takes it now: api and sync are callbacks on their calls,
# memcpy/memset/memory callbacks that would enable their kind at its first call (never, here),
# marker enabled at the first NVTX call (never, here).  The "+activity" variants are the library's
# fallback (API calls as activity records, every kind enabled at start): what each kind cost before.
LOOP_VARIANTS: dict[str, dict[str, str]] = {
    "kernel": {KN + "KINDS": "kernel"},
    **{f"kernel+{k}": {KN + "KINDS": f"kernel,{k}"} for k in ("memcpy", "memset", "sync", "memory", "marker", "api")},
    "default": {},
    "default+zeroed": {KN + "ZEROED": "1"},
    "default+pinned1": {KN + "PINNED": "1"},
    "default+pinned0": {KN + "PINNED": "0"},
    "default+devbuf32": {KN + "DEVBUF_MB": "32"},
    "default+perthread0": {KN + "PERTHREAD": "0"},
    "default+perthread1": {KN + "PERTHREAD": "1"},
    "default+buffer32": {KN + "BUFFER": str(32 << 20)},  # the activity buffer (default 8 MB)
    "best": {KN + "ZEROED": "1", KN + "DEVBUF_MB": "32", KN + "BUFFER": str(32 << 20)},
    # selectable, not in the default set
    "default+buffer2": {KN + "BUFFER": str(2 << 20)},
    "default+devbuf_pre0": {KN + "DEVBUF_PRE": "0"},
    "default+devbuf_pre8": {KN + "DEVBUF_PRE": "8"},
    "no-kind": {KN + "KINDS": "none"},
    "default-no-flush": {KN + "FLUSH_MS": "0"},
    "kernel+api+zeroed": {KN + "KINDS": "kernel,api", KN + "ZEROED": "1"},
    # the activity mechanism (API calls as RUNTIME/DRIVER activity records, every kind enabled at
    # start: the library's behaviour where the CUPTI subscriber is taken), against the callbacks
    "default+activity": {KN + "API_MECHANISM": "activity"},
    # launch calls as per-cbid activity records, syncs and the lazy kinds by callbacks on their cbids
    "default+hybrid": {KN + "API_MECHANISM": "hybrid"},
    "kernel+api+hybrid": {KN + "KINDS": "kernel,api", KN + "API_MECHANISM": "hybrid"},
    "kernel+api+activity": {KN + "KINDS": "kernel,api", KN + "API_MECHANISM": "activity"},
    **{f"kernel+{k}+activity": {KN + "KINDS": f"kernel,{k}", KN + "API_MECHANISM": "activity"}
       for k in ("sync", "memcpy", "memset", "memory", "marker")},
    "best+kernel-only": {KN + "KINDS": "kernel", KN + "ZEROED": "1", KN + "DEVBUF_MB": "32",
                         KN + "BUFFER": str(32 << 20)},
}
DEFAULT_LOOP = ["kernel", *(f"kernel+{k}" for k in ("memcpy", "memset", "sync", "memory", "marker", "api")),
                "default", "default+activity", "default+zeroed", "default+pinned1", "default+pinned0", "default+devbuf32",
                "default+perthread0", "default+perthread1", "default+buffer32", "best"]


def _loop_s(r: subprocess.CompletedProcess) -> float:
    """empty_loop's own timing of its launches ("... in S s"): the program start and the store are not in it."""
    try:
        return float(r.stdout.split(" in ")[1].split()[0])
    except (IndexError, ValueError):
        RESULTS.setdefault("loop_errors", []).append((r.stdout + r.stderr)[-300:])
        return float("nan")


def _run_facts(run: Path) -> dict[str, object]:
    """Kernels stored, records dropped and the capture's notes (a knob CUPTI refused) of one run."""
    try:
        meta = json.loads((run / "run.json").read_text())
    except (OSError, ValueError) as e:
        return {"kernels": None, "dropped": None, "notes": [f"no run.json: {e}"]}
    notes = [str(v) for k, v in (meta.get("status") or {}).items() if "native" in k]
    mech = sorted({str((p.get("handlers") or {}).get("native", {}).get("api_mechanism")) for p in
                   meta.get("processes") or []})
    return {"kernels": (meta.get("rows") or {}).get("kernel", 0), "dropped": meta.get("dropped_events"), "notes": notes,
            "api_mechanism": mech, "launch_calls": rows(run, "api", "where name like 'cudaLaunchKernel%'"),
            "syncs": rows(run, "sync"), "rows": meta.get("rows")}


def part_loop(exe: dict[str, Path], out: Path, rounds: int = 3, variants: list[str] | None = None) -> None:
    names = variants or DEFAULT_LOOP
    times: dict[str, list[float]] = {"bare": [], **{v: [] for v in names}}
    walls: dict[str, list[float]] = {"bare": [], **{v: [] for v in names}}
    facts: dict[str, dict[str, object]] = {}
    for rnd in range(rounds):  # interleaved: the host drifts between minutes
        t0 = time.perf_counter()
        times["bare"].append(_loop_s(sh([str(exe["empty_loop"]), "100000"])))
        walls["bare"].append(time.perf_counter() - t0)
        for name in names:
            t0 = time.perf_counter()
            r = pastaprof_run(out / "loop", [str(exe["empty_loop"]), "100000"], LOOP_VARIANTS[name])
            walls[name].append(time.perf_counter() - t0)
            times[name].append(_loop_s(r))
            if rnd == 0:
                facts[name] = _run_facts(out / "loop")
    med = {n: statistics.median(v) for n, v in times.items()}
    bare = med["bare"]
    print(f"\nlaunch-bound loop: empty_loop 100000, {rounds} rounds, median of the program's own loop time", flush=True)
    print(f"{'variant':<22} {'loop s':>8} {'x bare':>7} {'us/launch':>9} {'proc s':>7} {'kernels':>8} {'dropped':>7}  "
          "env / notes")
    for n in times:
        f = facts.get(n, {})
        env = " ".join(f"{k.removeprefix(KN)}={v}" for k, v in LOOP_VARIANTS.get(n, {}).items())
        notes = "; ".join([*(f.get("notes") or []), f"api {','.join(f.get('api_mechanism') or [])[:40]}",  # type: ignore[list-item]
                           f"{f.get('launch_calls')} launch calls, {f.get('syncs')} syncs"])
        print(f"{n:<22} {med[n]:>8.4f} {med[n] / bare:>7.2f} {med[n] / 100000 * 1e6:>9.2f} "
              f"{statistics.median(walls[n]):>7.2f} {str(f.get('kernels', '-')):>8} {str(f.get('dropped', '-')):>7}  "
              f"{env}{'  | ' + notes if notes else ''}", flush=True)
    if "default" in med:
        k = facts["default"]["kernels"]
        check("100,000 empty kernels counted", k == 100001, f"{k} stored (program launched 100,001)")
        f = facts["default"]
        check("loop: launch calls and syncs by callbacks", (f["api_mechanism"], f["launch_calls"], f["syncs"]) == (
              ["callbacks"], 100001, 2), f"{f['api_mechanism']}, {f['launch_calls']} cudaLaunchKernel rows of 100,001, "
              f"{f['syncs']} sync rows of 2 (cudaDeviceSynchronize)")
        check("launch-bound loop <= 1.3x", med["default"] / bare <= 1.3,
              f"default {med['default'] / bare:.2f}x (bare {bare / 100000 * 1e6:.2f} us/launch); best variant "
              "{1} {0:.2f}x".format(*min((m / bare, n) for n, m in med.items() if n != "bare")))
    RESULTS["loop"] = {"rounds": rounds, "bare_median_s": bare,
                       "variants": {n: {"env": LOOP_VARIANTS.get(n, {}), "median_s": med[n], "ratio": med[n] / bare,
                                        "times_s": times[n], "process_s": walls[n], **facts.get(n, {})}
                                    for n in times}}


def part_exits(exe: dict[str, Path], out: Path) -> None:
    bare = sh([str(exe["vecadd"]), "30", "abort"])
    r = pastaprof_run(out / "abort", [str(exe["vecadd"]), "30", "abort"])
    k = rows(out / "abort", "kernel")
    api = rows(out / "abort", "api", "where name like 'cudaLaunchKernel%'")  # callback rows, written at abort()
    check("abort(): exit, kernels and launch calls", r.returncode == bare.returncode and k == 30 and api == 30,
          f"exit bare {bare.returncode} run {r.returncode}; {k} kernels of 30, {api} cudaLaunchKernel rows")
    run = out / "term"
    shutil.rmtree(run, ignore_errors=True)
    p = subprocess.Popen([sys.executable, "-m", "pastaprof.cli", "run", "--out", str(run), "--",
                          str(exe["vecadd"]), "0", "spin"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(4)
    p.send_signal(signal.SIGTERM)
    try:
        so, se = p.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill()
        so, se = p.communicate()
        se = "hung after SIGTERM; " + se
    k = rows(run, "kernel")
    check("SIGTERM: run stored with the kernels so far", p.returncode in (-15, 143) and k > 1000,
          f"exit {p.returncode}; {k} kernels; stderr {se.strip()[-200:]!r}")
    # injection failure: a libcupti that does not load -> one line, the program unchanged
    bad = out / "not-a-lib.so"
    bad.write_text("x")
    bare = sh([str(exe["vecadd"]), "10"])
    r = pastaprof_run(out / "bad", [str(exe["vecadd"]), "10"], {"PASTAPROF_NATIVE_CUPTI": str(bad)})
    lines = [ln for ln in r.stderr.splitlines() if "native capture" in ln or "libcupti" in ln]
    check("injection failure: one line, program unchanged",
          (r.returncode, r.stdout) == (bare.returncode, bare.stdout) and len(lines) == 1, repr(r.stderr[-400:]))


def part_procs(exe: dict[str, Path], out: Path) -> None:
    script = f"{exe['vecadd']} 10 && RANK=1 {exe['vecadd']} 20"
    r = pastaprof_run(out / "procs", ["sh", "-c", script])
    k = rows(out / "procs", "kernel")
    ranks = json.loads((out / "procs" / "run.json").read_text()).get("ranks") if r.returncode == 0 else None
    check("child processes: one shard each", k == 30 and ranks == [0, 1], f"{k} kernels of 10+20, ranks {ranks}")
    # two programs of one rank, each numbering its launches from 1
    r = pastaprof_run(out / "procs", ["sh", "-c", f"{exe['vecadd']} 10 && {exe['vecadd']} 20"])
    check("two programs of one rank: each kernel joins its own launch call",
          r.returncode == 0 and _joins_own_calls(out / "procs"), f"{rows(out / 'procs', 'kernel')} kernels of 30; "
          f"{r.stderr[-200:]!r}")
    mpirun = shutil.which("mpirun")
    if mpirun:
        r = pastaprof_run(out / "mpi", [mpirun, "--allow-run-as-root", "--oversubscribe", "-np", "2",
                                        str(exe["vecadd"]), "10"])
        k = rows(out / "mpi", "kernel")
        ranks = json.loads((out / "mpi" / "run.json").read_text()).get("ranks") if (out / "mpi").exists() else None
        check("mpirun -np 2", k == 20 and ranks == [0, 1], f"{k} kernels, ranks {ranks}; {r.stderr[-200:]!r}")
    else:
        RESULTS["mpirun"] = "not on this machine"


def _joins_own_calls(run: Path) -> bool:
    """Every kernel has exactly one launch call of its (rank, correlation), of its own pid."""
    import duckdb

    k = [str(f) for f in (run / "kernel").glob("*.parquet")]
    a = [str(f) for f in (run / "api").glob("*.parquet")]
    if not k or not a:
        return False
    q = (f"select count(*), count(*) filter (where calls = 1 and same = 1) from (select k.rank, k.correlation, "
         f"count(a.pid) as calls, bool_and(a.pid = k.pid)::int as same from read_parquet({k!r}) k left join "
         f"read_parquet({a!r}) a on a.rank = k.rank and a.correlation = k.correlation group by all)")
    n, ok = duckdb.connect().execute(q).fetchone()
    return n > 0 and n == ok


def part_sanitizer(exe: dict[str, Path], out: Path) -> None:
    """-t working_set on the native vector add: per launch, exactly 2 * 2^20 lane reads and
    2^20 lane writes (4096 blocks x 256 threads = 2^20 elements, c[i] = a[i] + b[i])."""
    bare = sh([str(exe["vecadd"]), "3"])
    r = pastaprof_run(out / "san", [str(exe["vecadd"]), "3"], flags=["-t", "working_set"], timeout=400)
    run = out / "san"
    check("sanitizer: output unchanged", (r.returncode, r.stdout) == (bare.returncode, bare.stdout),
          f"exit {r.returncode}; stderr {r.stderr.strip()[-400:]!r}")
    import duckdb

    files = [str(f) for f in (run / "access_summary").glob("*.parquet")]
    if not files:
        check("sanitizer: exact access counts", False, f"no access_summary rows; stderr {r.stderr[-400:]!r}")
        return
    got = duckdb.connect().execute(f"select correlation, sum(reads), sum(writes) from read_parquet({files!r}) "
                                   "group by correlation order by correlation").fetchall()
    want = [(2 << 20, 1 << 20)] * 3
    check("sanitizer: exact access counts", [(int(a), int(b)) for _, a, b in got] == want,
          f"per launch (reads, writes) {[(int(a), int(b)) for _, a, b in got]}, expected {want[0]} x 3")
    RESULTS["sanitizer_report"] = r.stderr[-3000:]


def total(run: Path, kind: str, col: str, where: str = "") -> int:
    import duckdb

    files = list((run / kind).glob("*.parquet"))
    if not files:
        return 0
    v = duckdb.connect().execute(f"select sum({col}) from read_parquet({[str(f) for f in files]!r}) {where}").fetchone()
    return int(v[0] or 0)


def part_uvm(exe: dict[str, Path], out: Path) -> None:
    """examples/native/uvm.cu under --uvm: the stored counters against the program's own counts
    (every managed page written on the host, touched by a kernel, read back), the uvm_advisor
    report on the run, and no uvm rows without --uvm."""
    cmd = [str(exe["uvm"]), "64"]
    bare = sh(cmd)
    facts = dict(kv.split("=") for kv in bare.stdout.split() if "=" in kv)
    touched, read = int(facts.get("kernel_touched", 0)), int(facts.get("host_read", 0))
    r = pastaprof_run(out / "uvm", cmd, flags=["--uvm"])
    run = out / "uvm"
    check("uvm output and exit unchanged", (r.returncode, r.stdout) == (bare.returncode, bare.stdout) and
          "check ok" in bare.stdout, f"bare {bare.returncode} {bare.stdout.strip()!r}; run {r.returncode}; "
          f"stderr {r.stderr.strip()[-300:]!r}")
    status = [p.get("status", {}).get("uvm") for p in _processes(run)]
    htod = total(run, "uvm", "bytes", "where uvm_kind = 'htod'")
    dtoh = total(run, "uvm", "bytes", "where uvm_kind = 'dtoh'")
    faults = total(run, "uvm", "count", "where uvm_kind = 'gpu_page_fault'")
    cpu = total(run, "uvm", "count", "where uvm_kind = 'cpu_page_fault'")
    RESULTS["uvm_counts"] = {"htod_bytes": htod, "dtoh_bytes": dtoh, "gpu_fault_groups": faults, "cpu_faults": cpu,
                             "rows": rows(run, "uvm"), "status": status, "program": facts}
    check("uvm status", status == ["ok"], f"processes' uvm status {status}")
    check("uvm HtoD >= bytes the kernel touched", touched > 0 and htod >= touched, f"{htod} B HtoD, touched {touched}")
    check("uvm GPU page-fault groups", faults > 0, f"{faults} fault groups, {cpu} CPU faults")
    check("uvm DtoH >= bytes the host read back", read > 0 and dtoh >= read, f"{dtoh} B DtoH, read {read}")
    j = out / "uvm.json"
    a = sh([sys.executable, "-m", "pastaprof.cli", "analyze", str(run), "-t", "uvm_advisor", "--json", str(j), "-q"])
    s = json.loads(j.read_text())["tools"]["uvm_advisor"]["summary"] if a.returncode == 0 and j.exists() else {}
    RESULTS["uvm_advisor"] = s
    check("uvm_advisor reports them", (s.get("htod_bytes"), s.get("dtoh_bytes"), s.get("gpu_faults")) == (
          htod, dtoh, faults) and s.get("allocations", 0) >= 1 and s.get("unattributed") == 0,
          f"summary {s}; stderr {a.stderr.strip()[-300:]!r}")
    pastaprof_run(out / "uvm-off", cmd)
    n = rows(out / "uvm-off", "uvm")
    check("no uvm rows without --uvm", n == 0, f"{n} uvm rows")


def _processes(run: Path) -> list[dict]:
    p = run / "run.json"
    return json.loads(p.read_text()).get("processes", []) if p.exists() else []


def part_python(out: Path) -> None:
    """A torch program started by a shell under `pastaprof run` (the shell is not Python, so the
    library is in CUDA_INJECTION64_PATH and LD_PRELOAD for it): the Python session captures it,
    the library stays out (no native files, no CUPTI conflict)."""
    code = "import torch; x = torch.ones(1000, device='cuda'); [x.add_(1) for _ in range(100)]; print(x[0].item())"
    r = pastaprof_run(out / "py", ["sh", "-c", f'exec "{sys.executable}" -c "{code}"'])
    k = rows(out / "py", "kernel")
    mech = json.loads((out / "py" / "run.json").read_text())["processes"] if (out / "py" / "run.json").exists() else []
    names = [list((p.get("handlers") or {}).keys()) for p in mech]
    check("torch program: Python session only", r.returncode == 0 and k >= 100 and not any("native" in n for n in names),
          f"{k} kernels, handlers {names}; stdout {r.stdout.strip()!r}; stderr {r.stderr.strip()[-300:]!r}")


def part_harness(exe: dict[str, Path], out: Path) -> None:
    """A Python program that does torch work and runs a native program (a harness): the torch
    kernels are its Python session's, the native program's 10 kernels the library's."""
    code = (f"import subprocess, torch; x = torch.ones(1000, device='cuda'); [x.add_(1) for _ in range(100)]; "
            f"torch.cuda.synchronize(); print(subprocess.run(['{exe['vecadd']}', '10']).returncode)")
    r = pastaprof_run(out / "harness", [sys.executable, "-c", code])
    native = rows(out / "harness", "kernel", "where name like 'vecadd%'")
    torch_k = rows(out / "harness", "kernel", "where name not like 'vecadd%'")
    check("python harness: its native child captured", r.returncode == 0 and native == 10 and torch_k >= 100,
          f"{native} vecadd kernels (10 launched), {torch_k} torch kernels; stdout {r.stdout.strip()[-120:]!r}; "
          f"stderr {r.stderr.strip()[-300:]!r}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--parts", default="build,vecadd,libs,loop,exits,procs,sanitizer,uvm,python,harness")
    ap.add_argument("--loop-rounds", type=int, default=3, help="rounds of part loop (each runs every variant once)")
    ap.add_argument("--pin", action="store_true",
                    help="run every program on the GPU's NUMA-local CPUs (bench/host_cpus.py), as launchers bind ranks")
    ap.add_argument("--loop-variants", default="",
                    help=f"comma-separated, of: {', '.join(LOOP_VARIANTS)} (default: {','.join(DEFAULT_LOOP)})")
    a = ap.parse_args()
    variants = [v for v in a.loop_variants.split(",") if v]
    unknown = [v for v in variants if v not in LOOP_VARIANTS]
    if unknown or a.loop_rounds < 1:
        print(f"gpu_native_check: unknown loop variants {unknown} or --loop-rounds < 1", file=sys.stderr)
        return 2
    a.out.mkdir(parents=True, exist_ok=True)
    if a.pin:
        sys.path.insert(0, str(ROOT / "bench"))
        from host_cpus import gpu_local_cpus

        cpus = gpu_local_cpus()
        if cpus:
            os.sched_setaffinity(0, cpus)  # the programs and pastaprof run inherit it
        RESULTS["pinned_cpus"] = sorted(cpus)
        print(f"pinned to {len(cpus)} GPU-local CPUs" if cpus else "--pin: the GPU's local CPUs unknown; not pinned")
    parts = a.parts.split(",")
    exe = build(Path("/tmp/pastaprof-native-build"), parts)
    runs = Path("/tmp/pastaprof-native-runs")  # the runs stay on the machine; results.json comes back
    runs.mkdir(parents=True, exist_ok=True)
    loop = functools.partial(part_loop, rounds=a.loop_rounds, variants=variants or None)
    for name, fn in (("vecadd", part_vecadd), ("libs", part_libs), ("loop", loop), ("exits", part_exits),
                     ("procs", part_procs), ("sanitizer", part_sanitizer), ("uvm", part_uvm),
                     ("harness", part_harness)):
        if name in parts:
            t0 = time.perf_counter()
            try:
                fn(exe, runs)
            except Exception as e:  # noqa: BLE001 -- one part's failure is reported, the others run
                check(f"{name} part", False, f"{type(e).__name__}: {e}")
            RESULTS[f"{name}_seconds"] = round(time.perf_counter() - t0, 1)
    if "python" in parts:
        try:
            part_python(runs)
        except Exception as e:  # noqa: BLE001
            check("python part", False, f"{type(e).__name__}: {e}")
    (a.out / "results.json").write_text(json.dumps(RESULTS, indent=1))
    print(f"{len(FAILED)} failed: {FAILED}" if FAILED else "all native checks passed")
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
