"""Live-capture fidelity on a GPU (issue B): run a real training workload under
`pastaprof run` and assert what must hold.  Used by scripts/gpu-check.

    python scripts/gpu_live_check.py OUTDIR
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    run = out / "live-gpt2"
    cmd = [sys.executable, "-m", "pastaprof.cli", "run", "-o", str(run), "--force", "-t", "ops,kernels,memory", "--",
           sys.executable, "bench/workloads.py", "gpt2", "bare", "--steps", "2"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    (out / "live-gpt2.stderr.txt").write_text(r.stderr)
    assert r.returncode == 0, r.stderr[-3000:]
    import pastaprof

    pr = pastaprof.load(run)
    k, api, op = pr.table("kernel"), pr.table("api"), pr.table("op")
    kop = np.asarray(k["op_id"].fill_null(-1).to_numpy(zero_copy_only=False))
    linked = float((kop >= 0).mean())
    # every attributed kernel was launched (API call start) inside its op's interval
    a_corr = np.asarray(api["correlation"].to_numpy(zero_copy_only=False))
    a_start = np.asarray(api["start_ns"].to_numpy(zero_copy_only=False))
    by_corr = dict(zip(a_corr.tolist(), a_start.tolist()))
    o_ids = op["id"].to_pylist()
    o_iv = dict(zip(o_ids, zip(op["start_ns"].to_pylist(), op["end_ns"].to_pylist())))
    inside = bad = 0
    for c, oid in zip(k["correlation"].to_pylist(), kop.tolist()):
        if oid < 0 or c not in by_corr:
            continue
        s, e = o_iv[oid]
        if s <= by_corr[c] <= e:
            inside += 1
        else:
            bad += 1
    rep = {r.tool: r for r in pastaprof.analyze(pr, tools=["ops", "memory"])}
    attributed = 0
    for kind in ("kernel", "memcpy", "memset"):
        t = pr.table(kind)
        if t.num_rows:
            oid = np.asarray(t["op_id"].fill_null(-1).to_numpy(zero_copy_only=False))
            d = np.asarray(t["end_ns"].to_numpy()) - np.asarray(t["start_ns"].to_numpy())
            attributed += int(d[oid >= 0].sum())
    res = {
        "kernels": k.num_rows, "ops": op.num_rows, "api": api.num_rows, "tensor_events": pr.table("tensor").num_rows,
        "kernels_linked_share": round(linked, 5), "launch_inside_op": inside, "launch_outside_op": bad,
        "ops_attributed_gpu_ns": rep["ops"].summary["attributed_gpu_ns"],
        "gpu_ns_with_op_id": attributed, "ops_gpu_ns_total": rep["ops"].summary["gpu_ns"],
        "memset_rows": pr.table("memset").num_rows, "memcpy_rows": pr.table("memcpy").num_rows, "memory_peak_bytes": rep["memory"].summary.get("peak_bytes"),
        "manifest_status": json.loads((run / "run.json").read_text())["status"],
        # kernel names as torch.profiler shows them (the C drain demangles CUPTI's symbols)
        "mangled_kernel_names": sum(1 for n in set(k["name"].cast(pa.string()).to_pylist()) if n and n.startswith("_Z")),
    }
    print(json.dumps(res, indent=1))
    (out / "live-gpt2.json").write_text(json.dumps(res, indent=1))
    # The step window, counted by optimizer.step(): after the 2 warm-up steps the counter is 2,
    # so --steps 2:3 records exactly the first measured step (torch.profiler: 1,153 kernels).
    # Twice: gated at the source (CUPTI's per-launch kinds and callbacks off outside the window),
    # and with PASTAPROF_OFF=gate (CUPTI records throughout, the store gates).  The same kernels
    # must be kept: switching CUPTI off as the window closes loses no record of work launched
    # inside it that was still running.
    window = {}
    for mode, env in (("source", {}), ("store", {"PASTAPROF_OFF": "gate"})):
        win = out / f"live-gpt2-step-{mode}"
        w = subprocess.run([sys.executable, "-m", "pastaprof.cli", "run", "-o", str(win), "--force", "--steps", "2:3",
                            "--", sys.executable, "bench/workloads.py", "gpt2", "bare", "--steps", "2"],
                           capture_output=True, text=True, env={**os.environ, **env})
        assert w.returncode == 0, w.stderr[-3000:]
        kt = pastaprof.load(win).table("kernel")
        cupti = json.loads((win / "run.json").read_text())["processes"][0]["handlers"]["cupti"]
        window[mode] = {"kernels": kt.num_rows, "names": sorted(kt["name"].cast(pa.string()).to_pylist()),
                        "kernels_seen": cupti["kernels_seen"], "gate_changes": cupti["gate_changes"],
                        "gate_seconds": cupti.get("gate_seconds")}
    res["kernels_in_step_window_2_3"] = window["source"]["kernels"]
    res["step_window"] = {m: {k: v for k, v in d.items() if k != "names"} for m, d in window.items()}
    print(json.dumps({"kernels_in_step_window_2_3": res["kernels_in_step_window_2_3"],
                      "step_window": res["step_window"]}))
    (out / "live-gpt2.json").write_text(json.dumps(res, indent=1))
    assert linked >= 0.99, res
    assert res["ops_attributed_gpu_ns"] == attributed, res  # op GPU times sum to the attributed GPU time
    assert bad == 0, res
    assert res["tensor_events"] > 0, res
    assert res["mangled_kernel_names"] == 0, res
    src, store = window["source"], window["store"]
    assert src["names"] == store["names"] and src["kernels"] > 0, res["step_window"]  # nothing lost at the source
    assert src["gate_changes"] >= 2 and store["gate_changes"] == 0, res["step_window"]
    assert src["kernels_seen"] < store["kernels_seen"], res["step_window"]  # CUPTI was off outside the window
    check_syncs(out)


SYNCS = """
import torch
side = torch.cuda.Stream()
x = torch.ones(1 << 20, device="cuda")
torch.cuda.synchronize()
for _ in range(5):
    with torch.cuda.stream(side):
        y = x * 2
    side.synchronize()
for _ in range(4):
    e = torch.cuda.Event()
    e.record(side)
    torch.cuda.current_stream().wait_event(e)
    e.synchronize()
for _ in range(3):
    torch.cuda.synchronize()
print("ok")
"""


def check_syncs(out: Path) -> None:
    """Planted synchronizations, recorded by the launch callbacks (the default) and by CUPTI's
    SYNCHRONIZATION records (PASTAPROF_OFF=callbacks): the same rows of each kind, at least the
    planted ones, and the side stream's syncs name the stream its kernels ran on."""
    import pastaprof

    app = out / "syncs.py"
    app.write_text(SYNCS)
    got = {}
    for mech, env in (("callbacks", {}), ("activity", {"PASTAPROF_OFF": "callbacks"})):
        run = out / f"syncs-{mech}"
        r = subprocess.run([sys.executable, "-m", "pastaprof.cli", "run", "-o", str(run), "--force", "--",
                            sys.executable, str(app)], capture_output=True, text=True, env={**os.environ, **env})
        assert r.returncode == 0 and r.stdout == "ok\n", r.stderr[-3000:]
        pr = pastaprof.load(run)
        sy, k = pr.table("sync"), pr.table("kernel")
        kinds = sy["sync_kind"].cast(pa.string()).to_pylist()
        streams = sy["stream"].to_pylist()
        side = {s for s, n in zip(k["stream"].to_pylist(), k["name"].cast(pa.string()).to_pylist()) if "mul" in n.lower()}
        cupti = json.loads((run / "run.json").read_text())["processes"][0]["handlers"]["cupti"]
        got[mech] = {"by_kind": {n: kinds.count(n) for n in sorted(set(kinds))},
                     "stream_sync_streams": sorted({s for s, n in zip(streams, kinds) if n == "stream"}),
                     "mul_kernel_streams": sorted(side), "syncs": (cupti.get("buffers") or {}).get("syncs")}
    print(json.dumps({"syncs": got}))
    (out / "syncs.json").write_text(json.dumps(got, indent=1))
    cb, act = got["callbacks"], got["activity"]
    assert cb["syncs"] == "callbacks" and act["syncs"] == "activity", got
    assert cb["by_kind"] == act["by_kind"], got
    planted = {"stream": 5, "stream_wait_event": 4, "event": 4, "context": 4}
    assert all(cb["by_kind"].get(n, 0) >= c for n, c in planted.items()), got
    for g in (cb, act):
        assert g["stream_sync_streams"] == g["mul_kernel_streams"] and len(g["mul_kernel_streams"]) == 1, got


if __name__ == "__main__":
    main()
