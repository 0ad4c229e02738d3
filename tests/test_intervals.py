"""The vectorized interval algebra against a plain stack-based reference."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pastaprof.processor.intervals import innermost_enclosing, parents


def _laminar(draw_sizes: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Build a properly nested family from a random recursive split of [0, 1000)."""
    out: list[tuple[int, int]] = []

    def split(lo: int, hi: int, depth: int, it) -> None:
        for a, b in it:
            if depth > 4 or hi - lo < 2:
                return
            s = lo + a % (hi - lo)
            e = min(hi, s + 1 + b % (hi - s))
            out.append((s, e))
            split(s, e, depth + 1, it)
            lo = e
            if lo >= hi:
                return

    split(0, 1000, 0, iter(draw_sizes))
    return out


def _ref_innermost(fam: list[tuple[int, int]], t: int) -> int:
    best, best_len = -1, None
    for i, (s, e) in enumerate(fam):
        if s <= t < e and e > s and (best_len is None or e - s < best_len or (e - s == best_len and s >= fam[best][0])):
            best, best_len = i, e - s
    return best


@settings(max_examples=150, deadline=None)
@given(sizes=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 10**6)), max_size=60),
       queries=st.lists(st.integers(-5, 1005), max_size=40))
def test_innermost_enclosing_matches_reference(sizes, queries):
    fam = _laminar(sizes)
    s = np.array([a for a, _ in fam], dtype=np.int64)
    e = np.array([b for _, b in fam], dtype=np.int64)
    got = innermost_enclosing(np.zeros(len(fam)), s, e, np.zeros(len(queries)), np.array(queries, dtype=np.int64))
    for q, g in zip(queries, got):
        want = _ref_innermost(fam, q)
        if want == -1:
            assert g == -1
        else:
            # identical intervals are interchangeable; compare the interval itself
            assert g >= 0 and fam[g] == fam[want], (q, fam[g] if g >= 0 else None, fam[want])


@settings(max_examples=150, deadline=None)
@given(sizes=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 10**6)), max_size=60))
def test_parents_and_depth_match_a_stack_walk(sizes):
    fam = _laminar(sizes)
    n = len(fam)
    s = np.array([a for a, _ in fam], dtype=np.int64)
    e = np.array([b for _, b in fam], dtype=np.int64)
    par, depth = parents(np.zeros(n), s, e)
    for i in range(n):
        # identical intervals nest in input order (the earlier one is outside)
        encl = [j for j in range(n) if j != i and s[j] <= s[i] and e[i] <= e[j]
                and ((e[j] - s[j]) > (e[i] - s[i]) or j < i)]
        if not encl:
            assert par[i] == -1 and depth[i] == 0
        else:
            inner = min(encl, key=lambda j: (e[j] - s[j], -j))
            assert par[i] >= 0 and (s[par[i]], e[par[i]]) == (s[inner], e[inner])
            assert depth[i] == depth[par[i]] + 1


def test_groups_are_independent():
    # same intervals on two threads: answers never cross groups
    s, e, g = np.array([0, 10, 0, 10]), np.array([100, 20, 100, 20]), np.array([1, 1, 2, 2])
    got = innermost_enclosing(g, s, e, np.array([1, 2, 3]), np.array([15, 15, 15]))
    assert list(got) == [1, 3, -1]
    par, depth = parents(g, s, e)
    assert list(par) == [-1, 0, -1, 2] and list(depth) == [0, 1, 0, 1]


@given(st.lists(st.integers(-2, 40), max_size=60), st.lists(st.integers(-2, 45), max_size=30), st.booleans())
def test_map_keys_is_a_first_match_lookup(table, queries, sort_table):
    """map_keys == a dict of each key's first value (keys < 0 never match), whether the
    table comes sorted (the sort is skipped) or not."""
    from pastaprof.processor.link import map_keys

    tk = np.array(sorted(table) if sort_table else table, np.int64)
    tv = np.arange(len(tk), dtype=np.int64) * 7 + 1
    first: dict[int, int] = {}
    for k, v in zip(tk.tolist(), tv.tolist()):
        if k >= 0:
            first.setdefault(k, v)
    got = map_keys(np.array(queries, np.int64), tk, tv)
    assert got.tolist() == [first.get(q, -1) if q >= 0 else -1 for q in queries]
