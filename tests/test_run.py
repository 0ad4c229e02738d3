"""`pastaprof run` and the live Python API, on this GPU-less machine: the program is
never harmed (output, exit code, signals), settings are validated before it starts,
every process writes its shard of one run.  GPU capture itself is checked by
scripts/gpu-check on the lent H200."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import pastaprof
from pastaprof.live.config import CaptureConfig, parse_rank_list, parse_steps
from pastaprof.live.session import Session

PP = [sys.executable, "-m", "pastaprof.cli", "run"]

APP = textwrap.dedent("""
    import os, sys, time
    import pastaprof
    for i in range(3):
        with pastaprof.range(f"step{i}"):
            print("working", i, flush=True)
        pastaprof.step()
    mode = sys.argv[1] if len(sys.argv) > 1 else "ok"
    if mode == "exit3":
        sys.exit(3)
    if mode == "raise":
        raise RuntimeError("boom")
    if mode == "os_exit":
        time.sleep(1.5)  # > one flush period: the ranges above are on disk
        os._exit(5)
    if mode == "term":
        time.sleep(1.5)
        os.kill(os.getpid(), 15)
        time.sleep(5)
    print("done")
""")


@pytest.fixture()
def app(tmp_path) -> Path:
    p = tmp_path / "app.py"
    p.write_text(APP)
    return p


def _bare(app: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(app), *args], capture_output=True, text=True)


def _run(out: Path, *cmd: str, env: dict | None = None, flags: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    e = dict(os.environ, PASTAPROF_FLUSH_MS="200", **(env or {}))
    return subprocess.run([*PP, "-o", str(out), *flags, "--", *cmd], capture_output=True, text=True, env=e)


def _ranges(out: Path) -> list[str]:
    return sorted(pastaprof.load(out).table("range")["name"].to_pylist())


@pytest.mark.parametrize("mode, code", [("ok", 0), ("exit3", 3), ("raise", 1), ("os_exit", 5), ("term", -15)])
def test_exit_code_output_and_flushed_events(tmp_path, app, mode, code):
    bare = _bare(app, mode)
    r = _run(tmp_path / "run", sys.executable, str(app), mode)
    assert bare.returncode == code
    assert r.returncode == code, r.stderr
    assert r.stdout == bare.stdout  # the program's output is its own
    if mode == "raise":
        assert "RuntimeError: boom" in r.stderr
    m = json.loads((tmp_path / "run" / "run.json").read_text())
    assert m["exit_code"] == code and m["command"][-1] == mode
    # the program's ranges, and the two steps its three pastaprof.step() calls delimit
    assert _ranges(tmp_path / "run") == ["pastaprof.step#0", "pastaprof.step#1", "step0", "step1", "step2"]
    assert not list(tmp_path.glob(".run.partial*"))


@pytest.mark.skipif(os.path.exists("/dev/nvidiactl"), reason="this machine has a GPU")
def test_no_gpu_is_reported_once_and_capture_continues(tmp_path, app):
    r = _run(tmp_path / "run", sys.executable, str(app))
    assert r.returncode == 0
    assert r.stderr.count("no GPU found") == 1
    status = json.loads((tmp_path / "run" / "run.json").read_text())["status"]
    assert any("no GPU found" in v for v in status.values())


@pytest.mark.parametrize("env, flags, needle", [
    ({"PASTAPROF_SAMPLE": "zero"}, (), "PASTAPROF_SAMPLE='zero'"),
    ({}, ("--steps", "9:3"), "PASTAPROF_STEPS='9:3'"),
    ({}, ("--kernels", "gemm("), "PASTAPROF_KERNELS='gemm('"),
    ({"PASTAPROF_RANKS": "0,x"}, (), "PASTAPROF_RANKS='0,x'"),
    ({"PASTAPROF_SHAPES": "maybe"}, (), "PASTAPROF_SHAPES='maybe'"),
    ({"PASTAPROF_OFF": "ops,kernal"}, (), "unknown part 'kernal'"),
    ({"PASTAPROF_SAN_PCS": "lots"}, (), "PASTAPROF_SAN_PCS='lots'"),
    ({"PASTAPROF_SAN_RAW_MB": "-5"}, (), "PASTAPROF_SAN_RAW_MB='-5'"),
    ({"PASTAPROF_SAN_UNPATCH": "sometimes"}, (), "PASTAPROF_SAN_UNPATCH='sometimes'"),
    ({"PASTAPROF_SAN_SHARDS": "0"}, (), "PASTAPROF_SAN_SHARDS='0'"),
    ({"PASTAPROF_SAN_SHARDS": "128"}, (), "PASTAPROF_SAN_SHARDS='128'"),
    ({}, ("-t", "kernels,nosuch"), "unknown tool 'nosuch'"),
])
def test_bad_settings_stop_before_the_program_starts(tmp_path, env, flags, needle):
    marker = tmp_path / "started"
    r = _run(tmp_path / "run", sys.executable, "-c", f"open({str(marker)!r}, 'w')", env=env, flags=flags)
    assert r.returncode == 2
    assert needle in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not marker.exists() and not (tmp_path / "run").exists()


def test_missing_program_and_existing_output(tmp_path, app):
    r = _run(tmp_path / "run", "/no/such/program")
    assert r.returncode == 2 and "cannot start '/no/such/program'" in r.stderr
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "x").write_text("keep")
    r = _run(tmp_path / "taken", sys.executable, str(app))
    assert r.returncode == 2 and "already exists" in r.stderr
    assert (tmp_path / "taken" / "x").read_text() == "keep"


def test_child_processes_write_shards_of_one_run(tmp_path):
    p = tmp_path / "mp.py"
    p.write_text(textwrap.dedent("""
        import multiprocessing as mp, os
        import pastaprof
        def work(i):
            with pastaprof.range(f"child{i}"):
                pass
            return os.getpid()
        if __name__ == "__main__":
            with pastaprof.range("parent"):
                ctx = mp.get_context("spawn")
                pool = ctx.Pool(2)
                pids = pool.map(work, [0, 1])
                pool.close()
                pool.join()
            with pastaprof.range("forked"):
                p = mp.get_context("fork").Process(target=work, args=(2,))
                p.start()
                p.join()
            print(len(set(pids)) >= 1)
    """))
    r = _run(tmp_path / "run", sys.executable, str(p))
    assert r.returncode == 0, r.stderr
    t = pastaprof.load(tmp_path / "run").table("range")
    assert sorted(t["name"].to_pylist()) == ["child0", "child1", "child2", "forked", "parent"]
    m = json.loads((tmp_path / "run" / "run.json").read_text())
    assert len({pr["pid"] for pr in m["processes"]}) >= 2  # the pool workers have shards of their own
    assert len(set(t["pid"].to_pylist())) >= 2


def test_python_dash_m_and_the_programs_own_sitecustomize(tmp_path):
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "__main__.py").write_text("import pastaprof, sys\nwith pastaprof.range('m'):\n    print(sys.argv[1:])\n")
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(f"open({str(tmp_path / 'theirs')!r}, 'w').write('ran')\n")
    env = {"PYTHONPATH": os.pathsep.join(p for p in (str(site), str(tmp_path), os.environ.get("PYTHONPATH", "")) if p)}
    r = _run(tmp_path / "run", sys.executable, "-m", "mypkg", "a", "b", env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "['a', 'b']"
    assert (tmp_path / "theirs").read_text() == "ran"
    assert _ranges(tmp_path / "run") == ["m"]


def test_python_api_profile_writes_a_run(tmp_path):
    code = textwrap.dedent(f"""
        import pastaprof
        with pastaprof.profile(out={str(tmp_path / 'api')!r}, steps="1:2") as prof:
            for i in range(3):
                with pastaprof.range(f"s{{i}}"):
                    pass
                pastaprof.step()
        print(prof.run.table("range").num_rows)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "5"  # 3 ranges and 2 steps (the three step() calls delimit two)
    assert json.loads((tmp_path / "api" / "run.json").read_text())["processes"][0]["steps_seen"] == 3


def test_vocabulary_parsing():
    assert parse_rank_list("0,2,4-6") == (0, 2, 4, 5, 6)
    assert parse_steps("10:20") == (10, 20) and parse_steps("7") == (7, 8) and parse_steps("3:") == (3, None)
    cfg = CaptureConfig.from_env({"PASTAPROF_RANGES": "fwd*,loss", "PASTAPROF_KERNELS": "gemm|conv",
                                  "PASTAPROF_SAMPLE": "4", "PASTAPROF_STEPS": "2:4", "PASTAPROF_RANKS": "1"})
    assert cfg.range_selected(["outer", "fwd_block"]) and not cfg.range_selected(["bwd"])
    assert cfg.kernel_selected("sm90_gemm_bf16") and not cfg.kernel_selected("elementwise")
    assert [s for s in range(6) if cfg.step_selected(s)] == [2, 3]
    assert cfg.rank_selected(1) and not cfg.rank_selected(0)
    assert CaptureConfig.from_env(cfg.to_env()) == cfg
    off = CaptureConfig.from_env({"PASTAPROF_OFF": "copies,sync"})  # every CUPTI kind can be switched off
    assert off.is_off("copies") and off.is_off("sync") and not off.is_off("kernels")
    from pastaprof.live.config import current_rank

    assert current_rank({"OMPI_COMM_WORLD_RANK": "5"}) == 5 and current_rank({}) == 0
    assert current_rank({"RANK": str(2**40), "SLURM_PROCID": "3"}) == 3  # no int32: the next variable says


def test_step_window_gates_gpu_work_by_launch_time(tmp_path):
    """Activity launched inside the step window is kept, the rest dropped; a kernel
    is judged by its launch call's time, not by when the GPU ran it."""
    s = Session(CaptureConfig(out=str(tmp_path / "g"), steps=(1, 2)))
    s._update_gate()                         # step 0: closed
    t0 = time.time_ns()
    s.next_step()                            # step 1: open
    t1 = time.time_ns()
    s.next_step()                            # step 2: closed
    t2 = time.time_ns()
    api = pa.table({"start_ns": [t0, t1, t2], "correlation": [1, 2, 3]})
    kern = pa.table({"start_ns": [t2 + 10, t2 + 20, t2 + 30], "correlation": [1, 2, 3]})
    out = s._gated({"api": api, "kernel": kern})
    assert out["kernel"]["correlation"].to_pylist() == [2]
    assert out["api"]["correlation"].to_pylist() == [2]
    assert s.filtered_out == 4
    assert np.array_equal(s._in_windows(np.array([t0, t1, t2])), [False, True, False])


def test_sigterm_is_passed_to_the_program(tmp_path):
    p = tmp_path / "sleepy.py"
    p.write_text("import time, pastaprof\nwith pastaprof.range('r'):\n    pass\nprint('up', flush=True)\ntime.sleep(30)\n")
    e = dict(os.environ, PASTAPROF_FLUSH_MS="200")
    proc = subprocess.Popen([*PP, "-o", str(tmp_path / "run"), "--", sys.executable, str(p)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=e)
    assert proc.stdout.readline().strip() == "up"
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=20)
    assert proc.returncode == -15
    assert _ranges(tmp_path / "run") == ["r"]


TORCH_APP = textwrap.dedent("""
    import torch, pastaprof
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    for i in range(3):
        loss = net(torch.randn(8, 64)).sum()
        loss.backward()
        pastaprof.step()
    with open(__file__ + ".ptrs", "w") as f:  # what input_ptrs must say of Linear_0's addmm
        f.write(f"{net[0].bias.data_ptr()} {net[0].weight.data_ptr()}")
    print("ok")
""")


@pytest.mark.parametrize("native", ["1", "0"])
def test_pytorch_ops_with_shapes_modules_and_call_sites(tmp_path, native):
    """Both op mechanisms: the C++ RecordFunction observer (Kineto's op names and
    nesting) and the Python dispatch-mode fallback (PASTAPROF_NATIVE=0)."""
    pytest.importorskip("torch")
    app = tmp_path / "tapp.py"
    app.write_text(TORCH_APP)
    r = _run(tmp_path / "run", sys.executable, str(app), flags=("-t", "ops"), env={"PASTAPROF_NATIVE": native})
    assert r.returncode == 0, r.stderr
    assert r.stdout == "ok\n"
    run = pastaprof.load(tmp_path / "run")
    mechanism = run.manifest["processes"][0]["handlers"]["torch"]["mechanism"]
    assert mechanism == ("native" if native == "1" else "python")
    addmm_name, mm_name = ("aten::addmm", "aten::mm") if native == "1" else ("aten.addmm.default", "aten.mm.default")
    op = run.table("op").to_pylist()
    addmm = [o for o in op if o["name"] == addmm_name]
    # 2 Linear layers x 3 steps, each with its module path and the line that ran the model
    assert len(addmm) == 6
    assert sorted(o["module"] for o in addmm) == ["Sequential_0/Linear_0"] * 3 + ["Sequential_0/Linear_1"] * 3
    assert {o["call_site"] for o in addmm} == {f"{app}(6): <module>"}
    shapes = "[[64],[8,64],[64,64],[],[]]" if native == "1" else "[[64],[8,64],[64,64]]"  # Kineto lists scalars
    assert {o["input_shapes"] for o in addmm if o["module"].endswith("Linear_0")} == {shapes}
    assert all(not o["is_backward"] for o in addmm)
    # input data pointers (the memory tool's tensor uses): bias, input, weight (t() is a view),
    # and 0 for each scalar argument
    bias, weight = map(int, Path(str(app) + ".ptrs").read_text().split())
    ptrs = [o["input_ptrs"] for o in addmm if o["module"].endswith("Linear_0")]
    assert all(p[0] == bias and p[2] == weight and p[1] not in (0, bias, weight) for p in ptrs), ptrs
    assert all(len(p) == (5 if native == "1" else 3) and p[3:] == [0] * (len(p) - 3) for p in ptrs), ptrs
    bwd = [o for o in op if o["is_backward"]]
    mm = [o for o in bwd if o["name"] == mm_name]
    assert mm  # weight gradients
    assert len({o["id"] for o in op}) == len(op)
    assert all(o["start_ns"] <= o["end_ns"] for o in op)
    assert "ops" in r.stderr and "aten" in r.stderr and "addmm" in r.stderr  # the live tool's report, on stderr
    if native == "0":
        assert all(o["call_site"] is None for o in bwd)
        return
    # The observer nests ops (aten::linear -> aten::addmm), and backward ops take the module
    # and line of the forward op that autograd links them to (sequence number).
    by_id = {o["id"]: o for o in op}
    assert {by_id[o["parent_id"]]["name"] for o in addmm} == {"aten::linear"}
    assert all(o["depth"] == by_id[o["parent_id"]]["depth"] + 1 for o in op if o["parent_id"] is not None)
    assert {o["module"] for o in mm} == {"Sequential_0/Linear_0", "Sequential_0/Linear_1"}
    assert {o["call_site"] for o in mm} == {f"{app}(6): <module>"}
    evaluate = [o for o in op if o["name"].startswith("autograd::engine::evaluate_function: ")]
    assert evaluate and all(o["is_backward"] and o["call_site"] == f"{app}(7): <module>" for o in evaluate)
    # each node of the backward graph named once per step (the engine builds these names in
    # temporary strings whose addresses repeat: a cache keyed by address alone mixed them up)
    nodes = Counter(o["name"].split(": ", 1)[1] for o in evaluate)
    per_step = {"SumBackward0": 1, "AddmmBackward0": 2, "TBackward0": 2, "ReluBackward0": 1,
                "torch::autograd::AccumulateGrad": 4}
    assert nodes == {k: 3 * v for k, v in per_step.items()}, nodes


def test_without_a_compiler_the_python_op_path_takes_over(tmp_path):
    """No C++ compiler (so no native observer): one notice, ops still recorded."""
    pytest.importorskip("torch")
    app = tmp_path / "tapp.py"
    app.write_text(TORCH_APP)
    env = {"CXX": "no-such-compiler", "PASTAPROF_CACHE": str(tmp_path / "cache")}
    r = _run(tmp_path / "run", sys.executable, str(app), env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "ok\n"
    assert r.stderr.count("native op observer unavailable") == 1 and "no-such-compiler" in r.stderr
    run = pastaprof.load(tmp_path / "run")
    assert run.manifest["processes"][0]["handlers"]["torch"]["mechanism"] == "python"
    assert len([o for o in run.table("op")["name"].to_pylist() if o == "aten.addmm.default"]) == 6


def test_no_shapes_no_call_sites(tmp_path):
    """--no-shapes / --no-call-sites: the ops are all still there, without those columns."""
    pytest.importorskip("torch")
    app = tmp_path / "tapp.py"
    app.write_text(TORCH_APP)
    r = _run(tmp_path / "run", sys.executable, str(app), flags=("--no-shapes", "--no-call-sites"))
    assert r.returncode == 0, r.stderr
    op = pastaprof.load(tmp_path / "run").table("op").to_pylist()
    addmm = [o for o in op if o["name"] in ("aten::addmm", "aten.addmm.default")]
    assert len(addmm) == 6
    assert all(o["input_shapes"] is None and o["call_site"] is None for o in op)
    assert sorted(o["module"] for o in addmm) == ["Sequential_0/Linear_0"] * 3 + ["Sequential_0/Linear_1"] * 3


def test_mechanisms_switched_off_for_overhead_breakdowns(tmp_path):
    """PASTAPROF_OFF (bench/overhead.py --breakdown): the op observer off leaves no ops; the
    module hooks off leaves every op, without module paths."""
    pytest.importorskip("torch")
    app = tmp_path / "tapp.py"
    app.write_text(TORCH_APP)
    r = _run(tmp_path / "no-ops", sys.executable, str(app), env={"PASTAPROF_OFF": "ops"})
    assert r.returncode == 0 and r.stdout == "ok\n", r.stderr
    assert "op" not in pastaprof.load(tmp_path / "no-ops").manifest["rows"]
    r = _run(tmp_path / "no-modules", sys.executable, str(app), env={"PASTAPROF_OFF": " modules "})
    assert r.returncode == 0, r.stderr
    op = pastaprof.load(tmp_path / "no-modules").table("op").to_pylist()
    addmm = [o for o in op if o["name"] in ("aten::addmm", "aten.addmm.default")]
    assert len(addmm) == 6 and all(o["module"] is None for o in addmm)


def test_optimizer_steps_drive_the_step_window_until_pastaprof_step_is_called(tmp_path):
    pytest.importorskip("torch")
    from pastaprof.live.session import Session

    s = Session(CaptureConfig(out=str(tmp_path / "s")))
    assert [s.next_step("optimizer") for _ in range(3)] == [1, 2, 3]
    assert s.next_step("user") == 1            # the program counts steps itself from now on
    assert s.next_step("optimizer") == 1       # ... so optimizer steps no longer do
    assert s.next_step("user") == 2
    app = tmp_path / "opt.py"
    app.write_text(textwrap.dedent("""
        import torch, pastaprof
        net = torch.nn.Linear(4, 4)
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        for i in range(4):
            net(torch.randn(2, 4)).sum().backward()
            opt.step()
        print(pastaprof.live.current().step)
    """))
    r = _run(tmp_path / "run", sys.executable, str(app))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "4"
    assert json.loads((tmp_path / "run" / "run.json").read_text())["processes"][0]["steps_seen"] == 4


def test_record_function_and_nvtx_ranges_are_ranges(tmp_path):
    torch = pytest.importorskip("torch")
    try:  # NVTX needs a CUDA build of torch; on a CPU build range_push raises (with or without us)
        torch.cuda.nvtx.range_push("probe")
        torch.cuda.nvtx.range_pop()
        nvtx = True
    except Exception:
        nvtx = False
    app = tmp_path / "rf.py"
    app.write_text(textwrap.dedent(f"""
        import torch, pastaprof
        with torch.profiler.record_function("my_block"):
            torch.ones(3) + 1
        if {nvtx}:
            torch.cuda.nvtx.range_push("outer_nvtx")
        with pastaprof.range("mine"):
            pass
        if {nvtx}:
            torch.cuda.nvtx.range_pop()
    """))
    r = _run(tmp_path / "run", sys.executable, str(app))
    assert r.returncode == 0, r.stderr
    t = pastaprof.load(tmp_path / "run").table("range").to_pylist()
    got = {(x["name"], x["domain"]) for x in t}
    assert {("my_block", "record_function"), ("mine", "user")} <= got
    by = {x["name"]: x for x in t}
    assert by["my_block"]["start_ns"] < by["my_block"]["end_ns"] <= by["mine"]["start_ns"]
    if nvtx:
        assert ("outer_nvtx", "nvtx") in got
        assert by["outer_nvtx"]["start_ns"] <= by["mine"]["start_ns"] <= by["mine"]["end_ns"] <= by["outer_nvtx"]["end_ns"]


def test_torch_profiler_in_the_program_is_one_warning_and_both_keep_working(tmp_path):
    """On a GPU-less machine only the hand-over wiring is checked: the program's own
    torch.profiler still works, pastaprof warns once, and its capture goes on."""
    pytest.importorskip("torch")
    app = tmp_path / "tp.py"
    app.write_text(textwrap.dedent("""
        import torch, pastaprof
        for i in range(2):
            with torch.profiler.profile() as prof:
                torch.ones(4) @ torch.ones(4)
            print(len(prof.key_averages()) > 0)
        torch.ones(2) + 1
    """))
    r = _run(tmp_path / "run", sys.executable, str(app))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True", "True"]
    assert r.stderr.count("torch.profiler ran in the program") == 1  # one warning, even for two sessions
    ops = pastaprof.load(tmp_path / "run").table("op")["name"].to_pylist()
    assert {"aten::add", "aten.add.Tensor"} & set(ops)  # recorded after the foreign sessions ended


TORCHRUN_APP = textwrap.dedent("""
    import torch, torch.distributed as dist
    dist.init_process_group("gloo")
    r = dist.get_rank()
    t = torch.ones(4) * (r + 1)
    dist.all_reduce(t)
    net = torch.nn.Linear(8, 8)
    net(torch.randn(2, 8)).sum().backward()
    print(f"<rank {r} sum {t.sum().item()}>", flush=True)
    dist.destroy_process_group()
""")


@pytest.mark.parametrize("ranks", [None, "1"])
def test_torchrun_two_ranks_one_run(tmp_path, ranks):
    """`pastaprof run -- torchrun --nproc_per_node 2 app.py` (gloo on CPU): each rank writes
    its shard of one run; --ranks keeps only the chosen rank's events."""
    pytest.importorskip("torch")
    import socket

    app = tmp_path / "ddp.py"
    app.write_text(TORCHRUN_APP)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    flags = ("--ranks", ranks) if ranks else ()
    r = _run(tmp_path / "run", sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
             "--master_addr", "127.0.0.1", "--master_port", str(port), str(app), flags=flags)
    assert r.returncode == 0, r.stderr[-3000:]
    import re

    # the ranks' lines may interleave on the shared stdout; (1 + 2) * 4 on both
    assert sorted(re.findall(r"<rank \d sum [\d.]+>", r.stdout)) == ["<rank 0 sum 12.0>", "<rank 1 sum 12.0>"]
    run = pastaprof.load(tmp_path / "run")
    op = run.table("op").select(["rank", "name"]).to_pylist()
    allreduce = sorted(o["rank"] for o in op if "allreduce" in str(o["name"]))
    linear = sorted(o["rank"] for o in op if o["name"] in ("aten::linear", "aten.addmm.default"))
    want = [0, 1] if ranks is None else [1]
    assert allreduce == want and linear == want
    assert set(run.manifest["ranks"]) >= set(want)
    # the ranks' processes only: torchrun's own agent process is not captured (it posed as a
    # rank 0 without GPU work, seen on the H200)
    assert sorted(p["rank"] for p in run.manifest["processes"]) == [0, 1]


def test_forked_child_does_not_repeat_the_parents_pending_ops(tmp_path):
    """A fork() while the parent has unflushed ops: the child's shard has only its own ops
    (the native observer's buffers are reset in the child)."""
    pytest.importorskip("torch")
    app = tmp_path / "fk.py"
    app.write_text(textwrap.dedent("""
        import os, torch
        x = torch.zeros(1)
        for _ in range(1000): x.add_(1)
        pid = os.fork()
        if pid == 0:
            for _ in range(10): x.add_(1)
            raise SystemExit(0)
        os.waitpid(pid, 0)
    """))
    r = _run(tmp_path / "run", sys.executable, str(app))
    assert r.returncode == 0, r.stderr
    run = pastaprof.load(tmp_path / "run")
    counts = sorted(n for _, n in run.sql(
        "SELECT pid, count(*) FROM op WHERE name IN ('aten::add_', 'aten.add_.Tensor') GROUP BY pid").fetchall())
    assert counts == [10, 1000]


@pytest.mark.skipif(os.path.exists("/dev/nvidiactl"), reason="this machine has a GPU (scripts/gpu_uvm_check.py)")
def test_uvm_without_cupti_is_one_notice_and_the_run_goes_on(tmp_path, app):
    r = _run(tmp_path / "run", sys.executable, str(app), "ok", flags=("--uvm",))
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("unified-memory counters not recorded") == 1
    status = json.loads((tmp_path / "run" / "run.json").read_text())["status"]
    assert any("unified-memory counters not recorded" in v for v in status.values())


def test_gpu_work_arriving_before_its_correlation_record_is_held_and_linked(tmp_path):
    """CUPTI delivers per-device and per-thread buffers independently, so a kernel's record can
    reach a flush before the external-correlation record that names its op.  The session holds
    such GPU work for one flush, links it then, and needs no re-link at compaction; what is still
    unlinked at the final flush is stored without an op.  (Tables shaped as the CUPTI handler
    drains them; no GPU here.)"""
    import pyarrow as pa

    from pastaprof.live.session import Session
    from pastaprof.store.compact import compact

    class Feed:  # a handler that hands the session prepared drains, one per flush
        name = "feed"
        status, records, dropped, sampled_out, kernels_seen = None, 0, 0, 0, 0

        def __init__(self, drains):
            self.drains = drains

        def drain(self):
            return self.drains.pop(0) if self.drains else {}

        def stop(self):
            pass

    def kernels(corr, t0):
        n = len(corr)
        return pa.table({"start_ns": [t0 + i for i in range(n)], "end_ns": [t0 + i + 1 for i in range(n)],
                         "device": [0] * n, "stream": [7] * n, "correlation": corr, "name": ["k"] * n,
                         "rank": pa.array([0] * n, pa.int32())})

    def ext(corr, ops):
        return pa.table({"correlation": corr, "external_id": ops})

    out = tmp_path / "run"
    s = Session(CaptureConfig(out=str(out), flush_ms=100000), gpu=False)
    s.start()
    s.handlers.append(Feed([
        {"external": ext([1, 2], [10, 20]), "kernel": kernels([1, 2, 3], 1000)},  # 3's record comes later
        {"external": ext([3], [30]), "kernel": kernels([4], 2000)},               # 4: never gets one
        {},
    ]))
    s.flush()                     # 1, 2 linked and stored; 3 held
    s.flush()                     # 3 linked; 4 held
    s.stop()                      # final: 4 stored without an op
    meta = json.loads(next((out / "shards").glob("*.json")).read_text())
    assert meta["relink_needed"] is False
    compact(out)
    k = pastaprof.load(out).table("kernel").sort_by("correlation").to_pylist()
    assert [(x["correlation"], x["op_id"]) for x in k] == [(1, 10), (2, 20), (3, 30), (4, None)]

    # A correlation record later than one flush: the kernel was stored without an op, the
    # session says so, and compaction re-links it from the stored correlation records.
    out2 = tmp_path / "run2"
    s = Session(CaptureConfig(out=str(out2), flush_ms=100000), gpu=False)
    s.start()
    s.handlers.append(Feed([{"external": ext([1], [10]), "kernel": kernels([1, 5], 1000)}, {},
                            {"external": ext([5], [50])}]))
    s.flush(), s.flush(), s.flush()
    s.stop()
    meta = json.loads(next((out2 / "shards").glob("*.json")).read_text())
    assert meta["relink_needed"] is True
    compact(out2)
    k = pastaprof.load(out2).table("kernel").sort_by("correlation").to_pylist()
    assert [(x["correlation"], x["op_id"]) for x in k] == [(1, 10), (5, 50)]

    # ... also when that record comes in the final flush (which stores correlation records only
    # when a re-link needs them)
    out3 = tmp_path / "run3"
    s = Session(CaptureConfig(out=str(out3), flush_ms=100000), gpu=False)
    s.start()
    s.handlers.append(Feed([{"external": ext([1], [10]), "kernel": kernels([1, 6], 1000)}, {},
                            {"external": ext([6], [60])}]))
    s.flush(), s.flush()
    s.stop()
    assert json.loads(next((out3 / "shards").glob("*.json")).read_text())["relink_needed"] is True
    compact(out3)
    k = pastaprof.load(out3).table("kernel").sort_by("correlation").to_pylist()
    assert [(x["correlation"], x["op_id"]) for x in k] == [(1, 10), (6, 60)]


@pytest.mark.parametrize("flushes", [3, 10])
def test_compaction_keeps_a_few_parts_and_merges_many(tmp_path, flushes):
    """Up to KEEP_PARTS parts per kind and rank stay as written (merging them cost a short
    run more than its capture); more are merged into one time-sorted file.  Either way the
    run reads the same: every row once, through Arrow and through DuckDB."""
    import pyarrow as pa

    from pastaprof.live.session import Session
    from pastaprof.store.compact import KEEP_PARTS, compact

    class Feed(_OnceHandler):
        def __init__(self):
            self.left = flushes

        def drain(self):  # each flush: two ops, the second starting first
            if not self.left:
                return {}
            self.left -= 1
            t = 1000 * (flushes - self.left)
            return {"op": pa.table({"start_ns": [t + 5, t], "end_ns": [t + 9, t + 20], "tid": [1, 1],
                                    "id": [2 * t, 2 * t + 1], "name": ["aten::b", "aten::a"],
                                    "rank": pa.array([0, 0], pa.int32())})}

    out = tmp_path / "run"
    s = Session(CaptureConfig(out=str(out), flush_ms=100000), gpu=False)
    s.start()
    s.handlers.append(Feed())
    for _ in range(flushes):
        s.flush()
    s.stop()
    # a part damaged after it was written (a full disk, say): dropped, never half-read
    last = sorted((out / "op").glob("*.parquet"))[-1]
    last.write_bytes(last.read_bytes()[:40])
    manifest = compact(out)
    files = sorted(p.name for p in (out / "op").glob("*.parquet"))
    if flushes <= KEEP_PARTS:
        assert len(files) == flushes - 1 and all("-part-" in f for f in files)
    else:
        assert files == ["rank-0.parquet"]
    run = pastaprof.load(out)
    assert manifest["rows"]["op"] == run.table("op").num_rows == 2 * (flushes - 1)
    start = run.table("op")["start_ns"].to_pylist()
    assert sorted(start) == sorted(1000 * i + d for i in range(1, flushes) for d in (0, 5))
    assert start == sorted(start)  # each part sorted at the flush, parts in flush order
    assert run.sql("SELECT count(*), count(DISTINCT id) FROM op").fetchall() == [(2 * (flushes - 1),) * 2]


def test_torch_compile_with_dynamic_shapes_is_left_alone(tmp_path):
    """torch.compile traces with FakeTensors and symbolic shapes; the op observer must not read
    their sizes (each failed read would print a warning from RecordFunction on the program's
    stderr).  Output, exit code and stderr stay the program's own."""
    pytest.importorskip("torch")
    app = tmp_path / "tc.py"
    app.write_text(textwrap.dedent("""
        import torch
        def f(x):
            return (x.sin() + x.cos()).sum(dim=-1)
        cf = torch.compile(f, dynamic=True, backend="aot_eager")
        for n in (8, 16, 33):
            print(round(float(cf(torch.ones(4, n)).sum()), 3))
    """))
    bare = subprocess.run([sys.executable, str(app)], capture_output=True, text=True)
    r = _run(tmp_path / "run", sys.executable, str(app))
    assert r.returncode == bare.returncode == 0, r.stderr
    assert r.stdout == bare.stdout
    assert "Exception in RecordFunction callback" not in r.stderr
    assert [ln for ln in r.stderr.splitlines() if not ln.startswith("pastaprof:")] == \
        [ln for ln in bare.stderr.splitlines()]


def test_custom_functions_failing_ops_and_threads(tmp_path):
    """A custom autograd.Function, an op that raises (caught by the program) and ops on a
    thread pool: output unchanged; the failed op does not leave the observer's stack
    unbalanced (later ops are top-level again); thread ops carry their own call site."""
    pytest.importorskip("torch")
    app = tmp_path / "rb.py"
    app.write_text(textwrap.dedent("""
        import torch
        from concurrent.futures import ThreadPoolExecutor
        class Square(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                ctx.save_for_backward(x)
                return x * x
            @staticmethod
            def backward(ctx, g):
                (x,) = ctx.saved_tensors
                return 2 * x * g
        torch.manual_seed(0)
        x = torch.randn(16, requires_grad=True)
        Square.apply(x).sum().backward()
        print("grad", round(float(x.grad.sum()), 4))
        try:
            torch.ones(2) @ torch.ones(3)
        except RuntimeError as e:
            print("caught", type(e).__name__)
        torch.ones(5).neg()
        def work(i):
            t = torch.full((8, 8), float(i))
            return float((t @ t).sum())
        with ThreadPoolExecutor(3) as ex:
            print(sorted(ex.map(work, range(6))))
    """))
    bare = subprocess.run([sys.executable, str(app)], capture_output=True, text=True)
    r = _run(tmp_path / "run", sys.executable, str(app))
    assert r.returncode == bare.returncode == 0, r.stderr
    assert r.stdout == bare.stdout
    run = pastaprof.load(tmp_path / "run")
    neg = run.sql("SELECT depth, parent_id FROM op WHERE name = 'aten::neg'").fetchall()
    assert neg == [(0, None)]  # the matmul that raised did not leave a frame behind
    sites = {s for (s,) in run.sql("SELECT DISTINCT call_site FROM op WHERE name = 'aten::matmul'").fetchall()}
    assert sites == {f"{app}(18): <module>", f"{app}(24): work"}  # the text starts with an empty line
    assert run.sql("SELECT count(DISTINCT tid) FROM op WHERE call_site LIKE '%: work'").fetchall()[0][0] >= 1
    sq = run.sql("SELECT is_backward, call_site FROM op WHERE name = 'SquareBackward'").fetchall()
    assert sq == [(True, f"{app}(15): <module>")]  # backward op: its forward op's line


class _OnceHandler:
    """A handler whose first drain returns ``tables()`` and later ones nothing."""

    name = "once"
    status, records, dropped, sampled_out, kernels_seen = None, 0, 0, 0, 0
    done = False

    def drain(self):
        if self.done:
            return {}
        self.done = True
        return self.tables()

    def stop(self):
        pass


def test_two_handlers_emitting_one_kind_in_one_flush_keep_all_events(tmp_path):
    """Seen on the H200: CUPTI's MEMORY2 rows and the managed-allocation registry's rows are
    both ``alloc`` with different columns (and ``memory_kind`` dictionary-encoded in one, a
    string in the other: seen on the H200 after the first fix); when they met in one flush, concatenation failed
    and the flush lost every event of the run (ranges included).  (CUPTI-shaped drain; no
    GPU here.  The registry is the real one.)"""
    import pyarrow as pa

    from pastaprof.live.session import Session
    from pastaprof.live.uvm_plan import SCHEMA, UvmPlanApplier

    class Feed(_OnceHandler):
        def tables(self):
            return {"alloc": pa.table({"start_ns": [5], "end_ns": [5], "rank": pa.array([0], pa.int32()),
                                       "device": pa.array([0], pa.int32()), "correlation": [9],
                                       "address": pa.array([4096], pa.uint64()), "bytes": [64],
                                       # dictionary-encoded, as the C drain gives it; the registry's is a string
                                       "memory_kind": pa.array(["device_static"]).dictionary_encode(),
                                       "is_async": [False]})}

    out = tmp_path / "run"
    s = Session(CaptureConfig(out=str(out), flush_ms=100000), gpu=False)
    s.start()
    registry = UvmPlanApplier({"schema": SCHEMA, "actions": []})
    registry.allocated(1 << 40, 1 << 20, "app.py(3): <module>")
    s.handlers += [Feed(), registry]
    s.range_end("r", s.range_begin("r"))
    s.flush(final=True)
    s.stop()
    alloc = pq_rows(out / "alloc")
    assert sorted((r["address"], r["bytes"], r["memory_kind"], r["name"]) for r in alloc) == \
        [(4096, 64, "device_static", None), (1 << 40, 1 << 20, "managed", "app.py(3): <module>")]
    assert len(pq_rows(out / "range")) == 1


def test_cupti_memory_and_pool_records_in_one_drain(tmp_path):
    """Seen on the H200 in a 2-GPU NCCL job: CUPTI delivered MEMORY2 (memory_kind
    dictionary-encoded) and MEMORY_POOL (memory_kind a string) records in one drain; both
    become ``alloc`` and their concatenation failed, so the final flush lost every event of
    both ranks.  (The C drain's columns as NumPy arrays; no GPU here.)"""
    import numpy as np

    from pastaprof.handlers.cupti_activity import CuptiActivityHandler

    class Drain:  # what NativeCupti.take() returns: per CUPTI kind, NumPy columns
        def take(self):
            one = {"start_ns": np.array([10], np.int64), "device": np.array([0], np.int32),
                   "correlation": np.array([1], np.int64), "address": np.array([4096], np.uint64),
                   "bytes": np.array([512], np.int64), "operation": np.array([1], np.int64)}
            return {"memory": {**one, "stream": np.array([0], np.int64), "memory_kind": np.array([3], np.int64),
                               "pid": np.array([5], np.int64)},
                    "pool": {**one, "address": np.array([8192], np.uint64), "is_managed": np.array([0], np.int64)}}

        def stat(self, name):
            return 0

    h = CuptiActivityHandler(CaptureConfig(), 0)
    h._native = Drain()
    h._native_stats = lambda: None
    alloc = h._drain_native()["alloc"]
    assert sorted(zip(alloc["address"].to_pylist(), alloc["memory_kind"].to_pylist())) == \
        [(4096, "device"), (8192, "device_pool")]


def test_a_failing_handler_loses_only_its_own_events(tmp_path):
    from pastaprof.live.session import Session

    class Broken(_OnceHandler):
        name = "broken"

        def drain(self):
            raise ValueError("bad buffer")

    out = tmp_path / "run"
    s = Session(CaptureConfig(out=str(out), flush_ms=100000), gpu=False)
    s.start()
    s.handlers.append(Broken())
    s.range_end("r", s.range_begin("r"))
    s.stop()
    assert len(pq_rows(out / "range")) == 1
    assert "broken" in s.status["drain failed"]


def test_gpu_work_rows_conformed_by_their_handler_are_stored(tmp_path):
    """Seen on the H200: the sanitizer's memcpy rows come conformed to the schema (op_id
    already a column, null); the flush's op linking appended a second op_id and the flush
    failed, losing every event of the run.  Also: the copies keep their addresses and the
    synchronize callbacks become sync rows.  (The sanitizer's real conversion; no GPU here.)"""
    from pastaprof.handlers.sanitizer import SanitizerHandler
    from pastaprof.live.session import Session

    class Copies(_OnceHandler):
        def tables(self):
            san = SanitizerHandler.__new__(SanitizerHandler)
            san.rank, san.pid = 0, 7
            c = {"kind": np.array([0, 0, 1, 2, 3]), "start_ns": np.array([10, 20, 30, 40, 50]),
                 "stream": np.array([1, 1, 2, 2, 0]), "bytes": np.array([64, 128, 256, 0, 0]),
                 "direction": np.array([1, 2, 0, 0, 0]), "dst": np.array([1 << 40, 1 << 41, 1 << 42, 0, 0]),
                 "src": np.array([4096, 8192, 0, 0, 0])}
            return san._copies(c)

    out = tmp_path / "run"
    s = Session(CaptureConfig(out=str(out), flush_ms=100000), gpu=False)
    s.start()
    s.handlers.append(Copies())
    s.flush(final=True)
    s.stop()
    copies = sorted((r["start_ns"], r["bytes"], r["op_id"], r["direction"], r["dst_address"], r["src_address"])
                    for r in pq_rows(out / "memcpy"))
    assert copies == [(10, 64, None, "HtoH", 1 << 40, 4096), (20, 128, None, "HtoD", 1 << 41, 8192)]
    assert [(r["bytes"], r["op_id"], r["address"]) for r in pq_rows(out / "memset")] == [(256, None, 1 << 42)]
    # the synchronize callbacks: stream and context syncs, host time of completion
    assert sorted((r["start_ns"], r["sync_kind"], r["stream"]) for r in pq_rows(out / "sync")) == \
        [(40, "stream", 2), (50, "context", 0)]


def pq_rows(d: Path) -> list[dict]:
    import pyarrow.parquet as pq

    return [r for f in sorted(d.glob("*.parquet")) for r in pq.read_table(f).to_pylist()]


def test_without_the_sanitizer_an_access_tool_is_one_notice_and_the_run_goes_on(tmp_path, app):
    """Issue D's bad input: no Compute Sanitizer (gVisor, no toolkit): the instruction-level
    tools say so once; the program's output and exit code are its own; the rest is recorded."""
    r = _run(tmp_path / "run", sys.executable, str(app), "exit3", flags=("-t", "working_set"),
             env={"PASTAPROF_SANITIZER_HOME": str(tmp_path / "nowhere")})
    assert r.returncode == 3, r.stderr
    assert r.stderr.count("instruction-level accesses not recorded: Compute Sanitizer API not found") == 1
    run = pastaprof.load(tmp_path / "run")
    status = run.manifest["processes"][0]["status"]
    assert status["sanitizer"].startswith("instruction-level accesses not recorded")
    assert run.table("range").num_rows >= 1 and run.table("access_summary").num_rows == 0


def test_ranges_without_capture_do_not_load_the_capture_machinery():
    """A program annotated with pastaprof.range but run without capture paid ~0.2 s at the
    first range (the session, pyarrow and numpy were imported by it)."""
    code = ("import sys, pastaprof\n"
            "with pastaprof.range('x'):\n"
            "    pass\n"
            "pastaprof.step()\n"
            "print(sorted(m for m in ('pyarrow', 'numpy', 'pastaprof.live.session') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env={k: v for k, v in os.environ.items() if not k.startswith("PASTAPROF_")})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_many_ops_in_one_drain_keep_every_row_and_pointer(tmp_path):
    """More ops than one storage chunk holds (8,192 rows; 65,536 input pointers) in one
    drain and over several drains: every op stored once, in order, with its own pointers."""
    pytest.importorskip("torch")
    code = textwrap.dedent("""
        import torch, pastaprof
        a, b, c = torch.zeros(4), torch.ones(4), torch.ones(4)
        print(a.data_ptr(), b.data_ptr(), c.data_ptr())
        with pastaprof.range("burst"):
            for _ in range(40000):
                torch.addcmul(a, b, c, out=a)   # inputs a, b, c, value (a scalar: 0), out=a
        import time; time.sleep(1.3)            # a periodic drain in between
        with pastaprof.range("after"):
            for _ in range(9000):
                a.add_(b)
    """)
    out = tmp_path / "many"
    r = subprocess.run([sys.executable, "-m", "pastaprof.cli", "run", "-o", str(out), "--shapes", "all", "--",
                        sys.executable, "-c", code], capture_output=True, text=True)  # every op's pointers
    assert r.returncode == 0, r.stderr
    pa_, pb, pc_ = map(int, r.stdout.split())
    run = pastaprof.load(out)
    ops = run.table("op").to_pylist()
    addcmul = [o for o in ops if o["name"] == "aten::addcmul" and o["depth"] == 0]
    add_ = [o for o in ops if o["name"] == "aten::add_" and o["depth"] == 0]
    assert len(addcmul) == 40000 and len(add_) == 9000
    assert len({o["id"] for o in ops}) == len(ops)  # no row stored twice
    assert all(o["input_ptrs"] == [pa_, pb, pc_, 0, pa_] for o in addcmul)  # 200,000 pointers
    assert all(o["input_ptrs"] == [pa_, pb, 0] for o in add_)
    starts = [o["start_ns"] for o in addcmul]
    assert starts == sorted(starts)


def test_stop_seconds_cover_the_manifest_write(tmp_path):
    """stop_seconds (the exit path's cost in run.json) is taken after this process's manifest
    is built, not before its write: what the manifest asks of the handlers is counted."""
    from pastaprof.live.session import Session

    class Slow(_OnceHandler):
        tables = dict
        stopping = False

        def stop(self):
            self.stopping = True

        @property
        def kernels_seen(self):  # asked by the manifest write only
            if self.stopping:
                time.sleep(0.05)
            return 0

    out = tmp_path / "run"
    s = Session(CaptureConfig(out=str(out), flush_ms=100000), gpu=False)
    s.start()
    s.handlers.append(Slow())
    s.stop()
    meta = json.loads(next((out / "shards").glob("*.json")).read_text())
    assert meta["capture_overhead"]["stop_seconds"] >= 0.05
    assert meta["capture_overhead"]["stop_seconds"] == round(s.stop_seconds, 6)


def test_gate_keeps_what_a_filter_keeps():
    """The gate slices where the kept rows are one run (no copy), else filters."""
    import pyarrow as pa

    from pastaprof.live.linking import _kept

    t = pa.table({"a": list(range(6)), "b": [[i] for i in range(6)]})
    for keep in ([0, 0, 0, 0, 0, 0], [1] * 6, [0, 1, 1, 1, 0, 0], [1, 0, 0, 0, 0, 0], [0, 0, 0, 0, 1, 1],
                 [1, 0, 1, 0, 0, 1]):
        k = np.array(keep, bool)
        assert _kept(t, k).equals(t.filter(pa.array(k)))


def test_op_stack_of_the_launch_callbacks():
    """The op observer pushes op ids to the native CUPTI library's thread-local stack; a launch
    callback tags its row with the innermost one.  Without a libcupti bound, nothing is
    forwarded to CUPTI and the callback API is refused (the handler then uses activity records)."""
    import ctypes

    from pastaprof import native

    try:
        lib = native.load("cupti")
    except RuntimeError as e:
        pytest.skip(str(e))
    got = ctypes.c_uint64(0)
    for op_id in (5, 7, 11):
        assert lib.pp_tls_push(2, op_id) == 0
    popped = []
    for _ in range(3):
        assert lib.pp_tls_pop(2, ctypes.byref(got)) == 0
        popped.append(got.value)
    assert popped == [11, 7, 5]
    got.value = 99
    lib.pp_tls_pop(2, ctypes.byref(got))  # an empty stack leaves the id alone
    assert got.value == 99
    assert lib.pp_cupti_callbacks_on() != 0  # no libcupti bound in this process
    assert lib.pp_cupti_take(4) == 0 and lib.pp_cupti_take(5) == 0  # no launch rows, no op links


def test_sync_rows_come_from_the_launch_callbacks():
    """With sync rows on, a sync call's callback writes a sync row (its type, its call's
    correlation and times) beside its launch-call row, so CUPTI's SYNCHRONIZATION kind can stay
    off; other calls, and every call once sync rows are off, write none.  The stream id needs a
    libcupti: without one it is -1, as for context syncs."""
    import ctypes

    import numpy as np

    from pastaprof import native
    from pastaprof.handlers.cupti_activity import sync_type
    from pastaprof.handlers.cupti_native import COLUMNS, KIND_INDEX

    assert [sync_type(n) for n in ("cudaEventSynchronize_v3020", "cudaStreamWaitEvent_ptsz_v7000",
                                   "cudaStreamSynchronize_v3020", "cuStreamSynchronize", "cudaDeviceSynchronize_v3020",
                                   "cuCtxSynchronize", "cudaThreadSynchronize_v3020", "cudaLaunchKernel_v7000",
                                   "cudaMemcpyAsync_v3020", "cudaEventRecord_v3020")] == [1, 2, 3, 3, 4, 4, 4, 0, 0, 0]
    try:
        lib = native.load("cupti")
    except RuntimeError as e:
        pytest.skip(str(e))
    S, A = KIND_INDEX["sync"], KIND_INDEX["api"]

    def take(kind: int) -> dict[str, list[int]]:
        n = lib.pp_cupti_take(kind)
        names = COLUMNS["sync" if kind == S else "api"]
        cols = {}
        for i, name in enumerate(names):
            buf = np.zeros(n, np.int64)
            lib.pp_cupti_copy(kind, i, buf.ctypes.data)
            cols[name] = buf.tolist()
        lib.pp_cupti_release()
        return cols

    take(S), take(A)
    stream = ctypes.c_void_p(0x1234)
    lib.pp_cupti_sync_cbid(0, 131, 3, 1)  # a stream sync, per-thread variant
    lib.pp_cupti_sync_cbid(1, 126, 4, 0)  # a driver context sync
    lib.pp_cupti_sync_rows(1)
    lib.pp_cupti_callback_replay(0, 131, 41, ctypes.byref(stream))
    lib.pp_cupti_callback_replay(0, 211, 42, None)  # a launch: no sync row
    lib.pp_cupti_callback_replay(1, 126, 43, None)
    lib.pp_cupti_callback_replay(1, 131, 44, None)  # cbid 131 of the other domain is not a sync
    sync, api = take(S), take(A)
    assert sync["correlation"] == [41, 43] and sync["sync_type"] == [3, 4] and sync["stream"] == [-1, -1]
    assert all(0 < s <= e for s, e in zip(sync["start_ns"], sync["end_ns"]))
    assert api["correlation"] == [41, 42, 43, 44] and api["is_driver"] == [0, 0, 1, 1]
    assert api["start_ns"][0] == sync["start_ns"][0] and api["end_ns"][2] == sync["end_ns"][1]
    lib.pp_cupti_sync_rows(0)
    lib.pp_cupti_callback_replay(0, 131, 45, ctypes.byref(stream))
    assert take(S)["correlation"] == [] and take(A)["correlation"] == [45]


def _captured(tmp_path: Path, source: str, stdout: str, env: dict | None = None):
    """Run `source` as a program under `pastaprof run`; check its exit and output; the run."""
    pytest.importorskip("torch")
    app = tmp_path / "app_under_test.py"
    app.write_text(source)
    r = _run(tmp_path / "run", sys.executable, str(app), env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout == stdout
    return pastaprof.load(tmp_path / "run")


MODULES_APP = textwrap.dedent("""
    import threading, torch
    shared = torch.nn.Linear(4, 4)
    a, b = torch.nn.Sequential(shared, torch.nn.ReLU()), torch.nn.Sequential(torch.nn.Tanh(), shared)
    x = torch.randn(2, 4)
    a(x)
    b(x)
    with torch.no_grad():
        t = threading.Thread(target=lambda: [b(x) for _ in range(50)])
        t.start()
        for _ in range(50):
            a(x)
        t.join()
    print("ok")
""")


@pytest.mark.parametrize("native", ["1", "0"])
def test_module_paths_follow_the_parent_and_the_thread(tmp_path, native):
    """One Linear inside two Sequentials: its ops carry the path of the parent that called
    it, also while the two run at once on two threads (paths are per thread).  The Python
    fallback's dispatch mode is the main thread's only: it sees no op of the other thread."""
    op = _captured(tmp_path, MODULES_APP, "ok\n", env={"PASTAPROF_NATIVE": native}).table("op").to_pylist()
    linear = "aten::addmm" if native == "1" else "aten.addmm.default"
    relu, tanh = ("aten::relu", "aten::tanh") if native == "1" else ("aten.relu.default", "aten.tanh.default")
    by = {}
    for o in op:
        if o["name"] in (linear, relu, tanh):
            by.setdefault((o["name"], o["module"]), set()).add(o["tid"])
    threads = 2 if native == "1" else 1  # b: on the main thread, then on the other
    assert {k: len(v) for k, v in by.items()} == {
        (linear, "Sequential_0/Linear_0"): 1, (relu, "Sequential_0/ReLU_0"): 1,
        (linear, "Sequential_1/Linear_0"): threads, (tanh, "Sequential_1/Tanh_0"): threads,
    }
    counts = {}
    for o in op:
        if o["name"] == linear:
            counts[o["module"]] = counts.get(o["module"], 0) + 1
    assert counts == {"Sequential_0/Linear_0": 51, "Sequential_1/Linear_0": 51 if native == "1" else 1}


EXCEPTION_APP = textwrap.dedent("""
    import torch

    class Fails(torch.nn.Module):
        def forward(self, x):
            x = x.relu()
            raise ValueError("no")

    fails, after = torch.nn.Sequential(torch.nn.Linear(4, 4), Fails()), torch.nn.Sequential(torch.nn.Tanh())
    x = torch.randn(2, 4)
    try:
        fails(x)
    except ValueError:
        pass
    after(x)
    # torch.compile traces through the wrapped Module.__call__ without a graph break
    compiled = torch.compile(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.GELU()), backend="eager", fullgraph=True)
    print(compiled(x).shape[0])
""")


def test_module_path_after_an_exception_and_under_torch_compile(tmp_path):
    """A forward that raises leaves no stale path behind (a forward hook would not have
    run), and torch.compile(fullgraph=True) traces modules without a graph break."""
    op = _captured(tmp_path, EXCEPTION_APP, "2\n").table("op").to_pylist()
    assert {o["module"] for o in op if o["name"] == "aten::relu"} == {"Sequential_0/Fails_0"}
    assert {o["module"] for o in op if o["name"] == "aten::tanh"} == {"Sequential_1/Tanh_0"}


FOREACH_APP = textwrap.dedent("""
    import torch
    a, b = [torch.zeros(2), torch.zeros(3, 4)], [torch.ones(2), torch.ones(3, 4)]
    torch._foreach_add_(a, b)
    with open(__file__ + ".ptrs", "w") as f:
        f.write(" ".join(str(t.data_ptr()) for t in a + b))
    print(float(a[1].sum()))
""")


def test_tensor_list_inputs_of_a_foreach_op(tmp_path):
    """An optimizer's foreach ops take tensor lists: their shapes, dtypes and data pointers
    are read from the list in place (the observer no longer copies it)."""
    run = _captured(tmp_path, FOREACH_APP, "12.0\n")
    assert run.manifest["processes"][0]["handlers"]["torch"]["mechanism"] == "native"
    (op,) = [o for o in run.table("op").to_pylist() if o["name"] == "aten::_foreach_add_" and o["depth"] == 0]
    assert op["input_shapes"] == "[[[2],[3,4]],[[2],[3,4]],[]]"
    assert op["input_dtypes"] == '["TensorList","TensorList","Scalar"]'
    assert op["input_ptrs"] == [int(p) for p in (tmp_path / "app_under_test.py.ptrs").read_text().split()] + [0]
