"""Speed of turning a native program's record files into the run's parts (handlers/native_program.py).

The injection library's own writer (``pp_inject_selftest``, the decode and write path a capture
takes) writes N kernel records, N launch-call records and N/10 NVTX ranges from a real C
program; then ``convert`` is timed (what ``pastaprof run`` does after the program ends), best of
``--repeat``, with peak RSS.

    python bench/native_reader.py --kernels 1000000
"""

from __future__ import annotations

import argparse
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROGRAM = r"""
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
int main(int argc, char** argv) {
  void* h = dlopen(argv[1], RTLD_NOW);
  int (*st)(int, int, int, int) = (int (*)(int, int, int, int))dlsym(h, "pp_inject_selftest");
  return st(atoi(argv[2]), 64, 100, 1) == 0 ? 0 : 1;
}
"""


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kernels", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    from pastaprof import native
    from pastaprof.handlers.native_program import convert

    lib = native.build_inject()
    tmp = Path(tempfile.mkdtemp(prefix="pp-native-bench-"))
    try:
        (tmp / "w.c").write_text(PROGRAM)
        subprocess.run(["gcc", "-O1", "-o", str(tmp / "w"), str(tmp / "w.c"), "-ldl"], check=True)
        best, write_s, size = float("inf"), 0.0, 0
        for _ in range(a.repeat):
            run = tmp / "run"
            shutil.rmtree(run, ignore_errors=True)
            t0 = time.perf_counter()
            subprocess.run([str(tmp / "w"), str(lib), str(a.kernels)], check=True, env={"PASTAPROF_OUT": str(run)})
            write_s = time.perf_counter() - t0
            size = sum(p.stat().st_size for p in (run / "native").iterdir())
            t0 = time.perf_counter()
            rows = convert(run)
            best = min(best, time.perf_counter() - t0)
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        n = sum(rows.values())
        print(f"{a.kernels:,} kernels: files {size / 1e6:.1f} MB written in {write_s:.2f} s (the program's run, "
              f"records built and written); convert {best:.2f} s best of {a.repeat} ({n / best / 1e6:.2f} M rows/s, "
              f"{n:,} rows: {rows}); peak RSS {rss:.0f} MB")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
