"""Protobuf wire-format encoding, scalar and vectorized with NumPy.

Why this module exists: the Perfetto export writes one small protobuf message per
event, millions of them, and building each through Python objects (or the
protobuf runtime) would cost a Python object per event.  The functions here
encode whole columns of field values at once, so the per-event work stays in
NumPy.  They know only the wire format -- varints, tags, length-delimited and
fixed64 fields -- and nothing of any message schema: which fields make up which
Perfetto message, and their numbers, live in ``perfetto_wire.py``.

Three layers, from the simplest to the fastest per row:

* scalar (``pvarint``, ``tag``, ``fint``, ``fbytes``, ``fstr``): ``bytes``, for the
  few messages written once or per track (descriptors, headers);
* *segments* (``varint``, ``vfield``, ``lfield``, ``rowcat``): variable-length rows
  kept flat, each row's bytes packed back to back (used for the interned names);
* padded *parts* (``p_const``, ``p_varint``, ``p_field``, ``p_fixed64s``,
  ``p_lens``, ``assemble``): each field of a batch of rows as a padded
  (rows x bytes) matrix with a validity mask -- varints, nested lengths and
  repeated fixed64 lists computed column-wise -- so that one boolean gather of
  the concatenated matrices yields the encoded rows.

Negative integers are encoded as ten-byte two's complement varints, as int64 /
uint64 / int32 fields carry them (there are no zigzag ``sint`` fields here).
"""

from __future__ import annotations

import numpy as np

# --- scalar encoding ------------------------------------------------------------------------

def pvarint(v: int) -> bytes:
    v &= (1 << 64) - 1
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def tag(field: int, wire: int) -> bytes:
    return pvarint(field << 3 | wire)


def fint(field: int, v: int) -> bytes:
    return tag(field, 0) + pvarint(v)


def fbytes(field: int, b: bytes) -> bytes:
    return tag(field, 2) + pvarint(len(b)) + b


def fstr(field: int, s: str) -> bytes:
    return fbytes(field, s.encode())


# --- vectorized protobuf encoding -----------------------------------------------------------
# A *segment* is (flat uint8 bytes, lens int64): row r owns lens[r] consecutive bytes of flat.
# A *part* of a row layout is a segment or a constant ``bytes`` present in every row.

Segment = tuple[np.ndarray, np.ndarray]


def varint_rows(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Varints of ``values`` (two's complement for negatives, as int64/uint64 fields
    encode them): a left-aligned (n, width) byte matrix and each row's length."""
    v = np.asarray(values)
    u = v if v.dtype == np.uint64 else v.astype(np.int64, copy=False).view(np.uint64)
    n = u.size
    nbytes = np.ones(n, np.int64)
    for k in range(1, 10):
        big = u >= np.uint64(1 << (7 * k))
        if not big.any():
            break
        nbytes += big
    width = int(nbytes.max()) if n else 1
    mat = np.empty((n, width), np.uint8)
    for k in range(width):
        mat[:, k] = ((u >> np.uint64(7 * k)) & np.uint64(0x7F)).astype(np.uint8) | ((nbytes > k + 1).astype(np.uint8) << 7)
    return mat, nbytes


def varint(values: np.ndarray) -> Segment:
    mat, nbytes = varint_rows(values)
    if mat.shape[1] == 1:
        return mat.reshape(-1), nbytes
    return mat[np.arange(mat.shape[1]) < nbytes[:, None]], nbytes


def rowcat(parts: list[bytes | Segment], n: int) -> Segment:
    """Concatenate the parts row by row: row r = part0[r] + part1[r] + ..."""
    lens = np.zeros(n, np.int64)
    for p in parts:
        lens += len(p) if isinstance(p, bytes) else p[1]
    out = np.empty(int(lens.sum()), np.uint8)
    cur = np.cumsum(lens) - lens
    for p in parts:
        if isinstance(p, bytes):
            if p and n:
                out[cur[:, None] + np.arange(len(p))] = np.frombuffer(p, np.uint8)
                cur += len(p)
            continue
        flat, plens = p
        if flat.size:
            dest = np.repeat(cur - (np.cumsum(plens) - plens), plens)
            dest += np.arange(flat.size)
            out[dest] = flat
        cur += plens
    return out, lens


def vfield(field: int, values: np.ndarray) -> Segment:
    return rowcat([tag(field, 0), varint(values)], len(values))


def lfield(field: int, seg: Segment) -> list[bytes | Segment]:
    return [tag(field, 2), varint(seg[1]), seg]


# Bulk packets use a padded layout instead: a *part* is (bytes (n, w), valid (n, w) or None
# for all valid, lens (n,)); a row is the valid bytes of its parts in order, so the encoded
# rows of a list of parts are ``hstack(bytes)[hstack(valid)]`` -- one boolean gather.

Part = tuple[np.ndarray, "np.ndarray | None", np.ndarray]


def p_const(b: bytes, n: int, present: np.ndarray | None = None) -> Part:
    mat = np.broadcast_to(np.frombuffer(b, np.uint8), (n, len(b)))
    if present is None:
        return mat, None, np.full(n, len(b), np.int64)
    return mat, np.broadcast_to(present[:, None], mat.shape), present * len(b)


def p_varint(values: np.ndarray, present: np.ndarray | None = None) -> Part:
    mat, nbytes = varint_rows(values)
    valid = np.arange(mat.shape[1]) < nbytes[:, None]
    if present is None:
        return mat, (None if mat.shape[1] == 1 else valid), nbytes
    return mat, valid & present[:, None], np.where(present, nbytes, 0)


def p_field(field: int, values: np.ndarray, present: np.ndarray | None = None) -> list[Part]:
    return [p_const(tag(field, 0), len(values), present), p_varint(values, present)]


def p_fixed64s(field: int, counts: np.ndarray, first: np.ndarray) -> list[Part]:
    """Per row, ``counts[r]`` entries of a repeated fixed64 field: first[r], first[r] + 1, ..."""
    n, width = len(counts), int(counts.max()) if len(counts) else 0
    if width == 0:
        return []
    key = np.frombuffer(tag(field, 1), np.uint8)
    k = len(key) + 8
    mat = np.empty((n, width, k), np.uint8)
    mat[:, :, :len(key)] = key
    ids = (first[:, None] + np.arange(width)).astype("<u8")
    mat[:, :, len(key):] = ids.view(np.uint8).reshape(n, width, 8)
    valid = np.repeat(np.arange(width) < counts[:, None], k, axis=1)
    return [(mat.reshape(n, width * k), valid, counts.astype(np.int64) * k)]


def p_lens(parts: list[Part]) -> np.ndarray:
    return sum((p[2] for p in parts[1:]), parts[0][2].copy())


def assemble(parts: list[Part]) -> np.ndarray:
    mat = np.concatenate([p[0] for p in parts], axis=1)
    if all(p[1] is None for p in parts):
        return mat.reshape(-1)
    valid = np.concatenate([np.ones(p[0].shape, bool) if p[1] is None else p[1] for p in parts], axis=1)
    return mat[valid]
