"""A captured CUDA torch program that execs another one (the same pid; the new image numbers its
ops and CUPTI its launches from 1 again), on the GPU: the stored run's op ids and correlation ids
are unique, every kernel joins exactly one launch call, and kernels keep their op.

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
B = textwrap.dedent("""
    import torch
    x = torch.randn(256, 256, device="cuda")
    for _ in range(30):
        x = (x + 1).sigmoid()
    torch.cuda.synchronize()
""")


def main() -> int:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    (out / "a.py").write_text(A)
    (out / "b.py").write_text(B)
    run = out / "run"
    r = subprocess.run([sys.executable, "-m", "pastaprof.cli", "run", "-o", str(run), "--", sys.executable,
                        str(out / "a.py"), str(out / "b.py")], capture_output=True, text=True, timeout=300)
    print(r.stderr.strip()[-400:])
    import duckdb

    def q(sql: str):
        tables = {k: f"read_parquet('{run}/{k}/*.parquet')" for k in ("kernel", "api", "op")}
        return duckdb.connect().execute(sql.format(**tables)).fetchone()

    kernels, distinct, linked = q("select count(*), count(distinct correlation), count(op_id) from {kernel}")
    joined = q("select count(*) from {kernel} k join {api} a on a.rank = k.rank and a.correlation = k.correlation")[0]
    ops, op_ids = q("select count(*), count(distinct id) from {op}")
    checks = {"exit 0": r.returncode == 0, "kernels of both images": kernels >= 50,
              "correlation ids unique": distinct == kernels, "each kernel joins one call": joined == kernels,
              "op ids unique": op_ids == ops, "kernels keep their op": linked == kernels}
    print(f"{kernels} kernels ({distinct} correlation ids, {joined} joined, {linked} with an op), "
          f"{ops} ops ({op_ids} ids)")
    for name, ok in checks.items():
        print(f"{'ok  ' if ok else 'FAIL'} {name}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
