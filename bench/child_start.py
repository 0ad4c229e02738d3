"""What a Python child of a captured program pays at start (issue E: <= 20 ms over bare for a
child that never imports a GPU framework).

    python bench/child_start.py [--n 21] [--code "pass"]

Runs ``python -c CODE`` ``--n`` times per variant, interleaved, and prints the median wall
time per variant and its difference to bare:
* ``bare``: no pastaprof;
* ``captured``: the environment ``pastaprof run`` gives every process of the program (the
  bootstrap first on PYTHONPATH, PASTAPROF_OUT set): the bootstrap defers the session until a
  GPU framework or ``pastaprof.live`` is imported;
* ``eager``: the same with ``PASTAPROF_EAGER=1`` (the session started at once, as the bootstrap
  did before: pyarrow, numpy and the handlers imported in every child).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BOOTSTRAP = Path(__file__).resolve().parents[1] / "src" / "pastaprof" / "live" / "bootstrap"


def _env(out: Path, eager: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PASTAPROF_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(BOOTSTRAP), env.get("PYTHONPATH", "")) if p)
    env["PASTAPROF_OUT"] = str(out)
    env["PASTAPROF_RUN_PARENT"] = "1"  # as under `pastaprof run`: status lines are the launcher's
    if eager:
        env["PASTAPROF_EAGER"] = "1"
    return env


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=21)
    ap.add_argument("--code", default="pass")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp())
    bare_env = {k: v for k, v in os.environ.items() if not k.startswith("PASTAPROF_")}
    variants = {"bare": bare_env, "captured": _env(tmp / "lazy", False), "eager": _env(tmp / "eager", True)}
    times: dict[str, list[float]] = {v: [] for v in variants}
    for _ in range(a.n):
        for name, env in variants.items():
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-c", a.code], env=env, check=True, stdout=subprocess.DEVNULL)
            times[name].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    print(json.dumps({**{f"{k}_ms": round(v, 2) for k, v in med.items()},
                      **{f"{k}_over_bare_ms": round(med[k] - med["bare"], 2) for k in ("captured", "eager")}}))


if __name__ == "__main__":
    main()
