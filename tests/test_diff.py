"""pastaprof diff: real traces against themselves, against edited copies with planted changes
(tallied independently from the raw JSON), and two CPU torch.profiler traces recorded here."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import orjson
import pyarrow as pa
import pytest
from conftest import DATA, FOREIGN, TRACES, dur_ns, raw_events

import pastaprof
from pastaprof.report.diff_names import finding_key, normalize_kernel_name

PY = [sys.executable, "-m", "pastaprof.cli"]
MLP = DATA / "mlp_train_3steps.pt.trace.json.gz"
GEMM = "void sgemm_largek_lds64<true, false, 5, 5, 4, 4, 4, 34>(float*, float const*, float const*, int, int, " \
       "int, int, int, int, float const*, float const*, float, float, int, int, int*, int*)"
SOFTMAX_BWD = "void (anonymous namespace)::softmax_warp_backward<float, float, float, 4, true, false>" \
              "(float*, float const*, float const*, int, int, int, bool const*)"
PLANTED = "pastaprof_planted_kernel_0x7f3a2b10"


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*PY, *args], capture_output=True, text=True)


def one_error_line(r: subprocess.CompletedProcess) -> str:
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert len(lines) == 1 and lines[0].startswith("pastaprof: error: "), r.stderr
    assert "Traceback" not in r.stderr
    return lines[0]


def doc(path: Path) -> dict:
    opener = gzip.open if path.read_bytes()[:2] == b"\x1f\x8b" else open
    with opener(path, "rb") as f:
        return orjson.loads(f.read())


def write(path: Path, d: dict) -> Path:
    path.write_bytes(gzip.compress(orjson.dumps(d)))
    return path


def us(v) -> Decimal:
    return Decimal(str(v))


def launch_in(events: list[dict], windows: list[tuple[Decimal, Decimal]]) -> dict[int, bool]:
    """Per kernel event (index): whether the runtime call that launched it starts in a window."""
    calls = {e["args"]["correlation"]: e for e in events
             if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    out = {}
    for i, e in enumerate(events):
        if e.get("cat") == "kernel":
            c = calls.get(e["args"].get("correlation"))
            t = us(c["ts"] if c else e["ts"])
            out[i] = any(a <= t < b for a, b in windows)
    return out


def step_windows(events: list[dict]) -> list[tuple[Decimal, Decimal]]:
    return [(us(e["ts"]), us(e["ts"]) + us(e["dur"])) for e in events
            if e.get("cat") == "user_annotation" and e["name"] in ("step0", "step1", "step2")]


# ---------------------------------------------------------------- kernel names


def real_kernel_names() -> list[str]:
    names = set()
    for p in [*TRACES, *FOREIGN, *sorted((DATA / "recorded").glob("*.json.gz"))]:
        names.update(e["name"] for e in raw_events(p) if isinstance(e, dict) and str(e.get("cat", "")).lower() == "kernel")
    return sorted(names)


def test_normalize_kernel_name_on_real_names():
    names = real_kernel_names()
    assert len(names) >= 80
    keys: dict[str, list[str]] = {}
    for n in names:
        keys.setdefault(normalize_kernel_name(n), []).append(n)
        assert normalize_kernel_name(normalize_kernel_name(n)) == normalize_kernel_name(n)  # a key is its own key
    merged = {k: v for k, v in keys.items() if len(v) > 1}
    # Only names that differ in launch bounds, lambda numbering or an AMD clone suffix share a key:
    for k, group in merged.items():
        stripped = {normalize_kernel_name(n.replace(" [clone .kd]", "")) for n in group}
        assert stripped == {k}
        assert any(s in k for s in ("reduce_kernel<N,N", "pow_tensor_scalar", "CUDAFunctor_add<float>")), group
    assert len(keys) == len(names) - sum(len(v) - 1 for v in merged.values())
    # distinct functors, dtypes and GEMM tiles stay distinct
    vec = [k for k in keys if k.startswith("at::native::vectorized_elementwise_kernel<")]
    assert len(vec) >= 20
    assert len([k for k in keys if k.startswith("cutlass::Kernel2<")]) == len(
        [n for n in names if n.startswith("void cutlass::Kernel2<")])
    assert normalize_kernel_name(SOFTMAX_BWD) == "softmax_warp_backward<float,float,float,N,true,false>"
    assert normalize_kernel_name(GEMM) == "sgemm_largek_lds64<true,false,N,N,N,N,N,N>"


@pytest.mark.parametrize("edit", [
    lambda n: n.replace("(anonymous namespace)::", "{anonymous}::"),      # another demangler
    lambda n: n.replace("> >", ">>"),
    lambda n: n.replace("1ul>", "1>").replace("3ul>", "3>"),
    lambda n: n.replace("<4, ", "<8, "),                                    # another vector width
    lambda n: n + " [clone .kd]",                                           # AMD code object
    lambda n: n[:-1] + ", long)" if n.endswith(")") else n,                # parameters are not the identity
])
def test_normalize_kernel_name_ignores_spelling(edit):
    for n in real_kernel_names():
        assert normalize_kernel_name(edit(n)) == normalize_kernel_name(n), n


def test_normalize_kernel_name_suffixes_and_families():
    for real in ("triton_poi_fused_addmm_relu_0", "triton_per_fused_sum_threshold_backward_1"):
        base = real.rsplit("_", 1)[0]
        assert normalize_kernel_name(real) == normalize_kernel_name(base + "_7") == base
        assert normalize_kernel_name(real + "_0x7f3a2b10") == base  # an address baked into the name
    assert normalize_kernel_name("void foo<(void*)0x7ffd1234, 4>(int)") == normalize_kernel_name("void foo<(void*)0x55aa, 4>(int)")
    f32 = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul> >" \
          "(int, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul>)"
    bf16 = "void at::native::vectorized_elementwise_kernel<8, at::native::CUDAFunctor_add<c10::BFloat16>, " \
           "at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<c10::BFloat16>, at::detail::Array<char*, 3>)"
    assert normalize_kernel_name(f32) != normalize_kernel_name(bf16)
    assert normalize_kernel_name(f32, keep_templates=False) == normalize_kernel_name(bf16, keep_templates=False) \
        == "at::native::vectorized_elementwise_kernel"
    gather = [n for n in real_kernel_names() if "_scatter_gather_elementwise_kernel" in n][0]
    assert "operator()<at::native::TensorAssign>" in normalize_kernel_name(gather)  # operator() is part of a name


def test_finding_key_leaves_out_numbers_and_lines():
    a = {"tool": "steps", "title": "step0 of rank 0 took 4.01x the median step (+6.9 ms), mostly host wait",
         "location": "train.py(18): <module>"}
    b = {"tool": "steps", "title": "step0 of rank 0 took 2.50x the median step (+900 us), mostly host wait",
         "location": "train.py(21): <module>"}
    c = {**b, "title": b["title"].replace("host wait", "compute")}
    assert finding_key(a) == finding_key(b) != finding_key(c)
    assert finding_key({**a, "id": "F1"}) == finding_key({**c, "id": "F1"})


# ---------------------------------------------------------------- (1) a trace against itself


def test_trace_against_its_run_directory_no_difference(tmp_path):
    run_dir = tmp_path / "run"
    assert cli("import", str(MLP), "-o", str(run_dir)).returncode == 0
    out = tmp_path / "d.json"
    r = cli("diff", str(run_dir), str(MLP), "--fail-above", "1", "--json", str(out))
    assert r.returncode == 0, r.stderr
    d = json.loads(out.read_text())
    assert d["regressions"] == d["improvements"] == d["new"] == d["vanished"] == []
    assert d["findings"] == {"resolved": [], "introduced": []}
    assert d["normalization"] == "per step" and d["steps"]["base_steps"] == d["steps"]["new_steps"] == 3
    assert all(row["delta_ns"] == 0 and row["ratio"] in (1, None) for row in d["steps"]["rows"])
    kernels = {e["name"] for e in raw_events(MLP) if e.get("cat") == "kernel"}
    assert d["unchanged"] >= len({normalize_kernel_name(k) for k in kernels})
    assert d["gate"]["worst"] is None and d["gate"]["exceeded"] is False
    assert "nothing got slower" in r.stdout


def test_same_path_twice_and_multi_rank(tmp_path):
    ranks = DATA / "ddp_mlp_2ranks"
    d = pastaprof.diff(ranks, ranks)
    assert d.regressions.num_rows == d.new.num_rows == d.vanished.num_rows == 0
    assert d.sources["base"]["ranks"] == 2 and "per step and rank" in d.normalization_note


# ---------------------------------------------------------------- (2) planted changes


def planted(tmp_path: Path, evil_name: str | None = None) -> tuple[Path, int, int]:
    """MLP trace with GEMM's durations doubled, SOFTMAX_BWD removed and PLANTED added (1 us, in
    step1, launched by nothing).  Returns (path, GEMM's added ns, PLANTED's ns)."""
    d = doc(MLP)
    events = d["traceEvents"]
    inside = launch_in(events, step_windows(events))
    gemm = [i for i, e in enumerate(events) if e.get("cat") == "kernel" and e["name"] == GEMM]
    assert len(gemm) == 6 and all(inside[i] for i in gemm)  # all counted per step
    added = sum(dur_ns(events[i]) for i in gemm)
    for i in gemm:
        events[i]["dur"] = float(us(events[i]["dur"]) * 2)
    src = events[gemm[0]]
    soft = [e for e in events if e.get("cat") == "kernel" and e["name"] == SOFTMAX_BWD]
    assert len(soft) == 3
    events[:] = [e for e in events if not (e.get("cat") == "kernel" and e["name"] == SOFTMAX_BWD)]
    step1 = next(e for e in events if e.get("name") == "step1")
    new = {**src, "name": evil_name or PLANTED, "ts": float(us(step1["ts"]) + 100), "dur": 1.0,
           "args": {**src["args"], "correlation": 987654321}}
    new["args"].pop("External id", None)
    events.append(new)
    return write(tmp_path / "planted.pt.trace.json.gz", d), added, 1000


def test_planted_regression_new_and_vanished(tmp_path):
    path, added, _ = planted(tmp_path)
    out = tmp_path / "d.json"
    r = cli("diff", str(MLP), str(path), "--json", str(out), "-q")
    assert r.returncode == 0, r.stderr
    d = json.loads(out.read_text())
    top = d["regressions"][0]
    assert (top["kind"], top["name"]) == ("kernel", normalize_kernel_name(GEMM))
    assert top["new_total_ns"] - top["base_total_ns"] == added            # the planted change, exactly
    assert top["delta_ns"] == pytest.approx(added / 3, abs=1e-3)          # per step: 3 steps each side
    assert top["ratio"] == 2 and top["base_count"] == top["new_count"] == 6
    kinds = lambda rows: [(e["kind"], e["name"]) for e in rows if e["kind"] == "kernel"]  # noqa: E731
    assert kinds(d["regressions"]) == [("kernel", normalize_kernel_name(GEMM))]
    assert kinds(d["improvements"]) == []
    assert kinds(d["new"]) == [("kernel", "pastaprof_planted_kernel")]
    assert kinds(d["vanished"]) == [("kernel", normalize_kernel_name(SOFTMAX_BWD))]
    soft_ns = sum(dur_ns(e) for e in raw_events(MLP) if e.get("name") == SOFTMAX_BWD)
    gone = next(e for e in d["vanished"] if e["kind"] == "kernel")
    assert gone["base_total_ns"] == soft_ns and gone["base_count"] == 3 and gone["new_ns"] == 0
    born = next(e for e in d["new"] if e["kind"] == "kernel")
    assert born["new_total_ns"] == 1000 and born["new_count"] == 1 and born["base_ns"] == 0
    # nothing but the planted kernel's own op / module / site got slower, and by no more than it
    assert all(e["delta_ns"] <= top["delta_ns"] + 1e-6 for e in d["regressions"])
    assert all(e["kind"].endswith("_gpu") or e["kind"] == "kernel" for e in d["regressions"])


def test_fail_above_threshold_around_the_planted_share(tmp_path):
    path, added, _ = planted(tmp_path)
    walls = [b - a for a, b in step_windows(raw_events(MLP))]
    share = float((Decimal(added) / 3) / (sum(walls) * 1000 / 3) * 100)  # of the mean base step
    assert 0.1 < share < 5
    below = cli("diff", str(MLP), str(path), "--fail-above", f"{share * 0.95:.4f}", "-q")
    above = cli("diff", str(MLP), str(path), "--fail-above", f"{share * 1.05:.4f}", "-q")
    assert below.returncode == 3, below.stderr
    assert above.returncode == 0, above.stderr
    assert "above --fail-above" in below.stderr and f"{share:.2f}%" in below.stderr
    out = tmp_path / "d.json"
    assert cli("diff", str(MLP), str(path), "--fail-above", "0", "-q", "--json", str(out)).returncode == 3
    gate = json.loads(out.read_text())["gate"]
    assert gate["exceeded"] is True and gate["worst"]["share_pct"] == pytest.approx(share, rel=1e-6)


def test_terminal_escapes_names_and_fits_100_columns(tmp_path):
    path, _, _ = planted(tmp_path, evil_name="evil\x1b]0;owned\x07\x1b[2J\nkernel_0x7f00")
    r = cli("diff", str(MLP), str(path), "--rows", "50")
    assert r.returncode == 0, r.stderr
    assert "\x1b" not in r.stdout and "\x07" not in r.stdout
    assert "evil\\x1b]0;owned\\x07\\x1b[2J\\x0akernel" in r.stdout
    lines = r.stdout.splitlines()
    assert max(len(line) for line in lines) <= 100
    reg = lines.index(next(line for line in lines if line.startswith("regressions")))
    assert "sgemm_largek_lds64" in "".join(lines[reg:reg + 5])  # top regression first


# ---------------------------------------------------------------- per-step normalization


def test_mean_per_step_counts_only_the_steps(tmp_path):
    """Base: 3 steps.  New: the same trace without the step0 range, so 2 steps: step0's kernels
    are outside every step and the mean is over step1 and step2."""
    d = doc(MLP)
    events = d["traceEvents"]
    windows = step_windows(events)
    inside_all = launch_in(events, windows)
    inside_12 = launch_in(events, windows[1:])
    events_new = [e for e in events if e.get("name") != "step0"]
    new_path = write(tmp_path / "two_steps.pt.trace.json.gz", {**d, "traceEvents": events_new})
    res = pastaprof.diff(MLP, new_path)
    assert res.normalization == "per step"
    assert (res.sources["base"]["steps"], res.sources["new"]["steps"]) == (3, 2)
    rows = {(r["kind"], r["name"]): r for t in (res.regressions, res.improvements) for r in t.to_pylist()}
    key = ("kernel", normalize_kernel_name(GEMM))
    gemm = [i for i, e in enumerate(events) if e.get("cat") == "kernel" and e["name"] == GEMM]
    base = sum(dur_ns(events[i]) for i in gemm if inside_all[i]) / 3
    new = sum(dur_ns(events[i]) for i in gemm if inside_12[i]) / 2
    assert rows[key]["base_ns"] == pytest.approx(base) and rows[key]["new_ns"] == pytest.approx(new)
    assert rows[key]["new_count"] == sum(1 for i in gemm if inside_12[i]) == 4
    walls = [float(b - a) * 1000 for a, b in windows]
    steps = {r["name"]: r for r in res.steps.to_pylist()}
    assert steps["wall"]["base_ns"] == pytest.approx(sum(walls) / 3)
    assert steps["wall"]["new_ns"] == pytest.approx(sum(walls[1:]) / 2)


def no_steps(events: list[dict]) -> list[dict]:
    """Without user ranges, and without the first top-level op (so no block of ops repeats)."""
    out = [e for e in events if e.get("cat") not in ("user_annotation", "gpu_user_annotation")]
    first = min((e for e in out if e.get("cat") == "cpu_op"), key=lambda e: us(e["ts"]))
    return [e for e in out if e is not first]


def test_totals_when_a_run_has_no_steps(tmp_path):
    d = doc(MLP)
    base = write(tmp_path / "base.pt.trace.json.gz", {**d, "traceEvents": no_steps(d["traceEvents"])})
    events = no_steps(d["traceEvents"])
    gemm = [e for e in events if e.get("cat") == "kernel" and e["name"] == GEMM]
    added = sum(dur_ns(e) for e in gemm)
    for e in gemm:
        e["dur"] = float(us(e["dur"]) * 2)
    new = write(tmp_path / "new.pt.trace.json.gz", {**d, "traceEvents": events})
    out = tmp_path / "d.json"
    r = cli("diff", str(base), str(new), "--json", str(out), "-q", "--fail-above", "100")
    assert r.returncode == 0, r.stderr
    res = json.loads(out.read_text())
    assert res["sources"]["base"]["steps"] == res["sources"]["new"]["steps"] == 0
    assert res["normalization"] == "total" and res["normalization_note"] == "totals: base and new have no steps"
    assert res["steps"]["rows"] == []
    top = res["regressions"][0]
    assert (top["kind"], top["name"], top["delta_ns"], top["ratio"]) == ("kernel", normalize_kernel_name(GEMM), added, 2)
    timed = [e for e in events if e.get("cat") in ("cpu_op", "cuda_runtime", "cuda_driver", "kernel", "gpu_memset",
                                                    "gpu_memcpy") and "dur" in e]
    span = max(us(e["ts"]) + us(e["dur"]) for e in timed) - min(us(e["ts"]) for e in timed)
    base_span = res["gate"]["base_time_ns"]
    assert abs(base_span - float(span) * 1000) <= float(us(gemm[-1]["dur"]) * 1000)  # the GEMM may end the new run
    share = 100 * added / base_span
    assert cli("diff", str(base), str(new), "-q", "--fail-above", f"{share * 0.95:.6f}").returncode == 3
    assert cli("diff", str(base), str(new), "-q", "--fail-above", f"{share * 1.05:.6f}").returncode == 0


def test_run_objects_and_family_match(tmp_path):
    """Loaded Runs compare like paths; a kernel whose template arguments changed (and got
    slower) is paired by family, one base name with one new name, not vanished + new."""
    d = doc(MLP)
    renamed = GEMM.replace("<true, false, 5, 5,", "<false, true, 5, 5,")
    added = 0
    for e in d["traceEvents"]:
        if e.get("name") == GEMM:
            e["name"] = renamed
            added += dur_ns(e)
            e["dur"] = float(us(e["dur"]) * 2)
    other = write(tmp_path / "renamed.pt.trace.json.gz", d)
    a, b = pastaprof.load(MLP), pastaprof.load(other)
    same = pastaprof.diff(a, a)
    assert same.regressions.num_rows == same.new.num_rows == same.vanished.num_rows == 0
    res = pastaprof.diff(a, b)
    assert [r for r in res.new.to_pylist() + res.vanished.to_pylist() if r["kind"] == "kernel"] == []
    top = res.regressions.to_pylist()[0]
    assert (top["kind"], top["name"], top["match"]) == ("kernel", "sgemm_largek_lds64", "family")
    assert (top["base_name"], top["new_name"]) == (GEMM, renamed)
    assert top["new_total_ns"] - top["base_total_ns"] == added and top["ratio"] == 2


def test_family_pairs_only_one_to_one():
    from pastaprof.report.diff import _pairs
    from pastaprof.report.diff_collect import Agg

    def side(*names: str) -> dict:
        return {normalize_kernel_name(n): Agg(10, 1, {n: 10}) for n in names}

    f32 = "void k<float>(float*)"
    bf16, f16, f64 = "void k<c10::BFloat16>(c10::BFloat16*)", "void k<c10::Half>(c10::Half*)", "void k<double>(double*)"
    one = _pairs("kernel", side(f32), side(bf16))
    assert [(n, m) for n, _, _, m in one] == [("k", "family")]
    two = _pairs("kernel", side(f32, f64), side(bf16, f16))  # which is which would be a guess
    assert sorted((n, a is None, b is None, m) for n, a, b, m in two) == sorted(
        [(normalize_kernel_name(x), x in (bf16, f16), x in (f32, f64), "name") for x in (f32, f64, bf16, f16)])
    site = _pairs("call_site", {"train.py(12): step": Agg(5, 1, {"train.py(12): step": 5})},
                  {"train.py(14): step": Agg(7, 1, {"train.py(14): step": 7})})
    assert [(n, m) for n, _, _, m in site] == [("train.py: step", "family")]


def test_json_on_stdout_is_the_document_alone(tmp_path):
    r = cli("diff", str(MLP), str(MLP), "--json", "-")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["format_version"] == 1 and d["regressions"] == []
    assert "diff" in r.stderr  # the tables went to stderr


# ---------------------------------------------------------------- (3) real CPU profiles

RECORD = r"""
import sys, torch
from torch.profiler import profile, schedule, ProfilerActivity
torch.manual_seed(0)
torch.set_num_threads(1)
def record(out, width, active):
    model = torch.nn.Sequential(torch.nn.Linear(256, width), torch.nn.ReLU(), torch.nn.Linear(width, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(256, 256), torch.randint(0, 10, (256,))
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=1, active=active),
                 on_trace_ready=lambda p: p.export_chrome_trace(out)) as prof:
        for _ in range(1 + active):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            prof.step()
record(sys.argv[1], 256, 3)
record(sys.argv[2], 2048, 5)
"""


@pytest.fixture(scope="module")
def cpu_traces(tmp_path_factory):
    pytest.importorskip("torch")  # the README's test command runs without torch
    d = tmp_path_factory.mktemp("cpu")
    a, b = d / "narrow.json", d / "wide.json"
    r = subprocess.run([sys.executable, "-c", RECORD, str(a), str(b)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return a, b


def test_cpu_profiles_wider_linear(cpu_traces, tmp_path):
    a, b = cpu_traces
    res = pastaprof.diff(a, b)
    assert res.normalization == "per step"
    assert (res.sources["base"]["steps"], res.sources["new"]["steps"]) == (3, 5)
    assert res.sources["base"]["rule"] == "ProfilerStep"
    assert isinstance(res.regressions, pa.Table) and res.regressions.schema.names[:6] == [
        "kind", "name", "base_ns", "new_ns", "delta_ns", "ratio"]
    ops = {r["name"]: r for r in res.regressions.to_pylist() if r["kind"] == "op"}
    for name in ("aten::addmm", "aten::mm", "aten::linear"):
        assert ops[name]["ratio"] > 1 and ops[name]["match"] == "name"
        assert ops[name]["base_name"] == ops[name]["new_name"] == name
    # the counts are per run, the times per step: addmm runs twice per step (2 Linear layers)
    assert ops["aten::addmm"]["base_count"] == 2 * 3 and ops["aten::addmm"]["new_count"] == 2 * 5
    raw = [e for e in raw_events(a) if e.get("name") == "aten::addmm" and e.get("cat") == "cpu_op"]
    assert ops["aten::addmm"]["base_total_ns"] == sum(dur_ns(e) for e in raw)
    out = tmp_path / "d.json"
    r = cli("diff", str(a), str(b), "--fail-above", "1", "--json", str(out))
    assert r.returncode == 3, r.stderr
    assert "mean per step (3 base, 5 new steps" in r.stdout
    assert json.loads(out.read_text())["gate"]["exceeded"] is True


LIVE = r"""
import sys, torch
torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(256, 256), torch.randint(0, 10, (256,))
for _ in range(3):
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
"""


def test_live_run_against_a_kineto_trace(cpu_traces, tmp_path):
    """A run directory captured live by ``pastaprof run`` against a torch.profiler trace of the
    wider model: ops match by name across the two sources."""
    script = tmp_path / "narrow.py"
    script.write_text(LIVE)
    run_dir = tmp_path / "live"
    r = cli("run", "-o", str(run_dir), "--", sys.executable, str(script))
    assert r.returncode == 0, r.stderr[-2000:]
    res = pastaprof.diff(run_dir, cpu_traces[1])
    ops = {r["name"]: r for r in res.regressions.to_pylist() if r["kind"] == "op"}
    assert ops["aten::addmm"]["ratio"] > 1 and ops["aten::addmm"]["base_count"] == 6
    assert "aten::addmm" not in {r["name"] for t in (res.new, res.vanished) for r in t.to_pylist()}


# ---------------------------------------------------------------- (4) bad inputs


def test_bad_inputs_one_line_exit_2(tmp_path):
    corrupt = tmp_path / "corrupt.json"
    corrupt.write_text('{"traceEvents": [{"ph": "X", "cat": "kernel", ')
    truncated = tmp_path / "truncated.json.gz"
    truncated.write_bytes(MLP.read_bytes()[:4000])
    both = tmp_path / "both"
    assert cli("import", str(MLP), "-o", str(both)).returncode == 0
    (both / "extra.pt.trace.json.gz").write_bytes(MLP.read_bytes())
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "rank-0.pt.trace.json.gz").write_bytes(MLP.read_bytes())
    assert cli("import", str(MLP), "-o", str(folder / "run")).returncode == 0
    damaged = tmp_path / "damaged"
    assert cli("import", str(MLP), "-o", str(damaged)).returncode == 0
    (damaged / "run.json").write_text("{not json")
    out = tmp_path / "d.json"
    for base, new in ((tmp_path / "missing.json", MLP), (MLP, corrupt), (truncated, MLP), (MLP, both),
                      (folder, MLP), (MLP, tmp_path), (damaged, MLP)):
        line = one_error_line(cli("diff", str(base), str(new), "--json", str(out), "--fail-above", "1"))
        assert str(base if base != MLP else new) in line
        assert not out.exists()
    for flag in ("nan", "-1", "abc", "inf"):
        one_error_line(cli("diff", str(MLP), str(MLP), "--fail-above", flag))
    one_error_line(cli("diff", str(MLP)))
    one_error_line(cli("diff", str(MLP), str(MLP), "--json", str(tmp_path / "no" / "such" / "dir.json")))
