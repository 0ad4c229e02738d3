"""What module paths cost per ``nn.Module`` call, in one process.

    python bench/module_hooks.py [--repeat 7] [--calls 20000] [--native]

Variants, interleaved ``--repeat`` times, median per variant:
* ``bare``: a tiny module (``nn.Identity``) called in a loop, no hooks;
* ``hooks_open``: pastaprof's global forward pre/post hooks (handlers/module_paths.py), recording;
* ``hooks_gated``: the same hooks with the gate flag closed, still registered (they only
  return: what a closed gate costs while torch.compile is loaded or a module call is open);
* ``hooks_removed``: the gate closed through ``set_gate`` otherwise (the hooks unregistered);
* ``wrapper``: a wrapped ``nn.Module.__call__`` doing the same bookkeeping (the design the hooks
  replaced: cheaper, but what introspects ``__call__`` saw the wrapper);
* ``step_*``: a CPU training step of a 75-module conv net (bench/gated_capture.py's) bare, with the
  hooks recording and with them gated.

Prints microseconds per module call (``*_us``, minus bare) and step milliseconds.  With
``--native`` the hooks write the native observer's module cell (needs the C++ build), and three
more steps run with the native op observer recording (default sampled shapes, call sites):
``step_observer`` without module paths, ``step_observer_hooks`` with the hooks keeping them, and
``step_observer_frames`` with the observer reading them from the interpreter's frames (CPython
3.11-3.13; handlers/module_paths.py).
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time

import torch

from pastaprof.handlers.module_paths import ModulePaths


def _net() -> tuple[torch.nn.Module, torch.Tensor, torch.optim.Optimizer]:
    torch.manual_seed(0)
    blocks = [torch.nn.Sequential(torch.nn.Conv2d(16, 16, 3, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU())
              for _ in range(24)]
    net = torch.nn.Sequential(*blocks, torch.nn.Flatten(), torch.nn.Linear(16 * 16 * 16, 10))
    return net, torch.randn(2, 16, 16, 16), torch.optim.SGD(net.parameters(), lr=0.01)


def _calls(m: torch.nn.Module, x: torch.Tensor, n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        m(x)
    return (time.perf_counter() - t0) / n * 1e6


def _steps(net: torch.nn.Module, x: torch.Tensor, opt: torch.optim.Optimizer, n: int = 10) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        net(x).sum().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def _wrapper(paths: ModulePaths) -> object:
    """The bookkeeping as a wrapped ``__call__`` (the replaced design), for comparison."""
    original = torch.nn.Module.__call__
    enter, exit_ = paths.hooks(lambda: False)

    @functools.wraps(original)
    def call(module, *args, **kwargs):
        enter(module, args)
        try:
            return original(module, *args, **kwargs)
        finally:
            exit_(module, args, None)

    return call


def _hooked(native: object) -> ModulePaths:
    """ModulePaths that keep paths with the global hooks even where frames could be read."""
    paths = ModulePaths(native)
    paths._read_from_frames = lambda _nn_module: False
    return paths


def _observed_steps(native, name: str, net, xs, opt) -> float:
    """Steps with the native op observer recording, module paths per ``name``."""
    from pastaprof.handlers.torch_native import SAMPLE_CHASE, SAMPLE_PERIOD, SAMPLE_WINDOW

    lib = native.lib
    lib.pp_obs_sampling(2, 1, SAMPLE_PERIOD, SAMPLE_WINDOW, SAMPLE_CHASE)
    lib.pp_obs_start(None, None, 0, 3, 1)
    handles = []
    if name != "step_observer":
        paths = _hooked(native) if name.endswith("hooks") else ModulePaths(native)
        handles = paths.install(torch)
        if name.endswith("frames") and paths.mechanism != "frames":
            raise SystemExit("module paths cannot be read from frames on this Python")
    try:
        return _steps(net, xs, opt)
    finally:
        for h in handles:
            h.remove()
        native.drain()
        lib.pp_obs_stop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--native", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(1)
    native = None
    if a.native:
        from pastaprof import native as build
        from pastaprof.handlers.torch_native import NativeOps

        native = NativeOps(build.load("torch"), 0)
    m, x = torch.nn.Identity(), torch.ones(1)
    net, xs, opt = _net()
    res: dict[str, list[float]] = {}
    original = torch.nn.Module.__call__
    for _ in range(a.repeat):
        res.setdefault("bare", []).append(_calls(m, x, a.calls))
        res.setdefault("step_bare", []).append(_steps(net, xs, opt))
        paths = _hooked(native)
        handles = paths.install(torch)
        res.setdefault("hooks_open", []).append(_calls(m, x, a.calls))
        res.setdefault("step_hooks_open", []).append(_steps(net, xs, opt))
        paths.gate[0] = False
        res.setdefault("hooks_gated", []).append(_calls(m, x, a.calls))
        res.setdefault("step_hooks_gated", []).append(_steps(net, xs, opt))
        paths.set_gate(False)
        res.setdefault("hooks_removed", []).append(_calls(m, x, a.calls))
        res.setdefault("step_hooks_removed", []).append(_steps(net, xs, opt))
        for h in handles:
            h.remove()
        torch.nn.Module.__call__ = _wrapper(_hooked(native))
        try:
            res.setdefault("wrapper", []).append(_calls(m, x, a.calls))
            res.setdefault("step_wrapper", []).append(_steps(net, xs, opt))
        finally:
            torch.nn.Module.__call__ = original
        if native is not None:
            for name in ("step_observer", "step_observer_hooks", "step_observer_frames"):
                res.setdefault(name, []).append(_observed_steps(native, name, net, xs, opt))
    med = {k: statistics.median(v) for k, v in res.items()}
    out = {"bare_call_us": round(med["bare"], 3)}
    for k in ("hooks_open", "hooks_gated", "hooks_removed", "wrapper"):
        out[f"{k}_us"] = round(med[k] - med["bare"], 3)
    steps = ("step_bare", "step_hooks_open", "step_hooks_gated", "step_hooks_removed", "step_wrapper",
             "step_observer", "step_observer_hooks", "step_observer_frames")
    for k in (k for k in steps if k in med):
        out[f"{k}_ms"] = round(med[k], 3)
        out[f"{k}_x"] = round(med[k] / med["step_bare"], 3)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
