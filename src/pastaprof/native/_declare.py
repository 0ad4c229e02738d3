"""ctypes signatures of the native libraries' C functions.

ctypes calls a function without a declared signature with ``int`` arguments and an
``int`` result, which truncates pointers and 64-bit counts; every function the
handlers call is declared here, once, when ``pastaprof.native.load`` opens a library.
"""

from __future__ import annotations

import ctypes
from typing import Any


def declare_torch(lib: Any) -> None:
    """Signatures of the torch observer library (torch_*.cpp): op rows, sampling, allocator trace."""
    c = ctypes
    lib.pp_obs_start.argtypes = [c.c_void_p, c.c_void_p, c.c_int, c.c_int, c.c_int]
    lib.pp_obs_start.restype = c.c_int
    lib.pp_obs_stop.restype = None
    lib.pp_obs_pause.argtypes = [c.c_int]
    lib.pp_obs_pause.restype = None
    lib.pp_obs_module_cell.restype = c.c_void_p
    lib.pp_obs_module_frames.argtypes = [c.py_object, c.py_object]
    lib.pp_obs_module_frames.restype = c.c_int
    lib.pp_obs_forget_module.argtypes = [c.c_void_p]
    lib.pp_obs_forget_module.restype = None
    lib.pp_obs_dropped.restype = c.c_int64
    lib.pp_obs_take.restype = c.c_int64
    lib.pp_obs_pending.restype = c.c_int64
    lib.pp_obs_limits.argtypes = [c.c_int64, c.c_int64]
    lib.pp_obs_limits.restype = None
    lib.pp_obs_max_pending.restype = c.c_int64
    lib.pp_obs_wait.argtypes = [c.c_uint32, c.c_int]
    lib.pp_obs_wait.restype = c.c_uint32
    lib.pp_obs_notify.restype = None
    lib.pp_obs_copy_all.argtypes = [c.c_void_p]
    lib.pp_obs_copy_all.restype = None
    lib.pp_obs_release.restype = None
    lib.pp_obs_ptr_count.restype = c.c_int64
    lib.pp_obs_copy_ptrs.argtypes = [c.c_void_p]
    lib.pp_obs_copy_ptrs.restype = None
    lib.pp_obs_string_count.restype = c.c_int64
    lib.pp_obs_string.argtypes = [c.c_int64]
    lib.pp_obs_string.restype = c.c_char_p
    lib.pp_obs_intern.argtypes = [c.c_char_p]
    lib.pp_obs_intern.restype = c.c_int32
    lib.pp_obs_sampling.argtypes = [c.c_int, c.c_int64, c.c_int64, c.c_int64, c.c_int64]
    lib.pp_obs_sampling.restype = c.c_int
    lib.pp_obs_sampling_stats.argtypes = [c.c_void_p]
    lib.pp_obs_sampling_stats.restype = None
    lib.pp_obs_floor_start.argtypes = [c.c_int]
    lib.pp_obs_floor_start.restype = c.c_uint64
    lib.pp_obs_floor_stop.argtypes = [c.c_uint64]
    lib.pp_obs_floor_stop.restype = None
    lib.pp_mem_start.restype = c.c_int
    lib.pp_mem_error.restype = c.c_char_p
    lib.pp_mem_stop.restype = None
    lib.pp_mem_take.restype = c.c_int64
    lib.pp_mem_copy.argtypes = [c.c_int, c.c_void_p]
    lib.pp_mem_dropped.restype = c.c_int64


def declare_sanitizer(lib: Any) -> None:
    """Signatures of the Compute Sanitizer tool library (sanitizer_tool.cpp): accesses and copies."""
    c = ctypes
    lib.pp_san_configure.argtypes = [c.c_int, c.c_char_p, c.c_char_p, c.c_long, c.c_int, c.c_long, c.c_long,
                                     c.c_long, c.c_int]
    lib.pp_san_configure.restype = c.c_int
    lib.InitializeInjection.restype = c.c_int
    lib.pp_san_set_shards.argtypes = [c.c_int]
    lib.pp_san_set_shards.restype = None
    lib.pp_san_set_enabled.argtypes = [c.c_int]
    lib.pp_san_set_enabled.restype = None
    lib.pp_san_record_copies.argtypes = [c.c_int]
    lib.pp_san_record_copies.restype = c.c_int
    lib.pp_san_set_cubin_dir.argtypes = [c.c_char_p]
    lib.pp_san_set_cubin_dir.restype = None
    lib.pp_san_tensor.argtypes = [c.c_uint64, c.c_uint64, c.c_int]
    lib.pp_san_tensor.restype = None
    lib.pp_san_objects.argtypes = [c.c_void_p, c.c_int64]
    lib.pp_san_objects.restype = c.c_int64
    lib.pp_san_error.restype = c.c_char_p
    lib.pp_san_notes.restype = c.c_int64
    lib.pp_san_note.argtypes = [c.c_int64]
    lib.pp_san_note.restype = c.c_char_p
    lib.pp_san_stat.argtypes = [c.c_int]
    lib.pp_san_stat.restype = c.c_int64
    lib.pp_san_take.argtypes = [c.c_void_p]
    lib.pp_san_take.restype = None
    lib.pp_san_copy.argtypes = [c.c_int, c.c_int, c.c_void_p]
    lib.pp_san_copy.restype = None
    lib.pp_san_copy_addresses.argtypes = [c.c_void_p]
    lib.pp_san_copy_addresses.restype = None
    lib.pp_san_name_count.restype = c.c_int64
    lib.pp_san_demangle.argtypes = [c.c_char_p, c.c_char_p, c.c_int64]
    lib.pp_san_demangle.restype = c.c_int64
    lib.pp_san_name.argtypes = [c.c_int64]
    lib.pp_san_name.restype = c.c_char_p


def declare_cupti(lib: Any) -> None:
    """Signatures of the CUPTI drain library (cupti_drain.c, cupti_callbacks.c): activity columns and callbacks."""
    c = ctypes
    lib.pp_cupti_init.argtypes = [c.c_char_p, c.c_size_t]
    lib.pp_cupti_init.restype = c.c_int
    lib.pp_cupti_register.restype = c.c_int
    lib.pp_cupti_error.restype = c.c_char_p
    lib.pp_cupti_shared_buffers.restype = c.c_int
    lib.pp_cupti_own_clock.restype = c.c_int
    lib.pp_cupti_keep_api.argtypes = [c.c_int, c.c_int, c.c_int]
    lib.pp_cupti_keep_api.restype = None
    lib.pp_cupti_take.argtypes = [c.c_int]
    lib.pp_cupti_take.restype = c.c_int64
    lib.pp_cupti_copy.argtypes = [c.c_int, c.c_int, c.c_void_p]
    lib.pp_cupti_copy.restype = c.c_int
    lib.pp_cupti_release.restype = None
    lib.pp_cupti_stat.argtypes = [c.c_int]
    lib.pp_cupti_stat.restype = c.c_int64
    lib.pp_cupti_string_count.restype = c.c_int64
    lib.pp_cupti_string.argtypes = [c.c_int64]
    lib.pp_cupti_string.restype = c.c_char_p
    lib.pp_cupti_lookup_ext.argtypes = [c.c_void_p, c.c_void_p, c.c_int64]
    lib.pp_cupti_lookup_ext.restype = None
    lib.pp_cupti_push_fn.restype = c.c_void_p
    lib.pp_cupti_configure_uvm.argtypes = [c.c_int]
    lib.pp_cupti_configure_uvm.restype = c.c_int
    lib.pp_cupti_pop_fn.restype = c.c_void_p
    lib.pp_cupti_callbacks_on.restype = c.c_int
    lib.pp_cupti_callbacks_off.restype = c.c_int
    lib.pp_cupti_callback_cbid.argtypes = [c.c_int, c.c_int]
    lib.pp_cupti_callback_cbid.restype = c.c_int
    lib.pp_cupti_sync_cbid.argtypes = [c.c_int, c.c_int, c.c_int, c.c_int]
    lib.pp_cupti_sync_cbid.restype = None
    lib.pp_cupti_sync_rows.argtypes = [c.c_int]
    lib.pp_cupti_sync_rows.restype = None
    lib.pp_cupti_callback_replay.argtypes = [c.c_int, c.c_int, c.c_uint32, c.c_void_p]
    lib.pp_cupti_callback_replay.restype = None
    lib.pp_cupti_callbacks_gate.argtypes = [c.c_int]
    lib.pp_cupti_callbacks_gate.restype = c.c_int
    lib.pp_cupti_callback_stat.argtypes = [c.c_int]
    lib.pp_cupti_callback_stat.restype = c.c_int64
    lib.pp_tls_push.argtypes = [c.c_int, c.c_uint64]
    lib.pp_tls_push.restype = c.c_int
    lib.pp_tls_pop.argtypes = [c.c_int, c.c_void_p]
    lib.pp_tls_pop.restype = c.c_int
