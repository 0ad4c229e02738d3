"""Per-op and per-launch cost of each capture mechanism, toggled inside one process (issue B).

    python bench/capture_inprocess.py [--workloads tiny,resnet50] [--rounds 3] [--steps 5] [--only a,b]

Process-to-process spread on the lent H200 reaches 15-50% (docs/benchmarks.md), more than the
differences wanted here, so one process runs every configuration, interleaved, each started
and stopped around its own steps:

- ``bare``: nothing attached;
- ``rf_empty`` / ``rf_empty_inputs``: an empty RecordFunction callback without / with the op's
  inputs -- what PyTorch itself charges per op for any op observer (the floor);
- ``ops_lean`` / ``ops_shapes`` / ``ops_full``: pastaprof's C++ op observer without inputs and
  call sites, with every op's inputs, with both (``--shapes all``); ``ops_sampled``: with both, the
  inputs of sampled ops only (``--shapes sample``, the default, its first phase skipped: the
  steady state); ``ops_sig`` / ``ops_ptrs``: with the inputs' shapes and dtypes only / data
  pointers only; ``tensors``: the allocator tracker alone;
- ``cupti_kernels``: CUPTI kernel, memcpy, memset and synchronization records only;
  ``cupti_memory``: and MEMORY2/MEMORY_POOL; ``cupti_launch_cb``: and launch calls through the
  callback API (the default); ``cupti_launch_act``: launch calls as RUNTIME/DRIVER records instead;
- ``all``: everything pastaprof's session starts except the Python parts (module paths, ranges,
  the flush thread): CUPTI as by default, the op observer tagging launches, the allocator tracker;
  every op's inputs; ``all_sampled``: the same with sampled inputs (the default capture).

Each cell: median seconds of ``--steps`` steps (synchronized), median over rounds, as a ratio to
bare and as microseconds per op (per kernel launch for the CUPTI rows) over bare; ``min_x``: the
fastest step's ratio to bare's fastest (this host's noise only adds time, so it is the steadier
estimate of a mechanism's own cost).  Workloads from
bench/workloads.py (a GPU is needed for the CUPTI rows).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


class Configs:
    """Start/stop of each configuration; drain() empties what a configuration recorded."""

    def __init__(self) -> None:
        from pastaprof import native
        from pastaprof.handlers.torch_native import NativeOps

        self.lib = native.load("torch")
        self.ops = NativeOps(self.lib, 0)
        self.cupti = None
        self._floor = 0
        self.names = ["bare", "rf_empty", "rf_empty_inputs", "ops_lean", "ops_sig", "ops_ptrs", "ops_shapes", "ops_full", "ops_sampled",
                      "tensors", "cupti_kernels", "cupti_memory", "cupti_launch_cb", "cupti_launch_act", "all",
                      "all_sampled"]

    def _sampling(self, sampled: bool) -> None:
        """The observer's shapes mode for the next start: sampled (first phase skipped) or all."""
        from pastaprof.handlers.torch_native import SAMPLE_CHASE, SAMPLE_PERIOD, SAMPLE_WINDOW

        self.lib.pp_obs_sampling(2 if sampled else 1, 1, SAMPLE_PERIOD, SAMPLE_WINDOW, SAMPLE_CHASE)

    def start(self, name: str) -> bool:
        lib = self.lib
        if name.startswith("ops_") or name.startswith("all"):
            self._sampling(name.endswith("_sampled"))
        if name.startswith("rf_empty"):
            self._floor = lib.pp_obs_floor_start(int(name.endswith("inputs")))
        elif name.startswith("ops_"):
            shapes, sites = {"ops_lean": (0, 0), "ops_sig": (1, 0), "ops_ptrs": (2, 0), "ops_shapes": (3, 0),
                             "ops_full": (3, 1), "ops_sampled": (3, 1)}[name]
            lib.pp_obs_start(None, None, 0, shapes, sites)
        elif name == "tensors":
            if lib.pp_mem_start() != 0:
                return False
            self.ops.mem = True
        elif name.startswith("cupti_") or name.startswith("all"):
            from pastaprof.handlers.cupti_activity import CuptiActivityHandler
            from pastaprof.live.config import CaptureConfig

            off = {"cupti_kernels": "api,ext,memory", "cupti_memory": "api,ext", "cupti_launch_cb": "ext",
                   "cupti_launch_act": "ext,callbacks", "all": "", "all_sampled": ""}[name]
            self.cupti = CuptiActivityHandler(CaptureConfig.from_env({"PASTAPROF_OFF": off} if off else {}))
            self.cupti.start()
            if self.cupti.status:
                raise SystemExit(f"CUPTI did not start: {self.cupti.status}")
            if name.startswith("all"):
                self.cupti.external_correlation()
                push, pop, kind = self.cupti.native_external
                lib.pp_obs_start(push, pop, kind, 3, 1)
                lib.pp_mem_start()
                self.ops.mem = True
        return True

    def stop(self, name: str) -> int:
        """Stops; returns how many launches CUPTI saw (0 without CUPTI)."""
        lib = self.lib
        if name.startswith("rf_empty"):
            lib.pp_obs_floor_stop(self._floor)
        if name.startswith("ops_") or name.startswith("all"):
            lib.pp_obs_stop()
        if name in ("tensors", "all", "all_sampled"):
            lib.pp_mem_stop()
        launches = 0
        if self.cupti is not None:
            self.cupti.stop()
            kernels = self.cupti.drain().get("kernel")
            launches = kernels.num_rows if kernels is not None else 0
            self.cupti = None
        return launches

    def drain(self) -> int:
        """Empties the observer; returns its op rows."""
        out = self.ops.drain()
        self.ops.mem = False
        return out["op"].num_rows if "op" in out else 0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workloads", default="tiny,resnet50")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--only", default="", help="comma-separated configurations (bare always runs)")
    a = ap.parse_args()
    import torch
    from workloads import make, timed_steps

    cfg = Configs()
    names = ["bare"] + [n for n in cfg.names[1:] if not a.only or n in a.only.split(",")]
    for workload in a.workloads.split(","):
        step = make(workload)
        for _ in range(2):
            step()
        torch.cuda.synchronize()
        times: dict[str, list[float]] = {c: [] for c in names}
        fastest: dict[str, float] = dict.fromkeys(names, float("inf"))  # noise only adds time
        n_ops = n_launches = 0
        for _ in range(a.rounds):
            for name in names:
                if not cfg.start(name):
                    continue
                per = timed_steps(step, a.steps)
                launches = cfg.stop(name)
                rows = cfg.drain()
                if name == "ops_full":
                    n_ops = rows // a.steps
                if launches:
                    n_launches = launches // a.steps
                times[name].append(statistics.median(per))
                fastest[name] = min(fastest[name], *per)
        bare = statistics.median(times["bare"])
        res = {}
        for c, t in times.items():
            if not t:
                continue
            s = statistics.median(t)
            res[c] = {"s": round(s, 6), "x": round(s / bare, 3), "min_x": round(fastest[c] / fastest["bare"], 3)}
            per_event = n_launches if c.startswith("cupti_") else n_ops
            if per_event:
                res[c]["us_per_launch" if c.startswith("cupti_") else "us_per_op"] = round((s - bare) / per_event * 1e6, 3)
        out = {"ops_per_step": n_ops, "kernels_per_step": n_launches, **res}
        print(json.dumps({workload: out}), flush=True)


if __name__ == "__main__":
    main()
