"""eBPF probes (`pastaprof run --probe`): real bpftrace, real uprobes on libc's malloc, a real
USDT probe of examples/usdt, real programs; skipped with the reason where eBPF is not there."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pastaprof.api import load
from pastaprof.handlers.probe_session import BpftraceSession, unavailable
from pastaprof.handlers.probe_spec import ProbeSpec, linker_cache, parse_spec, parse_specs

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "usdt"
PASTAPROF = [sys.executable, "-m", "pastaprof.cli"]
N_MALLOCS, SIZE, K_TICKS = 2500, 4242, 777

needs_ebpf = pytest.mark.skipif(unavailable() is not None, reason=f"no eBPF here: {unavailable()}")


def _pastaprof(*args: str, **kw) -> subprocess.CompletedProcess[str]:
    code = "from pastaprof.cli import main; main()"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300, **kw)


@pytest.fixture(scope="module")
def programs(tmp_path_factory) -> dict[str, Path]:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build examples/usdt")
    d = tmp_path_factory.mktemp("usdt")
    out = {}
    for name in ("mallocs", "ticks"):
        subprocess.run([cc, "-O2", "-o", str(d / name), str(EXAMPLES / f"{name}.c")], check=True)
        out[name] = d / name
    return out


# ---- specs: checked before the program starts -------------------------------------------

def test_specs_resolve_libraries_and_args(programs: dict[str, Path]) -> None:
    s = parse_spec("libc.so.6:malloc:args=2")
    assert (s.kind, s.function, s.nargs, s.text) == ("uprobe", "malloc", 2, "libc.so.6:malloc")
    assert os.path.isfile(s.lib) and s.lib == os.path.realpath(linker_cache()["libc.so.6"])
    assert parse_spec("libc.so:free").lib == s.lib  # a name without its version finds the versioned one
    u = parse_spec(f"usdt:{programs['ticks']}:pastaprof_demo:tick")
    assert (u.kind, u.function, u.nargs, u.lib) == ("usdt", "pastaprof_demo:tick", 0, str(programs["ticks"]))
    assert len(parse_specs("libc.so.6:malloc; libc.so.6:free\nlibc.so.6:calloc")) == 3


@pytest.mark.parametrize("spec, why", [
    ("malloc", "expected LIB:FUNCTION"),
    ("libc.so.6:", "expected LIB:FUNCTION"),
    ("libc.so.6:mal loc", "is not a function name"),
    ("libc.so.6:malloc:args=7", "args= takes 0 to 6"),
    ("libnosuch.so.9:f", "not in the dynamic linker's cache"),
    ("/no/such/lib.so:f", "no such file"),
    ("usdt:ticks:prov", "expected usdt:BINARY:PROVIDER:PROBE"),
    ("usdt:/bin/sh:pro-v:tick", "is not a C identifier"),
    ("libc.so.6:malloc;libc.so.6:malloc", "given twice"),
])
def test_bad_spec_is_one_line_and_exit_2(spec: str, why: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=why):
        parse_specs(spec)
    args = [a for s in spec.split(";") for a in ("--probe", s)]
    r = _pastaprof("run", *args, "-o", str(tmp_path / "run"), "--", sys.executable, "-c", "print('ran')")
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pastaprof: error:") and why in lines[0], r.stderr
    assert "ran" not in r.stdout and not (tmp_path / "run").exists()  # the program never started


def test_lines_parse_in_bulk_with_lost_and_counted() -> None:
    """bpftrace's own lines among the calls: skipped, its loss reports and kernel counts read."""
    specs = (ProbeSpec("libc.so.6:malloc", "uprobe", "/lib/libc.so.6", "malloc", 2),
             ProbeSpec("usdt:x:p:t", "usdt", "/bin/x", "p:t", 1))
    s = BpftraceSession(specs, root_pid=1, rank=3)
    s.offset_ns = 1_000
    try:
        data = (b"Attaching 4 probes...\nR,5\nP,0,10,11,100,250,64,7,0,0,0,0,999\nC,300\nLost 3 events\n"
                b"P,1,10,12,400,400,-5,0,0,0,0,0,0\nP,9,10,11,1,2,0,0,0,0,0,0,0\n@n[10, 0]: 4\n@n[10, 1]: 1\n")
        t = s.parse(data, own_tids=set())
    finally:
        s.close()
    assert t.num_rows == 2  # probe 9 is not one of ours
    assert t["start_ns"].to_pylist() == [1_100, 1_400] and t["end_ns"].to_pylist() == [1_250, 1_400]
    assert t["args"].to_pylist() == [[64, 7], [-5]] and t["ret"].to_pylist() == [999, None]
    assert t["name"].to_pylist() == ["libc.so.6:malloc", "usdt:x:p:t"] and t["rank"].to_pylist() == [3, 3]
    assert s.lost == 3 and s.counted == {(10, 0): 4, (10, 1): 1}
    assert s.missing() == 0  # 5 counted = 3 lines of ours (probe 9 counted as read) + 3 lost: none unaccounted
    assert s.calls() == {"libc.so.6:malloc": 4, "usdt:x:p:t": 1}


# ---- real probes --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def probed_run(programs: dict[str, Path], tmp_path_factory) -> dict:
    if unavailable() is not None:
        pytest.skip(f"no eBPF here: {unavailable()}")
    out = tmp_path_factory.mktemp("probe") / "run"
    code = (f"import subprocess, sys; a = subprocess.Popen([{str(programs['mallocs'])!r}, '{N_MALLOCS}', '{SIZE}']);"
            f"a.wait(); b = subprocess.Popen([{str(programs['ticks'])!r}, '{K_TICKS}']); b.wait();"
            f"print('children', a.pid, b.pid, a.returncode, b.returncode, flush=True); sys.exit(5)")
    t0 = time.time_ns()
    r = _pastaprof("run", "--probe", "libc.so.6:malloc:args=1",
                   "--probe", f"usdt:{programs['ticks']}:pastaprof_demo:tick:args=2",
                   "-o", str(out), "--", sys.executable, "-c", code)
    t1 = time.time_ns()
    return {"r": r, "out": out, "t0": t0, "t1": t1}


@needs_ebpf
def test_malloc_uprobe_counts_every_call_of_a_c_child(probed_run: dict) -> None:
    r = probed_run["r"]
    assert r.returncode == 5, r.stderr  # the program's exit code, its output untouched
    assert "mallocs done\nticks done\n" in r.stdout
    mpid, tpid = (int(x) for x in r.stdout.split("children ")[1].split()[:2])
    run = load(probed_run["out"])
    rows = run.sql(f"select args[1], ret, start_ns, end_ns, tid from probe where name = 'libc.so.6:malloc' "
                   f"and pid = {mpid}").fetchall()
    assert len(rows) == N_MALLOCS  # exactly the C program's calls
    assert {a for a, *_ in rows} == {SIZE}
    assert all(ret and ret > 0 for _, ret, *_ in rows) and {tid for *_, tid in rows} == {mpid}
    assert all(probed_run["t0"] <= s <= e <= probed_run["t1"] for _, _, s, e, _ in rows)  # epoch ns
    python_calls = run.sql(f"select count(*) from probe where name = 'libc.so.6:malloc' and pid not in "
                           f"({mpid}, {tpid})").fetchall()[0][0]
    assert python_calls > 1000  # the Python parent's own mallocs (the interpreter, its imports) are there too
    m = json.loads((probed_run["out"] / "run.json").read_text())
    h = [p["handlers"]["probe"] for p in m["processes"] if "probe" in p["handlers"]]
    root = next(p["pid"] for p in m["processes"] if "probe" in p["handlers"])
    assert len(h) == 1 and h[0]["dropped"] == 0 and m["status"][f"rank 0 pid {root}: probe"] == "ok"
    assert h[0]["calls_counted"]["libc.so.6:malloc"] >= N_MALLOCS + python_calls
    assert abs(h[0]["clock_uncertainty_ns"]) < 5_000_000


@needs_ebpf
def test_usdt_probe_fires_k_times_with_its_arguments(probed_run: dict) -> None:
    run = load(probed_run["out"])
    tpid = int(probed_run["r"].stdout.split("children ")[1].split()[1])
    n, s1, s2, instant, rets = run.sql(
        f"select count(*), sum(args[1]), sum(args[2]), sum(case when start_ns = end_ns then 1 else 0 end), "
        f"count(ret) from probe where function = 'pastaprof_demo:tick' and pid = {tpid}").fetchall()[0]
    k = K_TICKS
    assert (n, s1, s2, instant, rets) == (k, k * (k - 1) // 2, (k - 1) * k * (2 * k - 1) // 6, k, 0)
    assert run.sql("select count(*) from probe where function = 'pastaprof_demo:tick'").fetchall()[0][0] == k


@needs_ebpf
def test_probes_tool_counts_calls_and_time(probed_run: dict) -> None:
    from pastaprof.api import analyze

    (report,) = analyze(probed_run["out"], tools=["probes"])
    rows = {r["probe"]: r for r in report.tables["probes"].to_pylist()}
    assert rows["usdt:{}:pastaprof_demo:tick".format(load(probed_run["out"]).sql(
        "select any_value(lib) from probe where function = 'pastaprof_demo:tick'").fetchall()[0][0])]["calls"] == K_TICKS
    malloc = rows["libc.so.6:malloc"]
    assert malloc["calls"] == load(probed_run["out"]).table("probe").num_rows - K_TICKS
    assert malloc["total_ns"] > 0 and malloc["processes"] >= 2


def test_without_ebpf_capabilities_the_program_runs_unprobed(tmp_path: Path) -> None:
    setpriv = shutil.which("setpriv")
    if setpriv is None or os.geteuid() != 0:
        pytest.skip("needs setpriv and root, to drop the capabilities")
    code = "import sys; print('hello'); sys.exit(7)"
    r = subprocess.run([setpriv, "--inh-caps=-all", "--bounding-set=-all", sys.executable, "-c",
                        "from pastaprof.cli import main; main()", "run", "--probe", "libc.so.6:malloc",
                        "-o", str(tmp_path / "run"), "--", sys.executable, "-c", code],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 7 and r.stdout == "hello\n", r.stderr
    probe_lines = [ln for ln in r.stderr.splitlines() if "probe" in ln]
    assert len(probe_lines) == 1 and "probes off" in probe_lines[0] and "unprobed" in probe_lines[0], r.stderr
    assert load(tmp_path / "run").table("probe").num_rows == 0


def test_gpu_idle_overlap_of_calls() -> None:
    """Calls against GPU activity [0,10) [5,20) [30,40) [50,60): idle [20,30) and [40,50)."""
    import numpy as np
    import pyarrow as pa

    from pastaprof.tools.probes import _idle_intervals, _overlap

    k = pa.table({"start_ns": [0, 5, 30, 50], "end_ns": [10, 20, 40, 60]})
    s, e = _idle_intervals([k, pa.table({"start_ns": pa.array([], pa.int64()), "end_ns": pa.array([], pa.int64())})])
    assert s.tolist() == [20, 40] and e.tolist() == [30, 50]
    start = np.array([0, 25, 15, 22, 45, 60, 41])
    end = np.array([5, 45, 35, 28, 70, 80, 41])
    assert _overlap(start, end, s, e).tolist() == [0, 10, 10, 6, 5, 0, 0]


@needs_ebpf
def test_launcher_hooks_probe_a_program_without_python(programs: dict[str, Path], tmp_path: Path) -> None:
    """handlers/probe_launch.py as `pastaprof run` calls it around a native program: attached
    before it starts, its calls stored as the run's probe parts before compaction."""
    from pastaprof.handlers import probe_launch
    from pastaprof.store.compact import compact

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    env = {**os.environ, "PASTAPROF_PROBE": f"libc.so.6:malloc:args=1;usdt:{programs['ticks']}:pastaprof_demo:tick"}
    cmd = [str(programs["mallocs"]), str(N_MALLOCS), str(SIZE)]
    assert probe_launch.launch_hook(env, [sys.executable, "x.py"]) is None  # Python: its own session probes
    session = probe_launch.launch_hook(env, cmd)
    assert session is not None and env["_PASTAPROF_PROBE_ROOT"] == str(os.getpid())
    a = subprocess.run(cmd, env=env, capture_output=True, text=True)
    b = subprocess.run([str(programs["ticks"]), "40"], env=env, capture_output=True, text=True)
    assert (a.returncode, a.stdout, b.returncode, b.stdout) == (0, "mallocs done\n", 0, "ticks done\n")
    stored = probe_launch.finish_hook(session, run_dir)
    manifest = compact(run_dir, command=cmd, exit_code=0)
    run = load(run_dir)
    by_probe = dict(run.sql("select function, count(*) from probe group by all").fetchall())
    assert by_probe == {"malloc": N_MALLOCS, "pastaprof_demo:tick": 40}  # the launcher's own calls are not there
    assert run.sql("select count(distinct args[1]) from probe where function = 'malloc'").fetchall()[0][0] == 1
    assert sorted(stored.values()) == [40, N_MALLOCS] and manifest["rows"]["probe"] == N_MALLOCS + 40
    h = next(p["handlers"]["probe"] for p in manifest["processes"] if "probe" in (p["handlers"] or {}))
    assert h["records"] == N_MALLOCS + 40 and h["dropped"] == 0


@needs_ebpf
def test_perfetto_export_draws_every_probed_call(probed_run: dict, tmp_path: Path) -> None:
    from test_perfetto import decode

    from pastaprof.report.perfetto import write_perfetto

    run = load(probed_run["out"])
    counts = write_perfetto(run, tmp_path / "t.pftrace")
    d = decode(tmp_path / "t.pftrace")
    probe_slices = [s for s in d.slices if d.descriptors[s.track].name.startswith("probes tid ")]
    n = run.table("probe").num_rows
    assert counts["probes"] == n == len(probe_slices)
    tpid = int(probed_run["r"].stdout.split("children ")[1].split()[1])
    ticks = sorted((s.start, s.end) for s in probe_slices if s.name.endswith("pastaprof_demo:tick"))
    want = sorted(run.sql(f"select start_ns, end_ns from probe where pid = {tpid}").fetchall())
    assert len(ticks) == K_TICKS and ticks == [tuple(w) for w in want]
    # each recorded process has its own track under a process track
    procs = {d.descriptors[d.descriptors[s.track].parent_uuid].process.pid for s in probe_slices}
    assert procs == {pid for (pid,) in run.sql("select distinct pid from probe").fetchall()}


@pytest.mark.skipif(shutil.which("nm") is None or shutil.which("readelf") is None, reason="no nm/readelf (binutils)")
def test_a_function_or_usdt_probe_the_binary_lacks_is_a_bad_spec(programs: dict[str, Path], tmp_path: Path) -> None:
    for spec, why in (("libc.so.6:no_such_function_pp", "defines no function 'no_such_function_pp'"),
                      (f"usdt:{programs['ticks']}:pastaprof_demo:tock", "has no USDT probe pastaprof_demo:tock "
                                                                        "(it has pastaprof_demo:tick)")):
        r = _pastaprof("run", "--probe", spec, "-o", str(tmp_path / "run"), "--", sys.executable, "-c", "print(1)")
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and why in lines[0] and r.stdout == "", r.stderr


@needs_ebpf
def test_bpftrace_leaving_a_probe_out_is_one_line(programs: dict[str, Path]) -> None:
    """bpftrace attaches nothing for a function it cannot find, silently: the session's
    count of attached probes catches it (here past the spec check, as a library could change)."""
    from pastaprof.handlers.probe_session import ProbeError

    lib = parse_spec("libc.so.6:malloc").lib
    s = BpftraceSession((ProbeSpec("x", "uprobe", lib, "no_such_function_pp"),), os.getpid(), 0)
    with pytest.raises(ProbeError, match="attached 3 of 5 probes"):
        s.start()
    assert not s.dir.exists() and s.proc is None


@needs_ebpf
def test_pastaprof_run_probes_a_program_without_python(programs: dict[str, Path], tmp_path: Path) -> None:
    """`pastaprof run --probe ... -- ./app`: no Python anywhere in the program, its calls are
    probed from the launcher: exactly the program's N mallocs of SIZE and its K ticks."""
    out = tmp_path / "run"
    r = _pastaprof("run", "-o", str(out), "--probe", "libc.so.6:malloc:args=1", "--", str(programs["mallocs"]),
                   str(N_MALLOCS), str(SIZE))
    assert r.returncode == 0 and r.stdout == "mallocs done\n", r.stderr
    assert "not a Python program" not in r.stderr
    run = load(out)
    (n, sized), = run.sql(f"select count(*), count(*) filter (where args[1] = {SIZE}) from probe "
                          "where function = 'malloc'").fetchall()
    assert sized == N_MALLOCS and n >= N_MALLOCS  # the C runtime's own mallocs (stdio) may come too
    r = _pastaprof("run", "-o", str(tmp_path / "t"), "--probe", f"usdt:{programs['ticks']}:pastaprof_demo:tick",
                   "--", str(programs["ticks"]), "40")
    assert r.returncode == 0 and r.stdout == "ticks done\n", r.stderr
    assert load(tmp_path / "t").sql("select count(*) from probe").fetchall() == [(40,)]
