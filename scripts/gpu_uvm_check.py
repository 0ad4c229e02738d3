"""Unified-memory capture and the uvm_advisor on a CuPy managed buffer (issue C), for the
H200.  Written in a session without GPU time left: run it, then fix what it shows.

    python scripts/gpu_uvm_check.py OUTDIR

The program: 64 MiB of managed memory written by the CPU (range "cpu_write"), scaled on
the GPU (range "gpu_scale"), read back by the CPU (range "cpu_read").  Expected (capture.md
section 4, measured without pastaprof): GPU page faults and ~64 MiB HtoD during gpu_scale,
CPU faults and ~64 MiB DtoH during cpu_read; a MEMORY2 record of kind managed for the
buffer; a plan with a prefetch to the device before range:gpu_scale.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

APP = textwrap.dedent("""
    import ctypes, numpy as np, cupy as cp, pastaprof
    n = 16 << 20                                   # 64 MiB of float32
    mem = cp.cuda.malloc_managed(4 * n)
    x = cp.ndarray((n,), cp.float32, mem)
    host = np.ctypeslib.as_array(ctypes.cast(mem.ptr, ctypes.POINTER(ctypes.c_float)), (n,))
    for it in range(3):
        with pastaprof.range("cpu_write"):
            host[:] = it
        with pastaprof.range("gpu_scale"):
            x *= 2
            cp.cuda.Device().synchronize()
        with pastaprof.range("cpu_read"):
            print(float(host[:1024].sum()))
""")


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    (out / "uvm_app.py").write_text(APP)
    run, plan = out / "uvm-run", out / "plan.json"
    r = subprocess.run([sys.executable, "-m", "pastaprof.cli", "run", "-o", str(run), "--force", "--uvm",
                        "-t", "uvm_advisor", "--", sys.executable, str(out / "uvm_app.py")],
                       capture_output=True, text=True)
    (out / "uvm-run.stderr.txt").write_text(r.stderr)
    print("\n".join(ln for ln in r.stderr.splitlines() if "pastaprof" in ln or "Error" in ln)[-3000:])
    assert r.returncode == 0, r.stderr[-3000:]
    import pastaprof

    run_ = pastaprof.load(run)
    res = {"status": run_.manifest.get("status"), "rows": run_.manifest.get("rows")}
    uvm = run_.table("uvm")
    res["uvm_by_kind"] = run_.sql("SELECT CAST(uvm_kind AS VARCHAR), count(*), sum(bytes), sum(count) "
                                  "FROM uvm GROUP BY 1 ORDER BY 1").fetchall() if uvm.num_rows else []
    alloc = run_.table("alloc")
    res["alloc_by_kind"] = run_.sql("SELECT CAST(memory_kind AS VARCHAR), count(*), sum(bytes) FROM alloc GROUP BY 1"
                                    ).fetchall() if alloc.num_rows else []
    subprocess.run([sys.executable, "-m", "pastaprof.cli", "analyze", str(run), "-t", "uvm_advisor", "-q",
                    "--uvm-plan", str(plan)], check=True)
    res["plan"] = json.loads(plan.read_text())["actions"]
    print(json.dumps(res, indent=1, default=str))
    (out / "uvm.json").write_text(json.dumps(res, indent=1, default=str))
    kinds = {k for k, *_ in res["uvm_by_kind"]}
    assert {"gpu_page_fault", "htod", "dtoh"} <= kinds, res["uvm_by_kind"]
    assert any(k == "managed" for k, *_ in res["alloc_by_kind"]), res["alloc_by_kind"]
    assert any(a["action"] == "prefetch" and a.get("before") == "range:gpu_scale" for a in res["plan"]), res["plan"]


if __name__ == "__main__":
    main()
