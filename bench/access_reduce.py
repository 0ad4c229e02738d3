"""Throughput of the CPU access reducer (issue D's CPU processor path).

    python bench/access_reduce.py [--requests 1000000] [--objects 1000] [--repeat 3]

Synthetic warp requests (32 lanes, 4-byte accesses, a mix of coalesced and strided
patterns) over ``--objects`` live objects of one launch; prints requests/s and lane
accesses/s of ``reduce_requests`` and the peak RSS.  On the GPU host this is the CPU side
of the GPU-vs-CPU reduction comparison (``--process cpu``), run on the same accesses.
"""

from __future__ import annotations

import argparse
import json
import resource
import time

import numpy as np

from pastaprof.processor.access import READ, WRITE, Objects, Requests, reduce_requests


def make(n_req: int, n_obj: int, seed: int = 0) -> tuple[Requests, Objects]:
    rng = np.random.default_rng(seed)
    base0 = 0x7F00_0000_0000
    sizes = rng.integers(1 << 12, 1 << 22, n_obj)
    bases = base0 + np.cumsum(np.r_[0, sizes[:-1] + 4096])
    obj = rng.integers(0, n_obj, n_req)
    start = bases[obj] + (rng.integers(0, 1 << 30, n_req) % np.maximum(sizes[obj] - 32 * 4 * 8, 1)) // 4 * 4
    stride = rng.choice([1, 1, 1, 2, 8, 32], n_req)
    addr = (start[:, None] + np.arange(32)[None, :] * stride[:, None] * 4).astype(np.uint64)
    req = Requests(np.zeros(n_req, np.int64), rng.integers(0, 64, n_req).astype(np.uint64) * 16,
                   rng.choice([READ, WRITE], n_req), np.full(n_req, 4), np.full(n_req, 0xFFFFFFFF, np.uint32), addr)
    return req, Objects(np.zeros(n_obj, np.int64), bases.astype(np.uint64), sizes)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=1_000_000)
    ap.add_argument("--objects", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    req, objs = make(a.requests, a.objects)
    times = []
    for _ in range(a.repeat):
        t0 = time.perf_counter()
        out = reduce_requests(req, objs)
        times.append(time.perf_counter() - t0)
    best = min(times)
    lanes = int(out["access_summary"]["reads"].to_numpy().sum() + out["access_summary"]["writes"].to_numpy().sum())
    print(json.dumps({"requests": a.requests, "objects": a.objects, "lane_accesses": lanes,
                      "seconds_best": round(best, 3), "seconds_all": [round(t, 3) for t in times],
                      "requests_per_s": round(a.requests / best), "lane_accesses_per_s": round(lanes / best),
                      "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)}))


if __name__ == "__main__":
    main()
