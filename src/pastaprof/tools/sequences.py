"""sequences -- kernel sequences that repeat: candidates for fusion or CUDA graphs.

Per stream (rank, device, stream), kernels in start order are reduced to their normalized names
(``report/diff_names.normalize_kernel_name``: no addresses, lambda numbers or numeric template
arguments), and every window of ``n`` consecutive kernels (``MIN_LEN`` <= n <= ``max_len``) is
hashed (a polynomial hash of the name codes, vectorized per n; windows never cross streams).
A window's *occurrences* are the windows with the same names that do not overlap each other
(in a run of overlapping ones, every n-th from its first).

Everything is measured per step, so a trace of one step and one of many steps of the same
program give the same sequences: the steps are the steps tool's (summed over the ranks with
kernels; a rank without steps counts as one step), and a sequence needs ``MIN_REPEATS`` (2)
occurrences per step on average -- it repeats *within* a step, so it is never a whole step, and
``length * count`` <= the kernels caps it at half a step's kernels.  Candidates are ranked by the
GPU time of their occurrences times ``1 - MIN_REPEATS / (per_step + 1)`` (a sequence that repeats
12 times a step, like a transformer layer, before a pair of kernels repeated twice) and kept
greedily; a kept one is grown kernel by kernel to the right and left while all its occurrences
continue alike (so a repeated layer of 50 kernels is one row, however short the hashed windows);
a candidate whose occurrences mostly start inside occurrences already kept (a shift or a piece
of a longer sequence), or whose kernels mostly are in kept ones once grown, is dropped, so the
table names each repeated stretch once.

Table ``sequences``: ``length``, ``count``, ``per_step`` (count / steps), ``gpu_ns`` (summed kernel
time of the occurrences), ``share`` (of all kernel time), ``mean_ns`` per occurrence, ``idle_ns``
(GPU idle time between the kernels inside the occurrences: what launching them as one CUDA graph
or one fused kernel could save at most: a graph replays them without the host work between
them), ``streams``, ``first`` (the first kernel, normalized) and ``kernels`` (the whole sequence).
Findings: sequences whose ``idle_ns`` is at least ``MIN_IDLE_SHARE`` of the kernel time,
``impact_ns`` = ``idle_ns``.  Option: ``max_len`` (16).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from pastaprof.processor.intervals import group_codes
from pastaprof.report.diff_names import normalize_kernel_name
from pastaprof.tools._timeline_math import fmt_ns, name_codes, to_np
from pastaprof.tools.base import Finding, Report, Tool
from pastaprof.tools.steps import Steps

MIN_LEN = 2
MAX_LEN = 16
MIN_REPEATS = 2        # occurrences per step (on average) a sequence needs
TOP = 10
GROWN = 50 * TOP       # candidates grown (the rest are pieces of these or have less GPU time)
COVERED = 0.5          # a candidate with more than half its occurrences inside kept ones is a repeat
MIN_IDLE_SHARE = 0.02  # idle inside a sequence's occurrences worth a finding: 2% of the kernel time
_P = np.uint64(1_000_003)
DISPLAY = {"sequences": ["length", "count", "per_step", "gpu_ns", "share", "mean_ns", "idle_ns", "first"]}


def _first_of_runs(key: np.ndarray, pos: np.ndarray, n: int) -> np.ndarray:
    """Mask of the windows that count as occurrences of their key: overlapping windows of one key
    form a chain (each within ``n`` of the one before); a chain counts every window ``n``, ``2n``,
    ... after its first, as a left-to-right scan would in a run like AAAA."""
    order = np.lexsort((pos, key))
    k, p = key[order], pos[order]
    new = np.ones(len(k), bool)
    new[1:] = (k[1:] != k[:-1]) | (p[1:] - p[:-1] >= n)
    chain_start = p[np.flatnonzero(new)][np.cumsum(new) - 1]
    out = np.zeros(len(k), bool)
    out[order] = (p - chain_start) % n == 0
    return out


def _extend(codes: np.ndarray, stream: np.ndarray, pos: np.ndarray, n: int, limit: int = 1 << 14) -> tuple[np.ndarray, int]:
    """Grow a repeated window to the right, then to the left, while every occurrence is followed
    (preceded) by the same kernel on its stream and the occurrences stay disjoint."""
    nk = len(codes)
    while n < limit:
        nxt = pos + n
        if nxt[-1] >= nk or (len(pos) > 1 and (nxt[:-1] >= pos[1:]).any()):
            break
        if not ((stream[nxt] == stream[pos]).all() and (codes[nxt] == codes[nxt[0]]).all()):
            break
        n += 1
    while n < limit:
        prv = pos - 1
        if prv[0] < 0 or (len(pos) > 1 and (prv[1:] < pos[:-1] + n).any()):
            break
        if not ((stream[prv] == stream[pos]).all() and (codes[prv] == codes[prv[0]]).all()):
            break
        pos, n = prv, n + 1
    return pos, n


def _candidates(codes: np.ndarray, stream: np.ndarray, csum: np.ndarray, need: int,
                max_len: int) -> list[tuple[float, int, np.ndarray]]:
    """Every window of MIN_LEN..max_len kernels (within one stream) with at least ``need``
    non-overlapping occurrences: (GPU time of its occurrences, length, their positions)."""
    out = []
    h = (codes + 1).astype(np.uint64)
    for n in range(2, min(max_len, len(codes)) + 1):
        h = h[:-1] * _P + (codes[n - 1:] + 1).astype(np.uint64)  # windows [i, i + n)
        pos = np.flatnonzero(stream[: len(h)] == stream[n - 1:])
        key = h[pos]
        pos = pos[_first_of_runs(key, pos, n)]
        u, inv, cnt = np.unique(h[pos], return_inverse=True, return_counts=True)
        good = cnt >= need
        if not good.any():
            break  # longer windows cannot repeat more often than their prefixes
        inv = inv.reshape(-1)
        gpu = np.bincount(inv, weights=(csum[pos + n] - csum[pos]).astype(np.float64))
        by_key = pos[np.argsort(inv, kind="stable")]  # each key's positions, ascending
        bounds = np.concatenate([[0], np.cumsum(cnt)])
        out += [(float(gpu[i]), n, by_key[bounds[i]: bounds[i + 1]]) for i in np.flatnonzero(good)]
    return out


def _grown(codes: np.ndarray, stream: np.ndarray, csum: np.ndarray,
           cands: list[tuple[float, int, np.ndarray]]) -> list[tuple[int, int, np.ndarray]]:
    """The candidates with the most GPU time, each grown as far as its occurrences continue alike
    (``_extend``): (GPU time of the grown occurrences, length, positions).  A candidate whose
    kernels all lie in stretches grown already is a piece of one of them and is not grown again."""
    out = []
    seen = np.zeros(len(codes), bool)
    cands.sort(key=lambda c: (-c[0], -c[1]))
    for _gpu, n, pos in cands:
        win = pos[:, None] + np.arange(n)
        if seen[win].all() or not (codes[win] == codes[win[0]]).all():  # a piece, or a hash collision
            continue
        pos, n = _extend(codes, stream, pos, n)
        seen[(pos[:, None] + np.arange(n)).reshape(-1)] = True
        out.append((int((csum[pos + n] - csum[pos]).sum()), n, pos))
        if len(out) == GROWN:
            break
    return out


class Sequences(Tool):
    name = "sequences"
    description = "Repeated kernel sequences per stream (fusion / CUDA graph candidates), their GPU-time share and idle gaps"
    consumes = ("kernel", "memcpy", "memset", "api", "op", "range")
    optional = ("memcpy", "memset", "api", "op", "range")  # for the steps tool's rules; no reason to capture

    def _steps(self) -> int:
        """Steps of the ranks with kernels (the steps tool's; a rank without steps is one step)."""
        steps = Steps()
        steps.info = self.info
        steps._batches = self._batches  # the same events: read, never changed
        table = steps.report().tables.get("steps")
        found = table["rank"].to_pylist() if table is not None else []
        ranks = set(to_np(self.table("kernel")["rank"]).tolist())
        return max(1, sum(max(1, found.count(r)) for r in ranks))

    def _streams(self) -> tuple[np.ndarray, ...]:
        """Kernels ordered by stream, then start: codes, stream code, start, end, names."""
        k = self.table("kernel")
        codes, names = name_codes(k["name"])
        norm = [normalize_kernel_name(x) for x in names]
        uniq, remap = np.unique(np.array(norm, dtype=object), return_inverse=True) if norm else ([], np.zeros(0))
        codes = remap.reshape(-1).astype(np.int64)[codes] if len(codes) else codes.astype(np.int64)
        stream = group_codes(to_np(k["rank"]), to_np(k["device"]), to_np(k["stream"]))
        start, end = to_np(k["start_ns"]), to_np(k["end_ns"])
        order = np.lexsort((start, stream))
        return codes[order], stream[order], start[order], np.maximum(end[order], start[order]), list(uniq)

    def report(self) -> Report:
        max_len = int(self.options.get("max_len", MAX_LEN))
        codes, stream, start, end, names = self._streams()
        total = int((end - start).sum())
        n_k = len(codes)
        if n_k < MIN_LEN * MIN_REPEATS:
            return Report(self.name, summary={"kernels": n_k, "sequences": 0,
                                              "note": "too few kernels to find repeated sequences"})
        steps = self._steps()
        csum = np.concatenate([[0], np.cumsum(end - start)])
        grown = _grown(codes, stream, csum, _candidates(codes, stream, csum, MIN_REPEATS * steps, max_len))
        rows, covered = [], np.zeros(n_k, bool)
        for _gpu, n, pos in sorted(grown, key=lambda g: (-g[0], -g[1], int(g[2][0]))):
            win = pos[:, None] + np.arange(n)
            if covered[win].any():  # rows name different stretches: no kernel launch in two
                continue
            covered[win] = True
            busy = csum[pos + n] - csum[pos]
            span = end[pos + n - 1] - start[pos]
            seq = [names[c] for c in codes[pos[0]: pos[0] + n]]
            rows.append({"length": n, "count": len(pos), "per_step": round(len(pos) / steps, 2),
                         "gpu_ns": int(busy.sum()), "share": round(busy.sum() / total, 4) if total else None,
                         "mean_ns": int(round(busy.mean())), "idle_ns": int(np.maximum(span - busy, 0).sum()),
                         "streams": int(len(np.unique(stream[pos]))), "first": seq[0], "kernels": seq})
            if len(rows) == TOP:
                break
        table = pa.Table.from_pylist(rows, schema=pa.schema([
            ("length", pa.int64()), ("count", pa.int64()), ("per_step", pa.float64()), ("gpu_ns", pa.int64()),
            ("share", pa.float64()), ("mean_ns", pa.int64()), ("idle_ns", pa.int64()), ("streams", pa.int64()),
            ("first", pa.string()), ("kernels", pa.list_(pa.string()))]))
        findings = [self._finding(r) for r in rows if total and r["idle_ns"] >= MIN_IDLE_SHARE * total]
        summary = {"kernels": n_k, "kernel_ns": total, "steps": steps, "sequences": len(rows),
                   "covered_share": round(float(covered.mean()), 4)}
        if not rows:
            summary["note"] = f"no kernel sequence of {MIN_LEN}..{max_len} kernels repeats {MIN_REPEATS} times per step"
        return Report(self.name, tables={"sequences": table} if rows else {}, findings=findings, summary=summary,
                      display=DISPLAY)

    @staticmethod
    def _finding(r: dict) -> Finding:
        return Finding(
            "info", f"a {r['length']}-kernel sequence repeats {r['count']} times ({r['per_step']:g} per step) with "
                    f"{fmt_ns(r['idle_ns'])} of GPU idle between its kernels",
            {"impact_ns": r["idle_ns"], "gpu_ns": r["gpu_ns"], "share": r["share"], "count": r["count"],
             "per_step": r["per_step"],
             "length": r["length"], "kernels": r["kernels"],
             "suggestion": "Capture this sequence in a CUDA graph (torch.cuda.graphs, torch.compile "
                           "mode='reduce-overhead') or fuse its kernels, so the GPU does not wait for each launch."},
            location=f"kernel sequence starting {r['first']}", kind=f"repeated sequence: {' > '.join(r['kernels'])}")
