#!/usr/bin/env python3
"""Import benchmark: pastaprof vs HolisticTraceAnalysis (HTA) on one big Kineto trace.

In one invocation, on the same file, each measured command is a child process whose
wall time and resources are measured from the outside:

  analyze   pastaprof analyze BIG -t kernels,timeline -q --json OUT.json
  import    pastaprof import BIG -o RUNDIR     (+ size of RUNDIR vs the JSON)
  hta       HTA 0.5.0 (from /work/htaenv, never a pastaprof dependency):
            TraceAnalysis(trace_dir=DIR-with-a-symlink-to-BIG),
            get_temporal_breakdown(), get_gpu_kernel_breakdown()

With --repeat N the three are interleaved (analyze, import, hta, analyze, ...), so a
drift of the machine hits all of them alike.  The file is read once beforehand so that
every run finds it in the page cache (the machine has RAM enough to keep it).

Measurements per run:
* wall: time.perf_counter() around spawn .. os.wait4();
* peak RSS: ``ru_maxrss`` of the rusage os.wait4() returns for that child (the kernel's
  high-water mark of the child, or of the largest of its own reaped children); plus
  the peak of the summed RSS of the child's whole process tree, sampled every 50 ms
  from /proc (catches helper processes that run at the same time, e.g. HTA's pools);
* user + sys CPU seconds from the same rusage.

Usage:
    .venv/bin/python bench/import_bench.py                 # builds the trace if missing (57 copies)
    .venv/bin/python bench/import_bench.py --skip-hta --repeat 3
    .venv/bin/python bench/import_bench.py --copies 2 --skip-hta  # quick smoke run

Results: a table on stdout and everything as JSON in --results
(default /tmp/pastaprof-bench/results.json).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
WORK = Path("/tmp/pastaprof-bench")
HTA_PYTHON = Path("/work/htaenv/bin/python")
PASTAPROF_TARGETS = {"wall_s": 15.0, "peak_rss_bytes": 1.5e9, "store_ratio": 0.1}
HTA_EARLIER = {"wall_s": 216.0, "peak_rss_bytes": 6.3e9}

HTA_SNIPPET = r"""
import json, logging, os, sys, time
t0 = time.perf_counter()
from hta.trace_analysis import TraceAnalysis
t_import = time.perf_counter()
for h in logging.getLogger("hta").handlers:
    h.setLevel(logging.CRITICAL + 1)
ta = TraceAnalysis(trace_dir=sys.argv[1])
t_load = time.perf_counter()
tb = ta.get_temporal_breakdown(visualize=False)
t_temporal = time.perf_counter()
kt, kernels = ta.get_gpu_kernel_breakdown(visualize=False)
t_kernels = time.perf_counter()
print(json.dumps({
    "phases_s": {"import_hta": t_import - t0, "load": t_load - t_import,
                 "temporal_breakdown": t_temporal - t_load, "gpu_kernel_breakdown": t_kernels - t_temporal},
    "temporal_breakdown": json.loads(tb.to_json(orient="records")),
    "kernel_types": json.loads(kt.to_json(orient="records")),
    "n_rows": {str(r): int(len(df)) for r, df in ta.t.traces.items()},
}))
"""


# ----------------------------------------------------------------------------- measuring


def _tree_rss(root: int) -> int:
    """Summed RSS (bytes) of ``root`` and its descendants, from /proc."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    page = os.sysconf("SC_PAGE_SIZE")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        fields = stat[stat.rindex(b")") + 2 :].split()
        pid, ppid = int(entry), int(fields[1])
        children.setdefault(ppid, []).append(pid)
        rss[pid] = int(fields[21]) * page
    total, stack = 0, [root]
    while stack:
        p = stack.pop()
        total += rss.get(p, 0)
        stack.extend(children.get(p, []))
    return total


def measure(cmd: list[str], env: dict[str, str] | None = None, log: Path | None = None,
            sample_s: float = 0.05) -> dict:
    """Run ``cmd``; wall seconds, peak RSS (wait4 and sampled tree), CPU seconds, rc, output."""
    out = open(log, "wb") if log else subprocess.DEVNULL
    stdout = tempfile.TemporaryFile()
    try:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=stdout, stderr=out, env=env, start_new_session=True)
        peak = 0
        stop = threading.Event()

        def sampler() -> None:
            nonlocal peak
            while not stop.is_set():
                try:
                    peak = max(peak, _tree_rss(proc.pid))
                except Exception:
                    pass
                stop.wait(sample_s)

        th = threading.Thread(target=sampler, daemon=True)
        th.start()
        try:
            _, status, ru = os.wait4(proc.pid, 0)
        except BaseException:  # interrupted: stop the child (its own process group) too
            os.killpg(proc.pid, 15)
            proc.wait()
            raise
        wall = time.perf_counter() - t0
        stop.set()
        th.join()
        proc.returncode = os.waitstatus_to_exitcode(status)
        stdout.seek(0)
        text = stdout.read().decode(errors="replace")
    finally:
        stdout.close()
        if log:
            out.close()
    return {
        "cmd": cmd, "rc": proc.returncode, "wall_s": wall, "loadavg_after": os.getloadavg(),
        "peak_rss_bytes": ru.ru_maxrss * 1024, "peak_tree_rss_sampled_bytes": peak,
        "user_s": ru.ru_utime, "sys_s": ru.ru_stime, "stdout": text[-20000:],
    }


def du_bytes(path: Path) -> dict:
    """Apparent size (sum of file sizes) and allocated size (du) of a directory."""
    apparent = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    try:
        allocated = int(subprocess.run(["du", "-sB1", str(path)], capture_output=True, text=True,
                                       check=True).stdout.split()[0])
    except (OSError, subprocess.CalledProcessError, ValueError, IndexError):
        allocated = None
    files = sorted(str(p.relative_to(path)) for p in path.rglob("*") if p.is_file())
    return {"apparent_bytes": apparent, "du_bytes": allocated, "n_files": len(files), "files": files[:50]}


# ----------------------------------------------------------------------------- environment


def _pkg_versions(python: str, names: list[str]) -> dict:
    code = ("import json, importlib.metadata as m, sys\nout={'python': sys.version.split()[0]}\n"
            f"for n in {names!r}:\n"
            "    try: out[n]=m.version(n)\n"
            "    except Exception: out[n]=None\n"
            "print(json.dumps(out))")
    try:
        return json.loads(subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout)
    except Exception as e:  # noqa: BLE001
        return {"error": str(e)}


def _git_state() -> dict:
    """HEAD, uncommitted files under src/ and a hash of their diff: the code a run measured
    (pastaprof is installed editable, so src/ edits made during a benchmark count)."""
    import hashlib

    def git(*a: str) -> str:
        return subprocess.run(["git", "-C", str(REPO), *a], capture_output=True, text=True).stdout.rstrip()
    diff = git("diff", "HEAD", "--", "src")
    return {"head": git("rev-parse", "--short", "HEAD").strip(), "uncommitted_src": git("status", "--short", "src").splitlines(),
            "src_diff_sha1": hashlib.sha1(diff.encode()).hexdigest()[:10] if diff else None}


def machine_info() -> dict:
    cpu = "?"
    with open("/proc/cpuinfo") as fh:
        for line in fh:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem = 0
    with open("/proc/meminfo") as fh:
        for line in fh:
            if line.startswith("MemTotal:"):
                mem = int(line.split()[1]) * 1024
    st = os.statvfs(tempfile.gettempdir())
    return {
        "date": subprocess.run(["date"], capture_output=True, text=True).stdout.strip(),
        "cpu": cpu, "cores": os.cpu_count(), "ram_bytes": mem, "kernel": platform.release(),
        "tmp_free_bytes": st.f_bavail * st.f_frsize,
    }


def available_tools(pastaprof: str, wanted: list[str], tries: int = 5) -> tuple[list[str], str]:
    """Installed tool names (retried a few times while a wanted one is missing: a tool
    whose module is being edited fails to load for a moment) and the last stderr."""
    for _ in range(tries):
        r = subprocess.run([pastaprof, "tools"], capture_output=True, text=True)
        have = [line.split()[0] for line in r.stdout.splitlines() if line.strip()]
        if all(t in have for t in wanted):
            break
        time.sleep(3)
    return have, r.stderr.strip()


# ----------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", type=Path, help="trace to use (default: /tmp/pastaprof-bench/gpt2_x<copies>.pt.trace.json, built if missing)")
    ap.add_argument("--copies", type=int, default=57, help="copies of the example for the built trace (default 57: ~4.0 M events, ~1.27 GB)")
    ap.add_argument("--repeat", type=int, default=1, help="rounds; the commands are interleaved in each round")
    ap.add_argument("--skip-hta", action="store_true", help="do not run HTA")
    ap.add_argument("--skip-import", action="store_true", help="do not run `pastaprof import`")
    ap.add_argument("--tools", default="kernels,timeline", help="tools for `pastaprof analyze` (missing ones are dropped with a warning)")
    ap.add_argument("--hta-python", type=Path, default=HTA_PYTHON, help=f"python with HTA 0.5.0 (default {HTA_PYTHON})")
    ap.add_argument("--pastaprof", default=str(Path(sys.executable).with_name("pastaprof")), help="pastaprof executable")
    ap.add_argument("--workdir", type=Path, default=WORK)
    ap.add_argument("--results", type=Path, help="JSON results (default WORKDIR/results.json)")
    args = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so a measured child is stopped too

    work = args.workdir
    work.mkdir(parents=True, exist_ok=True)
    trace = args.trace or work / f"gpt2_x{args.copies}.pt.trace.json"
    gen = None
    if not trace.exists():
        print(f"building {trace} ...", flush=True)
        t0 = time.perf_counter()
        r = subprocess.run([sys.executable, str(HERE / "make_big_trace.py"), "--copies", str(args.copies),
                            "-o", str(trace), "--json"], capture_output=True, text=True, check=True)
        gen = json.loads(r.stdout.strip().splitlines()[-1])
        print(f"  built in {time.perf_counter() - t0:.1f} s: {gen['events']:,} events, {gen['bytes']:,} bytes", flush=True)
    json_bytes = trace.stat().st_size

    tools = [t for t in args.tools.split(",") if t]
    have, why = available_tools(args.pastaprof, tools)
    missing = [t for t in tools if t not in have]
    if missing:
        print(f"warning: tools not installed, dropped: {missing} (have {have}) {why}", file=sys.stderr)
        tools = [t for t in tools if t in have]
    hta = not args.skip_hta
    if hta and not args.hta_python.exists():
        print(f"warning: {args.hta_python} missing: skipping HTA", file=sys.stderr)
        hta = False

    # Warm the page cache so that every measured run reads the file from memory.
    t0 = time.perf_counter()
    with open(trace, "rb") as fh:
        while fh.read(64 << 20):
            pass
    print(f"pre-read {json_bytes:,} bytes in {time.perf_counter() - t0:.1f} s", flush=True)

    hta_dir = Path(tempfile.mkdtemp(prefix="hta-", dir=work))
    (hta_dir / trace.name).symlink_to(trace.resolve())
    hta_env = dict(os.environ, HTA_DISABLE_NS_ROUNDING="1")  # as bench/hta_reference.py's hta_ns_precision

    src_at_start = _git_state()
    runs: list[dict] = []
    logs = work / "logs"
    logs.mkdir(exist_ok=True)
    try:
        for rnd in range(args.repeat):
            # analyze
            jout = work / f"analyze_r{rnd}.json"
            cmd = [args.pastaprof, "analyze", str(trace), "-t", ",".join(tools), "-q", "--json", str(jout)]
            print(f"[round {rnd + 1}/{args.repeat}] analyze -t {','.join(tools)} ...", flush=True)
            m = measure(cmd, log=logs / f"analyze_r{rnd}.log") | {"what": "analyze", "round": rnd, "src": _git_state()}
            if m["rc"] == 0 and jout.exists():
                with open(jout) as fh:
                    m["summaries"] = {k: v.get("summary") for k, v in json.load(fh)["tools"].items()}
            runs.append(m)
            _print_run(m)
            # import
            if not args.skip_import:
                rundir = work / f"run_r{rnd}"
                shutil.rmtree(rundir, ignore_errors=True)
                cmd = [args.pastaprof, "import", str(trace), "-o", str(rundir)]
                print(f"[round {rnd + 1}/{args.repeat}] import ...", flush=True)
                m = measure(cmd, log=logs / f"import_r{rnd}.log") | {"what": "import", "round": rnd,
                                                                      "src": _git_state()}
                if m["rc"] == 0:
                    m["store"] = du_bytes(rundir)
                    m["store"]["ratio_to_json"] = m["store"]["apparent_bytes"] / json_bytes
                    shutil.rmtree(rundir, ignore_errors=True)
                runs.append(m)
                _print_run(m)
            # HTA
            if hta:
                print(f"[round {rnd + 1}/{args.repeat}] HTA (minutes) ...", flush=True)
                cmd = [str(args.hta_python), "-c", HTA_SNIPPET, str(hta_dir)]
                m = measure(cmd, env=hta_env, log=logs / f"hta_r{rnd}.log") | {"what": "hta", "round": rnd}
                if m["rc"] == 0:
                    try:
                        m["hta"] = json.loads(m["stdout"].strip().splitlines()[-1])
                    except (ValueError, IndexError):
                        pass
                runs.append(m)
                _print_run(m)
    finally:
        shutil.rmtree(hta_dir, ignore_errors=True)

    results = {
        "machine": machine_info(),
        "versions": {
            "pastaprof_env": _pkg_versions(sys.executable, ["pastaprof", "duckdb", "pyarrow", "numpy", "orjson", "click"]),
            "hta_env": _pkg_versions(str(args.hta_python), ["HolisticTraceAnalysis", "pandas", "numpy", "torch"]) if hta else None,
        },
        "source_tree": {"at_start": src_at_start, "at_end": _git_state()},
        "trace": {"path": str(trace), "bytes": json_bytes, "generator": gen},
        "tools": tools,
        "repeat": args.repeat,
        "runs": [{k: v for k, v in r.items() if k != "stdout"} for r in runs],
        "summary": summarize(runs),
        "targets": {"pastaprof": PASTAPROF_TARGETS, "hta_earlier": HTA_EARLIER},
    }
    res_path = args.results or work / "results.json"
    res_path.write_text(json.dumps(results, indent=2) + "\n")
    print()
    print(table(results))
    if src_at_start != results["source_tree"]["at_end"]:
        print(f"WARNING: src/ changed during the benchmark: {src_at_start} -> {results['source_tree']['at_end']}")
    print(f"\nresults: {res_path}; child stderr logs: {logs}")
    return 0 if all(r["rc"] == 0 for r in runs) else 1


def _print_run(m: dict) -> None:
    extra = ""
    if "store" in m:
        s = m["store"]
        extra = f", store {s['apparent_bytes'] / 1e6:.1f} MB ({s['ratio_to_json']:.3f} of the JSON)"
    print(f"    rc={m['rc']} wall {m['wall_s']:.1f} s, peak RSS {m['peak_rss_bytes'] / 1e9:.2f} GB "
          f"(tree sampled {m['peak_tree_rss_sampled_bytes'] / 1e9:.2f} GB), CPU {m['user_s'] + m['sys_s']:.1f} s"
          + extra, flush=True)


def summarize(runs: list[dict]) -> dict:
    out: dict = {}
    for what in ("analyze", "import", "hta"):
        rs = [r for r in runs if r["what"] == what and r["rc"] == 0]
        if not rs:
            continue
        walls = [r["wall_s"] for r in rs]
        rss = [r["peak_rss_bytes"] for r in rs]
        tree = [r["peak_tree_rss_sampled_bytes"] for r in rs]
        out[what] = {"n": len(rs), "wall_s_median": statistics.median(walls), "wall_s_min": min(walls),
                     "wall_s_max": max(walls), "peak_rss_bytes_max": max(rss),
                     "peak_tree_rss_sampled_bytes_max": max(tree),
                     "cpu_s_median": statistics.median(r["user_s"] + r["sys_s"] for r in rs)}
        if what == "import":
            out[what]["store_bytes"] = rs[-1]["store"]["apparent_bytes"]
            out[what]["store_ratio"] = rs[-1]["store"]["ratio_to_json"]
    return out


def table(results: dict) -> str:
    s = results["summary"]
    gb = lambda b: f"{b / 1e9:.2f} GB"  # noqa: E731
    rows = ["| command | runs | wall (median, min-max) | peak RSS (max) | CPU user+sys | notes |",
            "| --- | --- | --- | --- | --- | --- |"]
    names = {"analyze": f"`pastaprof analyze -t {','.join(results['tools'])} -q --json`",
             "import": "`pastaprof import -o RUNDIR`", "hta": "HTA 0.5.0 load + temporal + kernel breakdown"}
    for what, st in s.items():
        note = ""
        if what == "import":
            note = f"run store {st['store_bytes'] / 1e6:.1f} MB = 1/{1 / st['store_ratio']:.0f} of the JSON"
        if what == "hta":
            note = "HTA_DISABLE_NS_ROUNDING=1"
        rows.append(f"| {names[what]} | {st['n']} | {st['wall_s_median']:.1f} s ({st['wall_s_min']:.1f}-{st['wall_s_max']:.1f}) "
                    f"| {gb(st['peak_rss_bytes_max'])} (tree {gb(st['peak_tree_rss_sampled_bytes_max'])}) "
                    f"| {st['cpu_s_median']:.1f} s | {note} |")
    return "\n".join(rows)


if __name__ == "__main__":
    sys.exit(main())
