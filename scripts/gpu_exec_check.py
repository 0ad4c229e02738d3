"""Captured CUDA programs that exec another image (the same pid; the new image numbers its ops and
CUPTI its launches from 1 again), on the GPU:

* a torch program: the stored run's op ids and correlation ids are unique, every kernel joins
  exactly one launch call, and kernels keep their op;
* a native program (nvcc; the injection library): both images' kernels are stored, their
  correlation ids are unique, and each kernel joins one launch call.

    python3 scripts/gpu_exec_check.py OUT
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

A = textwrap.dedent("""
    import os, sys, torch
    x = torch.randn(256, 256, device="cuda")
    for _ in range(20):
        x = (x @ x).relu() / 256
    torch.cuda.synchronize()
    os.execv(sys.executable, [sys.executable, sys.argv[1]])
""")
NATIVE = r"""
#include <cstdlib>
#include <cstdio>
#include <unistd.h>
#include <cuda_runtime.h>
__global__ void step(int* x) { x[threadIdx.x] += 1; }
int main(int argc, char** argv) {  // argv[1] kernels, then exec this program for argv[2] more
  int n = atoi(argv[1]), *x;
  cudaMalloc(&x, 128 * sizeof(int));
  for (int i = 0; i < n; ++i) step<<<1, 32>>>(x);
  cudaDeviceSynchronize();
  printf("image of %d kernels\n", n);
  fflush(stdout);
  if (argc > 2) { char* again[] = {argv[0], argv[2], nullptr}; execv(argv[0], again); return 9; }
  return 0;
}
"""
B = textwrap.dedent("""
    import torch
    x = torch.randn(256, 256, device="cuda")
    for _ in range(30):
        x = (x + 1).sigmoid()
    torch.cuda.synchronize()
""")


def query(run: Path, kinds: tuple[str, ...]):
    import duckdb

    tables = {k: f"read_parquet('{run}/{k}/*.parquet')" for k in kinds}
    return lambda sql: duckdb.connect().execute(sql.format(**tables)).fetchone()


def report(checks: dict[str, bool]) -> bool:
    for name, ok in checks.items():
        print(f"{'ok  ' if ok else 'FAIL'} {name}")
    return all(checks.values())


def torch_program(out: Path) -> bool:
    (out / "a.py").write_text(A)
    (out / "b.py").write_text(B)
    run = out / "run"
    r = subprocess.run([sys.executable, "-m", "pastaprof.cli", "run", "-o", str(run), "--", sys.executable,
                        str(out / "a.py"), str(out / "b.py")], capture_output=True, text=True, timeout=300)
    print(r.stderr.strip()[-400:])
    q = query(run, ("kernel", "api", "op"))
    kernels, distinct, linked = q("select count(*), count(distinct correlation), count(op_id) from {kernel}")
    joined = q("select count(*) from {kernel} k join {api} a on a.rank = k.rank and a.correlation = k.correlation")[0]
    ops, op_ids = q("select count(*), count(distinct id) from {op}")
    print(f"torch: {kernels} kernels ({distinct} correlation ids, {joined} joined, {linked} with an op), "
          f"{ops} ops ({op_ids} ids)")
    return report({"exit 0": r.returncode == 0, "kernels of both images": kernels >= 50,
                   "correlation ids unique": distinct == kernels, "each kernel joins one call": joined == kernels,
                   "op ids unique": op_ids == ops, "kernels keep their op": linked == kernels})


def native_program(out: Path) -> bool:
    (out / "again.cu").write_text(NATIVE)
    exe = out / "again"
    subprocess.run(["nvcc", "-O2", "-arch=sm_90", "-o", str(exe), str(out / "again.cu")], check=True)
    run = out / "native-run"
    r = subprocess.run([sys.executable, "-m", "pastaprof.cli", "run", "-o", str(run), "--", str(exe), "40", "25"],
                       capture_output=True, text=True, timeout=300)
    print(r.stdout.strip(), "|", r.stderr.strip()[-400:])
    q = query(run, ("kernel", "api"))
    kernels, distinct, pids = q("select count(*), count(distinct correlation), count(distinct pid) from {kernel}")
    joined = q("select count(*) from {kernel} k join {api} a on a.rank = k.rank and a.correlation = k.correlation")[0]
    files = sorted(p.name for p in (run / "native").glob("*.json")) if (run / "native").is_dir() else []
    print(f"native: {kernels} kernels ({distinct} correlation ids, {joined} joined, {pids} pid), files {files}")
    return report({"native exit 0": r.returncode == 0, "native kernels of both images (40 + 25)": kernels == 65,
                   "native correlation ids unique": distinct == kernels,
                   "native each kernel joins one call": joined == kernels})


def main() -> int:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    ok = torch_program(out)
    return 0 if native_program(out) and ok else 1


if __name__ == "__main__":
    sys.exit(main())
