"""Call sites of ops: the innermost frame outside torch and pastaprof, read from the
interpreter's own frame records (native/torch_inputs.cpp), in the shapes Python code takes:
a script's top level, a function, a generator, a method of a user's module, code reached
through functools and contextlib, and ops run from inside torch.nn modules."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections import Counter

import pytest

import pastaprof

torch = pytest.importorskip("torch")

APP = textwrap.dedent('''\
    import contextlib, functools, torch
    x = torch.ones(4)
    y = torch.neg(x)                                    # line 3: top level
    def helper(t):
        return torch.sin(t)                             # line 5: a function
    def gen(t):
        for _ in range(2):
            yield torch.cos(t)                          # line 8: a generator
    class Mine(torch.nn.Module):
        def forward(self, t):
            return torch.tanh(t) + 1                    # line 11: a user's module
    mine, relu = Mine(), torch.nn.ReLU()
    helper(x)
    list(gen(x))
    mine(x)
    functools.partial(helper, x)()                      # through functools: still line 5
    @contextlib.contextmanager
    def ctx():
        yield torch.exp(x)                              # line 19: inside a context manager
    with ctx():
        pass
    seq = torch.nn.Sequential(torch.nn.Sequential(relu))
    for _ in range(3):
        seq(x)                                          # line 24: ops inside torch.nn modules
    print("ok")
''')


def _captured(tmp_path, source: str) -> tuple[subprocess.CompletedProcess, pastaprof.Run, dict]:
    """``source`` run under ``pastaprof run``: the finished process, its run and its torch handler's stats."""
    app = tmp_path / "app.py"
    app.write_text(source)
    env = dict(os.environ, PASTAPROF_FLUSH_MS="200")
    r = subprocess.run([sys.executable, "-m", "pastaprof.cli", "run", "-o", str(tmp_path / "run"), "--", sys.executable,
                        str(app)], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    run = pastaprof.load(tmp_path / "run")
    return r, run, run.manifest["processes"][0]["handlers"]["torch"]


def test_call_sites_are_the_innermost_user_frame(tmp_path):
    r, run, torch_stats = _captured(tmp_path, APP)
    app = tmp_path / "app.py"
    assert r.stdout == "ok\n"
    ops = run.table("op").to_pylist()
    if torch_stats["mechanism"] != "native":
        pytest.skip("the native op observer is not built here")
    top = Counter((o["name"], o["call_site"]) for o in ops if o["parent_id"] is None)
    site = f"{app}({{}}): {{}}".format
    assert top[("aten::neg", site(3, "<module>"))] == 1
    assert top[("aten::sin", site(5, "helper"))] == 2  # called directly and through functools.partial
    assert top[("aten::cos", site(8, "gen"))] == 2
    assert top[("aten::tanh", site(11, "forward"))] == 1
    assert top[("aten::add", site(11, "forward"))] == 1
    assert top[("aten::exp", site(19, "ctx"))] == 1
    assert top[("aten::relu", site(24, "<module>"))] == 3
    # nested ops take their top-level op's site
    by_id = {o["id"]: o for o in ops}
    for o in ops:
        if o["parent_id"] is not None:
            root = o
            while root["parent_id"] is not None:
                root = by_id[root["parent_id"]]
            assert o["call_site"] == root["call_site"], (o["name"], root["name"])


MODULES_APP = textwrap.dedent('''\
    import torch
    from torch.nn.modules import module as nn_module
    class A(torch.nn.Module):
        def forward(self, x):
            return torch.sin(x)
    class B(A):
        pass
    x = torch.ones(2)
    for i in range(40):
        (A if i % 2 else B)()(x)                        # a temporary module each time
    shared = torch.nn.Tanh()
    outer = torch.nn.Sequential(torch.nn.Sequential(shared), torch.nn.Sequential(torch.nn.ReLU(), shared))
    outer(x)
    hooks = len(nn_module._global_forward_pre_hooks) + len(nn_module._global_forward_hooks)
    print("ok", hooks)
''')


def test_module_paths_read_from_frames_register_no_hook(tmp_path):
    """On CPython 3.11-3.13 the native observer reads module paths from the frames of torch's
    Module._call_impl: no global hook is registered (module calls keep torch's fast path), a
    module shared by two parents has one path under each, and a dead module's address reused by
    a new module does not lend it the dead one's name."""
    r, run, torch_stats = _captured(tmp_path, MODULES_APP)
    if torch_stats["mechanism"] != "native" or not (3, 11) <= sys.version_info[:2] <= (3, 13):
        pytest.skip("module paths come from hooks here")
    assert torch_stats["module_paths"] == "frames"
    assert r.stdout == "ok 0\n"
    ops = run.table("op").to_pylist()
    sins = [o["module"] for o in ops if o["name"] == "aten::sin"]
    assert len(sins) == 40 and len(set(sins)) == 40  # each temporary module its own name
    assert [m.rsplit("_", 1)[0] for m in sins] == ["A" if i % 2 else "B" for i in range(40)]
    assert sorted(o["module"] for o in ops if o["name"] == "aten::tanh") == [
        "Sequential_0/Sequential_1/Tanh_0", "Sequential_0/Sequential_2/Tanh_0"]
    assert [o["module"] for o in ops if o["name"] == "aten::relu"] == ["Sequential_0/Sequential_2/ReLU_0"]
