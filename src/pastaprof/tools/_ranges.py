"""Which ranges are the program's own (host-side) annotations.

Ranges come from several sources: Kineto's ``user_annotation`` (domain ``user``) and its GPU-side
projection ``gpu_user_annotation`` (``gpu_user``), and live capture's ``pastaprof.range``
(``user``), ``torch.profiler.record_function`` (``record_function``) and NVTX (``nvtx``).  Tools
that look for steps or a program's phases want every host-side range, whatever recorded it; the
GPU-side projections repeat host ranges on the device's clock and would count each one twice.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

#: Domains of ranges that are GPU-side projections of host ranges.
GPU_SIDE_DOMAINS = ("gpu_user",)


def host_ranges(rng: pa.Table) -> pa.Table:
    """The rows of a ``range`` table that are host-side annotations (a null domain counts)."""
    if not rng.num_rows or "domain" not in rng.column_names:
        return rng
    gpu = pc.is_in(rng["domain"].cast(pa.string()), value_set=pa.array(GPU_SIDE_DOMAINS))
    return rng.filter(pc.invert(pc.fill_null(gpu, False)))
