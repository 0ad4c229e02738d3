"""gemm -- GEMM health: matmuls that cannot use the GPU's tensor cores well, and why.

Leaf matmul ops (``aten::mm``, ``addmm``, ``bmm``, ``baddbmm``, ``_scaled_mm``: the ops that
launch the GEMM kernels; ``matmul`` / ``linear`` are wrappers around them) are grouped by name,
input shapes and dtypes (table ``gemms``): M, N, K and the batch from the shapes, FLOPs
(2·B·M·N·K per call), the GPU time of the kernels they launched, the achieved TFLOP/s, the
largest power of two (up to 64) dividing M, N and K, and the dominant kernel with the
architecture it was built for (``cutlass_75_...``, ``sm80_xmma_...``, ``nvjet_sm90_...``,
``ampere_...``) and its vector alignment (``_align1``).

Findings, one per cause and location (the op's module path, else its call site, else its name):

``unaligned shape``
    a dimension that is not a multiple of 16 bytes' worth of elements (8 for bf16/fp16, 4 for
    fp32/tf32, 16 for 8-bit types): cuBLAS falls back to narrow-alignment kernels (GPT-2's
    50257-wide LM head runs ``cutlass_75_..._align1`` on an H200).
``fp32 matmul``
    fp32 inputs on a device of compute capability >= 8.0 whose kernels are not TF32 kernels:
    no tensor cores at all.
``old-architecture kernel`` / ``unaligned kernel``
    a GEMM kernel built for an older architecture than the device (from the run's device
    list) or with alignment below 8, launched by ops whose shapes are fine (or unknown).

``impact_ns`` is an estimate: the group's GPU time minus the time its FLOPs would take at the
*reference rate* -- the FLOP-weighted rate this very trace's healthy GEMMs (aligned shapes,
16-bit inputs, kernels for the device's architecture) reached; never negative.  Where the
trace has no healthy GEMM to compare with, an fp32 group counts half its time (TF32 runs
fp32 GEMMs at least twice as fast on every GPU that has it) and the others have impact 0 (``at_stake`` says why).
Findings worth less than ``MIN_SHARE`` of the GPU kernel time are left out.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pyarrow as pa

from pastaprof.tools._timeline_math import fmt_ns
from pastaprof.tools.base import Finding, Report, Tool, sql

MIN_SHARE = 0.01
LEAF_GEMMS = {"aten::mm": (0, 1), "aten::addmm": (1, 2), "aten::bmm": (0, 1), "aten::baddbmm": (1, 2),
              "aten::_scaled_mm": (0, 1)}
ELEMENT_BYTES = {"c10::BFloat16": 2, "c10::Half": 2, "float": 4, "double": 8, "c10::Float8_e4m3fn": 1,
                 "c10::Float8_e5m2": 1, "c10::Float8_e4m3fnuz": 1, "c10::Float8_e5m2fnuz": 1,
                 "signed char": 1, "unsigned char": 1}
DTYPE_NAMES = {"c10::BFloat16": "bf16", "c10::Half": "fp16", "float": "fp32", "double": "fp64"}
_ARCH = re.compile(r"(?:cutlass_|\bsm_?|_sm)(\d{2,3})(?=[_a-z])")
_ARCH_WORDS = {"hopper": 90, "ampere": 80, "turing": 75, "volta": 70, "pascal": 60, "maxwell": 50}
_ALIGN = re.compile(r"_align(\d+)")
GEMM_KERNEL = re.compile(r"gemm|cutlass|nvjet|xmma|cublas|tensorop|s1688|h1688|s884|h884", re.IGNORECASE)
DISPLAY = {"gemms": ["op", "m", "n", "k", "batch", "dtype", "calls", "gpu_ns", "tflops", "multiple", "kernel",
                     "arch", "align"]}


def kernel_arch(name: str) -> int | None:
    """The SM architecture a GEMM kernel was built for (75 for ``cutlass_75_...``), or None."""
    m = _ARCH.search(name)
    if m:
        return int(m.group(1))
    low = name.lower()
    return next((v for w, v in _ARCH_WORDS.items() if low.startswith(w) or f" {w}_" in low), None)


def kernel_align(name: str) -> int | None:
    m = _ALIGN.search(name)
    return int(m.group(1)) if m else None


def gemm_dims(op: str, shapes: str | None) -> tuple[int, int, int, int] | None:
    """(batch, M, N, K) from an op's recorded input shapes, or None when they do not say."""
    if op not in LEAF_GEMMS or not shapes:
        return None
    try:
        s = json.loads(shapes)
        a, b = (s[i] for i in LEAF_GEMMS[op])
    except (ValueError, TypeError, IndexError, KeyError, RecursionError):  # a damaged store's strings
        return None
    ok = (isinstance(a, list) and isinstance(b, list)
          and all(type(x) is int and 0 < x < 1 << 40 for x in (*a, *b)))  # no floats, bools, negatives
    if ok and len(a) == 2 and len(b) == 2 and a[1] == b[0]:
        return 1, a[0], b[1], a[1]
    if ok and len(a) == 3 and len(b) == 3 and a[2] == b[1] and a[0] == b[0]:
        return a[0], a[1], b[2], a[2]
    return None


def _dtype(dtypes: str | None, op: str) -> str | None:
    try:
        d = json.loads(dtypes) if dtypes else None
    except (ValueError, RecursionError):
        return None
    i = LEAF_GEMMS[op][0]  # a trace's dtypes are whatever it wrote: a list of strings or nothing
    return d[i] if isinstance(d, list) and 0 <= i < len(d) and isinstance(d[i], str) else None


def _pow2(*dims: int) -> int:
    m = 64
    while m > 1 and any(d % m for d in dims):
        m //= 2
    return m


def device_arch(devices: list[dict[str, Any]]) -> int | None:
    """The lowest compute capability among the run's devices, as 90 for 9.0."""
    def number(v: Any) -> int | None:  # the manifest is the trace's: any JSON value may be there
        return v if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 100 else None

    caps = []
    for d in devices if isinstance(devices, list) else []:
        if isinstance(d, dict) and number(d.get("computeMajor")) is not None:
            caps.append(number(d.get("computeMajor")) * 10 + (number(d.get("computeMinor", 0)) or 0))
    return min(caps) if caps else None


def _by_shape(rows: list[dict[str, Any]]) -> pa.Table:
    """The per-location groups summed per op, shapes and dtypes (the table users read)."""
    keys = ("op", "m", "n", "k", "batch", "dtype", "multiple", "aligned", "kernel", "arch", "align")
    acc: dict[tuple, dict[str, Any]] = {}
    for r in rows:
        key = (r["op"], r["shapes"], r["dtypes"])
        a = acc.setdefault(key, {**{k: r[k] for k in keys}, "calls": 0, "gpu_ns": 0, "flops": 0, "impact_ns": 0,
                                 "locations": 0, "_top": -1})
        if r["gpu_ns"] > a["_top"]:  # the dominant kernel of the biggest location
            a["kernel"], a["arch"], a["align"], a["_top"] = r["kernel"], r["arch"], r["align"], r["gpu_ns"]
        a["calls"] += r["calls"]
        a["gpu_ns"] += r["gpu_ns"]
        a["locations"] += 1
        a["flops"] = None if r["flops"] is None or a["flops"] is None else a["flops"] + r["flops"]
        a["impact_ns"] = None if r["impact_ns"] is None or a["impact_ns"] is None else a["impact_ns"] + r["impact_ns"]
    out = sorted(acc.values(), key=lambda a: (-a["gpu_ns"], a["op"], str(a["m"]), str(a["n"]), str(a["k"])))
    for a in out:
        a.pop("_top")
        a["tflops"] = round(a["flops"] / a["gpu_ns"] / 1e3, 1) if a["flops"] and a["gpu_ns"] else None
    cols = [*keys[:6], "calls", "gpu_ns", "flops", "tflops", *keys[6:], "impact_ns", "locations"]
    if not out:  # the columns users read, with no rows
        return pa.table({c: pa.array([], pa.string() if c in ("op", "dtype", "kernel") else pa.int64()) for c in cols})
    return pa.Table.from_pylist([{c: a[c] for c in cols} for a in out])


class Gemm(Tool):
    name = "gemm"
    description = ("GEMM health: tensor-core-unfriendly shapes, fp32 matmuls, kernels for an older "
                   "architecture or unaligned, with the time at stake")
    consumes = ("op", "kernel")

    def _groups(self) -> pa.Table:
        con = sql(o=self.table("op"), k=self.table("kernel"))
        names = ", ".join(f"'{n}'" for n in LEAF_GEMMS)
        return con.sql(f"""
            WITH g AS (SELECT rank, id, CAST(name AS VARCHAR) AS op,
                              -- '' for none: calls without shapes group (and join their kernels) too
                              coalesce(CAST(input_shapes AS VARCHAR), '') AS shapes,
                              coalesce(CAST(input_dtypes AS VARCHAR), '') AS dtypes,
                              coalesce(CAST(module AS VARCHAR), CAST(call_site AS VARCHAR), CAST(name AS VARCHAR))
                                  AS location
                       FROM o WHERE CAST(name AS VARCHAR) IN ({names})),
                 kk AS (SELECT g.op, g.shapes, g.dtypes, g.location, g.id, g.rank, CAST(k.name AS VARCHAR) AS kernel,
                               k.end_ns - k.start_ns AS d FROM g JOIN k ON k.op_id = g.id AND k.rank = g.rank),
                 per_kernel AS (SELECT op, shapes, dtypes, location, kernel, sum(d) AS d FROM kk GROUP BY ALL),
                 dom AS (SELECT op, shapes, dtypes, location, first(kernel ORDER BY d DESC, kernel) AS kernel,
                                list(DISTINCT kernel ORDER BY kernel) AS kernels FROM per_kernel GROUP BY ALL),
                 calls AS (SELECT op, shapes, dtypes, location, count(*) AS calls FROM g GROUP BY ALL),
                 t AS (SELECT op, shapes, dtypes, location, sum(d)::BIGINT AS gpu_ns, count(*) AS launches,
                              count(DISTINCT (rank, id)) AS launching_calls FROM kk GROUP BY ALL)
            SELECT c.op, nullif(c.shapes, '') AS shapes, nullif(c.dtypes, '') AS dtypes, c.location, c.calls,
                   coalesce(t.gpu_ns, 0)::BIGINT AS gpu_ns,
                   coalesce(t.launches, 0) AS launches, coalesce(t.launching_calls, 0) AS launching_calls,
                   dom.kernel, dom.kernels
            FROM calls c LEFT JOIN t USING (op, shapes, dtypes, location) LEFT JOIN dom USING (op, shapes, dtypes, location)
            ORDER BY gpu_ns DESC, c.op, c.shapes, c.location
        """).to_arrow_table()

    def report(self) -> Report:
        dev = device_arch(self.info.devices)
        groups = self._groups().to_pylist()
        kernel_ns = int(sql(k=self.table("kernel")).execute(
            "SELECT coalesce(sum(end_ns - start_ns), 0) FROM k").fetchone()[0])
        rows = [self._row(g, dev) for g in groups]
        if not groups:
            return Report(self.name, summary={"gemm_calls": 0, "note": "no matmul ops (aten::mm, addmm, bmm, "
                                              "baddbmm) in this run: GEMM health needs framework ops"})
        if not self.table("kernel").num_rows:  # a CPU-only run: nothing to judge, said in one line
            n = sum(g["calls"] for g in groups)
            return Report(self.name, tables={"gemms": _by_shape([])}, display=DISPLAY, summary={
                "gemm_calls": n, "calls_without_kernels": n, "note": "no GPU kernels in this run: GEMM health needs them"})
        healthy = [r for r in rows if r["flops"] and r["gpu_ns"] and r["healthy"]]
        ref = (sum(r["flops"] for r in healthy) / sum(r["gpu_ns"] for r in healthy)) if healthy else None
        for r in rows:
            r["impact_ns"] = self._impact(r, ref)
        findings = self._findings(rows, kernel_ns, ref, dev)
        table = _by_shape([r for r in rows if r["gpu_ns"]])  # calls that launched no kernel (on the CPU, ...) left out
        summary = {"gemm_calls": sum(g["calls"] for g in groups),
                   "calls_without_kernels": sum(r["calls"] - r["launching_calls"] for r in rows),
                   "calls_without_shapes": sum(r["calls"] for r in rows if r["m"] is None),
                   "gemm_gpu_ns": sum(r["gpu_ns"] for r in rows), "kernel_ns": kernel_ns,
                   "device_arch": dev, "reference_tflops": round(ref / 1e3, 1) if ref else None}
        if dev is None:
            summary["note"] = "the run names no device compute capability: kernel architectures not checked"
        return Report(self.name, tables={"gemms": table}, findings=findings, summary=summary, display=DISPLAY)

    @staticmethod
    def _row(g: dict[str, Any], dev: int | None) -> dict[str, Any]:
        dims = gemm_dims(g["op"], g["shapes"])
        dt = _dtype(g["dtypes"], g["op"])
        size = ELEMENT_BYTES.get(dt or "")
        b, m, n, k = dims if dims else (None, None, None, None)
        flops = 2 * b * m * n * k * g["calls"] if dims else None
        need = 16 // size if size else None
        aligned = None if not (dims and need) else all(x % need == 0 for x in (m, n, k))
        kern = g["kernel"] or ""
        arch, align = kernel_arch(kern), kernel_align(kern)
        old = bool(dev and arch and arch < dev)
        narrow = bool(align is not None and size and align * size < 16)
        fp32_no_tc = bool(dt == "float" and dev and dev >= 80 and g["kernels"]
                          and not any("tf32" in (x or "").lower() for x in g["kernels"]))
        return {**g, "m": m, "n": n, "k": k, "batch": b, "dtype": DTYPE_NAMES.get(dt or "", dt), "flops": flops,
                "tflops": round(flops / g["gpu_ns"] / 1e3, 1) if flops and g["gpu_ns"] else None,
                "multiple": _pow2(m, n, k) if dims else None, "aligned": aligned, "need": need,
                "arch": arch, "align": align, "old": old, "narrow": narrow, "fp32": fp32_no_tc,
                "healthy": bool(aligned and size == 2 and not old and not narrow)}

    @staticmethod
    def _impact(r: dict[str, Any], ref: float | None) -> int | None:
        if r["healthy"] or not r["gpu_ns"]:
            return 0
        if ref and r["flops"]:
            return max(0, int(round(r["gpu_ns"] - r["flops"] / ref)))
        return r["gpu_ns"] // 2 if r["fp32"] else None

    def _findings(self, rows: list[dict[str, Any]], kernel_ns: int, ref: float | None, dev: int | None) -> list[Finding]:
        causes: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for r in rows:
            if r["aligned"] is False:
                cause = "unaligned shape"
            elif r["fp32"]:
                cause = "fp32 matmul"
            elif r["old"] or r["narrow"]:
                cause = "old-architecture kernel" if r["old"] else "unaligned kernel"
            else:
                continue
            causes.setdefault((cause, r["location"]), []).append(r)
        out = []
        for (cause, where), rs in causes.items():
            impacts = [r["impact_ns"] for r in rs if r["impact_ns"] is not None]
            impact = sum(impacts) if impacts else None
            gpu = sum(r["gpu_ns"] for r in rs)
            if (impact if impact is not None else gpu) < MIN_SHARE * max(kernel_ns, 1):
                continue
            out.append(self._finding(cause, where, rs, impact, gpu, ref, dev))
        return out

    @staticmethod
    def _finding(cause: str, where: str, rs: list[dict[str, Any]], impact: int | None, gpu: int,
                 ref: float | None, dev: int | None) -> Finding:
        top = max(rs, key=lambda r: r["gpu_ns"])
        flops = sum(r["flops"] or 0 for r in rs)
        archs = sorted({r["arch"] for r in rs if r["arch"]})
        aligns = sorted({r["align"] for r in rs if r["align"]})
        evidence: dict[str, Any] = {
            "impact_ns": impact, "gpu_ns": gpu, "calls": sum(r["calls"] for r in rs), "op": top["op"],
            "shapes": sorted({r["shapes"] for r in rs if r["shapes"]})[:6], "dtype": top["dtype"],
            "kernel": top["kernel"], "kernel_arch": archs, "kernel_align": aligns, "device_arch": dev,
            "achieved_tflops": round(flops / gpu / 1e3, 1) if flops and gpu else None,
            "reference_tflops": round(ref / 1e3, 1) if ref else None}
        ker = f" ({', '.join(f'sm{a}' for a in archs)}{' align' + '/'.join(map(str, aligns)) if aligns else ''} kernels)"
        if cause == "unaligned shape":
            bad = sorted({x for r in rs for x in (r["m"], r["n"], r["k"]) if x is not None and x % r["need"]})
            pad = [-(-x // 64) * 64 for x in bad]
            evidence["dimensions"], evidence["padded"] = bad, pad
            title = (f"{top['op']} with a {bad[0]}-wide dimension (not a multiple of {top['need']} for "
                     f"{top['dtype']}){ker if archs or aligns else ''}")
            evidence["suggestion"] = (f"Pad the dimension to a multiple of 64 ({bad[0]} -> {pad[0]}, e.g. the "
                                      "vocabulary or hidden size) so cuBLAS can pick aligned tensor-core kernels.")
        elif cause == "fp32 matmul":
            title = f"{top['op']} in fp32 without tensor cores on an sm{dev} GPU"
            evidence["suggestion"] = ("Run it in bf16 (torch.autocast) or allow TF32 "
                                      "(torch.backends.cuda.matmul.allow_tf32 = True).")
        else:
            title = (f"{top['op']} runs a GEMM kernel built for sm{archs[0]} on an sm{dev} GPU" if cause.startswith("old")
                     else f"{top['op']} runs an align{aligns[0]} GEMM kernel")
            evidence["suggestion"] = ("Check the shapes and strides (contiguous, multiples of 8) and the "
                                      "cuBLAS/cuBLASLt version: a kernel for this GPU should serve this GEMM.")
        if impact:
            title += f": ~{fmt_ns(impact)} at stake"
        if impact is None:
            evidence["impact_ns"], evidence["at_stake"] = 0, "no healthy GEMM in this trace to compare with; no saving estimated"
        return Finding("warning", title, evidence, location=where, kind=f"{cause}: {top['op']}")
