"""What CUPTI's mere presence costs the launch path, in one process (issue B).

    python bench/cupti_presence.py [--workloads tiny,resnet50] [--steps 10]

Bare steps before CUPTI is ever enabled; then with CUPTI's kernel records on (pastaprof's
native drain, kernels/memcpy/memset/sync only); then bare again with every kind disabled;
again after a second enable; and after ``cuptiFinalize``.  If the bare steps after the first
enable are slower than the ones before it, an in-process comparison against a bare baseline
taken after CUPTI was enabled (bench/capture_inprocess.py's CUPTI rows) understates CUPTI's
cost, and that cost is a floor for any CUPTI-based kernel trace (torch.profiler's included).
Two more phases price the floor of kernels + ops together: an empty RecordFunction callback
(what PyTorch charges any op observer) before CUPTI is first enabled, and CUPTI's kernel
records with that empty callback, last.
Medians and minima of ``--steps`` synchronized steps per phase.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workloads", default="tiny,resnet50")
    ap.add_argument("--steps", type=int, default=10)
    a = ap.parse_args()
    import torch
    from workloads import make, timed_steps

    from pastaprof.handlers.cupti_activity import CuptiActivityHandler
    from pastaprof.live.config import CaptureConfig

    steps = {w: make(w) for w in a.workloads.split(",")}
    for step in steps.values():
        for _ in range(3):
            step()
    torch.cuda.synchronize()

    def measure(step) -> dict:
        per = timed_steps(step, a.steps)
        return {"median": statistics.median(per), "min": min(per)}

    def kernels_on() -> CuptiActivityHandler:
        h = CuptiActivityHandler(CaptureConfig.from_env({"PASTAPROF_OFF": "api,ext,memory"}))
        h.start()
        if h.status:
            raise SystemExit(f"CUPTI did not start: {h.status}")
        return h

    from pastaprof import native

    torch_lib = native.load("torch")
    out: dict[str, dict] = {w: {} for w in steps}
    phases = ["bare_before", "rf_empty_before"]
    for w, step in steps.items():
        out[w]["bare_before"] = measure(step)
    floor = torch_lib.pp_obs_floor_start(0)  # an empty RecordFunction callback: any op observer's price
    for w, step in steps.items():
        out[w]["rf_empty_before"] = measure(step)
    torch_lib.pp_obs_floor_stop(floor)
    for phase in ("kernels_on", "bare_after", "kernels_on_again", "bare_after_again", "kernels_and_rf_empty"):
        phases.append(phase)
        h = kernels_on() if phase.startswith("kernels") else None
        floor = torch_lib.pp_obs_floor_start(0) if phase == "kernels_and_rf_empty" else 0
        for w, step in steps.items():
            out[w][phase] = measure(step)
        if floor:
            torch_lib.pp_obs_floor_stop(floor)
        if h is not None:
            h.stop()
            h.drain()
    report(out, phases)  # before cuptiFinalize, in case it does not return
    from cupti import cupti

    cupti.finalize()
    for w, step in steps.items():
        out[w]["bare_after_finalize"] = measure(step)
    report(out, ["bare_before", "bare_after_finalize"])


def report(out: dict[str, dict], phases: list[str]) -> None:
    for w, res in out.items():
        base = res["bare_before"]
        summary = {p: {"ms": round(res[p]["median"] * 1e3, 3), "x": round(res[p]["median"] / base["median"], 3),
                       "min_x": round(res[p]["min"] / base["min"], 3)} for p in phases}
        print(json.dumps({w: summary}), flush=True)


if __name__ == "__main__":
    main()
