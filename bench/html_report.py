#!/usr/bin/env python3
"""Time, memory and size of the HTML report (``pastaprof report``) on a big Kineto trace.

The trace is bench/make_big_trace.py's (the bundled example replicated ``--copies`` times; 57:
~4.0 M events, 1.28 GB).  Each command is a child process measured from the outside
(import_bench.measure: wall, peak RSS, CPU seconds):

  analyze   pastaprof analyze BIG -q -t TOOLS            (the same analysis, no page)
  report    pastaprof report BIG -o OUT.html -t TOOLS    (analysis + time bins + page)

so ``report - analyze`` is what the page costs.  TOOLS is ``--tools`` (default: the default
set; ``--tools kernels,timeline`` isolates the page's cost from the slow tools).  Then the page
is opened in headless Chromium (tests/html_cdp.py) and the seconds until every chart is drawn
are measured, with the console errors and network requests it made (expected: none).

Usage:
    .venv/bin/python bench/html_report.py                          # 57 copies, default tools
    .venv/bin/python bench/html_report.py --copies 16 --tools kernels,timeline
Results: a table on stdout, everything as JSON in --results.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))

from analyze_default import build  # noqa: E402
from import_bench import _git_state, machine_info, measure  # noqa: E402

WORK = Path("/tmp/pastaprof-bench")


def open_in_browser(page: Path) -> dict:
    try:
        import html_cdp
    except ImportError:
        return {"error": "tests/html_cdp.py not importable"}
    if html_cdp.chromium() is None:
        return {"error": "no chromium"}
    with html_cdp.Browser() as b:
        seconds = b.open(page, timeout=120)
        b.drain(0.5)
        charts = b.eval('document.querySelectorAll("div.chart.js-plotly-plot").length')
        return {"open_s": round(seconds, 3), "charts": charts, "errors": b.errors(),
                "requests": [u for u in b.requests() if u != page.resolve().as_uri() and not u.startswith("data:")]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--copies", type=int, default=57)
    ap.add_argument("--tools", help="tools for both commands (default: the default set)")
    ap.add_argument("--trace", type=Path, help="a trace to use instead of building one")
    ap.add_argument("--skip-analyze", action="store_true", help="only the report (the analysis alone is known)")
    ap.add_argument("--repeat", type=int, default=1, help="interleaved runs of each command (the median is reported)")
    ap.add_argument("--results", type=Path, default=WORK / "html_report.json")
    args = ap.parse_args(argv)
    trace = args.trace or build(args.copies)
    exe = str(Path(sys.executable).with_name("pastaprof"))
    tools = ["-t", args.tools] if args.tools else []
    out: dict = {"trace": str(trace), "trace_bytes": trace.stat().st_size, "tools": args.tools or "default",
                 "machine": machine_info(), "git": _git_state()}
    runs: dict[str, list[dict]] = {"analyze": [], "report": []}
    with tempfile.TemporaryDirectory(dir=WORK) as tmp:
        page = Path(tmp) / "report.html"
        for _ in range(args.repeat):  # interleaved: drift of a shared machine hits both alike
            if not args.skip_analyze:
                m = measure([exe, "analyze", str(trace), "-q", *tools])
                m.pop("stdout", None)
                runs["analyze"].append(m)
            m = measure([exe, "report", str(trace), "-o", str(page), "-q", *tools])
            m.pop("stdout", None)
            runs["report"].append(m)
        out["runs"] = runs
        for name, ms in runs.items():
            if ms:
                best = sorted(ms, key=lambda x: x.get("wall_s", 0))[len(ms) // 2]
                out[name] = {**best, "walls_s": [round(x.get("wall_s", 0), 2) for x in ms]}
        out["page_bytes"] = page.stat().st_size if page.exists() else None
        out["browser"] = open_in_browser(page) if page.exists() else {"error": "no page"}
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(out, indent=1))
    a, r = out.get("analyze", {}), out["report"]
    print(f"trace {trace.name} ({out['trace_bytes'] / 1e9:.2f} GB), tools {out['tools']}")
    if a:
        print(f"analyze: {a.get('wall_s', 0):.1f} s (runs {a.get('walls_s')}), CPU {a.get('user_s', 0) + a.get('sys_s', 0):.1f} s, "
              f"peak RSS {a.get('peak_rss_bytes', 0) / 2**30:.2f} GiB, rc {a.get('rc')}")
    print(f"report:  {r.get('wall_s', 0):.1f} s (runs {r.get('walls_s')}), CPU {r.get('user_s', 0) + r.get('sys_s', 0):.1f} s, "
          f"peak RSS {r.get('peak_rss_bytes', 0) / 2**30:.2f} GiB, rc {r.get('rc')}")
    if out["page_bytes"]:
        print(f"page: {out['page_bytes'] / 1e6:.2f} MB; browser: {out['browser']}")
    return 0 if r.get("rc") in (0, [0]) else 1


if __name__ == "__main__":
    sys.exit(main())
