"""Import speed of the Nsight Systems importer on a synthetic enlargement of a real export.

A copy of tests/data/nsys/mfu_2gpu_before.sqlite gets its real kernel rows (and their
runtime calls) copied again and again with shifted times and correlation ids until it
holds >= N kernel rows; then `pastaprof.api.load` imports it (all kinds, linked).
Target: >= 1M kernel rows per 10 s on the 2-core dev machine.

    python bench/nsys_import.py [--kernels 1000000] [--db big.sqlite] [--repeat 3]

CPU time counts every thread (SQLite reads chunks on several connections at once).
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


def measure(db: Path, repeat: int) -> tuple[float, float, int, int]:
    """Best wall and CPU seconds (all threads) of ``repeat`` loads, kernel and API rows."""
    import numpy as np
    import pyarrow as pa

    from pastaprof.api import load

    pa.array(np.arange(3))  # pyarrow imports pandas on its first conversion: paid before timing
    walls, cpus = [], []
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        run = load(db)
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    return min(walls), min(cpus), run.table("kernel").num_rows, run.table("api").num_rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kernels", type=int, default=1_000_000)
    ap.add_argument("--db", type=Path, help="an enlarged export to reuse (made there if missing)")
    ap.add_argument("--repeat", type=int, default=1, help="loads; the best wall and CPU time are shown")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        db = args.db or Path(tmp) / "big.sqlite"
        t0 = time.perf_counter()
        made = None
        if not db.exists():
            enlarge(db, args.kernels)
            made = time.perf_counter() - t0
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        n = con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
        con.close()
        took, cpu, got, api = measure(db, args.repeat)
        assert got == n, (got, n)
        mb = db.stat().st_size / 1e6
    made_s = f", made in {made:.1f} s" if made is not None else ""
    print(f"nsys import: {n:,} kernel rows + {api:,} runtime calls ({mb:.0f} MB sqlite{made_s}): "
          f"load {took:.2f} s wall, {cpu:.2f} s CPU = {n / took / 1e6:.2f} M kernel rows/s "
          f"(target >= 0.1 M/s: 1M per 10 s)")


if __name__ == "__main__":
    main()
