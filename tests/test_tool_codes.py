"""tools/_codes.py: the fast group codes and key lookups give exactly what the processor's
sorting versions give (the tools order their rows by these codes, so a different code is a
different output)."""

from __future__ import annotations

import numpy as np
import pytest

import pastaprof
from pastaprof.processor.intervals import group_codes
from pastaprof.processor.link import map_keys
from pastaprof.tools._codes import dense_codes, find_keys, radix_key


@pytest.fixture(scope="module")
def example_ops():
    run = pastaprof.load(pastaprof.api.example_path())
    return run.table("op"), run.table("tensor")


def _i64(col):
    return np.asarray(col.fill_null(-1).to_numpy(zero_copy_only=False), dtype=np.int64)


def test_dense_codes_equal_group_codes_on_the_example(example_ops):
    ops, tensor = example_ops
    cols = [np.r_[_i64(ops[c]), _i64(tensor[c])] for c in ("rank", "pid", "tid")]
    got, want = dense_codes(*cols), group_codes(*cols)
    assert np.array_equal(got, want)
    assert got.max() + 1 == len({tuple(r) for r in np.stack(cols, axis=1).tolist()})  # one code per thread


@pytest.mark.parametrize("n, highs", [(0, [3, 3]), (1, [3]), (10, [2, 5, 7]), (5000, [4, 3, 100]),
                                      (5000, [5000]), (3000, [3, 10**6])])
def test_dense_codes_equal_group_codes(n, highs):
    rng = np.random.default_rng(n)
    cols = [rng.integers(-5, h, n) * (10**15 if i == 1 else 1) for i, h in enumerate(highs)]
    assert np.array_equal(dense_codes(*cols), group_codes(*cols))


def test_dense_codes_when_the_radix_key_would_overflow():
    rng = np.random.default_rng(1)
    cols = [rng.integers(0, 2**62, 2000), rng.integers(0, 2**62, 2000), rng.integers(0, 3, 2000)]
    assert radix_key(*cols) is None
    assert np.array_equal(dense_codes(*cols), group_codes(*cols))


def test_radix_key_orders_like_the_tuples():
    rng = np.random.default_rng(2)
    a, b = rng.integers(-3, 4, 500), rng.integers(-10**9, 10**9, 500)
    key = radix_key(a, b)
    assert np.array_equal(np.argsort(key, kind="stable"), np.lexsort((b, a)))


@pytest.mark.parametrize("table", [np.arange(5, 1005), np.arange(0, 1000), np.r_[np.arange(10), 12],
                                   np.array([3, 2, 1]), np.array([-1, 0, 1]), np.array([], np.int64),
                                   np.array([7])])
def test_find_keys_equals_map_keys(table):
    rng = np.random.default_rng(len(table))
    keys = rng.integers(-3, 1100, 4000)
    values = rng.integers(0, 10**9, len(table))
    assert np.array_equal(find_keys(keys, table, values), map_keys(keys, table, values))


def test_find_keys_on_the_example_parents(example_ops):
    ops, _ = example_ops
    ids, parent = _i64(ops["id"]), _i64(ops["parent_id"])
    rows = np.arange(len(ids))
    got = find_keys(parent, ids, rows)
    assert np.array_equal(got, map_keys(parent, ids, rows))
    assert (got >= 0).sum() == (parent >= 0).sum()  # every op with a parent id finds its parent
