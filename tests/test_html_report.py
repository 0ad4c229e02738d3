"""The HTML report in a real headless Chromium (DevTools protocol over a pipe: tests/html_cdp.py).

Each page is written by the real CLI from real traces (the bundled GPT-2 example, the 2-rank
DDP trace, the 5-step leak, a UVM run and an access run), opened in the browser, and checked
against numbers computed here independently: table rows against the tools' Reports, the
timeline's busy bins against a brute-force overlap of the raw events, memory peaks, per-rank
busy time from the raw JSON; no console error, no request to any host, a hostile kernel name
stays text, and sorting a table sorts it.
"""

from __future__ import annotations

import gzip
import html
import json
import random
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from conftest import DATA, interval_ns, raw_events

import pastaprof
from pastaprof.report.html import build_page, tools_for
from pastaprof.report.html.collect import TimeBins, busy_per_bin, group_codes, union
from pastaprof.report.html.page import script_json
from pastaprof.report.html.sections import MAX_TABLE_ROWS, slug
from pastaprof.tools.base import Finding, Report, ordered_findings

plotly = pytest.importorskip("plotly", reason="the HTML report needs plotly (pip install 'pastaprof[html]')")
html_cdp = pytest.importorskip("html_cdp")
needs_browser = pytest.mark.skipif(html_cdp.chromium() is None, reason="no chromium")

HOSTILE_KERNEL = "<img src=x onerror=alert(1)>"
HOSTILE_OP = "</script><script>alert(2)</script>\u2028"


def _cli(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run([sys.executable, "-m", "pastaprof.cli", *args], capture_output=True, text=True, timeout=300)
    if check:
        assert p.returncode == 0, p.stderr
    return p


def _charts_json(page: str) -> dict:
    m = re.search(r'<script type="application/json" id="pp-charts">(.*?)</script>', page, re.S)
    assert m
    return json.loads(m.group(1))


@pytest.fixture(scope="module")
def browser():
    if html_cdp.chromium() is None:
        pytest.skip("no chromium")
    with html_cdp.Browser() as b:
        yield b


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    """Pages written by the CLI, by name (built once: each analysis takes seconds)."""
    d = tmp_path_factory.mktemp("html")
    out = {}
    _cli("report", "--example", "-o", str(d / "example.html"), "-q")
    out["example"] = d / "example.html"
    _cli("report", str(DATA / "ddp_mlp_2ranks"), "-o", str(d / "ddp.html"), "-q")
    out["ddp"] = d / "ddp.html"
    _cli("analyze", str(DATA / "leak_5steps.pt.trace.json.gz"), "--html", str(d / "leak.html"), "-q")
    out["leak"] = d / "leak.html"
    return out


def _load(browser, path: Path) -> None:
    browser.open(path)
    browser.drain(0.3)


def _assert_clean(browser, path: Path) -> None:
    """No console error or uncaught exception; no request but the page itself (and the data:
    URLs plotly makes in memory)."""
    assert browser.errors() == []
    others = [u for u in browser.requests() if u != path.resolve().as_uri() and not u.startswith("data:")]
    assert others == []
    assert not any(e["method"] == "Page.javascriptDialogOpening" for e in browser.events)


def _plots(browser) -> tuple[int, int, int]:
    return (browser.eval('document.querySelectorAll("div.chart").length'),
            browser.eval('document.querySelectorAll("div.chart.js-plotly-plot").length'),
            browser.eval('Array.from(document.querySelectorAll("div.chart")).filter('
                         'd => d.querySelector("svg.main-svg") && d.getBoundingClientRect().height > 100).length'))


def _dom_rows(browser, anchor: str) -> int:
    return browser.eval(f'document.getElementById("{anchor}").nextElementSibling.querySelector("tbody").rows.length')


@needs_browser
def test_example_page_renders_every_chart_and_table_with_no_error_and_no_request(browser, pages):
    path = pages["example"]
    page = path.read_text()
    _load(browser, path)
    _assert_clean(browser, path)
    specs = _charts_json(page)
    charts, drawn, visible = _plots(browser)
    assert charts == drawn == visible == len(specs) >= 10
    reports = pastaprof.analyze(pastaprof.example_path())
    for r in reports:  # every table of every tool, its rows as the Report has them (capped)
        for name, t in r.tables.items():
            if t.num_rows:
                assert _dom_rows(browser, slug("t", r.tool, name)) == min(t.num_rows, MAX_TABLE_ROWS), (r.tool, name)
    # findings: all of them, in the order of the time at stake
    titles = browser.eval('Array.from(document.querySelectorAll("#findings tbody tr summary")).map(s => s.textContent)')
    assert titles == [f.title for f in ordered_findings(reports)]
    assert "waiting for launches" in titles[0]
    sections = browser.eval('Array.from(document.querySelectorAll("section")).map(s => s.id)')
    assert sections[:2] == ["findings", "gpu-timeline"]
    assert {f"tool-{slug(r.tool)}" for r in reports} <= set(sections)
    assert path.stat().st_size < 20e6 and "chart-error" not in page
    browser.screenshot(path.with_suffix(".png"))
    assert path.with_suffix(".png").stat().st_size > 50_000  # a drawn page, not a blank one


def test_time_bins_match_a_brute_force_overlap_of_the_raw_events():
    """The busy ns of each bin, per stream, against a plain loop over the trace's own JSON
    (kernels, copies, memsets), and the device union against merged intervals."""
    src = DATA / "two_streams_copies.pt.trace.json.gz"
    reports = pastaprof.analyze(src, tools=[TimeBins()])
    s = reports[0].summary
    t0, bin_ns, n = s["t0_ns"], s["bin_ns"], s["bins"]
    with gzip.open(src, "rt") as f:
        base = int(json.load(f).get("baseTimeNanoseconds", 0))
    per_stream: dict[int, list[tuple[int, int]]] = {}
    for e in raw_events(src):
        if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
            a, b = interval_ns(e)
            per_stream.setdefault(int(e["args"]["stream"]), []).append((base + a, base + b))
    assert sorted(lane["stream"] for lane in s["streams"]) == sorted(per_stream)
    assert t0 == min(a for v in per_stream.values() for a, _ in v)
    for lane in s["streams"]:
        ivs = per_stream[lane["stream"]]
        assert lane["events"] == len(ivs)
        expect = [0] * n
        for a, b in ivs:
            for k in range(max(0, (a - t0) // bin_ns), min(n, (b - t0) // bin_ns + 1)):
                lo, hi = t0 + k * bin_ns, t0 + (k + 1) * bin_ns
                expect[k] += max(0, min(b, hi) - max(a, lo))
        got = [sum(v[k] for v in lane["bins"].values()) for k in range(n)]
        assert got == expect
        assert sum(lane["busy_ns"].values()) == sum(b - a for a, b in ivs)
    merged: list[list[int]] = []
    for a, b in sorted(iv for v in per_stream.values() for iv in v):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    (dev,) = s["devices"]
    assert dev["busy_ns"] == sum(b - a for a, b in merged) <= sum(sum(x["busy_ns"].values()) for x in s["streams"])


def test_bin_helpers_on_random_intervals_against_a_loop():
    rng = np.random.default_rng(7)
    for _ in range(50):
        m = int(rng.integers(0, 40))
        a = rng.integers(0, 10_000, m)
        b = a + rng.integers(0, 3_000, m)
        edges = np.arange(0, 14_001, int(rng.integers(50, 3_000)))
        expect = [sum(max(0, min(y, hi) - max(x, lo)) for x, y in zip(a, b)) for lo, hi in zip(edges[:-1], edges[1:])]
        assert busy_per_bin(a, b, edges).tolist() == expect
        s, e = union(a, b)
        covered = np.zeros(14_000, bool)
        for x, y in zip(a, b):
            covered[x:y] = True
        assert int((e - s).sum()) == int(covered.sum())
        assert np.all(s[1:] > e[:-1])
        cols = [rng.integers(-1, 3, m), rng.integers(0, 5, m) * 1_000_000_007, rng.integers(0, 2, m)]
        keys, of = group_codes(*cols) if m else (np.zeros((0, 3)), np.zeros(0))
        if m:
            rows = np.stack(cols, axis=1)
            assert np.array_equal(keys[of], rows)
            assert len(keys) == len({tuple(r) for r in rows.tolist()})


@needs_browser
def test_two_ranks_page_has_per_rank_bars_that_match_the_raw_traces(browser, pages):
    path = pages["ddp"]
    _load(browser, path)
    _assert_clean(browser, path)
    specs = _charts_json(path.read_text())
    assert browser.eval('!!document.getElementById("ranks")')
    (per_rank,) = [s for s in specs.values() if s["layout"]["title"]["text"] == "GPU busy time per rank"]
    expect = {}
    for rank in (0, 1):
        for e in raw_events(DATA / "ddp_mlp_2ranks" / f"rank-{rank}.pt.trace.json.gz"):
            if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
                a, b = interval_ns(e)
                expect[rank] = expect.get(rank, 0) + b - a
    got = {}
    for trace in per_rank["data"]:
        for cat, ms in zip(trace["x"], trace["y"]):
            got[cat] = got.get(cat, 0) + ms
    assert list(got) == ["0", "1"]
    for rank in (0, 1):
        assert got[str(rank)] == pytest.approx(expect[rank] / 1e6, abs=1e-5)
    nccl = sum(t["y"][i] for t in per_rank["data"] if t["name"] == "communication" for i in range(2))
    assert nccl > 0  # the DDP allreduce kernels are communication
    step_bars = [s for s in specs.values() if s["layout"]["title"]["text"] == "step time"][0]
    assert [t["name"] for t in step_bars["data"]] == ["rank 0", "rank 1"]


@needs_browser
def test_memory_view_marks_the_peak_the_memory_tool_found(browser, pages):
    path = pages["leak"]
    _load(browser, path)
    _assert_clean(browser, path)
    specs = _charts_json(path.read_text())
    (mem,) = [s for s in specs.values() if s["layout"]["title"]["text"] == "allocated memory over time"]
    rep = pastaprof.analyze(DATA / "leak_5steps.pt.trace.json.gz", tools=["memory"])[0]
    devices = [d for d in rep.tables["devices"].to_pylist() if d["peak_bytes"]]
    (peak,) = [t for t in mem["data"] if t["name"] == "peak"]
    assert sorted(peak["y"]) == sorted(round(d["peak_bytes"] / (1 << 30), 6) for d in devices)
    gpu = rep.tables["footprint"].filter(pa.compute.equal(rep.tables["footprint"]["device"], 0))
    (line,) = [t for t in mem["data"] if t["name"] == "gpu 0"]
    assert max(line["y"]) == pytest.approx(max(gpu["allocated_bytes"].to_pylist()) / (1 << 30), abs=1e-6)
    assert browser.eval('document.getElementById("tool-memory").querySelectorAll(".js-plotly-plot").length') >= 2


@needs_browser
def test_sorting_a_table_by_clicking_its_headers(browser, pages):
    _load(browser, pages["example"])
    anchor = slug("t", "kernels", "kernels")
    col = browser.eval(f'Array.from(document.getElementById("{anchor}").nextElementSibling.querySelectorAll("th"))'
                       '.findIndex(th => th.textContent === "launches")')
    read = (f'Array.from(document.getElementById("{anchor}").nextElementSibling.querySelector("tbody").rows)'
            f'.map(r => r.cells[{col}].getAttribute("data-v"))')
    before = browser.eval(read)
    click = (f'document.getElementById("{anchor}").nextElementSibling.querySelectorAll("th")[{col}].click()')
    browser.eval(click)
    desc = [int(v) for v in browser.eval(read)]
    assert desc == sorted((int(v) for v in before), reverse=True) and desc != [int(v) for v in before]
    browser.eval(click)
    assert [int(v) for v in browser.eval(read)] == sorted(desc)
    name_col = 0
    browser.eval(f'document.getElementById("{anchor}").nextElementSibling.querySelectorAll("th")[{name_col}].click()')
    names = browser.eval(f'Array.from(document.getElementById("{anchor}").nextElementSibling.querySelector("tbody")'
                         f'.rows).map(r => r.cells[{name_col}].textContent)')
    ordered = browser.eval(f"{json.dumps(names)}.slice().sort((a, b) => a.localeCompare(b))")
    assert names == ordered and len(names) == 74


def _hostile_trace(dest: Path) -> Path:
    """The MLP trace with its longest kernel and an op renamed to markup."""
    src = DATA / "mlp_train_3steps.pt.trace.json.gz"
    with gzip.open(src, "rt") as f:
        doc = json.load(f)
    kernels = [e for e in doc["traceEvents"] if e.get("cat") == "kernel" and e.get("ph") == "X"]
    top = max(kernels, key=lambda e: e["dur"])["name"]
    ops = [e for e in doc["traceEvents"] if e.get("cat") == "cpu_op"]
    op = ops[0]["name"]
    for e in doc["traceEvents"]:
        if e.get("name") == top:
            e["name"] = HOSTILE_KERNEL
        elif e.get("name") == op:
            e["name"] = HOSTILE_OP
    dest.write_text(json.dumps(doc))
    return dest


@needs_browser
def test_a_kernel_named_like_markup_stays_text(browser, tmp_path):
    trace = _hostile_trace(tmp_path / "hostile.pt.trace.json")
    out = tmp_path / "hostile.html"
    _cli("report", str(trace), "-o", str(out), "-q")
    page = out.read_text()
    assert page.count("<script") == 3 and "<img" not in page.replace(HOSTILE_KERNEL.replace("<", "&lt;"), "")
    _load(browser, out)
    _assert_clean(browser, out)
    assert browser.eval('document.querySelectorAll("img").length') == 0
    assert browser.eval('document.querySelectorAll("script").length') == 3
    assert browser.eval(f'document.body.textContent.includes({json.dumps(HOSTILE_KERNEL)})')
    assert browser.eval(f'document.body.textContent.includes({json.dumps(HOSTILE_OP.strip())})')
    # plotly drew the name as text too (the kernels chart's labels)
    assert browser.eval('Array.from(document.querySelectorAll("#tool-kernels svg text")).some('
                        't => t.textContent.includes("<img"))')


def test_the_file_names_no_other_file_or_host(pages):
    """Outside the inlined scripts, no src/href/url() at all but in-page anchors; the scripts
    have no src."""
    for path in pages.values():
        page = path.read_text()
        outside = re.sub(r"<script\b[^>]*>.*?</script>", "", page, flags=re.S)
        assert re.findall(r"<script\b[^>]*\bsrc=", page) == []
        assert re.findall(r"<link\b", outside) == []
        refs = re.findall(r"\b(?:src|href)\s*=\s*[\"']?([^\"' >]*)", outside)
        assert refs and all(r.startswith("#") for r in refs), [r for r in refs if not r.startswith("#")]
        assert "url(" not in outside and "@import" not in outside


def test_script_json_round_trips_hostile_strings_and_never_closes_the_element():
    rng = random.Random(20261201)
    alphabet = ["<", ">", "&", "/", "'", '"', "\\", "\u2028", "\u2029", "\x00", "\x1b", "script", "</", "<!--", "-->",
                "é", "\U0001f600", " ", "a", "\n", "]]>"]
    for _ in range(500):
        value = {"".join(rng.choices(alphabet, k=rng.randint(0, 6))): ["".join(rng.choices(alphabet, k=rng.randint(0, 12)))
                                                                       for _ in range(3)]}
        text = script_json(value)
        assert json.loads(text) == value
        low = text.lower()
        assert "</" not in low and "<!--" not in low and "\u2028" not in text and "\u2029" not in text


def test_a_tool_nobody_knows_gets_a_section_with_its_tables_chart_and_findings(tmp_path, browser):
    """Generic rendering: a third-party Report (a table with a name and a time column, a
    finding, a nested summary) appears without any change to the page code."""
    table = pa.table({"name": [HOSTILE_KERNEL, "b", "c"], "total_ns": [3_000_000, 2_000_000, 1_000],
                      "bytes": [1, 2, 3], "nested": [[1], [2], [3]]})
    rep = Report("thirdparty", tables={"by name": table}, summary={"things": 3, "per_rank": [{"rank": 0}]},
                 findings=[Finding("warning", "thing <b>slow</b>", {"impact_ns": 5_000}, location="x.py(3): f")])
    page = build_page([rep], source="memory")
    out = tmp_path / "third.html"
    out.write_text(page)
    _load(browser, out)
    _assert_clean(browser, out)
    assert _dom_rows(browser, slug("t", "thirdparty", "by name")) == 3
    assert browser.eval('document.querySelectorAll("#tool-thirdparty .js-plotly-plot").length') == 1
    assert browser.eval('document.querySelector("#findings summary").textContent') == "thing <b>slow</b>"
    assert browser.eval('document.querySelectorAll("b").length') == 0 or \
        browser.eval('Array.from(document.querySelectorAll("b")).every(b => !b.closest("summary"))')
    assert browser.eval('document.querySelector("#gpu-timeline .note").textContent') == "no GPU activity in this run"


def test_uvm_and_access_runs_get_their_tools_without_naming_them(tmp_path):
    from test_uvm_advisor import _program

    from pastaprof.store.writer import RunWriter

    uvm = tmp_path / "uvm"
    with RunWriter(uvm) as w:
        for kind, t in _program().items():
            w.write(kind, 0, t)
        w.commit({"ranks": [0], "source": "test"})
    names = [t if isinstance(t, str) else t.name for t in tools_for(uvm, None)]
    assert "uvm_advisor" in names and "working_set" not in names
    out = tmp_path / "uvm.html"
    _cli("report", str(uvm), "-o", str(out), "-q")
    page = out.read_text()
    rep = pastaprof.analyze(uvm, tools=["uvm_advisor"])[0]
    assert 'id="tool-uvm-advisor"' in page
    for name, t in rep.tables.items():
        if t.num_rows:
            m = re.search(rf'id="{slug("t", "uvm_advisor", name)}">.*?</h3>.*?<tbody>(.*?)</tbody>', page, re.S)
            assert m and m.group(1).count("<tr>") == min(t.num_rows, MAX_TABLE_ROWS)
    assert sum(html.escape(f.title) in page for f in rep.findings) == len(rep.findings) > 0


def test_access_run_report_has_the_instruction_level_tools(tmp_path):
    from pastaprof.events.schema import conform
    from pastaprof.store.writer import RunWriter

    acc = tmp_path / "acc"
    n = 4
    with RunWriter(acc) as w:
        w.write("access_summary", 0, conform("access_summary", pa.table({
            "start_ns": list(range(1_000, 1_000 + n)), "end_ns": list(range(1_000, 1_000 + n)), "rank": [0] * n,
            "correlation": list(range(1, n + 1)), "name": ["scale"] * n,
            "object_address": pa.array([0x7F00_0000_0000] * n, pa.uint64()), "object_bytes": [1 << 20] * n,
            "reads": [100] * n, "writes": [0] * n, "sectors": [64] * n})))
        w.commit({"ranks": [0], "source": "test"})
    names = [t if isinstance(t, str) else t.name for t in tools_for(acc, None)]
    assert {"working_set", "hotness"} <= set(names) and "uvm_advisor" not in names
    out = tmp_path / "acc.html"
    _cli("report", str(acc), "-o", str(out), "-q")
    page = out.read_text()
    assert 'id="tool-working-set"' in page and 'id="tool-hotness"' in page


def test_cli_outputs_stdout_json_beside_and_bad_input(tmp_path):
    p = _cli("report", "--example", "-o", "-")
    assert p.stdout.startswith("<!DOCTYPE html>") and p.stdout.rstrip().endswith("</html>")
    assert p.stderr.startswith("wrote -")
    html_out, json_out = tmp_path / "a.html", tmp_path / "a.json"
    p = _cli("analyze", "--example", "--html", str(html_out), "--json", str(json_out), "-q")
    doc = json.loads(json_out.read_text())
    assert "html_bins" not in doc["tools"] and set(doc["tools"]) >= {"kernels", "steps", "memory"}
    assert html_out.read_text().startswith("<!DOCTYPE html>")
    # -t is honoured: only the kernels section (and the page-wide ones)
    only = tmp_path / "k.html"
    _cli("report", "--example", "-t", "kernels", "-o", str(only), "-q")
    ids = re.findall(r'<section id="([^"]+)"', only.read_text())
    assert ids == ["findings", "gpu-timeline", "tool-kernels"]
    # bad input: one line, exit 2, the existing output untouched, nothing half-written beside it
    keep = tmp_path / "keep.html"
    keep.write_text("mine")
    bad = tmp_path / "bad.pt.trace.json"
    bad.write_text('{"traceEvents": [{"ph": "X", "ts": ')
    for args in (["report", str(bad), "-o", str(keep)], ["report", str(tmp_path / "missing"), "-o", str(keep)],
                 ["report", "--example", "-o", str(tmp_path / "no" / "dir.html")], ["report", "-o", str(keep)],
                 ["report", "--example", "-t", "nosuch", "-o", str(keep)]):
        p = _cli(*args, check=False)
        assert p.returncode == 2, args
        assert p.stderr.count("\n") == 1 and p.stderr.startswith("pastaprof: error: "), p.stderr
        assert "Traceback" not in p.stderr
    assert keep.read_text() == "mine"
    assert sorted(x.name for x in tmp_path.iterdir()) == ["a.html", "a.json", "bad.pt.trace.json", "k.html", "keep.html"]


@needs_browser
def test_dump_dom_of_headless_chromium_shows_the_drawn_plots(pages):
    """The plain `chromium --headless --dump-dom` route (no DevTools): the DOM after load has
    the plots drawn (plotly's SVG) and the tables."""
    p = subprocess.run([html_cdp.chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom",
                        pages["example"].resolve().as_uri()], capture_output=True, text=True, timeout=120)
    dom = p.stdout
    assert dom.count('class="main-svg"') >= 10
    assert dom.count("<table") >= 10 and "<img" not in dom


OTHER_TRACES = sorted((DATA / "foreign").glob("*.json")) + sorted((DATA / "recorded").glob("*.pt.trace.json.gz")) + \
    [DATA / "ranks" / "cpu_tb_2cycles", DATA / "bert4_infer_2iters.pt.trace.json.gz"]


@needs_browser
@pytest.mark.parametrize("source", OTHER_TRACES, ids=lambda p: p.name.split(".")[0])
def test_traces_from_other_programs_and_projects_render_whole(browser, tmp_path, source):
    """AMD (ROCm) traces, a torch 1.x trace, compiled and CUDA-graph programs, a CPU-only
    folder of two captures: every chart drawn, every table whole, nothing in the console."""
    out = tmp_path / "page.html"
    _cli("report", str(source), "-o", str(out), "-q")
    _load(browser, out)
    _assert_clean(browser, out)
    specs = _charts_json(out.read_text())
    charts, drawn, _ = _plots(browser)
    assert charts == drawn == len(specs)
    reports = pastaprof.analyze(source)
    for r in reports:
        for name, t in r.tables.items():
            if t.num_rows:
                assert _dom_rows(browser, slug("t", r.tool, name)) == min(t.num_rows, MAX_TABLE_ROWS), (r.tool, name)
    gpu = sum(pastaprof.load(source).table(k).num_rows for k in ("kernel", "memcpy", "memset"))
    heat = [s for s in specs.values() if s["data"] and s["data"][0]["type"] == "heatmap"]
    assert bool(heat) == bool(gpu)
    if not gpu:
        assert browser.eval('document.querySelector("#gpu-timeline .note").textContent') == "no GPU activity in this run"


def test_ranks_option_keeps_only_those_ranks(tmp_path):
    out = tmp_path / "r1.html"
    _cli("report", str(DATA / "ddp_mlp_2ranks"), "--ranks", "1", "-o", str(out), "-q")
    page = out.read_text()
    specs = _charts_json(page)
    (heat,) = [s for s in specs.values() if s["data"][0]["type"] == "heatmap"]
    assert heat["data"][0]["y"] and all(not y.startswith("rank") for y in heat["data"][0]["y"])  # one rank: no prefix
    assert 'id="ranks"' not in page
    rep = pastaprof.analyze(DATA / "ddp_mlp_2ranks", tools=["steps"], ranks=[1])[0]
    assert {s["rank"] for s in rep.tables["steps"].to_pylist()} == {1}
    (bars,) = [s for s in specs.values() if s["layout"]["title"]["text"] == "step time"]
    assert [t["name"] for t in bars["data"]] == ["rank 1"]
    assert len(bars["data"][0]["y"]) == rep.tables["steps"].num_rows


def test_sigterm_during_a_report_leaves_the_existing_file_and_no_partial(tmp_path):
    import signal
    import time

    keep = tmp_path / "keep.html"
    keep.write_text("mine")
    p = subprocess.Popen([sys.executable, "-m", "pastaprof.cli", "report", "--example", "-o", str(keep)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    time.sleep(1.5)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=60)
    assert p.returncode in (-signal.SIGTERM, 128 + signal.SIGTERM, 0), err
    assert b"Traceback" not in err  # a SIGTERM inside a DuckDB query ends as the signal too
    listing = sorted(x.name for x in tmp_path.iterdir())
    assert listing == ["keep.html"]
    text = keep.read_text()
    if p.returncode == 0:  # it finished first: the new page whole
        assert text.rstrip().endswith("</html>")
    else:  # killed before the rename (the old file whole) or between the rename and the exit (the new one)
        assert text == "mine" or (text.startswith("<!DOCTYPE html>") and text.rstrip().endswith("</html>")), text[-200:]


@needs_browser
@pytest.mark.parametrize("source", [None, DATA / "ddp_mlp_2ranks"], ids=["example", "ddp"])
def test_every_installed_tool_renders_with_its_charts(browser, tmp_path, source):
    """All tools at once (the new ones render generically): no chart lost to an error."""
    from pastaprof.tools.registry import available

    special = {"uvm_advisor", "working_set", "hotness", "coalescing", "heatmap"}
    names = [n for n in available() if n not in special]
    out = tmp_path / "all.html"
    _cli("report", *(["--example"] if source is None else [str(source)]), "-t", ",".join(names), "-o", str(out), "-q")
    page = out.read_text()
    assert "chart-error" not in page
    _load(browser, out)
    _assert_clean(browser, out)
    charts, drawn, _ = _plots(browser)
    assert charts == drawn == len(_charts_json(page))
    assert set(re.findall(r'<section id="tool-([^"]+)"', page)) == {slug(n) for n in names}


def test_a_cpu_only_run_shows_no_empty_gpu_columns():
    """A CPU-only profile's steps have null GPU columns: the page leaves them out and names them."""
    from pastaprof.report.html.sections import table_html

    (rep,) = pastaprof.analyze(DATA / "ranks" / "cpu_tb_2cycles", tools=["steps"])
    steps = rep.tables["steps"]
    assert steps.num_rows and steps["gpu_busy_ns"].null_count == steps.num_rows
    page = table_html("steps", steps, "t-steps")
    heads = re.findall(r'<th data-col="\d+"[^>]*>([^<]*)</th>', page)
    assert "wall_ns" in heads and "gpu_busy_ns" not in heads and "host_wait_ns" not in heads, heads
    assert "empty columns left out (gpu_busy_ns, gpu_idle_ns, host_wait_ns" in page
    assert page.count("<tr>") == 1 + steps.num_rows
    (gpu,) = pastaprof.analyze(DATA / "mlp_train_3steps.pt.trace.json.gz", tools=["steps"])
    assert "gpu_busy_ns</th>" in table_html("steps", gpu.tables["steps"], "t-steps")
    # no charts of GPU times that are all zeros: per op, per module, each step's GPU/idle split
    titles = lambda page: [spec["layout"]["title"]["text"] for spec in _charts_json(page).values()]  # noqa: E731
    cpu = titles(build_page(pastaprof.analyze(DATA / "ranks" / "cpu_tb_2cycles"), "cpu"))
    assert any(t.startswith("CPU time per op") for t in cpu) and any(t == "step time" for t in cpu), cpu
    assert not any("GPU time" in t or "where each step" in t for t in cpu), cpu
    mlp = titles(build_page(pastaprof.analyze(DATA / "mlp_train_3steps.pt.trace.json.gz"), "mlp"))
    assert any(t.startswith("GPU time launched per op") for t in mlp) and "GPU time per module" in mlp, mlp
    assert any(t.startswith("where each step") for t in mlp), mlp
