"""What a run costs at exit: the final flush and compaction of a short CPU program (issue B).

    python bench/exit_path.py [--runs 7]

A small training loop (conv, LayerNorm, Linear layers, AdamW) on the CPU, its last two steps in
``pastaprof.range("measure")``, run ``--runs`` times under ``pastaprof run --ranges measure``.
Prints the medians, in ms, of run.json's ``stop_seconds`` (everything the program's exit waits
for), its final flush phases, and the launcher's compaction.  No GPU needed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

APP = textwrap.dedent("""
    import torch, pastaprof
    torch.manual_seed(0)
    torch.set_num_threads(1)
    layers = []
    for i in range(3):
        layers += [torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU()]
    body = torch.nn.Sequential(*layers)
    mlp = torch.nn.Sequential(*[m for _ in range(12)
                                for m in (torch.nn.Linear(64, 64), torch.nn.LayerNorm(64), torch.nn.GELU())])
    head = torch.nn.Linear(8 * 8 * 8, 64)
    opt = torch.optim.AdamW([*body.parameters(), *mlp.parameters(), *head.parameters()], lr=1e-3)
    x = torch.randn(4, 8, 8, 8)

    def step():
        loss = mlp(head(body(x).flatten(1))).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()
    with pastaprof.range("measure"):
        for _ in range(2):
            step()
""")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=7)
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp())
    app = tmp / "app.py"
    app.write_text(APP)
    rows, m = [], {}
    for _ in range(a.runs):
        out = tmp / "run"
        subprocess.run([sys.executable, "-m", "pastaprof.cli", "run", "-o", str(out), "--force", "--ranges", "measure",
                        "--", sys.executable, str(app)], check=True, capture_output=True)
        m = json.loads((out / "run.json").read_text())
        p = m["processes"][0]["capture_overhead"]
        rows.append({"stop": p["stop_seconds"], "handlers": p["stop_handlers_seconds"],
                     "final_flush": p["final_flush_seconds"], "compact": m["capture_overhead"]["compact_seconds"],
                     **{k: v for k, v in p["final_flush_phases"].items()}})
    keys = sorted({k for r in rows for k in r})
    print(json.dumps({"runs": a.runs, "events": m.get("rows"),
                      "median_ms": {k: round(statistics.median(r.get(k, 0) for r in rows) * 1e3, 2) for k in keys},
                      "stop_ms": sorted(round(r["stop"] * 1e3, 1) for r in rows)}))


if __name__ == "__main__":
    main()
