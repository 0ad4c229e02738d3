"""The bpftrace session behind the probe handler (handlers/probe.py) and the launcher's side
(handlers/probe_launch.py): start bpftrace with probe_spec.script's program, wait until its
probes are attached, calibrate its clock to the run's epoch clock, read its lines in bulk
into ``probe`` tables, and stop it once it has written what its rings hold.  Kept apart
from the handler so that a session that probes nothing never imports it.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv

from pastaprof.handlers.probe_spec import MAX_ARGS, ProbeSpec, resolve, script
from pastaprof.store.safe_read import native_buffer

# bpftrace's perf ring per CPU: its default (64 pages) loses bursts of calls; 64 MiB over all CPUs
RING_PAGES = max(64, min(8192, 1 << ((16384 // max(1, os.cpu_count() or 1)).bit_length() - 1)))
READY_TIMEOUT_S = 60.0  # bpftrace compiles its program with LLVM before attaching: ~2 s here
_COLUMNS = ["tag", "probe", "pid", "tid", "start", "end", *[f"a{j}" for j in range(MAX_ARGS)], "ret"]
_LOST = re.compile(rb"Lost (\d+) events")
_COUNTED = re.compile(r"^@n\[(\d+), (\d+)\]: (\d+)")


class ProbeError(RuntimeError):
    """bpftrace could not be started or attached (the message is the one line to show)."""


def unavailable() -> str | None:
    """Why eBPF probes cannot run here (one line), or None."""
    exe = shutil.which("bpftrace")
    if exe is None:
        return "bpftrace not found (apt-get install bpftrace)"
    if not _has_bpf_caps():
        return "eBPF needs root's capabilities (CAP_SYS_ADMIN, or CAP_BPF and CAP_PERFMON)"
    if not os.path.exists("/sys/kernel/btf/vmlinux"):
        return "the kernel has no BTF (/sys/kernel/btf/vmlinux)"
    return None


def _has_bpf_caps() -> bool:
    """Whether this process's effective capabilities (bpftrace inherits them) allow loading
    eBPF programs: CAP_SYS_ADMIN (21), or CAP_BPF (39) with CAP_PERFMON (38).  Unreadable:
    assumed so (bpftrace then says what fails)."""
    try:
        for line in Path("/proc/self/status").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("CapEff:"):
                eff = int(line.split()[1], 16)
                return bool(eff & (1 << 21)) or (bool(eff & (1 << 39)) and bool(eff & (1 << 38)))
    except (OSError, ValueError):
        pass
    return True


class BpftraceSession:
    """One bpftrace recording the specs' calls in ``root_pid``'s process tree (with
    ``include_root`` the root process itself too), read in batches into Arrow tables."""

    def __init__(self, specs: tuple[ProbeSpec, ...], root_pid: int, rank: int, include_root: bool = True) -> None:
        self.specs, self.root_pid, self.rank, self.include_root = specs, root_pid, rank, include_root
        self.dir = Path(tempfile.mkdtemp(prefix="pastaprof-probe-"))
        self.out_path, self.err_path = self.dir / "events.csv", self.dir / "bpftrace.err"
        self.proc: subprocess.Popen[bytes] | None = None
        self.pos = 0  # bytes of the output parsed
        self.offset_ns = 0  # epoch ns = bpftrace ns + offset_ns
        self.offset_error_ns = 0
        self.lost = 0
        self.raw_rows = 0  # call lines read (before pastaprof's own threads' are left out)
        self.counted: dict[tuple[int, int], int] = {}  # (pid, probe) -> calls counted in the kernel
        self._lock = threading.Lock()
        self.tid = 0  # the thread that started bpftrace: its getppid() calls are the clock marks
        self._names = pa.array([s.text for s in specs], pa.string())
        self._libs = pa.array([s.lib for s in specs], pa.string())
        self._functions = pa.array([s.function for s in specs], pa.string())
        self._nargs = np.array([s.nargs for s in specs], np.int64)
        self._uprobe = np.array([s.kind == "uprobe" for s in specs], bool)

    # -- life ---------------------------------------------------------------
    def start(self) -> None:
        """Start bpftrace and wait until its probes are attached, then calibrate its clock."""
        libc = resolve("libc.so.6", "libc.so.6")
        tid = threading.get_native_id()
        self.tid = tid
        text = script(self.specs, self.root_pid, tid, libc, self.include_root)
        (self.dir / "probes.bt").write_text(text, encoding="utf-8")
        # stdout, not -o: bpftrace buffers a -o file fully whatever -B says (the ready line would wait)
        cmd = ["bpftrace", "-B", "line", str(self.dir / "probes.bt")]
        if shutil.which("setpriv"):
            cmd = ["setpriv", "--pdeathsig", "TERM", "--", *cmd]  # never outlives the process that started it
        env = {**os.environ, "BPFTRACE_PERF_RB_PAGES": os.environ.get("BPFTRACE_PERF_RB_PAGES", str(RING_PAGES))}
        env.pop("PYTHONPATH", None)
        with open(self.err_path, "wb") as err, open(self.out_path, "wb") as out:
            try:
                self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env,
                                             start_new_session=True, close_fds=True)
            except OSError as e:
                raise ProbeError(f"bpftrace did not start: {e.strerror}") from None
        self._wait_for(lambda data: b"R," in data, READY_TIMEOUT_S, "attach its probes")
        self._check_attached()
        self._calibrate()

    def _check_attached(self) -> None:
        """bpftrace leaves out a uprobe whose function it cannot find (its "Attaching N
        probes" says so): fewer than BEGIN, END, the clock mark and each spec's is an error."""
        want = 3 + sum(2 if s.kind == "uprobe" else 1 for s in self.specs)
        m = re.search(rb"Attaching (\d+) probes?", self.out_path.read_bytes())
        if m and int(m.group(1)) < want:
            self.close()
            raise ProbeError(f"bpftrace attached {int(m.group(1))} of {want} probes (a function or USDT probe "
                             "it did not find)")

    def _wait_for(self, done: Any, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while True:
            data = self.out_path.read_bytes()[self.pos:]
            if done(data):
                return
            if self.proc is None or self.proc.poll() is not None:
                line = self.error_line()
                self._cleanup()
                raise ProbeError(f"bpftrace could not {what}: {line}")
            if time.monotonic() > deadline:  # stopped at once: no marker of a session that never started to wait for
                self.proc.kill()
                self.proc.wait()
                self.proc = None
                self._cleanup()
                raise ProbeError(f"bpftrace did not {what} within {timeout:.0f} s")
            time.sleep(0.01)

    def error_line(self) -> str:
        """bpftrace's most telling error line."""
        try:
            lines = self.err_path.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            lines = []
        errors = [ln.strip() for ln in lines if "ERROR" in ln and "RLIMIT_MEMLOCK" not in ln and "detach" not in ln]
        return (errors or [ln.strip() for ln in lines if ln.strip()] or ["it exited"])[0][:300]

    def _calibrate(self, rounds: int = 8) -> None:
        """epoch = bpftrace ns + offset: the probed getppid() between two time_ns() reads, the
        tightest of ``rounds`` pairs; the uncertainty is half its width."""
        pairs = []
        for _ in range(rounds):
            t1 = time.time_ns()
            os.getppid()
            t2 = time.time_ns()
            pairs.append((t1, t2))
        self._wait_for(lambda data: data.count(b"\nC,") >= rounds, 10.0, "calibrate its clock")
        ks = [int(m) for m in re.findall(rb"\nC,(\d+)", self.out_path.read_bytes())[:rounds]]
        best = min(range(rounds), key=lambda i: pairs[i][1] - pairs[i][0])
        t1, t2 = pairs[best]
        self.offset_ns = (t1 + t2) // 2 - ks[best]
        self.offset_error_ns = (t2 - t1 + 1) // 2

    def stop(self) -> None:
        """Let the last calls reach the output (a marker call, seen in it), then stop bpftrace."""
        p = self.proc
        if p is None:
            return
        if p.poll() is None:
            self._catch_up()
        if p.poll() is None:
            p.send_signal(signal.SIGINT)
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.proc = None
        try:
            self.lost += sum(int(n) for n in _LOST.findall(self.err_path.read_bytes()))
        except OSError:
            pass

    def _catch_up(self, timeout: float = 60.0) -> None:
        """Wait until bpftrace has written what its rings hold: the marker call (from the
        calibrating thread) is seen and the output stopped growing for 0.2 s (bpftrace's
        ring of another CPU may still be read after the marker's)."""
        before = self._size()
        marked = threading.get_native_id() == self.tid
        if marked:
            marks = self.out_path.read_bytes().count(b"\nC,")
            os.getppid()
        deadline, last, still = time.monotonic() + timeout, before, time.monotonic()
        while time.monotonic() < deadline:
            time.sleep(0.02)
            size = self._size()
            if size != last:
                last, still = size, time.monotonic()
            elif time.monotonic() - still >= 0.2 and (not marked or self.out_path.read_bytes().count(b"\nC,") > marks):
                return

    def _size(self) -> int:
        try:
            return self.out_path.stat().st_size
        except OSError:
            return 0

    def _cleanup(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)

    def close(self) -> None:
        """Stop (if running) and remove the files."""
        self.stop()
        self._cleanup()

    # -- reading ------------------------------------------------------------
    def read(self, own_tids: set[int] | None = None, final: bool = False) -> pa.Table:
        """The calls written since the last read, as a ``probe`` table (epoch ns)."""
        with self._lock:
            try:
                with open(self.out_path, "rb") as f:
                    f.seek(self.pos)
                    data = f.read()
            except OSError:
                return _empty()
            if not final:
                data = data[:data.rfind(b"\n") + 1]  # a line being written is read next time
            self.pos += len(data)
            if self.proc is None and not final:
                self._cleanup_if_done()
        return self.parse(data, own_tids or set())

    def _cleanup_if_done(self) -> None:
        """After stop, once everything was read, the files go."""
        try:
            if self.pos >= self.out_path.stat().st_size:
                self._cleanup()
        except OSError:
            pass

    def parse(self, data: bytes, own_tids: set[int]) -> pa.Table:
        """bpftrace's lines -> a ``probe`` table; lines that are not calls are skipped."""
        if not data.strip():
            return _empty()
        skipped: list[str] = []

        def skip(row: Any) -> str:
            skipped.append(row.text)
            return "skip"

        table = pcsv.read_csv(
            pa.BufferReader(native_buffer(data)),
            read_options=pcsv.ReadOptions(column_names=_COLUMNS, block_size=1 << 24),
            parse_options=pcsv.ParseOptions(invalid_row_handler=skip),
            convert_options=pcsv.ConvertOptions(column_types={c: (pa.string() if c == "tag" else pa.int64())
                                                              for c in _COLUMNS}))
        for text in skipped:
            if (m := _LOST.search(text.encode())):
                self.lost += int(m.group(1))
            elif (m := _COUNTED.match(text)):
                self.counted[(int(m.group(1)), int(m.group(2)))] = int(m.group(3))
        return self._events(table, own_tids)

    def missing(self) -> int:
        """Calls the kernel counted that no line (nor a "Lost N events") accounts for: bpftrace
        stopped before it read them.  Known once bpftrace ended (its counters print at exit)."""
        return max(0, sum(self.counted.values()) - self.raw_rows - self.lost) if self.counted else 0

    def calls(self) -> dict[str, int]:
        """Calls per probe as the kernel counted them (all recorded processes), once bpftrace ended."""
        out: dict[str, int] = {}
        for (_pid, i), n in sorted(self.counted.items()):
            if 0 <= i < len(self.specs):
                out[self.specs[i].text] = out.get(self.specs[i].text, 0) + n
        return out

    def _events(self, t: pa.Table, own_tids: set[int]) -> pa.Table:
        probe = t["probe"].to_numpy(zero_copy_only=False)
        pid = t["pid"].to_numpy(zero_copy_only=False)
        tid = t["tid"].to_numpy(zero_copy_only=False)
        keep = (np.asarray(t["tag"].to_numpy(zero_copy_only=False)) == "P") & (probe >= 0) & (probe < len(self.specs))
        self.raw_rows += int(keep.sum())
        if own_tids:
            keep &= ~((pid == os.getpid()) & np.isin(tid, np.fromiter(own_tids, np.int64)))
        idx = np.flatnonzero(keep)
        if not len(idx):
            return _empty()
        probe, pid, tid = probe[idx], pid[idx], tid[idx]
        ids = pa.array(probe.astype(np.int32))
        nargs = self._nargs[probe]
        a = np.stack([t[f"a{j}"].to_numpy(zero_copy_only=False)[idx] for j in range(MAX_ARGS)], axis=1)
        values = a[np.arange(MAX_ARGS)[None, :] < nargs[:, None]]  # row-major: each row's first nargs
        offsets = np.concatenate([[0], np.cumsum(nargs)]).astype(np.int32)
        ret = t["ret"].to_numpy(zero_copy_only=False)[idx]
        n = len(idx)
        return pa.table({
            "start_ns": t["start"].to_numpy(zero_copy_only=False)[idx] + self.offset_ns,
            "end_ns": t["end"].to_numpy(zero_copy_only=False)[idx] + self.offset_ns,
            "rank": np.full(n, self.rank, np.int32), "pid": pid, "tid": tid,
            "name": pa.DictionaryArray.from_arrays(ids, self._names),
            "lib": pa.DictionaryArray.from_arrays(ids, self._libs),
            "function": pa.DictionaryArray.from_arrays(ids, self._functions),
            "args": pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, pa.int64())),
            "ret": pa.array(ret, pa.int64(), mask=~self._uprobe[probe]),
        })


def _empty() -> pa.Table:
    from pastaprof.events.schema import empty

    return empty("probe")
