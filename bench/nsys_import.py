"""Import speed of the Nsight Systems importer on a synthetic enlargement of a real export.

A copy of tests/data/nsys/mfu_2gpu_before.sqlite gets its real kernel rows (and their
runtime calls) copied again and again with shifted times and correlation ids until it
holds >= N kernel rows; then `pastaprof.api.load` imports it (all kinds, linked).
Target: >= 1M kernel rows per 10 s on the 2-core dev machine.

    python bench/nsys_import.py [--kernels 1000000]
"""

from __future__ import annotations

import argparse
import shutil
import sqlite3
import tempfile
import time
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "tests" / "data" / "nsys" / "mfu_2gpu_before.sqlite"


def enlarge(dest: Path, kernels: int) -> int:
    shutil.copy(SRC, dest)
    con = sqlite3.connect(dest)
    base_n, span = con.execute('SELECT count(*), max("end") - min(start) + 1000 FROM CUPTI_ACTIVITY_KIND_KERNEL').fetchone()
    corr = con.execute("SELECT max(correlationId) + 1 FROM CUPTI_ACTIVITY_KIND_RUNTIME").fetchone()[0]
    copies = -(-kernels // base_n) - 1
    kcols = [r[1] for r in con.execute("PRAGMA table_info(CUPTI_ACTIVITY_KIND_KERNEL)")]
    rcols = [r[1] for r in con.execute("PRAGMA table_info(CUPTI_ACTIVITY_KIND_RUNTIME)")]

    def shifted(cols: list[str]) -> str:
        return ", ".join(f'"{c}" + :dt' if c in ("start", "end") else "correlationId + :dc" if c == "correlationId"
                         else f'"{c}"' for c in cols)
    ks, rs = shifted(kcols), shifted(rcols)
    for i in range(1, copies + 1):
        args = {"dt": span * i, "dc": corr * i}
        con.execute(f"INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL SELECT {ks} FROM CUPTI_ACTIVITY_KIND_KERNEL "
                    f"WHERE rowid <= {base_n}", args)
        con.execute(f"INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME SELECT {rs} FROM CUPTI_ACTIVITY_KIND_RUNTIME "
                    "WHERE rowid <= 7466", args)
    con.commit()
    n = con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    con.close()
    return n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kernels", type=int, default=1_000_000)
    args = ap.parse_args()
    from pastaprof.api import load

    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "big.sqlite"
        t0 = time.perf_counter()
        n = enlarge(db, args.kernels)
        made = time.perf_counter() - t0
        t0 = time.perf_counter()
        run = load(db)
        took = time.perf_counter() - t0
        got = run.table("kernel").num_rows
        api = run.table("api").num_rows
        assert got == n, (got, n)
        mb = db.stat().st_size / 1e6
    print(f"nsys import: {n:,} kernel rows + {api:,} runtime calls ({mb:.0f} MB sqlite, made in {made:.1f} s): "
          f"load {took:.2f} s = {n / took / 1e6:.2f} M kernel rows/s (target >= 0.1 M/s: 1M per 10 s)")


if __name__ == "__main__":
    main()
