"""The PyTorch handler's native path: ops from a C++ RecordFunction observer and
caching-allocator events from a C++ trace tracker (native/torch_memory.cpp).

Why: the Python ``TorchDispatchMode`` costs ~4-8 us per op and ``_snapshot()``
builds a Python dict per allocator entry; the observer costs ~1-2 us per op on
the CPU (shapes and call site included) and the tracker ~0.1 us per block event,
with nothing per event in Python.  Python only drains whole columns.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np
import pyarrow as pa

from pastaprof.native import copy_all_columns, copy_columns

# Column order of torch_observer.cpp's OpCol / torch_memory.cpp's MemCol.
OP_COLS = ("start_ns", "end_ns", "tid", "id", "parent_id", "depth", "sequence_id", "is_backward", "name",
           "input_shapes", "input_dtypes", "module", "call_site", "n_ptrs")
MEM_COLS = ("start_ns", "device", "stream", "address", "bytes", "action")

# --shapes sample (native/torch_sampling.cpp): every op's inputs for the first FIRST ops, then
# windows of WINDOW consecutive ops about every PERIOD ops, and CHASE ops when an op and call site
# without sampled shapes appears (at most one such window per 8 x CHASE ops).
SHAPES_MODES = {"none": 0, "all": 1, "sample": 2}
SAMPLE_FIRST, SAMPLE_PERIOD, SAMPLE_WINDOW, SAMPLE_CHASE = 20_000, 2_048, 32, 2_048
SAMPLE_RULE = (f"every op's inputs for the first {SAMPLE_FIRST:,} ops, then {SAMPLE_WINDOW} consecutive ops "
               f"about every {SAMPLE_PERIOD:,}, and {SAMPLE_CHASE:,} ops after an op and call site without shapes")


class NativeOps:
    """Drains the observer's columns into ``op`` (and ``tensor``) tables."""

    def __init__(self, lib: Any, rank: int) -> None:
        self.lib = lib
        self.rank = rank
        self._strings = pa.array([], pa.string())  # all interned strings so far (ids index it)
        self._path_ids: dict[str, int] = {}
        self.mem = False
        self.mem_error: str | None = None
        self.observing = False

    def start(self, push: int | None, pop: int | None, ext_kind: int, memory: bool, shapes: str = "all",
              call_sites: bool = True, observe: bool = True) -> str | None:
        """Start observing (ops unless not `observe`, allocator events if `memory`); `shapes`:
        of which ops inputs are boxed and read (SHAPES_MODES).  Returns a status line for what
        could not start, else None."""
        self.observing = observe
        if observe:
            mode = SHAPES_MODES[shapes]
            if mode:
                self.lib.pp_obs_sampling(mode, SAMPLE_FIRST, SAMPLE_PERIOD, SAMPLE_WINDOW, SAMPLE_CHASE)
            self.lib.pp_obs_start(push, pop, ext_kind, 3 if mode else 0, int(call_sites))  # shapes, pointers
        if memory:
            if not getattr(self.lib, "has_cuda", False):
                return "native allocator tracker unavailable (CUDA headers not found at build)"
            import torch

            # The caching allocator's per-device parts exist only once CUDA is initialized, and a
            # tracker attached earlier is lost: attach right after torch's lazy CUDA init.
            self.mem = True
            torch.cuda._lazy_call(self._attach_allocator)
        return None

    def sampling(self) -> dict[str, int]:
        """Ops the observer entered, how many with their inputs, and the sampler's windows."""
        v = (ctypes.c_int64 * 5)()
        self.lib.pp_obs_sampling_stats(v)
        return {"ops": v[0], "ops_with_shapes": v[1], "windows": v[2], "chase_windows": v[3], "toggles": v[4]}

    def _attach_allocator(self) -> None:
        """At torch's lazy CUDA init.  A program that swapped in its own allocator (a
        CUDAPluggableAllocator, e.g. cudaMallocManaged) has no trace trackers: say so once,
        record the rest."""
        if self.lib.pp_mem_start() != 0:
            self.mem = False
            self.mem_error = (f"tensor events not recorded: {self.lib.pp_mem_error().decode(errors='replace')}"
                              " (the program uses its own CUDA allocator)")
            from pastaprof.live.messages import notice

            notice(self.mem_error)

    def pause(self, paused: bool) -> None:
        """Take the op callback out of (or back into) PyTorch's RecordFunction, for capture
        gated at the source (see TorchHandler.set_gate)."""
        if self.observing:
            self.lib.pp_obs_pause(int(paused))

    def stop(self) -> None:
        if self.observing:
            self.lib.pp_obs_stop()
        if self.mem:
            self.lib.pp_mem_stop()

    def intern(self, text: str) -> int:
        """The id of a string in the observer's table (module paths)."""
        i = self._path_ids.get(text)
        if i is None:
            i = self._path_ids[text] = self.lib.pp_obs_intern(text.encode("utf-8", "replace"))
        return i

    def module_frames(self, call_code: Any, namer: Any) -> bool:
        """Module paths read from the frames of ``call_code`` (torch's ``Module._call_impl``)
        at each top-level op, new (parent path, module) pairs named by ``namer``; None, None
        turns it off.  False where the library cannot read frames (the hooks stay)."""
        return self.lib.pp_obs_module_frames(call_code, namer) == 0

    def forget_module(self, module_id: int) -> None:
        self.lib.pp_obs_forget_module(module_id)

    def module_cell(self) -> ctypes.c_int32:
        """The calling thread's current module path id, as a writable ctypes cell."""
        return ctypes.c_int32.from_address(self.lib.pp_obs_module_cell())

    @property
    def dropped(self) -> int:
        return int(self.lib.pp_obs_dropped()) + int(self.lib.pp_mem_dropped())

    def _strings_table(self) -> pa.Array:
        """The interned strings, extended by the ones new since the last drain (only those
        cross ctypes; the array is not rebuilt)."""
        n = self.lib.pp_obs_string_count()
        if n > len(self._strings):
            new = [self.lib.pp_obs_string(i).decode("utf-8", "replace") for i in range(len(self._strings), n)]
            self._strings = pa.concat_arrays([self._strings, pa.array(new, pa.string())])
        return self._strings

    def drain(self) -> dict[str, pa.Table]:
        out: dict[str, pa.Table] = {}
        lib = self.lib
        n = lib.pp_obs_take()
        if n:
            cols = copy_all_columns(lib.pp_obs_copy_all, OP_COLS, n)
            ptrs = np.empty(lib.pp_obs_ptr_count(), np.int64)
            lib.pp_obs_copy_ptrs(ptrs.ctypes.data_as(ctypes.c_void_p))
            lib.pp_obs_release()
            offsets = np.zeros(n + 1, np.int32)
            np.cumsum(cols["n_ptrs"], out=offsets[1:])
            strings = self._strings_table()

            def text(codes: np.ndarray, dictionary: bool) -> pa.Array:
                if dictionary:
                    return pa.DictionaryArray.from_arrays(pa.array(codes.astype(np.int32), mask=codes < 0), strings)
                return strings.take(pa.array(codes, pa.int64(), mask=codes < 0))

            ids = pa.array(cols["id"], pa.int64())
            parent = cols["parent_id"]
            out["op"] = pa.table({
                "start_ns": pa.array(cols["start_ns"]), "end_ns": pa.array(cols["end_ns"]),
                "rank": pa.array(np.full(n, self.rank, np.int32)), "tid": pa.array(cols["tid"]),
                "id": ids, "external_id": ids, "parent_id": pa.array(parent, pa.int64(), mask=parent < 0),
                "depth": pa.array(cols["depth"].astype(np.int32)),
                "sequence_id": pa.array(cols["sequence_id"], pa.int64(), mask=cols["sequence_id"] < 0),
                "is_backward": pa.array(cols["is_backward"].astype(bool)),
                "name": text(cols["name"], True), "input_shapes": text(cols["input_shapes"], True),
                "input_dtypes": text(cols["input_dtypes"], True), "module": text(cols["module"], True),
                "call_site": text(cols["call_site"], True),
                "input_ptrs": pa.ListArray.from_arrays(pa.array(offsets), pa.array(ptrs)),
            })
        if self.mem:
            m = lib.pp_mem_take()
            if m:
                cols = copy_columns(lib.pp_mem_copy, MEM_COLS, m)
                block = np.abs(cols["action"]) == 1  # tensor blocks; segments (+-2) are reserved memory
                sign = np.sign(cols["action"][block])
                t = cols["start_ns"][block]
                k = int(block.sum())
                out["tensor"] = pa.table({
                    "start_ns": t, "end_ns": t, "device": cols["device"][block].astype(np.int32),
                    "stream": cols["stream"][block], "address": pa.array(cols["address"][block].astype(np.uint64)),
                    "bytes": cols["bytes"][block] * sign, "rank": pa.array(np.full(k, self.rank, np.int32)),
                    "name": _constant("[memory]", k), "device_type": _constant("cuda", k),
                })
                if not k:
                    del out["tensor"]
        return out


def _constant(value: str, n: int) -> pa.Array:
    return pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, np.int32)), pa.array([value]))
