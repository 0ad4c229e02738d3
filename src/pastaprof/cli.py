"""The ``pastaprof`` command line.

Every failure a user can cause (bad path, corrupt trace, unknown tool, bad
flag) ends as one line on stderr and exit code 2 -- never a traceback.
"""

from __future__ import annotations

import errno
import io
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from pastaprof import __version__
from pastaprof.errors import PastaprofError


def _fail(message: str) -> None:
    from pastaprof.report.names import terminal_safe

    click.echo(f"pastaprof: error: {terminal_safe(message)}", err=True)  # one line, no control sequences
    sys.exit(2)


def _echo(message: str, err: bool = False) -> None:
    """A line for the terminal: names and paths in it cannot send control sequences."""
    from pastaprof.report.names import terminal_safe
    from pastaprof.report.pipes import silence

    try:
        click.echo(terminal_safe(message), err=err)
    except BrokenPipeError:  # the reader went away (| head): see main
        silence(2 if err else 1)


def _parse_ranks(value: str | None) -> list[int] | None:
    """'0,2,4-7' -> [0, 2, 4, 5, 6, 7] (live/config.py ``parse_rank_list``, the one parser of
    rank lists); a bad list is one line, exit 2."""
    if value is None:
        return None
    from pastaprof.live.config import parse_rank_list

    return list(_run_guarded(lambda: parse_rank_list(value, "--ranks")))


def _parse_tools(value: str | None) -> list[str] | None:
    if not value:
        return None
    return [t.strip() for t in value.split(",") if t.strip()]


def _progress(path: Path, quiet: bool) -> Any:
    """Progress of a long import and its phases on stderr (report/progress.py)."""
    from pastaprof.report.progress import progress_for

    return progress_for(path, quiet)


class _Terminated(BaseException):
    """SIGTERM/SIGHUP while pastaprof writes: unwinds like Ctrl-C, so that every writer removes
    its temp file or hidden run directory before pastaprof dies of the signal."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


#: Signals _terminate raised _Terminated for: a library that swallows the exception (DuckDB turns
#: it into "RuntimeError: Query interrupted") still ends the command as that signal, not a traceback.
_PENDING_SIGNALS: list[int] = []


def _terminate(signum: int, _frame: Any) -> None:
    _PENDING_SIGNALS.append(signum)
    raise _Terminated(signum)


def _die_of(signum: int) -> None:
    import signal

    from pastaprof.store.run_dirs import discard_unpublished

    discard_unpublished()
    sys.stdout.flush()
    signal.signal(signum, signal.SIG_DFL)  # die of it, as the sender expects
    signal.raise_signal(signum)
    sys.exit(128 + signum)


def _run_guarded(fn: Callable[[], Any], signals: bool = True) -> Any:
    """``fn`` with pastaprof's errors as one line and exit 2; with ``signals``, a SIGTERM or SIGHUP
    cleans up first (``pastaprof run`` passes those to its program instead)."""
    import signal

    _PENDING_SIGNALS.clear()
    old = {sig: signal.signal(sig, _terminate) for sig in (signal.SIGTERM, signal.SIGHUP)} if signals else {}
    try:
        return fn()
    except Exception as e:
        if _PENDING_SIGNALS:  # our _Terminated, swallowed and re-raised as another error by a library
            _die_of(_PENDING_SIGNALS[-1])
        if isinstance(e, PastaprofError):
            _fail(str(e))
        if isinstance(e, MemoryError):
            _fail("out of memory")
        overflow = _overflow(e)
        if overflow:
            _fail(overflow)
        raise
    except KeyboardInterrupt:
        from pastaprof.store.run_dirs import discard_unpublished

        discard_unpublished()
        click.echo("pastaprof: interrupted", err=True)
        sys.exit(130)
    except _Terminated as e:
        _die_of(e.signum)
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


def _overflow(e: Exception) -> str | None:
    """The line for numbers of the input that int64 arithmetic cannot take once added up or
    subtracted (a damaged or hand-made store: kernels on another clock than ops), else None."""
    import duckdb

    if isinstance(e, (duckdb.ConversionException, duckdb.OutOfRangeException)) and (
            "INT128" in str(e) or "overflow" in str(e).lower() or "out of range" in str(e).lower()):
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return ("the input's numbers do not fit 64-bit integers once added up (times of different event kinds "
                f"far apart? sizes too large?): {first[:200]}")
    if isinstance(e, OverflowError):
        return f"the input's numbers do not fit 64-bit integers: {e}"
    return None


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", "-V", prog_name="pastaprof")
def cli() -> None:
    """pastaprof: program analysis for GPU workloads.

    Analyze a PyTorch profiler (Kineto) trace or a pastaprof run:

        pastaprof analyze --example
        pastaprof analyze trace.json.gz -t kernels,timeline --json findings.json
    """


@cli.command()
@click.argument("path", required=False, type=click.Path(path_type=Path))
@click.option("--example", is_flag=True, help="Analyze the bundled example (GPT-2 small, 3 training steps, H200).")
@click.option("-t", "--tools", "tools", metavar="TOOL[,TOOL]", help="Tools to run (see `pastaprof tools`).")
@click.option("--json", "json_out", type=click.Path(path_type=Path), help="Write findings and tables as JSON here.")
@click.option("--ranks", metavar="LIST", help="Only these ranks, e.g. 0,2,4-7.")
@click.option("-o", "--out", type=click.Path(path_type=Path), help="Also store the imported events as a run directory.")
@click.option("--rows", default=10, show_default=True, type=click.IntRange(1, 10_000),
              help="Rows per table in the terminal (JSON has them all).")
@click.option("--wide", is_flag=True, help="Full names and every column, one line per row however long.")
@click.option("-q", "--quiet", is_flag=True, help="No terminal tables (use with --json).")
@click.option("--uvm-plan", "uvm_plan", type=click.Path(path_type=Path), help="Write the uvm_advisor plan (JSON) here.")
@click.option("--access-run", "access_run", type=click.Path(path_type=Path),
              help="uvm_advisor: an access run of the same program (pastaprof run -t working_set), to choose "
                   "between migrating an allocation and pinning it on the CPU.")
@click.option("--html", "html_out", type=click.Path(path_type=Path),
              help="Also write the HTML report here (one self-contained page; see `pastaprof report`).")
@click.option("--engine", type=click.Choice(["local", "dask"]), default="local", show_default=True,
              help="Where the per-rank work runs: this process, or a Dask cluster (docs/scale.md).")
@click.option("--scheduler", metavar="ADDRESS",
              help="--engine dask: the scheduler of an existing cluster (default: start a local one).")
def analyze(path: Path | None, example: bool, tools: str | None, json_out: Path | None, ranks: str | None,
            out: Path | None, rows: int, wide: bool, quiet: bool, uvm_plan: Path | None, access_run: Path | None,
            engine: str = "local", scheduler: str | None = None, html_out: Path | None = None) -> None:
    """Run analysis tools on a trace file, a folder of per-rank traces, or a run directory."""
    from pastaprof.api import analyze as run_analyze
    from pastaprof.api import example_path
    from pastaprof.report.findings import write_json
    from pastaprof.report.terminal import print_reports

    if example == (path is not None):
        _fail("give either a PATH or --example")
    source = example_path() if example else path
    assert source is not None
    rank_list = _parse_ranks(ranks)
    tool_list = _parse_tools(tools)
    from pastaprof.engine import check_engine

    _run_guarded(lambda: check_engine(engine, scheduler))  # before anything is read
    from pastaprof.store.outputs import check_not_input, check_output_file, is_stdout
    from pastaprof.store.run_dirs import check_output_dir

    for target in (json_out, uvm_plan, html_out, out):
        _run_guarded(lambda t=target: check_not_input(t, (source, access_run)))
    for target in (json_out, uvm_plan, html_out):
        if target is not None:
            _run_guarded(lambda t=target: check_output_file(t))  # before the analysis, not after it
    if html_out is not None:
        from pastaprof.report import html as html_report

        _run_guarded(html_report.check_available)
        tool_list = html_report.tools_for(source, tool_list)
    if out is not None:
        _run_guarded(lambda: check_output_dir(out))
    for flag, given in (("--uvm-plan", uvm_plan), ("--access-run", access_run)):
        if given is not None and tool_list is not None and "uvm_advisor" not in tool_list:
            _fail(f"{flag} needs the uvm_advisor tool (-t uvm_advisor)")
    if access_run is not None:
        from pastaprof.api import is_run_dir
        from pastaprof.tools.uvm_advisor import UvmAdvisor

        if not is_run_dir(access_run):
            _fail(f"{access_run}: not a pastaprof run directory (--access-run)")
        if tool_list is not None:  # the advisor with its option, in the place of its name
            tool_list = [UvmAdvisor(access_run=str(access_run)) if t == "uvm_advisor" else t for t in tool_list]

    def work() -> None:
        from pastaprof.report.progress import phase

        with _progress(source, quiet) as progress:
            reports = run_analyze(source, tools=tool_list, ranks=rank_list, progress=progress, out=out,
                                  engine=engine, scheduler=scheduler)
            phase(progress, "writing the report")
        if html_out is not None:
            reports, everything = html_report.split(reports)
            html_report.write_html(everything, html_out, source=str(source))
        if not quiet:  # with --json on stdout, stdout carries the JSON alone
            print_reports(reports, max_rows=rows, stderr=is_stdout(json_out) or is_stdout(uvm_plan) or is_stdout(html_out),
                          wide=wide)
        if json_out is not None:
            write_json(reports, json_out, source=str(source))
        if uvm_plan is not None:
            from pastaprof.tools.uvm_advisor import write_plan

            rep = next((r for r in reports if r.tool == "uvm_advisor"), None)
            if rep is not None:
                write_plan(rep, str(uvm_plan))

    _run_guarded(work)


@cli.command("report")
@click.argument("path", required=False, type=click.Path(path_type=Path))
@click.option("--example", is_flag=True, help="Report on the bundled example (GPT-2 small, 3 training steps, H200).")
@click.option("-o", "--out", "dest", required=True, type=click.Path(path_type=Path),
              help="The HTML file to write (- for standard output).")
@click.option("-t", "--tools", "tools", metavar="TOOL[,TOOL]", help="Tools to run (see `pastaprof tools`).")
@click.option("--ranks", metavar="LIST", help="Only these ranks, e.g. 0,2,4-7.")
@click.option("-q", "--quiet", is_flag=True, help="No line saying what was written.")
def report(path: Path | None, example: bool, dest: Path, tools: str | None, ranks: str | None, quiet: bool) -> None:
    """Write an HTML report of a trace, a folder of per-rank traces or a run directory: one
    self-contained page (works offline) with the findings, GPU timeline, steps, kernels, ops,
    modules, memory and per-rank charts, and every tool's tables."""
    from pastaprof.api import analyze as run_analyze
    from pastaprof.api import example_path
    from pastaprof.report import html as html_report
    from pastaprof.store.outputs import check_not_input, check_output_file, is_stdout

    if example == (path is not None):
        _fail("give either a PATH or --example")
    source = example_path() if example else path
    assert source is not None
    rank_list = _parse_ranks(ranks)
    _run_guarded(lambda: check_not_input(dest, (source,)))
    _run_guarded(lambda: check_output_file(dest))  # before the analysis, not after it
    _run_guarded(html_report.check_available)
    tool_list = html_report.tools_for(source, _parse_tools(tools))

    def work() -> None:
        from pastaprof.report.progress import phase

        with _progress(source, quiet) as progress:
            reports = run_analyze(source, tools=tool_list, ranks=rank_list, progress=progress)
            phase(progress, "writing the HTML page")
            size = html_report.write_html(reports, dest, source=str(source))
        if not quiet:
            _echo(f"wrote {dest} ({size / 1e6:.1f} MB)", err=is_stdout(dest))

    _run_guarded(work)


@cli.command("import")
@click.argument("path", type=click.Path(path_type=Path))
@click.option("-o", "--out", required=True, type=click.Path(path_type=Path), help="Run directory to create.")
@click.option("--ranks", metavar="LIST", help="Only these ranks, e.g. 0,2,4-7.")
@click.option("--force", is_flag=True, help="Replace OUT if it exists.")
def import_cmd(path: Path, out: Path, ranks: str | None, force: bool) -> None:
    """Import a foreign trace into a run directory (Parquet + run.json)."""
    from pastaprof.api import import_trace

    def work() -> None:
        with _progress(path, False) as progress:
            dest = import_trace(path, out, ranks=_parse_ranks(ranks), force=force, progress=progress)
        _echo(f"wrote {dest}")

    _run_guarded(work)


@cli.command()
def tools() -> None:
    """List the installed analysis tools."""
    from pastaprof.tools.registry import available

    for name, cls in available().items():
        _echo(f"{name:<14} {cls.description}  [consumes: {', '.join(cls.consumes)}]")


@cli.command("handlers")
def handlers_cmd() -> None:
    """List the installed capture handlers (event sources of `pastaprof run`)."""
    from pastaprof.handlers.registry import describe

    for h in describe():
        extra = "".join(f"  [{k}: {', '.join(v) if isinstance(v, list) else v}]"
                        for k, v in (("capabilities", h["capabilities"]), ("settings", h["settings"]),
                                     ("starts on import of", h["starts_on_import"])) if v)
        _echo(f"{h['name']:<10} kinds: {', '.join(h['kinds'])}{extra}")


@cli.command()
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--ranks", metavar="LIST", help="Only these ranks.")
def info(path: Path, ranks: str | None) -> None:
    """What a run or trace holds: manifest, ranks, devices, event counts per kind."""

    from pastaprof.api import load
    from pastaprof.report.terminal import make_console
    from pastaprof.report.terminal import markup_safe as ms

    def work() -> None:
        with _progress(path, False) as progress:
            run = load(path, ranks=_parse_ranks(ranks), progress=progress)
        events = _events_table(run)  # reads every part first: a damaged one is the only line printed
        m = run.manifest
        console = make_console()
        version = f" {m['format_version']}" if m.get("format_version") else ""
        console.print(f"[bold]{ms(path)}[/]  format={ms(m.get('format', 'pastaprof'))}{ms(version)}"
                      f"  schema={ms(m.get('schema_version', '-'))}  ranks={ms(run.ranks)}", soft_wrap=True)
        for d in m.get("devices", []):
            console.print(ms(f"  device {d.get('id')}: {d.get('name')} ({d.get('numSms', '?')} SMs)"))
        if m.get("versions"):
            console.print(ms("  versions: " + ", ".join(f"{k}={v}" for k, v in m["versions"].items())), soft_wrap=True)
        if m.get("unknown_categories"):
            console.print(ms(f"  unknown categories (skipped): {m['unknown_categories']}"), soft_wrap=True)
        from pastaprof.report.run_info import run_lines

        for line in run_lines(m):
            console.print(ms(f"  {line}"), soft_wrap=True)
        notes = m.get("notes") if run.path is not None else None  # a trace's notes went to stderr as it was read
        for line in notes if isinstance(notes, list) else []:
            console.print(ms(f"  note: {line}"), soft_wrap=True)
        console.print(events)

    _run_guarded(work)


def _events_table(run: Any) -> Any:
    """Events per kind, first and last as offsets from the run's first event (epoch ns say nothing to a reader)."""
    import pyarrow.compute as pc
    from rich.table import Table

    from pastaprof.report.terminal import format_value
    from pastaprof.report.terminal import markup_safe as ms

    spans = [(kind, table.num_rows, pc.min(table["start_ns"]).as_py(), pc.max(table["end_ns"]).as_py())
             for kind, table in run.iter_tables() if table.num_rows]
    starts = [s for _, _, s, _ in spans if s is not None]
    t0 = min(starts, default=0)
    t = Table("kind", "events", "first (from start)", "last (from start)", title="events")
    for kind, n, first, last in spans:
        t.add_row(ms(kind), f"{n:,}", "-" if first is None else format_value("duration_ns", first - t0),
                  "-" if last is None else format_value("duration_ns", last - t0))
    return t


@cli.command()
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--perfetto", "fmt", flag_value="perfetto", default=True,
              help="Perfetto protobuf trace (the default and only format so far).")
@click.option("-o", "--out", "dest", required=True, type=click.Path(path_type=Path),
              help="Output file, e.g. trace.pftrace (.gz to compress).")
@click.option("--ranks", metavar="LIST", help="Only these ranks.")
def export(path: Path, fmt: str, dest: Path, ranks: str | None) -> None:
    """Export a run or trace: Perfetto trace with kernels per stream, ops per thread,
    op -> kernel flows and a memory counter track.  Open it at ui.perfetto.dev."""
    from pastaprof.api import load
    from pastaprof.store.outputs import check_not_input, check_output_file, is_stdout

    _run_guarded(lambda: check_not_input(dest, (path,)))
    _run_guarded(lambda: check_output_file(dest))  # before loading the input, not after

    def work() -> None:
        from pastaprof.report.perfetto import write_perfetto

        with _progress(path, False) as progress:
            run = load(path, ranks=_parse_ranks(ranks), progress=progress)
        counts = write_perfetto(run, dest)
        _echo(f"wrote {dest} ({', '.join(f'{k}={v}' for k, v in counts.items())})", err=is_stdout(dest))

    _run_guarded(work)


@cli.command("diff")
@click.argument("base", type=click.Path(path_type=Path))
@click.argument("new", type=click.Path(path_type=Path))
@click.option("--json", "json_out", type=click.Path(path_type=Path), help="Write the comparison as JSON here.")
@click.option("--fail-above", "fail_above", type=float, metavar="PCT",
              help="Exit 3 when something got slower by more than PCT% of the base step (or total) time.")
@click.option("--rows", default=15, show_default=True, type=click.IntRange(1, 10_000), help="Rows per table.")
@click.option("-q", "--quiet", is_flag=True, help="No terminal tables (use with --json or --fail-above).")
def diff_cmd(base: Path, new: Path, json_out: Path | None, fail_above: float | None, rows: int, quiet: bool) -> None:
    """Compare two traces or runs: per step, kernel, op, module and call site; new and
    vanished kernels; findings resolved and introduced.  Usable as a CI gate."""
    from pastaprof.report.diff import diff_main

    sys.exit(_run_guarded(lambda: diff_main(base, new, json_out, fail_above, rows, quiet)))


@cli.command("build-native")
def build_native() -> None:
    """Build the native capture libraries now (else the first profiled run does)."""
    from pastaprof import native

    for name, what in native.build_all().items():
        _echo(f"{name}: {what}")


@cli.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("-t", "--tools", metavar="TOOL[,TOOL]", help="Tools whose reports print when the program exits.")
@click.option("-o", "--out", type=click.Path(path_type=Path), help="Run directory to create.")
@click.option("--ranges", metavar="A,B*", help="Record only inside these ranges (PASTAPROF_RANGES).")
@click.option("--kernels", metavar="REGEX", help="Record only kernels whose name matches (PASTAPROF_KERNELS).")
@click.option("--sample", metavar="N", help="Record every Nth kernel launch (PASTAPROF_SAMPLE).")
@click.option("--steps", metavar="A:B", help="Record only steps A..B-1 (PASTAPROF_STEPS).")
@click.option("--ranks", "ranks_", metavar="LIST", help="Record only these ranks (PASTAPROF_RANKS).")
@click.option("--shapes", metavar="sample|all", help="Ops' input shapes, dtypes and pointers: of sampled calls (default) "
              "or of every op (PASTAPROF_SHAPES).")
@click.option("--no-shapes", is_flag=True, default=False, help="Ops without input shapes (PASTAPROF_SHAPES=none).")
@click.option("--call-sites/--no-call-sites", default=None,
              help="Record ops' Python call sites (PASTAPROF_CALL_SITES, default on).")
@click.option("--uvm", is_flag=True, default=None, help="Record unified-memory counters (PASTAPROF_UVM).")
@click.option("--apply-uvm-plan", "uvm_plan", metavar="FILE",
              help="Apply a uvm_advisor plan in the program (PASTAPROF_UVM_PLAN).")
@click.option("--process", metavar="gpu|cpu",
              help="Reduce instruction-level accesses on the GPU (default) or on the CPU from raw records "
                   "(PASTAPROF_PROCESS).")
@click.option("--page-bytes", metavar="N", help="Page size of access hotness histograms (PASTAPROF_PAGE, 65536).")
@click.option("--probe", "probes", metavar="SPEC", multiple=True,
              help="eBPF probe, repeatable: LIB:FUNCTION (uprobe+uretprobe) or usdt:BINARY:PROVIDER:PROBE, "
                   "optionally :args=N (PASTAPROF_PROBE; docs/probes.md).")
@click.option("--force", is_flag=True, help="Replace OUT if it exists.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED, required=True)
def run(tools: str | None, out: Path | None, ranges: str | None, kernels: str | None, sample: str | None,
        steps: str | None, ranks_: str | None, shapes: str | None, no_shapes: bool, call_sites: bool | None, uvm: bool | None,
        uvm_plan: str | None, process: str | None, page_bytes: str | None, probes: tuple[str, ...], force: bool,
        command: tuple[str, ...]) -> None:
    """Profile a program without changing it:  pastaprof run [OPTIONS] -- python train.py ARGS

    Works with `python -m pkg` and `torchrun ...` too; every Python process of the
    program (ranks, DataLoader workers) records its own shard of one run.  The
    program's output, and its exit code, are its own.
    """
    from pastaprof.live.launch import launch

    def onoff(v: bool | None) -> str | None:
        return None if v is None else str(int(v))

    flags = {"TOOLS": tools, "RANGES": ranges, "KERNELS": kernels, "SAMPLE": sample, "STEPS": steps,
             "RANKS": ranks_, "SHAPES": "none" if no_shapes else shapes, "CALL_SITES": onoff(call_sites), "UVM": onoff(uvm),
             "UVM_PLAN": str(Path(uvm_plan).resolve()) if uvm_plan else None, "PROCESS": process,
             "PAGE": page_bytes}
    if probes:  # a Python program's session probes it; another program is probed by the launcher
        flags.update({"PROBE": ";".join(probes), "EAGER": "1"})
    code = _run_guarded(lambda: launch(list(command), out, flags, force), signals=False)
    sys.exit(code)


def main(argv: list[str] | None = None) -> None:
    """Entry point.  A reader that closed the output early (``pastaprof info RUN | head``) ends
    the command as it ends any Unix tool, by SIGPIPE (a shell sees 141), but only after the
    files it was asked for are written; no message."""
    import signal

    from pastaprof.report.pipes import reader_gone, silence

    if sys.stdout is None:  # the shell closed it (`>&-`): printing fails, as below, in one line
        sys.stdout = _ClosedOutput()
    try:
        _main(argv)
        sys.stdout.flush()
    except BrokenPipeError:
        silence(1)
    except OSError as e:  # the terminal output could not be written (a full disk, a closed stdout)
        if e.filename is not None or e.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EBADF, errno.EFBIG):
            raise
        silence(1)  # nothing more is written there, and no flush at exit fails
        from pastaprof.store.outputs import problem

        click.echo(f"pastaprof: error: cannot write the output: {problem(e)}", err=True)
        sys.exit(2)
    if reader_gone():
        sys.stderr.flush()
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        signal.raise_signal(signal.SIGPIPE)


class _ClosedOutput(io.TextIOBase):
    """Standard output the shell closed: the first thing printed fails as writing a closed
    descriptor does (main makes it one line)."""

    def writable(self) -> bool:
        return True

    def write(self, s: str) -> int:
        if s:
            raise OSError(errno.EBADF, "standard output is closed")
        return 0


def _main(argv: list[str] | None) -> None:
    """click's multi-line usage errors become one line and exit 2."""
    try:
        cli.main(args=argv, prog_name="pastaprof", standalone_mode=False)
    except click.exceptions.NoArgsIsHelpError as e:
        click.echo(e.ctx.get_help() if e.ctx else "")
    except click.UsageError as e:
        hint = f" (see `pastaprof {e.ctx.info_name} --help`)" if e.ctx and e.ctx.parent else " (see `pastaprof --help`)"
        _fail(e.format_message().replace("\n", " ") + hint)
    except click.exceptions.Abort:
        click.echo("pastaprof: interrupted", err=True)
        sys.exit(130)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except click.ClickException as e:
        _fail(e.format_message())


if __name__ == "__main__":
    main()
