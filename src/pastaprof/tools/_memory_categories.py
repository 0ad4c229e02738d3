"""What each allocator block *is*, inferred from when and by whom it was made and freed.

PyTorch's allocator does not know whether a block holds a parameter or an
activation, so the memory tool infers it from the ops and ranges around the
block's allocation and free, with these rules, first match wins (all vectorized):

=================  =====================================================================
category           rule
=================  =====================================================================
optimizer_state    allocated inside an optimizer step range (``Optimizer.step#...``) and
                   still live after that range ends (Adam moments, momentum buffers)
gradients          allocated by a backward op (autograd) and still live when the
                   backward pass of its step is over: at the step's optimizer range, or
                   at the step's end when there is none
parameters         allocated before the first step and live to the end of the trace
                   (parameters, buffers and other model state made while tracing)
activations        allocated by a forward op inside a step and freed by a backward op
                   (saved for backward)
temporaries        allocated and freed within one step without crossing from forward to
                   backward (workspaces, intermediate results)
unknown            anything else
before_trace       allocated before the trace began (its alloc is not in the trace); at
                   the peak this also counts memory the allocator held from before the
                   trace that is never freed in it (the replay's offset)
=================  =====================================================================

"Backward op" is the op table's ``is_backward`` (autograd's evaluate_function ops and
everything inside them).  Steps come from the memory tool's step windows.  Without
step windows every in-step rule fails and blocks fall back to ``unknown`` (or
``parameters`` when live throughout), which the report says.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pastaprof.processor.link import _np as _i64
from pastaprof.tools._by_rank import rows_of_rank

CATEGORIES = ("optimizer_state", "gradients", "parameters", "activations", "temporaries", "unknown", "before_trace")
OPTIMIZER_STEP = "Optimizer.step#"
NEVER = np.iinfo(np.int64).max


def optimizer_ranges(ranges: pa.Table, ops: pa.Table, rank: int) -> tuple[np.ndarray, np.ndarray]:
    """(start, end) of the optimizer step ranges of ``rank``, sorted by start, deduplicated
    (Kineto records each twice: CPU and GPU user annotation)."""
    parts = []
    for t in (ranges, ops):
        if t.num_rows == 0:
            continue
        t = rows_of_rank(t, rank)
        hit = t.filter(pc.fill_null(pc.starts_with(t["name"].cast(pa.string()), OPTIMIZER_STEP), False))
        if "domain" in hit.column_names:
            hit = hit.filter(pc.fill_null(pc.not_equal(hit["domain"].cast(pa.string()), "gpu_user"), True))
        if hit.num_rows:
            parts.append(np.stack([_i64(hit["start_ns"]), _i64(hit["end_ns"])], axis=1))
    if not parts:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    se = np.unique(np.concatenate(parts), axis=0)
    return se[:, 0], se[:, 1]


def classify(alloc_ns: np.ndarray, free_ns: np.ndarray, alloc_bwd: np.ndarray, free_bwd: np.ndarray,
             pretrace: np.ndarray, step_starts: np.ndarray, step_ends: np.ndarray,
             opt_starts: np.ndarray, opt_ends: np.ndarray, trace_end: int) -> np.ndarray:
    """Category index (into CATEGORIES) per block.  ``free_ns`` is NEVER for blocks not
    freed; ``alloc_bwd`` / ``free_bwd`` say whether the allocating / freeing op is a
    backward op."""
    n = len(alloc_ns)
    cat = np.where(pretrace, CATEGORIES.index("before_trace"), CATEGORIES.index("unknown")).astype(np.int8)
    undecided = ~pretrace.copy()
    freed = free_ns != NEVER

    def assign(mask: np.ndarray, name: str) -> None:
        m = mask & undecided
        cat[m] = CATEGORIES.index(name)
        undecided[m] = False

    # optimizer state
    if len(opt_starts):
        i = np.searchsorted(opt_starts, alloc_ns, "right") - 1
        inside = (i >= 0) & (alloc_ns < opt_ends[np.clip(i, 0, None)])
        assign(inside & (free_ns > opt_ends[np.clip(i, 0, None)]), "optimizer_state")
    step = np.searchsorted(step_starts, alloc_ns, "right") - 1 if len(step_starts) else np.full(n, -1)
    in_step = (step >= 0) & (alloc_ns < step_ends[np.clip(step, 0, None)] if len(step_ends) else False)
    sc = np.clip(step, 0, None)
    # gradients: made in backward, alive when the step's backward is over
    if len(step_starts):
        bwd_over = step_ends[sc].copy()
        if len(opt_starts):  # the step's first optimizer range, if it has one
            j = np.searchsorted(opt_starts, step_starts[sc], "left")
            has = (j < len(opt_starts)) & (opt_starts[np.clip(j, 0, len(opt_starts) - 1)] < step_ends[sc])
            bwd_over = np.where(has, opt_starts[np.clip(j, 0, len(opt_starts) - 1)], bwd_over)
        assign(in_step & alloc_bwd & (free_ns >= bwd_over), "gradients")
    else:
        assign(alloc_bwd & ~freed, "gradients")
    # parameters / model state
    first = step_starts[0] if len(step_starts) else trace_end
    assign((alloc_ns < first) & ~freed, "parameters")
    if len(step_starts):
        assign(in_step & ~alloc_bwd & freed & free_bwd, "activations")
        same_step = freed & (np.searchsorted(step_starts, free_ns, "right") - 1 == step) & \
            (free_ns < step_ends[sc])
        assign(in_step & same_step & (alloc_bwd == free_bwd), "temporaries")
    return cat
