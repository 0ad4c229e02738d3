"""``pastaprof run``: start a program under capture and turn its shards into a run.

The program is started as a child process with the bootstrap directory first
on PYTHONPATH (its sitecustomize starts a session in every Python process)
and the capture settings in PASTAPROF_* variables.  Its stdin/stdout/stderr
are its own; signals sent to pastaprof are passed on (live/supervise.py); its
exit status becomes ours (a death by signal is repeated on ourselves).  Settings are
validated before the program starts: a bad one is exit code 2.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pastaprof.errors import UsageError
from pastaprof.live.config import ENV_PREFIX, CaptureConfig
from pastaprof.live.python_flags import note_uncaptured
from pastaprof.live.supervise import Supervised, die_like, hold, program_notes, release
from pastaprof.report.names import terminal_safe

if TYPE_CHECKING:
    from pastaprof.store.run_dirs import OutputDir

BOOTSTRAP = Path(__file__).resolve().parent / "bootstrap"


def launch(command: list[str], out: Path | None, flags: dict[str, str | None], force: bool = False) -> int:
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise UsageError("nothing to run: pastaprof run [OPTIONS] -- python script.py")
    held = hold()  # before any import starts threads: each inherits the block (live/supervise.py)
    try:
        child, claim, config, t0, probes = _start(command, out, flags, force, held)
    except BaseException:
        release(held)
        raise
    # compaction's imports (pyarrow: ~0.1 s) and first calls, while the program runs instead of after it
    warm = threading.Thread(target=_warm_compaction, name="pastaprof-warm-up", daemon=True)
    warm.start()
    partial, dest = claim.tmp, claim.dest  # dest is not resolved: --force replaces a link, not its target
    try:
        code = child.wait()
        note_uncaptured(partial, command, child.pid)  # python -E/-I/-S kept the bootstrap out
        from pastaprof.handlers import native_program

        native_program.finish_hook(partial, config)  # native processes' record files -> parts
        if probes is not None:
            from pastaprof.handlers import probe_launch

            probe_launch.finish_hook(probes, partial)  # a program without Python: its probed calls -> parts
        wall = time.perf_counter() - t0
        warm.join(timeout=5)  # bounded: compaction does the same work itself if the warm-up is stuck
        _finish(partial, dest, command, code, wall, list(config.tools), claim, child)
    finally:
        child.restore()  # signals that came while the run was stored were meant for the ended program
    return die_like(code)  # a death by signal N is repeated on ourselves (a shell shows 128+N)


def _start(command: list[str], out: Path | None, flags: dict[str, str | None], force: bool,
           held: set[int]) -> tuple[Supervised, OutputDir, CaptureConfig, float, Any]:
    """Settings checked, the output claimed, the program's environment made and the program
    started; (the program, the claimed output, the settings, when it started, the probes of a
    program without Python or None)."""
    env = dict(os.environ)
    for key, value in flags.items():
        if value is not None:
            env[ENV_PREFIX + key] = value
    config = CaptureConfig.from_env(env)  # validates every setting before anything starts
    from pastaprof.store.run_dirs import OutputDir  # pyarrow: imported once hold() blocked the signals
    if config.tools:
        from pastaprof.tools.registry import resolve

        resolve(list(config.tools))
    claim = OutputDir(out or config.out or f"pastaprof-run-{time.strftime('%Y%m%d-%H%M%S')}", force)
    env[ENV_PREFIX + "OUT"] = str(claim.tmp)
    env["PASTAPROF_RUN_PARENT"] = "1"
    env["PASTAPROF_LAUNCHER"] = str(os.getpid())  # its stderr: where the program's own warnings go (live/messages.py)
    from pastaprof.handlers import registry

    if registry.loaded():  # found once here (from_env above, checking handler settings): not again
        env[registry.FOUND_ENV] = registry.entries_for_children()  # in each of the program's processes
    from pastaprof.handlers import native_program  # native CUDA programs: CUDA_INJECTION64_PATH

    # what pastaprof adds for itself: the bootstrap hides them from the program's os.environ
    added = [name for name in ("PYTHONPATH", "TEARDOWN_CUPTI", *native_program.ADDED_ENV) if name not in env]
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(BOOTSTRAP), env.get("PYTHONPATH", "")) if p)
    env.setdefault("TEARDOWN_CUPTI", "0")  # Kineto (torch.profiler) leaves CUPTI to pastaprof after its session

    native_program.launch_hook(env, command, config)
    env[ENV_PREFIX + "HIDE_ENV"] = ",".join(name for name in added if name in env)
    probes = None
    if env.get(ENV_PREFIX + "PROBE"):  # a Python program's session probes itself; others are probed from here
        from pastaprof.handlers import probe_launch

        probes = probe_launch.launch_hook(env, command, config)

    t0 = time.perf_counter()
    child = Supervised(command, env, held)  # signals for the program are passed on (live/supervise.py)
    try:
        child.start()
    except (OSError, ValueError) as e:  # ValueError: an empty program name, a NUL byte in an argument
        claim.discard()
        if probes is not None:
            probes.close()
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise UsageError(f"cannot start {command[0]!r}: {why}") from None
    return child, claim, config, t0, probes


def _warm_compaction() -> None:
    try:
        from pastaprof.store.compact import warm_up

        warm_up()
    except Exception:  # noqa: BLE001 -- _finish reports what fails for real
        pass


def _finish(partial: Path, dest: Path, command: list[str], code: int, wall: float, tools: list[str],
            claim: OutputDir, child: Supervised | None = None) -> None:
    from pastaprof.errors import PastaprofError
    from pastaprof.store.compact import compact
    from pastaprof.store.outputs import problem

    try:
        manifest = compact(partial, command=command, exit_code=code, wall_seconds=round(wall, 6))
        notes = program_notes(partial, manifest, code, child)  # how it ended, what that lost: run.json
        claim.publish()
    except PastaprofError as e:  # the output's own trouble (it appeared meanwhile, disk full): one line
        claim.discard()
        sys.stderr.write(f"pastaprof: warning: the run was not stored: {terminal_safe(str(e))}\n")
        return
    except OSError as e:  # compaction could not write the run (disk full, ulimit -f): the output's fault
        claim.discard()
        sys.stderr.write(terminal_safe(f"pastaprof: warning: the run was not stored in {dest}: {problem(e)}") + "\n")
        return
    except Exception as e:
        claim.discard()
        sys.stderr.write(f"pastaprof: warning: the run was not stored: {type(e).__name__}: {terminal_safe(str(e))}\n")
        return
    rows = manifest.get("rows", {})
    summary = ", ".join(f"{n} {k}" for k, n in sorted(rows.items())) or "no events"
    for line in sorted(set(manifest.get("status", {}).values())):  # what the run is like, then where it is
        if line != "ok":
            sys.stderr.write(f"pastaprof: {terminal_safe(str(line))}\n")
    sys.stderr.write(terminal_safe(f"pastaprof: run stored in {dest} ({summary}{notes})") + "\n")
    if tools:
        try:
            from pastaprof.api import analyze
            from pastaprof.report.terminal import print_reports

            print_reports(analyze(dest, tools=tools), stderr=True)  # stdout is the program's
        except Exception as e:
            sys.stderr.write(f"pastaprof: warning: tools failed: {type(e).__name__}: {terminal_safe(str(e))}\n")
