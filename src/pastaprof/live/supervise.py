"""``pastaprof run``'s side of the program's life: start it, pass signals on, die as it died.

Why this is not ``subprocess.Popen`` + ``child.wait()`` + Python signal handlers:

* Signals sent to ``pastaprof run`` itself must reach the program (else a SIGHUP,
  SIGUSR1 or SIGQUIT killed pastaprof and orphaned the program), but a signal the
  terminal sends to the whole foreground process group (Ctrl-C, Ctrl-\\, a window
  resize) already reached the program and must not be sent twice.  Only a signal's
  ``si_code`` tells the two apart: the supervisor blocks every catchable signal and
  takes them with ``sigtimedwait``, passing on those sent by a process (``kill``,
  ``si_code <= 0``) and never those the kernel sent to the group (``SI_KERNEL``), nor
  those the program's own processes sent (to their group, or to their parent).  A
  signal another process sends to the whole group (``kill -TERM -PGID``) reaches the
  program twice: nothing in ``siginfo`` tells it from one sent to pastaprof alone.
* The signals are blocked (``hold()``) before ``pastaprof run`` imports anything that starts
  threads of its own (numpy's OpenBLAS workers, pyarrow's jemalloc), so every thread of the
  process inherits the block: a thread that did not block them would take a process-directed
  SIGCHLD (lost: its default action is to ignore it) or SIGTERM (its default action would
  kill pastaprof mid-compaction and orphan the program).  So the parent waits for the
  program in one blocking ``sigtimedwait`` that only a signal ends, with a long timeout as the
  net for a library that unblocks them in a thread of its own; it uses no CPU while the
  program runs.  A signal that came before the program started was meant for pastaprof
  itself: it is delivered then, as if nothing had been blocked.
* The blocked mask must not reach the program: it is spawned with the mask
  ``pastaprof run`` was started with (``posix_spawnp``'s ``setsigmask``), and with
  SIGPIPE and SIGXFSZ at their default actions as ``Popen`` leaves them.
* A program stopped by job control (Ctrl-Z) stops ``pastaprof run`` too when it runs
  in a terminal's foreground, as the shell expects of a job's processes.
* A program killed by signal N makes ``pastaprof run`` die of signal N after the run
  is stored (a shell shows 128+N), without writing a core file of its own (which
  could replace the program's ``core``); SIGKILL included (the OOM killer).
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import sys
import time
from pathlib import Path
from typing import Any

# Faults are the kernel's verdict on pastaprof's own code, never blocked; SIGKILL/SIGSTOP cannot be.
_NOT_FORWARDED = {signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD, signal.SIGSEGV, signal.SIGBUS,
                  signal.SIGFPE, signal.SIGILL, signal.SIGTRAP, signal.SIGSYS}
FORWARDED = frozenset(s for s in signal.valid_signals() if s not in _NOT_FORWARDED)
_JOB_STOPS = {signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU, signal.SIGSTOP}
_SAFETY_S = 10.0  # a SIGCHLD taken by a foreign thread that unblocked it delays the exit by this much at most
_TAKEN = FORWARDED | {signal.SIGCHLD}


def hold() -> set[int]:
    """Block the signals the supervisor takes, in this thread and so in every thread started
    after; returns the mask before (``Supervised(held=...)`` spawns the program with it)."""
    return signal.pthread_sigmask(signal.SIG_BLOCK, _TAKEN)


def release(held: set[int]) -> None:
    """Undo ``hold()`` where no program was started: signals that came meanwhile are delivered."""
    signal.pthread_sigmask(signal.SIG_SETMASK, held)


class Supervised:
    """The program as a child process: ``start()``, then ``wait()`` for its exit code
    (``-N`` for a death by signal N, as ``Popen.returncode``)."""

    def __init__(self, command: list[str], env: dict[str, str], held: set[int] | None = None) -> None:
        self.command = command
        self.env = env
        self.pid = 0
        self.ended_ns = 0  # wall clock when the program was reaped (at most a look after its death)
        self.max_rss_bytes = 0  # the program's peak resident memory (its largest process), from wait4
        self.forwarded: dict[str, int] = {}  # signal name -> times passed on
        self._old_mask: set[int] | None = held  # from hold(), called early; else start() blocks

    def start(self) -> None:
        """Spawn the program with the signal mask we were started with; block ours."""
        if self._old_mask is None:
            self._old_mask = hold()
        elif signal.sigpending() & FORWARDED:  # came before the program existed: meant for us
            signal.pthread_sigmask(signal.SIG_SETMASK, self._old_mask)  # delivered (may end us)
            signal.pthread_sigmask(signal.SIG_BLOCK, _TAKEN)
        try:
            self.pid = os.posix_spawnp(self.command[0], self.command, self.env, setsigmask=self._old_mask,
                                       setsigdef=(signal.SIGPIPE, signal.SIGXFSZ))
        except BaseException:
            self.restore()
            raise

    def wait(self) -> int:
        """Pass signals on until the program ends; its exit code."""
        while True:
            code = self._reap()
            if code is not None:
                return code
            info = signal.sigtimedwait(_TAKEN, _SAFETY_S)
            if info is None or info.si_signo == signal.SIGCHLD:
                continue
            # sent by a process (kill, sigqueue, tgkill), not by the program itself (to its group,
            # which it is part of, or to its parent, which bare is not the program either)
            if info.si_code <= 0 and not self._from_program(info.si_pid):
                try:
                    os.kill(self.pid, info.si_signo)
                    name = _signal_name(info.si_signo)
                    self.forwarded[name] = self.forwarded.get(name, 0) + 1
                except ProcessLookupError:
                    pass

    def _from_program(self, sender: int) -> bool:
        """Whether ``sender`` is the program or one of its descendants (a /proc walk up)."""
        for _ in range(64):
            if sender == self.pid:
                return True
            if sender in (0, 1, os.getpid()):
                return False
            try:
                sender = int(_proc_stat(sender)[1])  # the parent's pid
            except (ValueError, IndexError):
                return False
        return False

    def _reap(self) -> int | None:
        try:
            pid, status, usage = os.wait4(self.pid, os.WNOHANG | os.WUNTRACED)
        except ChildProcessError:  # reaped by someone else (cannot know how it ended)
            return 1
        if pid == 0:
            return None
        self.max_rss_bytes = max(self.max_rss_bytes, usage.ru_maxrss * 1024)
        if os.WIFSTOPPED(status):
            if os.WSTOPSIG(status) in _JOB_STOPS and _foreground():
                os.kill(os.getpid(), signal.SIGSTOP)  # the shell waits for every process of the job to stop
            return None
        self.ended_ns = time.time_ns()
        return os.waitstatus_to_exitcode(status)

    def restore(self) -> None:
        """Discard signals still pending for us (meant for a program that has ended), unblock."""
        if self._old_mask is None:
            return
        pending = signal.sigpending() & FORWARDED
        while pending and signal.sigtimedwait(pending, 0) is not None:
            pending = signal.sigpending() & FORWARDED
        signal.pthread_sigmask(signal.SIG_SETMASK, self._old_mask)
        self._old_mask = None


def _foreground() -> bool:
    """Whether we run in the foreground process group of a controlling terminal (job control)."""
    for fd in (0, 1, 2):
        with contextlib.suppress(OSError):
            return os.tcgetpgrp(fd) == os.getpgrp()
    return False


def die_like(code: int) -> int:
    """End this process as the program ended: exit code ``code`` or, for ``-N``, signal N
    (returns 128+N only if that signal did not end us)."""
    if code >= 0:
        return code
    sig = -code
    sys.stdout.flush()
    sys.stderr.flush()
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))
    if sig not in (signal.SIGKILL, signal.SIGSTOP):
        with contextlib.suppress(ValueError, OSError):
            signal.signal(sig, signal.SIG_DFL)
    with contextlib.suppress(ValueError, OSError):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {sig})
    os.kill(os.getpid(), sig)
    return 128 + sig


def _signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def loss_bound_ms(overhead: dict[str, Any], ended_ns: int = 0) -> int:
    """What a process that died without its final flush lost at most, in ms of its run.
    Where its death is known (``ended_ns``: the program, reaped by ``pastaprof run``): the time
    from its manifest's ``flushed_through_ns`` to then, measured.  Else what the flush design
    bounds it by: the deadline, a flush period, the run of the flush that completed last and of
    the one in progress (each at most the longest measured, live/flush.py) and one look of the
    deadline thread."""
    from pastaprof.live.flush import LOOK_MS

    through = overhead.get("flushed_through_ns")
    if ended_ns and isinstance(through, int) and not isinstance(through, bool) and 0 < through <= ended_ns:
        return -(-(ended_ns - through) // 1_000_000)
    bounds = overhead.get("bounds") or {}
    deadline, period = bounds.get("deadline_ms", 0), bounds.get("flush_ms", 0)
    longest = overhead.get("longest_flush_ms", 0)
    if not all(isinstance(v, (int, float)) for v in (deadline, period, longest)):
        return 0
    return int(round(deadline + period + 2 * longest + LOOK_MS)) if deadline else 0


RUNNING = ("still running when the program ended (left behind: a daemon): the events it recorded after its "
           "last flush are not in the run")


def _proc_stat(pid: int) -> list[bytes]:
    """The fields of ``/proc/PID/stat`` after the command's name (state, ppid, ...); [] where
    the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return []


def _running(pid: Any) -> bool:
    """Whether process ``pid`` is alive (not a zombie)."""
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    state = _proc_stat(pid)[:1]
    return bool(state) and state[0] != b"Z"


def program_notes(run_dir: Any, manifest: dict[str, Any], code: int, child: Supervised | None) -> str:
    """How the program ended and what that cost the run: into run.json's ``program`` (rewritten
    in ``run_dir`` before it is published), and the words for the exit line ("" if nothing)."""
    from pastaprof.store.compact import _dumps
    from pastaprof.store.writer import MANIFEST

    procs = [p for p in manifest.get("processes") or [] if isinstance(p, dict)]
    gone = [p for p in procs if isinstance(p.get("status"), dict) and "exit" in p["status"]]
    unflushed = [p.get("pid") for p in gone]
    running = [p for p in gone if p.get("pid") != (child.pid if child else None) and _running(p.get("pid"))]
    for p in running:  # a daemon the program left behind: not a crash
        p["status"]["exit"] = RUNNING
        if isinstance(manifest.get("status"), dict):
            manifest["status"][f"rank {p.get('rank')} pid {p.get('pid')}: exit"] = RUNNING
    gone = [p for p in gone if p not in running]
    ended = {child.pid: child.ended_ns} if child is not None else {}
    lost_ms = max((loss_bound_ms(p.get("capture_overhead") or {}, ended.get(p.get("pid"), 0)
                                 if isinstance(p.get("pid"), int) else 0) for p in gone), default=0)
    program: dict[str, Any] = {"exit_code": code, "signal": _signal_name(-code) if code < 0 else None,
                               "unflushed_pids": unflushed, "running_pids": [p.get("pid") for p in running],
                               "lost_at_most_ms": lost_ms if gone else 0}
    if child is not None:
        program["max_rss_bytes"] = child.max_rss_bytes
        program["signals_forwarded"] = child.forwarded
    manifest["program"] = program
    (Path(run_dir) / MANIFEST).write_bytes(_dumps(manifest))
    notes = []
    if code < 0:
        notes.append(f"the program was killed by {program['signal']}")
    stopped = sum(str((p.get("status") or {}).get("exit", "")).startswith("capture stopped") for p in procs)
    crashed = len(gone) - stopped
    if crashed > 0:
        notes.append(f"{crashed} process{'es' if crashed > 1 else ''} ended without a final "
                     f"flush: events of the last {lost_ms} ms or less lost")
    if running:
        notes.append(f"{len(running)} process{'es' if len(running) > 1 else ''} still running (left behind by the "
                     f"program): events after {'their' if len(running) > 1 else 'its'} last flush not in the run")
    if stopped:  # its reason is the process's status line
        notes.append(f"capture stopped early in {stopped} process{'es' if stopped > 1 else ''}")
    dropped = int(manifest.get("dropped_events") or 0)
    if dropped:
        notes.append(f"{dropped} events dropped")
    return "".join(f"; {n}" for n in notes)


def capture_losses(manifest: dict[str, Any]) -> dict[str, Any] | None:
    """What the capture of a stored run lost (events dropped, processes that ended without a
    final flush), as a finding's fields for every report of the run; None if nothing."""
    dropped = int(manifest.get("dropped_events") or 0) if isinstance(manifest, dict) else 0
    program = manifest.get("program") if isinstance(manifest, dict) else None
    unflushed = list((program or {}).get("unflushed_pids") or []) if isinstance(program, dict) else []
    if not dropped and not unflushed:
        return None
    parts = []
    if dropped:
        parts.append(f"{dropped} events were dropped during capture")
    if unflushed:
        parts.append(f"{len(unflushed)} process(es) ended without a final flush (events after the last flush lost)")
    from pastaprof.tools.base import DATA_NOTE

    return {"severity": "warning", "title": "; ".join(parts) + ": counts and totals are low",
            "evidence": {"dropped_events": dropped, "unflushed_pids": unflushed, "at_stake": DATA_NOTE},
            "impact_ns": 0, "location": "the capture",
            "suggestion": "Read the counts as lower bounds, or capture again with fewer tools or a shorter run "
                          "so that no events are dropped."}
