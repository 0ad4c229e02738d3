"""group_codes / dense_rank / stable_group_order (hash-based, radix-sorted) give exactly the
codes and orders of the np.unique / stable argsort they replace; _is_library judged per
distinct file equals the per-row judgement on the real example's frames."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from pastaprof.importers.kineto import import_file
from pastaprof.processor.intervals import dense_rank, group_codes, stable_group_order
from pastaprof.processor.link import _is_library, _library_values

EXAMPLE = "src/pastaprof/data/example_gpt2_train_3steps.pt.trace.json.gz"


@pytest.mark.parametrize("n,k", [(0, 1), (1, 1), (7, 3), (100_000, 5), (200_000, 70_000)])
def test_codes_equal_np_unique(n: int, k: int) -> None:
    rng = np.random.default_rng(n + k)
    a = rng.integers(-5, k, n)
    b = rng.integers(-(2**62), 2**62, n) if k > 1000 else rng.integers(0, k, n)
    ref = np.unique(np.stack([a, b], 1), axis=0, return_inverse=True)[1].reshape(-1)
    assert np.array_equal(group_codes(a, b), ref)
    assert np.array_equal(dense_rank(a), np.unique(a, return_inverse=True)[1].reshape(-1))
    codes = group_codes(a, b)
    assert np.array_equal(stable_group_order(codes), np.argsort(codes, kind="stable"))
    big = codes + (1 << 20)  # past 16 bits: the general path
    assert np.array_equal(stable_group_order(big), np.argsort(big, kind="stable"))


def test_library_files_per_distinct_name_equal_per_row() -> None:
    tables, _ = import_file(EXAMPLE, kinds={"frame"})
    files = tables["frame"]["file"]
    assert pa.types.is_dictionary(files.type)
    per_row = _library_values(files.cast(pa.string()).combine_chunks())
    got = _is_library(files)
    assert np.array_equal(got, per_row)
    assert 0 < int(got.sum()) < len(got)  # both kinds of frames are present
    mixed = pa.chunked_array([pa.array(["torch/x.py", None, "me.py"]).dictionary_encode(),
                              pa.array([None, None], pa.string()).dictionary_encode()])
    assert _is_library(mixed).tolist() == [True, True, False, True, True]
