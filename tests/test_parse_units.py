"""Units under the importer and the timeline: the JSON structure scanner against a
byte-by-byte reference, and the timeline sweep with times that would overflow int64."""

from __future__ import annotations

import random

import numpy as np

from pastaprof.importers import jsonscan
from pastaprof.importers.jsonscan import ArrayEnd, Scanner
from pastaprof.tools._timeline_math import Sweep

ALPHABET = b'[]{}"\\ab,:'


def reference(data: bytes) -> list[tuple[int, int]]:
    """(position, depth after) of each bracket outside strings; a quote after an odd run
    of backslashes neither opens nor closes a string."""
    depth, inside, run, out = 0, False, 0, []
    for i, c in enumerate(data):
        if c == 0x5C:
            run += 1
            continue
        odd, run = run % 2, 0
        if c == 0x22 and odd:
            continue
        if inside:
            inside = c != 0x22
            continue
        if c == 0x22:
            inside = True
        elif c in b"[{":
            depth += 1
            out.append((i, depth))
        elif c in b"]}":
            depth -= 1
            out.append((i, depth))
    return out


def _cuts(rng: random.Random, n: int) -> list[int]:
    return sorted(rng.randint(0, n) for _ in range(rng.randint(0, 4))) + [n]


def test_scanner_matches_the_reference_across_any_block_cuts():
    rng = random.Random(11)
    for _ in range(3000):
        data = bytes(rng.choice(ALPHABET) for _ in range(rng.randint(0, 80)))
        sc, got, prev = Scanner(), [], 0
        for cut in _cuts(rng, len(data)):
            blk = sc.scan(data[prev:cut])
            got += [(int(p) + prev, int(d)) for p, d in zip(blk.brackets, blk.depth)]
            prev = cut
        assert got == reference(data), data


def test_array_end_matches_the_reference(monkeypatch):
    monkeypatch.setattr(jsonscan, "EXACT_PIECE", 7)  # the narrowing to pieces runs on short inputs too
    rng = random.Random(12)
    for _ in range(6000):
        data = bytes(rng.choice(ALPHABET) for _ in range(rng.randint(0, 90)))
        want = next((p - 1 for p, d in reference(b"[" + data) if d <= 0 and p > 0), -1)
        end, got, prev = ArrayEnd(1), -1, 0
        for cut in _cuts(rng, len(data)):
            got = end.feed(data[prev:cut])
            prev = cut
            if got >= 0:
                break
        if got < 0:
            got = end.finish()
        assert got == want, data


def test_sweep_over_times_spread_past_int64_offsets():
    seg = np.array([0, 0, 1, 1, 2])
    start = np.array([0, 10, -(2**61), 2**61, 5])
    end = np.array([5, 20, -(2**61) + 3, 2**61 + 7, 9])
    sw = Sweep(seg, start, end, 3)
    assert sw.batches is not None
    assert sw.union().tolist() == [15, 10, 4]
    assert sw.gaps()[0].tolist() == [0, 5, 0, 2**62 - 3, 0]
    small = Sweep(seg, start % 1000, np.maximum(end % 1000, start % 1000), 3)
    assert small.batches is None
