"""The sanitizer handler's host side without a GPU: the live-object tables of the native
tool (real library, built from the nvidia-cuda-sanitizer-api wheel's headers) and the
conversion of its per-launch columns into access events.  The device side -- patches,
reduction, exact counts, GPU vs CPU paths -- is checked on the H200 by bench/access_gpu.py."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from pastaprof.handlers.sanitizer import LAUNCH_COLS, OBJ_COLS, PC_COLS, SanitizerHandler
from pastaprof.live.config import CaptureConfig


@pytest.fixture(scope="module")
def lib():
    from pastaprof import native

    try:
        return native.load("sanitizer")
    except RuntimeError as e:
        pytest.skip(f"sanitizer tool not buildable here: {e}")


def _objects(lib) -> list[tuple[int, int]]:
    buf = np.zeros(2 * 64, np.uint64)
    n = lib.pp_san_objects(buf.ctypes.data_as(ctypes.c_void_p), 64)
    return [(int(buf[2 * i]), int(buf[2 * i + 1])) for i in range(min(n, 64))]


def test_live_tables_stay_disjoint(lib):
    """The device's binary search needs disjoint entries: a tensor whose free was never seen,
    or a block split differently, must not leave an overlapping entry behind."""
    base = 0x7000_0000_0000
    lib.pp_san_tensor(base, 4096, 1)
    lib.pp_san_tensor(base + 8192, 4096, 1)
    assert _objects(lib) == [(base, base + 4096), (base + 8192, base + 12288)]
    lib.pp_san_tensor(base + 2048, 8192, 1)          # overlaps both: both stale entries go
    assert _objects(lib) == [(base + 2048, base + 10240)]
    lib.pp_san_tensor(base + 2048, 0, 0)             # its free
    lib.pp_san_tensor(base + 10240, 1024, 1)         # touching, not overlapping: kept
    lib.pp_san_tensor(base + 11264, 1024, 1)
    assert _objects(lib) == [(base + 10240, base + 11264), (base + 11264, base + 12288)]
    assert lib.pp_san_stat(4) == 2
    for b in (base + 10240, base + 11264):
        lib.pp_san_tensor(b, 0, 0)
    assert _objects(lib) == [] and lib.pp_san_stat(4) == 0


def test_launch_columns_become_access_events(lib):
    """Columns laid out as sanitizer_tool.cpp's launch_end writes them (two launches, one with
    a page histogram and an unattributed row) -> access_summary / access_pc rows."""
    h = SanitizerHandler(CaptureConfig(page_bytes=4096), rank=3)
    h.lib = lib
    assert lib.pp_san_name_count() == 0          # no launch here: the names are the test's
    h._names = ["vadd", "strided"]
    launch = {c: np.zeros(2, np.int64) for c in LAUNCH_COLS}
    launch.update(correlation=np.array([7, 8]), start_ns=np.array([100, 200]), end_ns=np.array([150, 260]),
                  name_id=np.array([0, 1]), mode=np.array([1, 1]), live_bytes=np.array([12288, 4096]),
                  lanes=np.array([96, 32]), unattributed_lanes=np.array([0, 32]),
                  unattributed_sample=np.array([0, 0xDEAD0]))
    obj = {"correlation": [8, 7, 7], "object_address": [0, 0x1000, 0x4000], "object_bytes": [0, 8192, 4096],
           "kind": [-1, 0, 1], "reads": [32, 64, 0], "writes": [0, 0, 32], "bytes_read": [128, 256, 0],
           "bytes_written": [0, 0, 128], "sectors": [32, 8, 4], "page_start": [-1, 0, 2], "page_len": [0, 2, 1]}
    pages = np.array([40, 24, 32])
    pc = {"correlation": [7], "pc": [0x90], "requests": [3], "lanes": [96], "bytes": [384], "sectors": [12],
          "reads": [64], "writes": [32]}
    tables = [dict(enumerate(launch[c] for c in LAUNCH_COLS)),
              dict(enumerate(np.asarray(obj[c]) for c in OBJ_COLS)), {0: pages},
              dict(enumerate(np.asarray(pc[c]) for c in PC_COLS))]
    name_of = (launch["correlation"], np.arange(2))
    lc = dict(zip(LAUNCH_COLS, tables[0].values()))
    out = h._gpu_tables(tables, lc, name_of)
    s = out["access_summary"].to_pylist()
    assert [r["name"] for r in s] == ["strided", "vadd", "vadd"] and [r["rank"] for r in s] == [3, 3, 3]
    assert [r["start_ns"] for r in s] == [200, 100, 100] and [r["live_bytes"] for r in s] == [4096, 12288, 12288]
    assert s[0]["object_address"] is None and s[0]["object_kind"] is None and s[0]["page_counts"] is None
    assert (s[1]["object_kind"], s[1]["page_counts"], s[1]["reads"]) == ("tensor", [40, 24], 64)
    assert (s[2]["object_kind"], s[2]["page_counts"], s[2]["writes"]) == ("allocation", [32], 32)
    p = out["access_pc"].to_pylist()
    assert len(p) == 1 and p[0]["name"] == "vadd" and p[0]["pc"] == 0x90 and p[0]["sectors"] == 12


KERNELS = """extern "C" __global__ void strided(const float* x, float* out, long m, long s) {
  long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
  if (i < m)
    out[i] = x[i * s];
}

extern "C" __global__ void vadd(const float* a, const float* b, float* c, long n) {
  long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
  if (i < n)
    c[i] = a[i] + b[i];
}
"""


@pytest.fixture(scope="module")
def cubin(tmp_path_factory):
    """A real cubin with line info (nvcc -lineinfo), as the sanitizer hands module images over."""
    import subprocess

    pytest.importorskip("elftools")
    from pastaprof.native import _nvcc

    nvcc = _nvcc()
    if nvcc is None:
        pytest.skip("no nvcc")
    d = tmp_path_factory.mktemp("cubin")
    (d / "k.cu").write_text(KERNELS)
    r = subprocess.run([nvcc, "-cubin", "-arch=sm_90", "-lineinfo", "-o", str(d / "k.cubin"), str(d / "k.cu")],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"nvcc failed: {r.stderr[-300:]}")
    return d / "k.cubin"


def test_pcs_get_their_source_lines_from_the_cubin(cubin):
    from pastaprof.processor.lines import line_table, source_lines

    src = str(cubin.with_name("k.cu"))
    table = line_table(cubin.read_bytes())
    assert set(table) == {"strided", "vadd"}
    for fn, lines in (("strided", range(1, 6)), ("vadd", range(7, 12))):
        offsets, where = table[fn]
        assert offsets[0] == 0 and (np.diff(offsets) > 0).all()
        assert {w for w in where} <= {f"{src}:{n}" for n in lines}          # each function its own lines
        assert f"{src}:{lines[3]}" in where                                   # the load/store line
        mid = (offsets[:-1] + offsets[1:]) // 2
        assert source_lines(str(cubin), fn, mid) == where[:-1]                # a PC inside a line's range
    assert source_lines(str(cubin), "nope", np.array([0])) == [None]
    assert line_table(b"not an elf") == {} and line_table(cubin.read_bytes()[:200]) == {}


def test_access_pc_rows_carry_the_source_line_of_a_kept_image(cubin, tmp_path, lib):
    """The handler's lookup: the image kept as _cubins/<hash>.cubin, the launch's module hash and
    function name -> access_pc.source."""
    from pastaprof.processor.lines import line_table

    h = SanitizerHandler(CaptureConfig(), rank=0, out=tmp_path)
    h.lib = lib
    h._names = ["vadd"]
    h.cubins.mkdir()
    (h.cubins / f"{0x1234:016x}.cubin").write_bytes(cubin.read_bytes())
    offsets, where = line_table(cubin.read_bytes())["vadd"]
    launch = {c: np.zeros(1, np.int64) for c in LAUNCH_COLS}
    launch.update(correlation=np.array([5]), module_hash=np.array([0x1234]))
    lc = dict(launch)
    pcs = np.array([offsets[3], (offsets[3] + offsets[4]) // 2])
    got = h._sources(np.array([5, 5]), pcs, lc, (lc["correlation"], np.arange(1))).to_pylist()
    assert got == [where[3], where[3]]
    lc["module_hash"] = np.array([0])
    assert h._sources(np.array([5]), pcs[:1], lc, (lc["correlation"], np.arange(1))).to_pylist() == [None]


def test_a_kernel_regex_the_c_side_cannot_compile_is_named(lib):
    """--kernels is checked with Python's re before the program starts; the sanitizer selects
    launches with POSIX regcomp, which rejects some of Python's syntax: say which, don't guess."""
    patch = b"/nonexistent.fatbin"
    assert lib.pp_san_configure(1, patch, b"gemm|conv[0-9]+", 1, 12, 4096, 1 << 20, 1 << 10, 31) == 0
    assert lib.pp_san_configure(1, patch, b"(?i)gemm", 1, 12, 4096, 1 << 20, 1 << 10, 31) != 0
    assert "not a POSIX extended regular expression" in lib.pp_san_error().decode()


def test_drain_reads_every_table_of_the_library(lib):
    """pp_san_take writes one count per table: the handler must give it room for all of them."""
    from pastaprof.handlers.sanitizer import NCOLS

    h = SanitizerHandler(CaptureConfig(), rank=0)
    h.lib = lib
    tables, addrs = h._take()
    assert len(tables) == len(NCOLS) == 7 and addrs.shape == (0, 32)
    assert [len(t) for t in tables] == list(NCOLS) and all(len(c) == 0 for t in tables for c in t.values())
    assert h.drain() == {}


def test_copies_seen_by_the_sanitizer_become_memcpy_and_memset_rows():
    """With the sanitizer subscribed CUPTI cannot run; copies then come from the sanitizer's
    API callbacks, with host times (laid out as sanitizer_tool.cpp's copy_event writes them)."""
    h = SanitizerHandler(CaptureConfig(), rank=2)
    cols = {"start_ns": np.array([10, 20, 30]), "kind": np.array([0, 1, 0]), "bytes": np.array([4096, 256, 64]),
            "direction": np.array([2, 0, 4]), "stream": np.array([7, 7, 0]), "dst": np.array([1, 2, 3]),
            "src": np.array([4, 0, 5])}
    out = h._copies(cols)
    mc, ms = out["memcpy"].to_pylist(), out["memset"].to_pylist()
    assert [(r["start_ns"], r["end_ns"], r["bytes"], r["direction"], r["rank"]) for r in mc] == \
        [(10, 10, 4096, "HtoD", 2), (30, 30, 64, "DtoD", 2)]
    assert [(r["start_ns"], r["bytes"], r["stream"]) for r in ms] == [(20, 256, 7)]
    assert mc[0]["name"] == "memcpy (host-side, sanitizer)"
    assert h._copies({k: v[:0] for k, v in cols.items()}) == {}


def test_kernel_names_are_shown_demangled(lib):
    """The driver names kernels as mangled symbols; events show them as CUPTI and Kineto do,
    while the mangled name stays the key into the module image (line info)."""
    h = SanitizerHandler(CaptureConfig(), rank=0)
    h.lib = lib
    assert h.demangle("_Z7stridedPKfPfll") == "strided(float const*, float*, long, long)"
    assert h.demangle("vadd") == "vadd"
    long_name = "_Z" + "3abc" * 2000 + "v"  # not valid: returned as is, however long
    assert h.demangle(long_name) == long_name


def test_per_pc_table_only_for_tools_that_read_it(monkeypatch):
    """The per-PC probe is the patch's heaviest part: on only when a selected tool reads
    access_pc (coalescing), unless PASTAPROF_SAN_PCS says otherwise."""
    from pastaprof.handlers.sanitizer import pc_slots
    from pastaprof.live.wiring import _consumed_kinds

    monkeypatch.delenv("PASTAPROF_SAN_PCS", raising=False)
    counting = _consumed_kinds([], ("working_set", "hotness"))
    assert "access_summary" in counting and "access_pc" not in counting
    assert pc_slots("access_pc" in counting) == 0
    assert pc_slots("access_pc" in _consumed_kinds([], ("working_set", "coalescing"))) == 4096
    monkeypatch.setenv("PASTAPROF_SAN_PCS", "1024")
    assert pc_slots(False) == 1024
    monkeypatch.setenv("PASTAPROF_SAN_PCS", "0")
    assert pc_slots(True) == 0
