"""A captured program is never harmed: each program here runs bare and under the real
`pastaprof run` subprocess, and must give the same stdout, exit code and stderr (pastaprof's
own ``pastaprof:`` lines aside), while the run still records what it should (module paths
counted per op).  Real torch (the CPU build), real subprocesses, real runs on disk."""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
import textwrap
import threading
from collections import Counter
from pathlib import Path

import pytest

import pastaprof
from pastaprof.live.python_flags import interpreter_flags, uncaptured_reason

PP = [sys.executable, "-m", "pastaprof.cli", "run"]
PROGRAMS = Path(__file__).parent / "data" / "unharmed"
BOOTSTRAP = str(Path(pastaprof.__file__).parent / "live" / "bootstrap")
# torch.profiler's own log lines carry a time and pids: equal in kind, not in text
_NOISE = re.compile(r"^(pastaprof:|USDT:)")


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PASTAPROF_")}
    return {**env, **(extra or {})}


def _bare(cmd: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env=_env(env), timeout=300)


def _captured(out: Path, cmd: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*PP, "-o", str(out), "--", *cmd], capture_output=True, text=True, cwd=cwd,
                          env=_env(env), timeout=300)


def _program_stderr(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if not _NOISE.match(ln)]


def _same(bare: subprocess.CompletedProcess, run: subprocess.CompletedProcess) -> None:
    assert run.returncode == bare.returncode, run.stderr
    assert run.stdout == bare.stdout
    assert _program_stderr(run.stderr) == _program_stderr(bare.stderr)


def _modules(run_dir: Path, names: tuple[str, ...]) -> Counter:
    op = pastaprof.load(run_dir).table("op").to_pylist()
    return Counter((o["name"], o["module"]) for o in op if o["name"] in names)


# -- nn.Module.__call__ and everything that introspects it ------------------------------


def test_introspection_of_module_calls_sees_torchs_own(tmp_path):
    """torch.profiler(with_stack=True) crashed the program (its stack tracer read the wrapper's
    frame as a module call); identity and name checks, inspect.signature, pickling
    Module.__call__ by name, global and backward hooks, pickle/deepcopy of modules,
    torch.jit.script/trace and torch.fx.symbolic_trace all saw the wrapper."""
    pytest.importorskip("torch")
    cmd = [sys.executable, str(PROGRAMS / "introspect.py")]
    bare = _bare(cmd, tmp_path)
    assert bare.returncode == 0, bare.stderr
    assert "identity True True True" in bare.stdout
    run = _captured(tmp_path / "run", cmd, tmp_path)
    _same(bare, run)
    got = _modules(tmp_path / "run", ("aten::sigmoid", "aten::tanh", "aten::mul", "aten::addmm"))
    assert got[("aten::sigmoid", "Outer_0/Tail_0")] == 5  # 4 calls + 1 under catch_warnings
    assert got[("aten::mul", "Outer_0")] == 5
    # pickle/deepcopy copies and the fx GraphModule are modules of their own, one forward each
    assert got[("aten::tanh", "Net_1")] == got[("aten::tanh", "Net_2")] == got[("aten::tanh", "Net_3")] == 1
    assert got[("aten::addmm", "Net_3/Linear_0")] == 1  # fx keeps the original submodules
    # every eager forward of the first Net is attributed at both of its Linear layers
    n = got[("aten::tanh", "Net_0")]
    assert n >= 9 and got[("aten::addmm", "Net_0/Sequential_0/Linear_0")] == n
    assert got[("aten::addmm", "Net_0/Sequential_0/Linear_1")] == n


def test_torch_compile_same_graphs_no_warning(tmp_path):
    """Global module hooks make torch.compile(module) warn at each call and make dynamo trace
    ``__call__``: the program must get the same graphs, no graph break and no warning."""
    pytest.importorskip("torch")
    cmd = [sys.executable, str(PROGRAMS / "compiled.py")]
    bare = _bare(cmd, tmp_path)
    assert bare.returncode == 0, bare.stderr
    run = _captured(tmp_path / "run", cmd, tmp_path)
    _same(bare, run)
    assert "global hooks" not in run.stderr
    assert re.search(r"stats .*'unique_graphs': 3\} 0$", run.stdout, re.M)
    ops = pastaprof.load(tmp_path / "run").table("op")
    assert Counter(ops["name"].to_pylist())["aten::relu"] == 12  # 3 compiled calls x 2 blocks x (fake + real)
    # the compiled code runs no module hook: torch.compile(net)'s calls stand for net, as named eagerly
    got = _modules(tmp_path / "run", ("aten::relu",))
    assert got[("aten::relu", "Sequential_0")] >= 4  # 2 calls x 2 blocks, and the tracing's fake ops


def test_fsdp2_training_same_and_attributed(tmp_path):
    """FSDP2 (fully_shard) swaps module classes and registers module hooks of its own: the
    training gives the same loss, and ops are attributed to the FSDP modules."""
    pytest.importorskip("torch.distributed.fsdp")
    cmd = [sys.executable, str(PROGRAMS / "fsdp.py")]
    bare = _bare(cmd, tmp_path)
    assert bare.returncode == 0, bare.stderr
    run = _captured(tmp_path / "run", cmd, tmp_path)
    _same(bare, run)
    got = _modules(tmp_path / "run", ("aten::addmm", "aten::relu"))
    assert got == Counter({("aten::addmm", "FSDPSequential_0/FSDPLinear_0"): 3,
                           ("aten::addmm", "FSDPSequential_0/FSDPLinear_1"): 3,
                           ("aten::relu", "FSDPSequential_0/ReLU_0"): 3})


def test_a_step_window_makes_torch_compile_recompile_nothing(tmp_path):
    """The closed gate unregisters the module hooks only until dynamo has traced code: dynamo
    guards on the global hooks, so each gate change would recompile (or hit its recompile
    limit and fall back to eager)."""
    pytest.importorskip("torch")
    cmd = [sys.executable, str(PROGRAMS / "compiled_steps.py")]
    bare = _bare(cmd, tmp_path)
    assert bare.returncode == 0, bare.stderr
    run = subprocess.run([*PP, "-o", str(tmp_path / "run"), "--steps", "2:3", "--", *cmd], capture_output=True,
                         text=True, cwd=tmp_path, env=_env(), timeout=300)
    _same(bare, run)
    assert "'unique_graphs': 1}" in run.stdout
    m = json.loads((tmp_path / "run" / "run.json").read_text())
    assert m["processes"][0]["handlers"]["torch"]["gate_changes"] >= 2


def _hooked():
    torch = pytest.importorskip("torch")
    from pastaprof.handlers.module_paths import ModulePaths

    paths = ModulePaths()
    return torch, paths, paths.install(torch)


def test_hooks_keep_the_stack_balanced_across_gate_changes_and_exceptions():
    """The post hook pops only its own module's entry: a gate closed between a module's pre
    and post hook, a module entered while the gate was closed, and a forward that raises
    leave no stale entry behind; threads keep their own paths."""
    torch, paths, handles = _hooked()
    nn = torch.nn
    seen: list[str | None] = []

    class Probe(nn.Module):
        def __init__(self, action=None):
            super().__init__()
            self.action = action

        def forward(self, x):
            seen.append(paths.current())
            if self.action is not None:
                self.action()
            return x

    class Boom(nn.Module):
        def forward(self, x):
            raise ValueError("boom")

    def close():
        paths.gate[0] = False

    def reopen():
        paths.gate[0] = True

    try:
        outer = nn.Sequential(Probe(close))
        outer(torch.ones(1))  # gate closed inside: both posts still pop
        assert paths._local.ids == [] and paths._local.mods == []
        outer2 = nn.Sequential(Probe(reopen))
        outer2(torch.ones(1))  # entered closed, reopened inside: the post pops nothing of others
        assert paths._local.ids == []
        with pytest.raises(ValueError):
            nn.Sequential(nn.Sequential(Boom()))(torch.ones(1))
        assert paths._local.ids == []
        nn.Sequential(Probe())(torch.ones(1))
        assert seen == ["Sequential_0/Probe_0", None, "Sequential_3/Probe_1"]
        other: list[str | None] = []

        def worker():
            nn.Sequential(Probe())(torch.ones(1))
            other.append(seen[-1])

        t = threading.Thread(target=worker)
        t.start()
        t.join()
        assert other == ["Sequential_4/Probe_2"] and paths._local.ids == []
    finally:
        for h in handles:
            h.remove()
    from torch.nn.modules import module as nn_module

    assert not nn_module._global_forward_hooks and not nn_module._global_forward_pre_hooks
    assert not nn_module._has_any_global_hook()


def test_a_closed_gate_unregisters_the_hooks_only_where_safe():
    """Outside the windows modules take torch's fast path again (the hooks unregistered),
    but not while a module call is open (its post hook would be lost) nor once dynamo has
    traced code (it guards on the global hooks: each change would recompile)."""
    torch, paths, handles = _hooked()
    from torch.nn.modules import module as nn_module

    nn = torch.nn
    seen: list[str | None] = []

    class Step(nn.Module):
        def forward(self, x):
            paths.set_gate(False)  # a gate change inside a module call: the hooks stay
            seen.append(f"inside {len(nn_module._global_forward_hooks)}")
            return x

    class Probe(nn.Module):
        def forward(self, x):
            seen.append(paths.current())
            return x

    def ours() -> int:
        return len(set(nn_module._global_forward_pre_hooks) | set(nn_module._global_forward_hooks))

    try:
        assert ours() == 2
        paths.set_gate(False)
        assert ours() == 0 and not nn_module._global_forward_hooks_always_called
        nn.Sequential(Probe())(torch.ones(1))  # fast path: nothing recorded
        paths.set_gate(True)
        assert ours() == 2
        nn.Sequential(Probe())(torch.ones(1))
        nn.Sequential(Step())(torch.ones(1))
        assert ours() == 2 and paths._local.ids == []
        paths.set_gate(False)  # no call open now
        assert ours() == 0
        paths.set_gate(True)
        assert seen == [None, "Sequential_0/Probe_0", "inside 1"]
        importlib.import_module("torch.optim")  # loads dynamo: no reason to keep the hooks yet
        paths.set_gate(False)
        assert ours() == 0
        paths.set_gate(True)
        compiled = torch.compile(lambda t: t.sin(), backend="eager")
        compiled(torch.ones(1))  # dynamo has traced: registered for good, the flag gates
        paths.set_gate(False)
        assert ours() == 2
    finally:
        for h in handles:
            h.remove()
    assert ours() == 0 and not nn_module._has_any_global_hook()
    paths.set_gate(True)  # after the handler's stop: registers nothing
    assert ours() == 0


def test_a_dead_modules_id_does_not_name_a_new_module():
    """Paths were keyed by id(module): a module made after another died often got its id, and
    with it the dead module's name (even of another class)."""
    torch, paths, handles = _hooked()
    nn = torch.nn
    got: list[tuple[str | None, str]] = []

    class A(nn.Module):
        def forward(self, x):
            got.append((paths.current(), type(self).__name__))
            return x

    class B(A):
        pass

    try:
        for i in range(40):
            (A if i % 2 else B)()(torch.ones(1))  # a temporary module each time
    finally:
        for h in handles:
            h.remove()
    assert [p.rsplit("_", 1)[0] for p, _ in got] == [cls for _, cls in got]
    assert len({p for p, _ in got}) == 40  # each module its own name


def test_the_programs_own_global_hooks_still_warn_under_compile():
    """Only pastaprof's two hooks are disregarded by torch.compile(module)'s warning check."""
    torch, paths, handles = _hooked()
    from torch.nn.modules import module as nn_module

    try:
        assert not nn_module._has_any_global_hook()
        mine = nn_module.register_module_forward_hook(lambda m, a, o: None)
        assert nn_module._has_any_global_hook()
        mine.remove()
        assert not nn_module._has_any_global_hook()
    finally:
        for h in handles:
            h.remove()


# -- sitecustomize, sys.path ------------------------------------------------------------

SHOW_SITE = ("import sys; sc = sys.modules.get('sitecustomize'); "
             "print(sys.path[1:], 'sitecustomize' in sys.modules, getattr(sc, '__file__', None), "
             "getattr(sc, 'X', None)); sys.exit(1)")
SITES = {
    "raises": "raise ValueError('boom in site')",
    "exits": "print('site exits', flush=True)\n    sys.exit(3)",
    "imports_missing": "import pastaprof_no_such_module_x",
    "works": "X = 42\n    print('site ran', sys.modules['sitecustomize'].__name__, flush=True)",
    "none": None,
}
# the launcher (`python -m pastaprof.cli`) inherits PYTHONPATH too: the program's
# sitecustomize acts only in the program's process
_ONLY_IN_PROGRAM = "import sys\nif 'pastaprof.cli' not in sys.orig_argv:\n    {}\n"


@pytest.mark.parametrize("kind", sorted(SITES))
def test_the_programs_sitecustomize_runs_as_python_runs_it(tmp_path, kind):
    """Python prints a failing sitecustomize's error in one line and goes on (a SystemExit in it
    ends the interpreter); pastaprof's bootstrap printed its own warning instead, left itself
    in sys.modules['sitecustomize'] and its directory on sys.path."""
    site = tmp_path / "site"
    site.mkdir()
    if SITES[kind] is not None:
        (site / "sitecustomize.py").write_text(_ONLY_IN_PROGRAM.format(SITES[kind]))
    env = {"PYTHONPATH": str(site)}
    cmd = [sys.executable, "-c", SHOW_SITE]
    bare = _bare(cmd, tmp_path, env)
    run = _captured(tmp_path / "run", cmd, tmp_path, env)
    assert run.returncode == bare.returncode == (1 if kind != "exits" else bare.returncode)
    assert run.stdout == bare.stdout
    if kind == "exits":  # the fatal error's traceback names the bootstrap's frames as well
        assert bare.returncode != 0 and "SystemExit: 3" in run.stderr and "site exits" in run.stdout
        return
    assert _program_stderr(run.stderr) == _program_stderr(bare.stderr)
    assert BOOTSTRAP not in run.stdout
    if kind == "raises":
        assert "Error in sitecustomize; set PYTHONVERBOSE for traceback:\nValueError: boom in site\n" in run.stderr
    if kind == "works":
        assert "42" in run.stdout and str(site / "sitecustomize.py") in run.stdout


def test_sys_path_as_the_program_sees_it(tmp_path):
    """The bootstrap directory is not on the program's sys.path (nor in its importer cache),
    with and without a PYTHONPATH of the program's own."""
    code = ("import sys; print(sys.path); "
            "print([k for k in sys.path_importer_cache if 'bootstrap' in k and 'pastaprof' in k])")
    for i, env in enumerate(({}, {"PYTHONPATH": str(tmp_path)})):
        bare = _bare([sys.executable, "-c", code], tmp_path, env)
        run = _captured(tmp_path / f"run{i}", [sys.executable, "-c", code], tmp_path, env)
        _same(bare, run)
        assert run.stdout.splitlines()[1] == "[]"


# -- python -E / -I / -S ------------------------------------------------------------------


def test_interpreter_flags_parse():
    assert interpreter_flags(["python", "-I", "x.py"]) == {"I"}
    assert interpreter_flags(["/usr/bin/python3.11", "-bES", "x.py", "-I"]) == {"b", "E", "S"}
    assert interpreter_flags(["python", "-W", "ignore", "-X", "dev", "-sc", "pass"]) == {"s", "c"}
    assert interpreter_flags(["python", "-Wignore", "-m", "pkg", "-E"]) == {"m"}
    assert interpreter_flags(["python", "--check-hash-based-pycs", "always", "-E", "x"]) == {"E"}
    assert interpreter_flags(["bash", "-E", "x"]) == set() and interpreter_flags([]) == set()
    assert uncaptured_reason(["python", "-X", "dev", "-s", "x.py"]) is None
    assert uncaptured_reason(["python3", "-E", "x.py"]).startswith("python -E ignores PYTHONPATH")


@pytest.mark.parametrize("flag", ["-E", "-I", "-S"])
def test_python_flags_that_skip_the_bootstrap_are_said(tmp_path, flag):
    """Capture was silently off: now one status line, and run.json's entry for the process."""
    app = tmp_path / "app.py"
    app.write_text("import sys\nprint('ran', sys.flags.isolated, sys.flags.no_site)\nsys.exit(4)\n")
    cmd = [sys.executable, flag, str(app)]
    bare = _bare(cmd, tmp_path)
    run = _captured(tmp_path / "run", cmd, tmp_path)
    _same(bare, run)
    lines = [ln for ln in run.stderr.splitlines() if f"python {flag}" in ln]
    assert len(lines) == 1 and "uncaptured" in lines[0]
    m = json.loads((tmp_path / "run" / "run.json").read_text())
    assert [p["argv"] for p in m["processes"]] == [cmd]
    assert [v for v in m["status"].values() if f"python {flag}" in v] == [lines[0].removeprefix("pastaprof: ")]


# -- start-up cost: capture starts with the first GPU framework ---------------------------

HEAVY = "import sys; print(sorted(m for m in sys.modules if m.split('.')[0] in {'numpy','pyarrow','pandas','duckdb','pastaprof'}))"


def test_a_child_that_imports_no_gpu_framework_loads_no_capture_machinery(tmp_path):
    """The bootstrap imported pandas, pyarrow and numpy in every Python child (0.3-0.45 s)."""
    run = _captured(tmp_path / "run", [sys.executable, "-c", HEAVY], tmp_path)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]"


def test_a_child_importing_torch_later_is_still_captured(tmp_path):
    """A parent that never imports torch starts a child that does, after some work of its own:
    the child's ops are recorded with their module paths, under the child's pid."""
    pytest.importorskip("torch")
    child = textwrap.dedent("""
        import json, sys
        print(sorted(m for m in sys.modules if m.split('.')[0] in {'numpy', 'pyarrow'}), flush=True)
        import torch
        class Tail(torch.nn.Module):
            def forward(self, x):
                return torch.sigmoid(x)
        net = torch.nn.Sequential(Tail())
        with torch.no_grad():
            print([round(net(torch.ones(2)).sum().item(), 4) for _ in range(3)])
    """)
    (tmp_path / "child.py").write_text(child)
    parent = ("import subprocess, sys, os\n"
              "print(sum(range(10**5)), flush=True)\n"
              "r = subprocess.run([sys.executable, 'child.py'])\n"
              "print('child pid file', r.returncode)\n")
    (tmp_path / "parent.py").write_text(parent)
    cmd = [sys.executable, "parent.py"]
    bare = _bare(cmd, tmp_path)
    run = _captured(tmp_path / "run", cmd, tmp_path)
    _same(bare, run)
    assert "[]" in run.stdout.splitlines()[1]
    got = _modules(tmp_path / "run", ("aten::sigmoid",))
    assert got == Counter({("aten::sigmoid", "Sequential_0/Tail_0"): 3})
    m = json.loads((tmp_path / "run" / "run.json").read_text())
    assert [p["argv"][-1] for p in m["processes"]] == ["child.py"]  # the torch-less parent left no record


def test_pastaprof_verbs_start_capture_without_a_gpu_framework(tmp_path):
    """pastaprof.range/step in a program that imports no GPU framework still record."""
    code = ("import pastaprof\n"
            "for i in range(3):\n"
            "    with pastaprof.range(f'r{i}'):\n"
            "        pass\n"
            "    pastaprof.step()\n"
            "print('ok')\n")
    run = _captured(tmp_path / "run", [sys.executable, "-c", code], tmp_path)
    assert run.returncode == 0 and run.stdout == "ok\n", run.stderr
    assert sorted(pastaprof.load(tmp_path / "run").table("range")["name"].to_pylist()) == [
        "pastaprof.step#0", "pastaprof.step#1", "r0", "r1", "r2"]  # the three step() calls delimit two steps
    assert json.loads((tmp_path / "run" / "run.json").read_text())["processes"][0]["steps_seen"] == 3


def test_torch_imported_by_the_programs_sitecustomize_or_a_thread_is_captured(tmp_path):
    """The session starts at torch's import wherever it happens: inside the program's own
    sitecustomize (run by the bootstrap) or on a thread that is not the main one."""
    pytest.importorskip("torch")
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_ONLY_IN_PROGRAM.format("import torch"))
    app = tmp_path / "app.py"
    app.write_text(textwrap.dedent("""
        import sys, threading
        print('torch' in sys.modules, flush=True)
        def work():
            import torch
            class Tail(torch.nn.Module):
                def forward(self, x):
                    return torch.sigmoid(x)
            with torch.no_grad():
                print(round(torch.nn.Sequential(Tail())(torch.ones(3)).sum().item(), 4), flush=True)
        t = threading.Thread(target=work)
        t.start()
        t.join()
    """))
    for env, name in (({"PYTHONPATH": str(site)}, "site"), ({}, "thread")):
        bare = _bare([sys.executable, str(app)], tmp_path, env)
        run = _captured(tmp_path / f"run-{name}", [sys.executable, str(app)], tmp_path, env)
        _same(bare, run)
        assert run.stdout.splitlines()[0] == ("True" if name == "site" else "False")
        assert _modules(tmp_path / f"run-{name}", ("aten::sigmoid",)) == Counter({("aten::sigmoid", "Sequential_0/Tail_0"): 1})


def test_module_nesting_past_the_recursion_limit_raises_the_programs_recursion_error(tmp_path):
    """The module hooks run at every nesting level: at the recursion limit they failed inside
    pastaprof (a ctypes.ArgumentError the program's ``except RecursionError`` did not catch).
    (The hook path costs torch one more frame a level: the deepest nesting is about 3/4 of bare's.)"""
    pytest.importorskip("torch")
    cmd = [sys.executable, str(PROGRAMS / "deep_modules.py")]
    bare = _bare(cmd, tmp_path)
    assert bare.returncode == 0 and "called 480 past the limit True" in bare.stdout, bare.stderr
    run = _captured(tmp_path / "run", cmd, tmp_path)
    assert run.returncode == 0 and run.stdout == bare.stdout, run.stderr
    ops = pastaprof.load(tmp_path / "run").table("op").to_pylist()
    assert sum(o["name"] == "aten::ones" for o in ops) == 480


def test_a_warning_filter_that_makes_encoding_warnings_errors_sees_none_of_pastaprofs(tmp_path):
    """Files pastaprof writes in the program's process name their encoding: under
    ``-X warn_default_encoding -W error::EncodingWarning`` its manifest write raised in atexit."""
    pytest.importorskip("torch")
    p = tmp_path / "enc.py"
    p.write_text("import warnings\nwarnings.filterwarnings('ignore', category=EncodingWarning, module='torch')\n"
                 "import torch\nprint(torch.ones(2).add(1).tolist())\n")
    cmd = [sys.executable, "-X", "warn_default_encoding", "-W", "error::EncodingWarning", str(p)]
    bare = _bare(cmd, tmp_path)
    run = _captured(tmp_path / "run", cmd, tmp_path)
    _same(bare, run)
    assert "capture not started" not in run.stderr
    assert pastaprof.load(tmp_path / "run").table("op").num_rows > 0


def _old_pythons() -> list[str]:
    """Interpreters older than the bootstrap supports (pyenv's, where installed)."""
    import glob

    found = []
    for exe in sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/*/bin/python"))):
        r = subprocess.run([exe, "-c", "import sys; print(sys.version_info[0] * 100 + sys.version_info[1])"],
                           capture_output=True, text=True, timeout=60)
        if r.returncode == 0 and r.stdout.strip().isdigit() and int(r.stdout) < 308:
            found.append(exe)
    return found


def test_children_on_pythons_the_bootstrap_does_not_support_run_as_bare(tmp_path):
    """A program that starts a Python 2.7 or 3.6 child: the bootstrap's sitecustomize must parse
    there and leave it alone (a SyntaxError line on 2.7, AttributeErrors on 3.6 before)."""
    pytest.importorskip("torch")
    olds = _old_pythons()
    if not olds:
        pytest.skip("no Python older than 3.8 installed (pyenv)")
    p = tmp_path / "olds.py"
    p.write_text("import subprocess, sys, torch\nfor py in sys.argv[1:]:\n"
                 "    r = subprocess.run([py, '-c', 'import sys; print(sys.version_info[:2], len(sys.path), "
                 "\"sitecustomize\" in sys.modules)'], capture_output=True, text=True)\n"
                 "    print(r.returncode, r.stdout.strip(), repr(r.stderr))\n")
    cmd = [sys.executable, str(p), *olds]
    bare = _bare(cmd, tmp_path)
    run = _captured(tmp_path / "run", cmd, tmp_path)
    _same(bare, run)
    assert bare.stdout.count("0 (") == len(olds) and "''" in bare.stdout


def test_the_functions_pastaprof_wraps_pickle_as_bare(tmp_path):
    """pickle finds a function by module and name and checks it is the same object:
    ``pickle.dumps(signal.set_wakeup_fd)`` raised under capture, and os.close pickled as another
    module's."""
    pytest.importorskip("torch")
    p = tmp_path / "pk.py"
    p.write_text("import os, pickle, signal, torch\n"
                 "for f in (signal.signal, signal.getsignal, signal.set_wakeup_fd, os._exit, os.abort, os.execv,\n"
                 "          os.execve, os.close, os.closerange, os.putenv, os.unsetenv, os.posix_spawn):\n"
                 "    print(pickle.dumps(f), pickle.loads(pickle.dumps(f)) is f)\n")
    cmd = [sys.executable, str(p)]
    bare = _bare(cmd, tmp_path)
    assert bare.returncode == 0 and bare.stdout.count("True") == 12, bare.stderr
    _same(bare, _captured(tmp_path / "run", cmd, tmp_path))


JIT_RANGES = """
import inspect, torch
@torch.jit.script
def f(x):
    with torch.autograd.profiler.record_function("scripted"):
        y = x * 2
    return y
print(f(torch.ones(2)).tolist())
print(inspect.signature(torch.autograd.profiler.record_function.__exit__))
with torch.autograd.profiler.record_function("eager"):
    print(torch.ones(3).sum().item())
"""


def test_torchscript_compiles_record_function_and_eager_ranges_are_kept(tmp_path):
    """pastaprof wraps record_function's __enter__/__exit__ for its ranges.  TorchScript compiles
    record_function from its methods' source and names: the wrappers named ``enter``/``exit_``
    left it without __enter__ (the scripted function raised, exit 1).  Same output as bare,
    and the eager range is still recorded."""
    (tmp_path / "p.py").write_text(JIT_RANGES)
    bare = _bare([sys.executable, "p.py"], tmp_path)
    run = _captured(tmp_path / "run", [sys.executable, "p.py"], tmp_path)
    assert bare.returncode == 0 and bare.stdout.startswith("[2.0, 2.0]\n"), bare.stderr
    _same(bare, run)
    names = pastaprof.load(tmp_path / "run").table("range").column("name").to_pylist()
    assert "eager" in names, names


WARN_CHILD = """
import os, sys
os.environ["PASTAPROF_LAUNCHER"] = str(os.getppid())  # the shell ($0 "pastaprof") stands in for `pastaprof run`
sys.stderr = open(sys.argv[1], "w")  # the program's own log
from pastaprof.live import messages
messages.warn("disk full")
print("program line", file=sys.stderr)
"""


@pytest.mark.parametrize("launcher_stderr", ["pipe", "file"])
def test_capture_warnings_never_land_in_the_programs_own_log(tmp_path, launcher_stderr):
    """A program that points sys.stderr at its log: pastaprof's warning in the process (a shard it
    cannot write) went into that log.  It goes where `pastaprof run`'s own stderr is -- a pipe
    through /proc/PID/fd/2, a regular file through the shared fd 2."""
    (tmp_path / "c.py").write_text(WARN_CHILD)
    log, err = tmp_path / "log.txt", tmp_path / "err.txt"
    cmd = ["sh", "-c", f'"{sys.executable}" c.py "{log}"; true', "pastaprof"]
    if launcher_stderr == "pipe":
        r = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, env=_env(), timeout=60)
        said = r.stderr
    else:
        with open(err, "w") as f:
            subprocess.run(cmd, cwd=tmp_path, stderr=f, env=_env(), timeout=60)
        said = err.read_text()
    assert log.read_text() == "program line\n"
    assert said == "pastaprof: warning: disk full\n"
