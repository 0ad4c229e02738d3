#!/usr/bin/env python3
"""Where `pastaprof analyze` / `pastaprof import` spend time and memory, phase by phase.

Runs the same code path as the CLI in this process (``api.analyze`` + ``write_json``,
or ``api.import_trace``), with timers wrapped around pastaprof's functions from the
outside (monkeypatching; nothing in src/ is changed):

  stage_events (staging copy of the event array) or stage_plain (a big plain file) | DuckDB statements of the Kineto
  importer, each on its own: read_json -> raw, flows, ev (+ flow join), counts, and
  one projection per kind (executing the query + fetching it as Arrow) |
  _collectives | link_rank (link_ops, place_ops, link_api, link_activity) |
  conform + submit (fan-out to tools, Parquet writer when importing) | each tool's
  report() | write_json | writer.commit

For each phase: wall seconds, CPU seconds of the process, RSS at its end and the
peak RSS seen while it ran (sampled every 20 ms from /proc/self/statm), and the
bytes DuckDB says it holds (``duckdb_memory()``) after its big statements.

    .venv/bin/python bench/profile_import.py /tmp/pastaprof-bench/gpt2_x57.pt.trace.json -t kernels,timeline
    .venv/bin/python bench/profile_import.py TRACE --import-to /tmp/pastaprof-bench/prof_run
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import resource
import shutil
import sys
import threading
import time
from pathlib import Path

T_START = time.perf_counter()
PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_now() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * PAGE


class Recorder:
    def __init__(self) -> None:
        self.rows: list[dict] = []
        self.stack: list[dict] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.is_set():
            r = rss_now()
            for fr in self.stack:
                fr["peak"] = max(fr["peak"], r)
            self._stop.wait(0.02)

    @contextlib.contextmanager
    def phase(self, name: str):
        r0 = rss_now()
        fr = {"name": name, "depth": len(self.stack), "peak": r0, "rss_start": r0}
        self.rows.append(fr)
        self.stack.append(fr)
        t0, c0 = time.perf_counter(), time.process_time()
        try:
            yield fr
        finally:
            fr["wall_s"] = time.perf_counter() - t0
            fr["cpu_s"] = time.process_time() - c0
            fr["rss_end"] = rss_now()
            fr["peak"] = max(fr["peak"], fr["rss_end"])
            self.stack.pop()

    def wrap(self, owner, attr: str, name: str | None = None):
        fn = getattr(owner, attr)
        label = name or attr

        def wrapped(*a, **k):
            with self.phase(label):
                return fn(*a, **k)

        setattr(owner, attr, wrapped)
        return fn

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


REC = Recorder()


class TimedRelation:
    def __init__(self, rel, label: str) -> None:
        self._rel, self._label = rel, label

    def to_arrow_table(self, *a, **k):
        with REC.phase(self._label) as fr:
            t = self._rel.to_arrow_table(*a, **k)
            fr["rows"] = t.num_rows
            fr["arrow_bytes"] = t.nbytes
            return t

    def __getattr__(self, item):
        return getattr(self._rel, item)


class TimedCon:
    """A DuckDB connection whose statements are timed, labelled by what they do."""

    def __init__(self, con) -> None:
        self._con = con

    @staticmethod
    def _label(sql: str) -> str:
        s = " ".join(sql.split())
        if "read_json" in s:
            return "duckdb: read_json -> " + (re.search(r"CREATE TEMP TABLE (\w+)", s) or [None, "?"])[1]
        if m := re.search(r"CREATE TEMP TABLE (\w+)", s):
            return f"duckdb: table {m.group(1)}"
        if s.startswith(("DROP", "DELETE", "UPDATE")):
            return "duckdb: " + " ".join(s.split()[:3]).lower()
        if "GROUP BY" in s:
            return "duckdb: category counts"
        if "count(*)" in s:
            return "duckdb: count checks"
        return "duckdb: " + s[:40]

    def _duck_mem(self) -> int | None:
        try:
            return int(self._con.execute("SELECT sum(memory_usage_bytes) FROM duckdb_memory()").fetchone()[0])
        except Exception:
            return None

    def execute(self, sql, *a, **k):
        label = self._label(sql)
        with REC.phase(label) as fr:
            r = self._con.execute(sql, *a, **k)
            if "CREATE" in sql[:200]:
                fr["duckdb_memory_bytes"] = self._duck_mem()
            return r

    def sql(self, sql, *a, **k):
        m = re.search(r"WHERE kind = '(\w+)'", sql) or re.search(r"lcat IN \('(\w+)'", sql)
        label = m.group(1) if m else " ".join(sql.split())[:30]
        return TimedRelation(self._con.sql(sql, *a, **k), f"projection: {label}")

    def __getattr__(self, item):
        return getattr(self._con, item)


def instrument() -> None:
    with REC.phase("python imports (pastaprof, duckdb, pyarrow, tools)"):
        import pastaprof.api  # noqa: F401
        import pastaprof.importers.kineto as kineto
        import pastaprof.processor.link as link
        import pastaprof.processor.pipeline as pipeline
        import pastaprof.report.findings as findings
        import pastaprof.store.writer as writer
        from pastaprof.tools.registry import available

        tools = available()

    REC.wrap(kineto, "stage_events", "staging copy (stage_events)")
    if hasattr(kineto, "stage_plain"):  # a big plain file: staged by kernel copies, its events unread
        REC.wrap(kineto, "stage_plain", "staging of a plain file (stage_plain)")
    orig_connect = kineto._connect
    kineto._connect = lambda *a, **k: TimedCon(orig_connect(*a, **k))
    REC.wrap(kineto, "_project", "kineto._project (all DuckDB work)")
    import pastaprof.engine.mapcombine as mapcombine
    import pastaprof.importers.kineto_importer as kineto_importer

    REC.wrap(kineto_importer, "import_file", "import_file (stage + DuckDB + temp cleanup)")
    for attr in ("collectives", "_collectives"):  # the name kineto.py imports it under (old trees: _collectives)
        if hasattr(kineto, attr):
            REC.wrap(kineto, attr, "collectives from ops")
            break
    if hasattr(kineto, "_borrow_flow_ids"):
        REC.wrap(kineto, "_borrow_flow_ids", "borrow flow ids (old traces)")
    REC.wrap(pipeline, "link_rank", "link_rank")
    REC.wrap(mapcombine, "link_rank", "link_rank")
    for f in ("link_ops", "place_ops", "link_api", "link_activity"):
        REC.wrap(link, f)
    REC.wrap(pipeline, "conform", "conform (cast to schema)")
    REC.wrap(mapcombine, "conform", "conform (cast to schema)")
    REC.wrap(mapcombine.Combiner, "add", "combiner add (tables to tools)")
    orig_submit = pipeline.Processor.submit

    def submit(self, kind, table, rank=0):
        with REC.phase(f"submit {kind} ({table.num_rows:,} rows)"):
            return orig_submit(self, kind, table, rank)

    pipeline.Processor.submit = submit
    REC.wrap(writer.RunWriter, "write", "parquet write")
    REC.wrap(writer.RunWriter, "commit", "run dir commit")
    for name, cls in tools.items():
        REC.wrap(cls, "report", f"tool {name}: report()")
    REC.wrap(findings, "write_json", "write_json")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace", type=Path)
    ap.add_argument("-t", "--tools", default="kernels,timeline")
    ap.add_argument("--import-to", type=Path, help="profile `pastaprof import` into this run dir instead of analyze")
    ap.add_argument("--json", type=Path, help="also write the phase rows as JSON here")
    args = ap.parse_args(argv)
    instrument()
    from pastaprof.api import analyze, import_trace
    from pastaprof.report.findings import write_json

    t0 = time.perf_counter()
    with REC.phase("TOTAL (after imports)"):
        if args.import_to:
            shutil.rmtree(args.import_to, ignore_errors=True)
            import_trace(args.trace, args.import_to)
        else:
            tools = [t for t in args.tools.split(",") if t]
            reports = analyze(args.trace, tools=tools)
            out = Path("/tmp/pastaprof-bench/profile_analyze.json")
            write_json(reports, out, source=str(args.trace))
    total = time.perf_counter() - t0
    REC.close()
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(f"{'phase':<66} {'wall s':>7} {'cpu s':>7} {'RSS end':>8} {'peak':>8}  extra")
    for r in REC.rows:
        extra = []
        if "rows" in r:
            extra.append(f"{r['rows']:,} rows, {r['arrow_bytes'] / 1e6:.0f} MB arrow")
        if r.get("duckdb_memory_bytes"):
            extra.append(f"duckdb holds {r['duckdb_memory_bytes'] / 1e6:.0f} MB")
        name = "  " * r["depth"] + r["name"]
        print(f"{name[:66]:<66} {r['wall_s']:7.2f} {r['cpu_s']:7.2f} {r['rss_end'] / 1e9:7.2f}G {r['peak'] / 1e9:7.2f}G  "
              + "; ".join(extra))
    print(f"process: {time.perf_counter() - T_START:.1f} s from interpreter start ({total:.1f} s of work), "
          f"ru_maxrss {maxrss / 1e9:.2f} GB")
    if args.json:
        args.json.write_text(json.dumps({"rows": REC.rows, "ru_maxrss_bytes": maxrss, "total_s": total}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
