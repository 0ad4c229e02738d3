"""Collectives of one rank (the map side) and their matching across ranks (the combine side).

A rank's collectives come from its ``collective`` rows (Kineto's ``record_param_comms`` ops:
kind, bytes, group size, process-group ranks), each joined to the NCCL kernels it launched
(``kernel.op_id`` = the row's ``op_id``); a rank without such rows (a live run, an Nsight Systems
import) uses its NCCL kernels alone, the kind read from the kernel name and the process group
unknown.  ``wait`` rows (the host waiting on a work object) are not collectives.

Matching: NCCL requires every member of a process group to issue the group's collectives in
the same order, so the k-th collective of a kind in a group on one rank is the k-th on every
member: instances are keyed by (process group, kind, sequence within group and kind).  Where a
collective was issued in a step with an absolute number (``ProfilerStep#N``), the sequence
counts within that step: ranks whose profiles start at different collectives still match.
"""

from __future__ import annotations

import hashlib
import re

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pastaprof.tools._timeline_math import KeyIndex, name_codes, to_np

_KERNEL_RE = re.compile(r"^(?:void\s+)?nccl(?:Dev)?Kernel_([A-Za-z]+)")
#: Normalized kinds, tested in order on the lower-cased name without underscores.
_KINDS = (("reducescatter", "reduce_scatter"), ("allreduce", "allreduce"), ("allgather", "allgather"),
          ("alltoall", "alltoall"), ("broadcast", "broadcast"), ("reduce", "reduce"), ("barrier", "barrier"),
          ("sendrecv", "sendrecv"), ("send", "send"), ("recv", "recv"), ("gather", "gather"),
          ("scatter", "scatter"))
#: Kinds whose kernels end together on every member (the last arrival releases all): clock anchors.
SYNCHRONIZING = frozenset({"allreduce", "allgather", "reduce_scatter", "alltoall", "barrier"})
#: NCCL-tests' bus-bandwidth factor of each kind, given the group size n.
BUS_FACTOR = {"allreduce": lambda n: 2 * (n - 1) / n, "allgather": lambda n: (n - 1) / n,
              "reduce_scatter": lambda n: (n - 1) / n, "alltoall": lambda n: (n - 1) / n}

PG_KEY_CHARS = 64
ABSOLUTE_STEP = re.compile(r"^(?:ProfilerStep|pastaprof\.step)#\d+$")
COLUMNS = ("rank", "pg", "kind", "seq", "bytes", "group_size", "host_ns", "start_ns", "end_ns", "on_gpu")


def normalize_kind(name: str | None) -> str | None:
    """'allreduce', 'all_gather_into_tensor', '_reduce_scatter_base', 'AllReduce' -> one spelling;
    None for what is not a collective (``wait``, unknown names)."""
    key = (name or "").lower().replace("_", "").replace(" ", "")
    if not key or key.startswith("wait"):
        return None
    for token, kind in _KINDS:
        if token in key:
            return kind
    return None


def pg_key(peers: str) -> str:
    """A process group's key from its ranks' list as recorded ("[0, 1, 2]"): the list itself when
    short, else its size, first and last rank and a hash of the whole (a 1,024-rank group's list is
    5 kB, repeated on every collective row of every rank)."""
    text = peers.strip().strip('"')
    if len(text) <= PG_KEY_CHARS:
        return text
    nums = re.findall(r"-?\d+", text)
    digest = hashlib.sha1(text.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    return f"[{nums[0]}..{nums[-1]}] ({len(nums)} ranks) #{digest}" if nums else f"#{digest}"


def kernel_kind(name: str | None) -> str | None:
    """The collective kind of an NCCL kernel name (ncclDevKernel_AllReduce_Sum_f32_RING_LL ...), else None."""
    m = _KERNEL_RE.match(name or "")
    return normalize_kind(m.group(1)) if m else None


def _empty() -> pa.Table:
    return pa.table({"rank": pa.array([], pa.int32()), "pg": pa.array([], pa.string()),
                     "kind": pa.array([], pa.string()), "seq": pa.array([], pa.int64()),
                     "bytes": pa.array([], pa.int64()), "group_size": pa.array([], pa.int32()),
                     "host_ns": pa.array([], pa.int64()), "start_ns": pa.array([], pa.int64()),
                     "end_ns": pa.array([], pa.int64()), "on_gpu": pa.array([], pa.bool_())})


def nccl_kernels(kernel: pa.Table) -> tuple[np.ndarray, list[str | None]]:
    """Row mask of the NCCL kernels and the kind of each distinct kernel name (one regex per name)."""
    codes, names = name_codes(kernel["name"])
    kinds = [kernel_kind(n) for n in names]
    is_nccl = np.array([k is not None for k in kinds], bool)
    return (is_nccl[codes] if len(codes) else np.zeros(0, bool)), kinds


def rank_collectives(rank: int, tables: dict[str, pa.Table]) -> pa.Table:
    """One row per collective the rank issued (columns ``COLUMNS``), in issue order with its sequence."""
    kernel, coll, api = tables["kernel"], tables["collective"], tables["api"]
    mask = nccl_kernels(kernel)[0] if kernel.num_rows else np.zeros(0, bool)
    k = kernel.filter(pa.array(mask)) if kernel.num_rows else kernel
    k_start, k_end = to_np(k["start_ns"]), to_np(k["end_ns"])
    ckinds = [normalize_kind(x) for x in coll["name"].cast(pa.string()).to_pylist()] if coll.num_rows else []
    keep = np.array([c is not None for c in ckinds], bool)
    if keep.any():
        c = coll.filter(pa.array(keep))
        kind = [x for x in ckinds if x is not None]
        op = to_np(c["op_id"])
        host = to_np(c["start_ns"])
        start, end = host.copy(), to_np(c["end_ns"]).copy()
        on_gpu = np.zeros(len(op), bool)
        if k.num_rows:  # the kernels each collective launched: earliest start, latest end
            g = pa.table({"op": to_np(k["op_id"]), "s": k_start, "e": k_end}).filter(
                pc.greater_equal(pa.array(to_np(k["op_id"])), 0)).group_by("op", use_threads=False).aggregate([("s", "min"), ("e", "max")])
            row = KeyIndex(to_np(g["op"])).find(op) if g.num_rows else np.full(len(op), -1)
            hit = (row >= 0) & (op >= 0)
            start[hit], end[hit] = to_np(g["s_min"])[row[hit]], to_np(g["e_max"])[row[hit]]
            on_gpu = hit
        pg = [pg_key(p) for p in pc.fill_null(c["peers"].cast(pa.string()), "").to_pylist()]
        nbytes = c["bytes"].cast(pa.int64())
        size = c["group_size"].cast(pa.int32())
    elif k.num_rows:  # NCCL kernels alone: the kind from the name, the group unknown
        codes, names = name_codes(k["name"])
        kind = [kernel_kind(names[i]) for i in codes]
        start, end = k_start, k_end
        call = KeyIndex(to_np(api["rank"], dtype=np.int32), to_np(api["correlation"])).find(
            np.full(k.num_rows, rank, np.int32), to_np(k["correlation"]))
        host = np.where(call >= 0, to_np(api["start_ns"])[np.maximum(call, 0)] if api.num_rows else 0, start)
        pg = [""] * len(kind)
        on_gpu = np.ones(len(kind), bool)
        nbytes, size = pa.nulls(len(kind), pa.int64()), pa.nulls(len(kind), pa.int32())
    else:
        return _empty()
    order = np.lexsort((start, host))
    t = pa.table({"rank": np.full(len(order), rank, np.int32), "pg": pa.array(pg, pa.string()).take(order),
                  "kind": pa.array(kind, pa.string()).take(order), "seq": np.zeros(len(order), np.int64),
                  "bytes": nbytes.take(order), "group_size": size.take(order), "host_ns": host[order],
                  "start_ns": start[order], "end_ns": np.maximum(end, start)[order], "on_gpu": on_gpu[order]})
    return t.set_column(3, "seq", pa.array(_sequence(t["pg"], t["kind"]), pa.int64()))


def resequence(coll: pa.Table, labels: list[str | None]) -> pa.Table:
    """Number the collectives within (process group, kind, step) where the step's label is an
    absolute iteration number (``ProfilerStep#N``, ``pastaprof.step#N``: the same on every rank,
    whatever step each rank's profile starts at), within (process group, kind) elsewhere; the
    label used goes to column ``match_step``."""
    key = pa.array([lab if lab and ABSOLUTE_STEP.match(lab) else "" for lab in labels], pa.string())
    coll = coll.append_column("match_step", key)
    return coll.set_column(coll.schema.get_field_index("seq"), "seq",
                           pa.array(_sequence(coll["pg"], coll["kind"], coll["match_step"]), pa.int64()))


def _sequence(*keys: pa.ChunkedArray) -> np.ndarray:
    """The running count of each key combination, in row order (0, 1, 2 ... per key)."""
    code = np.zeros(len(keys[0]), np.int64)
    for k in keys:
        c, names = name_codes(k)
        code = code * (len(names) + 1) + c
    order = np.argsort(code, kind="stable")
    sc = code[order]
    first = np.r_[0, np.flatnonzero(np.diff(sc)) + 1]
    run_start = np.repeat(first, np.diff(np.r_[first, len(sc)]))
    seq = np.empty(len(code), np.int64)
    seq[order] = np.arange(len(code)) - run_start
    return seq


def match(coll: pa.Table) -> tuple[np.ndarray, int]:
    """Instance id of each row (same process group, kind and sequence on different ranks) and the count."""
    if coll.num_rows == 0:
        return np.zeros(0, np.int64), 0
    code = to_np(coll["seq"])
    names = ("pg", "kind", "match_step") if "match_step" in coll.column_names else ("pg", "kind")
    for name in names:
        c, names = name_codes(coll[name])
        code = code * (len(names) + 1) + c
    uniq, inst = np.unique(code, return_inverse=True)
    return inst.reshape(-1), len(uniq)


def bus_bandwidth(kind: str, nbytes: int | None, n: int, transfer_ns: int) -> float | None:
    """Achieved bus bandwidth in GB/s (NCCL-tests' definition) or None when unknown."""
    if not nbytes or transfer_ns <= 0 or n < 2:
        return None
    size = nbytes * n if kind == "allgather" else nbytes  # all-gather: the output is n inputs
    return round(size * BUS_FACTOR.get(kind, lambda _n: 1.0)(n) / transfer_ns, 3)
