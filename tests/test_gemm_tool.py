"""The gemm tool on real H200 traces: per-shape GPU time, FLOPs and the impact estimate checked
against a plain-Python join of the raw Kineto JSON (op External id <- runtime call <- kernel
correlation), the reference rate recomputed from the healthy GEMMs independently."""

from __future__ import annotations

import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
from conftest import interval_ns as ival
from conftest import raw_events as load

import pastaprof
from pastaprof.tools.gemm import device_arch, gemm_dims, kernel_align, kernel_arch

DATA = Path(__file__).parent / "data"
EXAMPLE = Path(pastaprof.__file__).parent / "data" / "example_gpt2_train_3steps.pt.trace.json.gz"
OPERANDS = {"aten::mm": (0, 1), "aten::addmm": (1, 2)}


def raw_gemms(ev: list[dict]) -> dict[tuple, dict]:
    """(op, dims of A, dims of B, input types) -> calls, kernel time, kernels, from the raw events."""
    ops = {e["args"]["External id"]: e for e in ev if e.get("cat") == "cpu_op" and e["name"] in OPERANDS}
    calls = {e["args"]["correlation"]: e for e in ev if e.get("cat") in ("cuda_runtime", "cuda_driver")
             and "correlation" in e.get("args", {})}
    out: dict[tuple, dict] = defaultdict(lambda: {"calls": 0, "gpu": 0, "kernels": set()})
    key_of = {}
    for x, e in ops.items():
        i, j = OPERANDS[e["name"]]
        dims = e["args"]["Input Dims"]
        key_of[x] = (e["name"], tuple(dims[i]), tuple(dims[j]), tuple(e["args"]["Input type"]))
        out[key_of[x]]["calls"] += 1
    for e in ev:
        if e.get("cat") == "kernel":
            c = calls.get(e["args"].get("correlation"))
            x = c and c["args"].get("External id")
            if x in key_of:
                s, t = ival(e)
                out[key_of[x]]["gpu"] += t - s
                out[key_of[x]]["kernels"].add(e["name"])
    return dict(out)


@pytest.fixture(scope="module")
def example():
    (rep,) = pastaprof.analyze(EXAMPLE, tools=["gemm"])
    return raw_gemms(load(EXAMPLE)), rep


def test_per_shape_time_and_flops_match_the_raw_join(example):
    raw, rep = example
    rows = rep.tables["gemms"].to_pylist()
    got = defaultdict(lambda: [0, 0, 0])
    for r in rows:
        g = got[(r["op"], r["m"], r["n"], r["k"], r["dtype"])]
        g[0] += r["calls"]
        g[1] += r["gpu_ns"]
        g[2] += r["flops"]
    want = defaultdict(lambda: [0, 0, 0])
    for (op, a, b, dt), w in raw.items():
        if not w["gpu"]:
            continue
        m, k, n = a[0], a[1], b[1]
        x = want[(op, m, n, k, {"c10::BFloat16": "bf16", "float": "fp32"}[dt[OPERANDS[op][0]]])]
        x[0] += w["calls"]
        x[1] += w["gpu"]
        x[2] += 2 * m * n * k * w["calls"]
    assert dict(got) == dict(want)
    assert rep.summary["device_arch"] == 90


def test_lm_head_is_the_one_finding_with_an_honest_impact(example):
    raw, rep = example
    healthy_f = healthy_t = 0
    bad = []
    for (_op, a, b, dt), w in raw.items():
        m, k, n = a[0], a[1], b[1]
        flops = 2 * m * n * k * w["calls"]
        if not w["gpu"]:
            continue
        if any(x % 8 for x in (m, n, k)):
            bad.append((w["gpu"], flops, w["kernels"]))
        elif dt[OPERANDS[_op][0]] == "c10::BFloat16" and all("sm90" in x for x in w["kernels"]):
            healthy_f += flops
            healthy_t += w["gpu"]
    ref = healthy_f / healthy_t
    assert 500e3 < ref < 800e3  # FLOP per ns: 500-800 TFLOP/s on the H200
    (f,) = rep.findings
    assert f.location == "GPT2LMHeadModel_0/Linear_0" and "50257" in f.title
    assert f.impact_ns == pytest.approx(sum(g - fl / ref for g, fl, _ in bad), abs=3)
    assert f.evidence["gpu_ns"] == sum(g for g, _, _ in bad)
    assert f.evidence["kernel_arch"] == [75] and f.evidence["kernel_align"] == [1]
    assert all("cutlass_75" in k and "align1" in k for _, _, ks in bad for k in ks)
    assert f.evidence["padded"] == [50304] and f.evidence["suggestion"]
    # a quarter of the GPU's GEMM time is the LM head; the estimate stays below its time
    assert 0 < f.impact_ns < f.evidence["gpu_ns"]


def test_fp32_simt_gemm_on_hopper():
    path = DATA / "two_streams_copies.pt.trace.json.gz"
    (rep,) = pastaprof.analyze(path, tools=["gemm"])
    raw = raw_gemms(load(path))
    (f,) = rep.findings
    assert "fp32 without tensor cores" in f.title and f.location == "record.py(39): <module>"
    gpu = sum(w["gpu"] for w in raw.values())
    assert all("simt_sgemm" in k for w in raw.values() for k in w["kernels"])
    # no bf16 GEMM in the trace to compare with: half the time (TF32 is at least 2x)
    assert f.evidence["gpu_ns"] == gpu and f.impact_ns == gpu // 2
    assert rep.summary["reference_tflops"] is None


def test_small_unaligned_mlp_head_and_shape_parsing():
    (rep,) = pastaprof.analyze(DATA / "mlp_train_3steps.pt.trace.json.gz", tools=["gemm"])
    titles = [f.title for f in rep.findings]
    assert any("10-wide dimension" in t and "fp32" in t for t in titles)
    assert len({f.id for f in rep.findings}) == len(rep.findings)
    assert gemm_dims("aten::mm", "[[4,6],[6,9]]") == (1, 4, 9, 6)
    assert gemm_dims("aten::baddbmm", "[[2,4,9],[2,4,6],[2,6,9],[],[]]") == (2, 4, 9, 6)
    for hostile in (None, "", "[[4,6]]", "not json", "[[4,6],[7,9]]", "[[[1]],[[2]]]", '{"a": 1}', "[[1e400,2],[2,3]]"):
        assert gemm_dims("aten::mm", hostile) is None
    assert gemm_dims("aten::relu", "[[4,6],[6,9]]") is None


def test_kernel_names_give_architecture_and_alignment():
    assert kernel_arch("void cutlass::Kernel2<cutlass_75_tensorop_bf16_s1688gemm_bf16_128x128_tn_align1>(x)") == 75
    assert kernel_arch("sm80_xmma_gemm_f32f32_f32f32_f32_nt_n_tilesize32x32x8") == 80
    assert kernel_arch("nvjet_sm90_tst_192x128_64x5_1x2_h_bz_coopB_TNT") == 90
    assert kernel_arch("ampere_bf16_s16816gemm_bf16_128x64_ldg8_f2f_nn") == 80
    assert kernel_arch("void at::native::vectorized_elementwise_kernel<4>") is None
    assert kernel_align("cutlass_80_simt_sgemm_256x128_8x4_nn_align1") == 1 and kernel_align("nvjet_sm90") is None
    assert device_arch([{"computeMajor": 9, "computeMinor": 0}, {"computeMajor": 8, "computeMinor": 6}]) == 86
    assert device_arch([{"name": "x"}, "junk", {"computeMajor": "9"}]) is None


def test_a_trace_without_shapes_keeps_its_gemm_time_and_an_empty_table_is_empty(tmp_path, example):
    """torch.profiler without record_shapes writes no "Input Dims"/"Input type": the calls still
    own their kernels (a join on the null shapes lost every one), and a table with no rows is
    [] in --json (a table of no columns sliced to 1,000 empty rows)."""
    import gzip
    import json

    raw, _ = example
    doc = json.loads(gzip.open(EXAMPLE).read())
    for e in doc["traceEvents"]:
        for key in ("Input Dims", "Input type", "Input Strides", "Concrete Inputs"):
            e.get("args", {}).pop(key, None)
    bare = tmp_path / "noshapes.pt.trace.json"
    bare.write_text(json.dumps(doc))
    (rep,) = pastaprof.analyze(bare, tools=["gemm"])
    calls = sum(w["calls"] for w in raw.values())
    assert rep.summary["calls_without_shapes"] == rep.summary["gemm_calls"] == calls
    assert rep.summary["calls_without_kernels"] == sum(w["calls"] for w in raw.values() if not w["gpu"])
    assert rep.summary["gemm_gpu_ns"] == sum(w["gpu"] for w in raw.values())
    by_op = {r["op"]: r["gpu_ns"] for r in rep.tables["gemms"].to_pylist()}
    assert by_op == {op: sum(w["gpu"] for (o, *_), w in raw.items() if o == op) for op in {k[0] for k in raw}}
    out = tmp_path / "cpu.json"
    cpu = tmp_path / "cpu.pt.trace.json"
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("cat") != "kernel"]
    cpu.write_text(json.dumps(doc))
    r = subprocess.run([sys.executable, "-m", "pastaprof.cli", "analyze", str(cpu), "-t", "gemm", "-q", "--json", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    gemm = json.loads(out.read_text())
    gemm = gemm["tools"]["gemm"] if "tools" in gemm else gemm
    assert gemm["tables"]["gemms"] == [] and gemm["summary"]["calls_without_kernels"] == calls


def test_runs_without_ops_or_devices_say_why():
    from pastaprof.tools.gemm import Gemm

    rep = Gemm().report()
    assert "no matmul ops" in rep.summary["note"] and not rep.findings
    (rep,) = pastaprof.analyze(DATA / "bert4_infer_2iters.pt.trace.json.gz", tools=["gemm"])
    assert rep.findings == [] and rep.summary["reference_tflops"] > 100  # aligned bf16 BERT: healthy


def test_fixed_seed_fuzz_of_the_shape_parser():
    """Mutated shape strings (the trace's text) never raise and never give a non-positive dimension."""
    import random

    rnd = random.Random(20261201)
    seeds = ["[[4096,768],[768,50257]]", "[[768],[4096,768],[768,768],[],[]]", "[[2,4,9],[2,9,6]]"]
    alphabet = "[],-0123456789.e\"{}: nulltrue"
    for _ in range(3000):
        s = list(rnd.choice(seeds))
        for _ in range(rnd.randint(1, 4)):
            i = rnd.randrange(len(s) + 1)
            if rnd.random() < 0.5 and s:
                del s[min(i, len(s) - 1)]
            else:
                s.insert(i, rnd.choice(alphabet))
        for op in ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"):
            got = gemm_dims(op, "".join(s))
            assert got is None or all(isinstance(x, int) and x > 0 for x in got)


@pytest.mark.parametrize("dtypes", ['{"0": "float"}', '[["float"]]', "[1, 2]", '"float"', "[]", "[", "null", "7"])
def test_a_gemms_dtypes_of_any_shape_in_a_trace_are_no_dtype(dtypes):
    from pastaprof.tools.gemm import _dtype

    assert _dtype(dtypes, "aten::mm") is None and _dtype(dtypes, "aten::addmm") is None
    assert _dtype('["c10::BFloat16", "float"]', "aten::mm") == "c10::BFloat16"
    assert _dtype('["", "c10::Half", "c10::Half"]', "aten::addmm") == "c10::Half"
