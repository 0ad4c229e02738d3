"""Flush-time processing of the session's tables: op ids for GPU work (CUPTI external
correlation, with late records held one flush), and the recording windows of the control
vocabulary (ranges, steps) applied by launch time.

A mixin of ``Session``: the methods use its ``_lock``, ``_windows``, ``_ext``, ``_held``,
``_unlinked``, ``_launches`` and counters.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from pastaprof.processor.intervals import in_windows
from pastaprof.processor.link import map_keys

EXTERNAL = "_external"  # CUPTI external-correlation records: launch correlation -> op id
EXT_KEEP = 1 << 20  # external-correlation records kept for kernels that arrive late


def _np_i64(col) -> np.ndarray:
    return np.asarray(col.fill_null(-1).to_numpy(zero_copy_only=False), dtype=np.int64)


def _kept(t: pa.Table, keep: np.ndarray) -> pa.Table:
    """``t.filter(keep)``, as a zero-copy slice where the kept rows are one run (a flush that
    a window's start or end cuts in two, the usual case): a filter copies the table (a 10,000-
    row op table at the final flush: 0.4 ms, and 13-19 ms where its memory was fresh)."""
    idx = np.flatnonzero(keep)
    if not len(idx):
        return t.slice(0, 0)
    if idx[-1] - idx[0] + 1 == len(idx):
        return t.slice(int(idx[0]), len(idx))
    return t.filter(pa.array(keep))


class Linking:
    def _in_windows(self, t: np.ndarray) -> np.ndarray:
        """Which times fall in a recording window (closed or still open)."""
        with self._lock:
            wins = list(self._windows)
            if self._gate_open_since is not None:
                wins.append((self._gate_open_since, np.iinfo(np.int64).max))
        if not wins:
            return np.zeros(len(t), dtype=bool)
        return in_windows(t, np.array([w[0] for w in wins], dtype=np.int64), np.array([w[1] for w in wins], dtype=np.int64))


    def _link_ops(self, tables: dict[str, pa.Table], final: bool = False) -> None:
        """op_id of GPU work and launch calls: the op id pushed as CUPTI external
        correlation around the launch.  A kernel's record may arrive a flush after
        its correlation record, so recent correlations are kept (bounded); and its
        correlation record may arrive a flush after the kernel (CUPTI delivers
        per-thread and per-device buffers independently), so GPU work without an op
        is held back for one flush before it is stored unlinked."""
        held, self._held = self._held, {}
        for kind, t in held.items():
            tables[kind] = pa.concat_tables([t, tables[kind].cast(t.schema)]) if kind in tables else t
        ext = tables.pop("external", None)
        if ext is not None and ext.num_rows:
            if len(self._unlinked) and np.isin(self._unlinked, _np_i64(ext["correlation"])).any():
                self._relink_needed = True
            # Stored too: compaction re-links with all of them (a kernel's record can come
            # in a later buffer than its launch's correlation record) -- needed from the final
            # flush only if a re-link is (this write was 1 of ~10 parts on the exit path).
            if not final or self._relink_needed:
                self._write_part(EXTERNAL, ext.append_column("pid", pa.array(np.full(ext.num_rows, self.pid,
                                                                                     np.int64))), self._part)
            self._ext = pa.concat_tables([self._ext, ext]) if self._ext is not None else ext
            if self._ext.num_rows > EXT_KEEP:
                self._ext = self._ext.slice(self._ext.num_rows - EXT_KEEP)
        keys = _np_i64(self._ext["correlation"]) if self._ext is not None else np.zeros(0, np.int64)
        vals = _np_i64(self._ext["external_id"]) if self._ext is not None else np.zeros(0, np.int64)
        held_kinds = ("kernel", "memcpy", "memset")
        for kind in ("kernel", "memcpy", "memset", "api"):
            t = tables.get(kind)
            if t is not None and t.num_rows:
                corr = _np_i64(t["correlation"])
                op = map_keys(corr, keys, vals)
                if "op_id" in t.column_names:  # rows conformed by their handler (e.g. the sanitizer's copies)
                    op = np.where(op >= 0, op, _np_i64(t["op_id"]))
                    t = t.drop_columns(["op_id"])
                tables[kind] = t.append_column("op_id", pa.array(op, pa.int64(), mask=op < 0))
                unlinked = (op < 0) & (corr > 0)
                # hold only where an op could still claim it: this process tags launches with
                # op ids (else, e.g. CuPy programs, holding would only delay the write)
                if not final and kind in held_kinds and self._ext is not None:
                    fresh = np.ones(len(op), dtype=bool)
                    if kind in held:
                        fresh[:held[kind].num_rows] = False
                    hold = unlinked & fresh
                    if hold.any():
                        self._held[kind] = t.filter(pa.array(hold))
                        tables[kind] = tables[kind].filter(pa.array(~hold))
                        unlinked &= ~hold
                missing = corr[unlinked]
                if len(missing):
                    self._unlinked = np.concatenate([self._unlinked, missing])[-EXT_KEEP:]

    def _gated(self, tables: dict[str, pa.Table]) -> dict[str, pa.Table]:
        """Keep GPU work whose launch (or start) lies in a recording window.  Launch
        times of recent API calls are kept across flushes (bounded), since GPU work can
        arrive a flush later than its launch call."""
        if not self.config.ranges and self.config.steps is None:
            return tables
        api = tables.get("api")
        if api is not None and api.num_rows:
            new = (_np_i64(api["correlation"]), _np_i64(api["start_ns"]))
            old = self._launches
            self._launches = (np.concatenate([old[0], new[0]])[-EXT_KEEP:], np.concatenate([old[1], new[1]])[-EXT_KEEP:])
        out = {}
        for kind, t in tables.items():
            if kind == "range" or kind.startswith("access_") or t.num_rows == 0:
                out[kind] = t  # access_*: gated at the source (only selected launches are instrumented)
                continue
            when = _np_i64(t["start_ns"])
            if kind != "api" and len(self._launches[0]) and "correlation" in t.column_names:
                launch = map_keys(_np_i64(t["correlation"]), *self._launches)
                when = np.where(launch >= 0, launch, when)
            keep = self._in_windows(when)
            dropped = len(keep) - int(np.count_nonzero(keep))
            self.filtered_out += dropped
            self.filtered_by_kind[kind] = self.filtered_by_kind.get(kind, 0) + dropped
            out[kind] = t if not dropped else _kept(t, keep)
        return out
