"""A captured program is never harmed, and its events survive how it ends: real torch CPU
programs under the real ``pastaprof run`` subprocess, killed, signalled, exec'd, forked,
ended with os._exit; op counts asserted against what the program itself says it did."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import pastaprof  # noqa: E402
from pastaprof.live.supervise import loss_bound_ms  # noqa: E402

PP = [sys.executable, "-m", "pastaprof.cli", "run"]
FLUSH_MS = 200

# A loop of tiny ops (one aten::add each) that says how many it has done, and when.
LOOP = textwrap.dedent("""
    import os, signal, sys, time
    import torch
    mode, seconds = sys.argv[1], float(sys.argv[2])
    print("pid", os.getpid(), flush=True)
    x = torch.ones(4)
    n, t0 = 0, time.monotonic()
    while time.monotonic() - t0 < seconds:
        for _ in range(200):
            x = x + 1
        n += 200
        print("n", n, round(time.monotonic() - t0, 3), flush=True)
        time.sleep(0.002)
    if mode != "wait":
        os.kill(os.getpid(), getattr(signal, mode))
    time.sleep(30)
""")


def _no_core() -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PASTAPROF_FLUSH_MS": str(FLUSH_MS), **extra}


def _start(tmp_path: Path, script: Path, *args: str, bare: bool = False) -> subprocess.Popen:
    cmd = [sys.executable, str(script), *args]
    if not bare:
        cmd = [*PP, "-o", str(tmp_path / "run"), "--", *cmd]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
                            preexec_fn=_no_core)


def _adds(run: Path) -> Counter:
    """aten::add rows per pid."""
    t = pastaprof.load(run).table("op")
    return Counter(p for p, name in zip(t["pid"].to_pylist(), t["name"].to_pylist()) if name == "aten::add")


def _progress(lines: list[str]) -> list[tuple[int, float]]:
    return [(int(ln.split()[1]), float(ln.split()[2])) for ln in lines if ln.startswith("n ")]


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def _wait_progress(proc: subprocess.Popen, upto_s: float) -> tuple[int, list[str]]:
    """The program's pid; its lines until its loop has run ``upto_s`` seconds."""
    lines = []
    pid = int(proc.stdout.readline().split()[1])
    while True:
        ln = proc.stdout.readline()
        lines.append(ln)
        if not ln or (ln.startswith("n ") and float(ln.split()[2]) >= upto_s):
            return pid, lines


@pytest.fixture()
def loop(tmp_path) -> Path:
    p = tmp_path / "loop.py"
    p.write_text(LOOP)
    return p


@pytest.mark.slow
@pytest.mark.parametrize("sig", ["SIGHUP", "SIGQUIT", "SIGTERM", "SIGINT", "SIGUSR1"])
@pytest.mark.parametrize("to", ["program", "pastaprof"])
def test_a_signal_ends_the_run_as_it_ends_the_bare_program_and_keeps_its_events(tmp_path, loop, sig, to):
    """Sent to the program or to ``pastaprof run``: same exit status as bare, the program is
    not orphaned, and no op is lost (the program had no handler: pastaprof's flushed)."""
    mode = sig if to == "program" else "wait"
    bare = _start(tmp_path, loop, mode, "0.3", bare=True)
    if to == "pastaprof":
        _wait_progress(bare, 0.2)
        bare.send_signal(getattr(signal, sig))
    bare.wait(timeout=30)
    proc = _start(tmp_path, loop, mode, "1.0")
    pid, lines = _wait_progress(proc, 0.8 if to == "pastaprof" else 99)
    if to == "pastaprof":
        proc.send_signal(getattr(signal, sig))
    out, err = proc.communicate(timeout=30)
    lines += out.splitlines()
    assert bare.returncode == -getattr(signal, sig)
    assert proc.returncode == bare.returncode, err
    assert _gone(pid)
    assert sig == "SIGINT" or "Traceback" not in err
    done = _progress(lines)[-1][0]
    adds = _adds(tmp_path / "run")
    assert adds[pid] >= done  # every op it finished before the signal (at most 200 more: the next batch)
    m = json.loads((tmp_path / "run" / "run.json").read_text())
    assert m["program"]["signal"] == sig and m["program"]["unflushed_pids"] == []
    assert f"killed by {sig}" in err
    if to == "pastaprof":
        assert m["program"]["signals_forwarded"] == {sig: 1}


@pytest.mark.slow
def test_sigkill_exits_137_and_keeps_the_events_up_to_the_last_flush(tmp_path, loop):
    """On a busy host (two CPU hogs on top of the program): the niced flush thread starves
    there, the deadline thread must not."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        proc = _start(tmp_path, loop, "wait", "10")
        pid, lines = _wait_progress(proc, 4.0)
        os.kill(pid, signal.SIGKILL)  # the OOM killer
        out, err = proc.communicate(timeout=60)
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    assert proc.returncode == -9, err  # a shell shows 137
    assert "Traceback" not in err
    assert _gone(pid)
    m = json.loads((tmp_path / "run" / "run.json").read_text())
    overhead = m["processes"][0]["capture_overhead"]
    assert overhead["bounds"]["deadline_ms"] == 2 * FLUSH_MS
    lost_ms = m["program"]["lost_at_most_ms"]
    assert m["program"] == {**m["program"], "signal": "SIGKILL", "unflushed_pids": [pid]}
    assert "killed by SIGKILL" in err and f"events of the last {lost_ms} ms or less lost" in err
    # The loss the run states is measured (the program's reaping minus the manifest's
    # flushed_through_ns): every op the program finished before the last line this test read
    # (the kill came later), less that loss, is kept.  And the deadline keeps the loss within
    # what the flush design bounds it by (the niced flush thread alone wrote its first part
    # after > 8 s here): ops finished that long before the kill are kept too.
    progress = _progress(lines)
    adds = _adds(tmp_path / "run")[pid]

    def done_by(lost: float) -> int:
        return max((n for n, t in progress if t <= progress[-1][1] - lost / 1000), default=0)

    assert 0 < done_by(lost_ms) <= adds <= progress[-1][0] + 200
    assert done_by(loss_bound_ms({**overhead, "flushed_through_ns": None})) <= adds, overhead
    reports = pastaprof.analyze(tmp_path / "run", tools=["ops"])  # the reports say what was lost too
    lost = [f for r in reports for f in r.findings if "without a final flush" in f.title]
    assert [f.evidence["unflushed_pids"] for f in lost] == [[pid]]


def test_getsignal_and_a_programs_own_handler_are_as_bare(tmp_path):
    p = tmp_path / "handlers.py"
    p.write_text(textwrap.dedent("""
        import os, signal, sys, time, torch
        print([signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGINT)])
        x = torch.ones(3)
        for _ in range(500):
            x = x + 1
        def mine(signum, frame):
            print("mine", signum, flush=True)
            sys.exit(7)
        print(signal.signal(signal.SIGTERM, mine))           # the previous one: SIG_DFL
        print(signal.getsignal(signal.SIGTERM) is mine)
        print(signal.signal(signal.SIGHUP, signal.SIG_IGN), signal.getsignal(signal.SIGHUP))
        print(signal.signal(signal.SIGHUP, signal.SIG_DFL), signal.getsignal(signal.SIGHUP))
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(10)
    """))
    bare = subprocess.run([sys.executable, str(p)], capture_output=True, text=True, timeout=60)
    r = subprocess.run([*PP, "-o", str(tmp_path / "run"), "--", sys.executable, str(p)], capture_output=True,
                       text=True, env=_env(), timeout=60)
    assert bare.returncode == 7 and "mine 15" in bare.stdout
    assert (r.returncode, r.stdout) == (bare.returncode, bare.stdout), r.stderr
    assert sum(_adds(tmp_path / "run").values()) == 500  # the program's handler exited: atexit flushed


def test_pool_context_manager_workers_keep_their_ops(tmp_path):
    """``with Pool()`` ends its workers with SIGTERM (Pool.terminate); forked workers inherit
    the parent's handler, which must flush the worker's own session."""
    p = tmp_path / "pool.py"
    p.write_text(textwrap.dedent("""
        import multiprocessing as mp, os, torch
        def work(n):
            x = torch.ones(4)
            for _ in range(n):
                x = x + 1
            return os.getpid(), n
        if __name__ == "__main__":
            with mp.get_context("fork").Pool(2) as pool:
                done = pool.map(work, [300, 500, 700, 900], chunksize=1)
            per = {}
            for pid, n in done:
                per[pid] = per.get(pid, 0) + n
            print(sorted(per.items()))
    """))
    r = subprocess.run([*PP, "-o", str(tmp_path / "run"), "--", sys.executable, str(p)], capture_output=True,
                       text=True, env=_env(), timeout=60)
    assert r.returncode == 0, r.stderr
    expected = dict(eval(r.stdout.strip()))  # noqa: S307 -- the test's own program's output
    assert sum(expected.values()) == 2400
    assert dict(_adds(tmp_path / "run")) == expected


def test_execv_keeps_both_images_events(tmp_path):
    p = tmp_path / "execs.py"
    p.write_text(textwrap.dedent("""
        import os, sys, torch
        x = torch.ones(2)
        n = 300 if len(sys.argv) == 1 else 450
        for _ in range(n):
            x = x + 1
        print(os.getpid(), n, flush=True)
        if len(sys.argv) == 1:
            os.execv(sys.executable, [sys.executable, __file__, "again"])
    """))
    r = subprocess.run([*PP, "-o", str(tmp_path / "run"), "--", sys.executable, str(p)], capture_output=True,
                       text=True, env=_env(), timeout=60)
    assert r.returncode == 0, r.stderr
    (pid1, n1), (pid2, n2) = [tuple(map(int, ln.split())) for ln in r.stdout.splitlines()]
    assert pid1 == pid2 and (n1, n2) == (300, 450)
    assert dict(_adds(tmp_path / "run")) == {pid1: 750}
    m = json.loads((tmp_path / "run" / "run.json").read_text())
    assert [p["pid"] for p in m["processes"]] == [pid1, pid1]  # one shard per image, neither overwritten


def test_os_exit_in_the_first_second_and_a_bare_fork_child(tmp_path):
    p = tmp_path / "exits.py"
    p.write_text(textwrap.dedent("""
        import os, torch
        x = torch.ones(2)
        child = os.fork()
        if child == 0:
            for _ in range(250):
                x = x + 1
            os._exit(0)
        _, status = os.waitpid(child, 0)
        for _ in range(120):
            x = x + 1
        print(child, os.getpid(), os.waitstatus_to_exitcode(status), flush=True)
        os._exit(3)
    """))
    r = subprocess.run([*PP, "-o", str(tmp_path / "run"), "--", sys.executable, str(p)], capture_output=True,
                       text=True, env=_env(PASTAPROF_FLUSH_MS="5000"), timeout=120)  # no periodic flush helps
    assert r.returncode == 3, r.stderr
    child, parent, child_code = map(int, r.stdout.split())
    assert child_code == 0
    assert dict(_adds(tmp_path / "run")) == {child: 250, parent: 120}



def test_os_abort_dies_of_sigabrt_as_bare_and_keeps_its_events(tmp_path):
    """os.abort() ended the process with no flush: a program aborting in its first second
    left no events at all."""
    p = tmp_path / "abort.py"
    p.write_text(textwrap.dedent("""
        import os, sys, torch
        x = torch.ones(2)
        for _ in range(140):
            x = x + 1
        print(os.getpid(), flush=True)
        sys.stderr.write("aborting\\n")
        os.abort()
    """))
    bare = subprocess.run([sys.executable, str(p)], capture_output=True, text=True, env=_env(), timeout=120,
                          preexec_fn=_no_core)
    r = subprocess.run([*PP, "-o", str(tmp_path / "run"), "--", sys.executable, str(p)], capture_output=True,
                       text=True, env=_env(PASTAPROF_FLUSH_MS="5000"), timeout=120, preexec_fn=_no_core)
    assert bare.returncode == r.returncode == -signal.SIGABRT, r.stderr
    assert [ln for ln in r.stderr.splitlines() if not ln.startswith("pastaprof:")] == bare.stderr.splitlines()
    assert dict(_adds(tmp_path / "run")) == {int(r.stdout): 140}

COUNTER = textwrap.dedent("""
    import signal, sys, time
    sig = getattr(signal, sys.argv[1])
    got = []
    signal.signal(sig, lambda s, f: got.append(s))
    print("ready", flush=True)
    t0 = time.monotonic()
    while time.monotonic() - t0 < 20 and not got:
        time.sleep(0.01)
    time.sleep(1.0)  # a second copy of the signal would come now
    print("got", len(got), flush=True)
""")


@pytest.mark.parametrize("sig", ["SIGUSR1", "SIGUSR2", "SIGWINCH", "SIGALRM"])
def test_a_signal_sent_to_pastaprof_reaches_the_programs_handler_once(tmp_path, sig):
    p = tmp_path / "counter.py"
    p.write_text(COUNTER)
    proc = subprocess.Popen([*PP, "-o", str(tmp_path / "run"), "--", sys.executable, str(p), sig],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
    assert proc.stdout.readline() == "ready\n"
    proc.send_signal(getattr(signal, sig))
    out, err = proc.communicate(timeout=60)
    assert (proc.returncode, out) == (0, "got 1\n"), err


def test_ctrl_c_from_the_terminal_reaches_the_program_once(tmp_path):
    """The terminal sends SIGINT to the whole foreground group (pastaprof and the program):
    pastaprof must not send it a second time."""
    import pty

    p = tmp_path / "counter.py"
    p.write_text(COUNTER)
    pid, fd = pty.fork()
    if pid == 0:  # a session leader with the pty as its terminal, like a shell's job
        try:
            os.execve(sys.executable, [*PP, "-o", str(tmp_path / "run"), "--", sys.executable, str(p), "SIGINT"],
                      _env())
        finally:
            os._exit(127)
    out = b""
    try:
        while b"ready" not in out:
            out += os.read(fd, 1024)
        os.write(fd, b"\x03")  # Ctrl-C
        while True:
            try:
                chunk = os.read(fd, 1024)
            except OSError:  # EIO: the terminal's last process closed it
                break
            if not chunk:
                break
            out += chunk
    finally:
        _, status = os.waitpid(pid, 0)
        os.close(fd)
    assert os.waitstatus_to_exitcode(status) == 0, out
    assert b"got 1" in out, out


def test_a_failed_exec_leaves_capture_going(tmp_path):
    """os.execv of an executable that cannot run (ENOEXEC): the session flushed for it, the
    exec fails, the program goes on, and so does capture (a second shard of the same pid)."""
    bad = tmp_path / "not-a-program"
    bad.write_bytes(b"\x00\x01garbage")
    bad.chmod(0o755)
    p = tmp_path / "failexec.py"
    p.write_text(textwrap.dedent(f"""
        import os, torch
        x = torch.ones(2)
        for _ in range(130):
            x = x + 1
        try:
            os.execv({str(bad)!r}, [{str(bad)!r}])
        except OSError as e:
            print("exec failed", e.errno, flush=True)
        for _ in range(170):
            x = x + 1
        print(os.getpid(), flush=True)
    """))
    bare = subprocess.run([sys.executable, str(p)], capture_output=True, text=True, timeout=60)
    r = subprocess.run([*PP, "-o", str(tmp_path / "run"), "--", sys.executable, str(p)], capture_output=True,
                       text=True, env=_env(), timeout=120)
    assert r.returncode == bare.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == bare.stdout.splitlines()[0]  # same errno
    pid = int(r.stdout.splitlines()[1])
    assert dict(_adds(tmp_path / "run")) == {pid: 300}


def test_ctrl_z_in_an_interactive_shell_stops_the_job_and_fg_resumes_it(tmp_path):
    """Job control in a real interactive bash on a pty: the shell reports a job stopped once
    every process of it stopped.  pastaprof blocks SIGTSTP (it takes signals with
    sigtimedwait), so it stops itself once the program stopped; ``fg`` continues both."""
    import pty
    import select
    import shlex

    if not os.path.exists("/bin/bash"):
        pytest.skip("needs /bin/bash")
    p = tmp_path / "pausable.py"
    p.write_text("import time\nprint('ready', flush=True)\ntime.sleep(2)\nprint('done', flush=True)\n")
    pid, fd = pty.fork()
    if pid == 0:
        try:
            os.execve("/bin/bash", ["bash", "--norc", "--noprofile", "-i"], {**_env(), "PS1": "$ "})
        finally:
            os._exit(127)
    out = bytearray()

    def until(needle: bytes) -> bool:
        end = time.monotonic() + 60
        while needle not in out and time.monotonic() < end:
            if select.select([fd], [], [], 0.2)[0]:
                try:
                    out.extend(os.read(fd, 4096))
                except OSError:
                    break
        return needle in out

    try:
        cmd = shlex.join([*PP, "-o", str(tmp_path / "run"), "--", sys.executable, str(p)])
        os.write(fd, cmd.encode() + b"\n")
        assert until(b"ready"), out
        os.write(fd, b"\x1a")  # Ctrl-Z
        assert until(b"Stopped"), out
        os.write(fd, b"fg\n")
        assert until(b"run stored"), out
        os.write(fd, b"echo rc=$?\n")
        assert until(b"rc=0"), out
        assert b"done" in out
    finally:
        os.write(fd, b"exit\n")
        os.waitpid(pid, 0)
        os.close(fd)


def test_a_signal_the_program_sends_to_its_own_group_reaches_it_once(tmp_path):
    p = tmp_path / "grp.py"
    p.write_text(textwrap.dedent("""
        import os, signal, time
        got = []
        signal.signal(signal.SIGUSR1, lambda s, f: got.append(s))
        os.killpg(0, signal.SIGUSR1)   # its group: bare, itself; under pastaprof, pastaprof too
        time.sleep(1.5)
        print("got", len(got), flush=True)
    """))
    bare = subprocess.run([sys.executable, str(p)], capture_output=True, text=True, timeout=60,
                          start_new_session=True)  # a group of its own, as a shell's job
    r = subprocess.run([*PP, "-o", str(tmp_path / "run"), "--", sys.executable, str(p)], capture_output=True,
                       text=True, env=_env(), timeout=120, start_new_session=True)
    assert bare.stdout == "got 1\n"
    assert (r.returncode, r.stdout) == (0, bare.stdout), r.stderr
    assert json.loads((tmp_path / "run" / "run.json").read_text())["program"]["signals_forwarded"] == {}


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGHUP"])
def test_a_signal_kills_a_program_stuck_in_c_code_as_bare(tmp_path, sig):
    """The Python-level handler only runs when the main thread runs Python; a main thread in
    a long native call (OpenSSL's PBKDF2, ~minutes here) must still die of the signal at once."""
    p = tmp_path / "stuck.py"
    p.write_text(textwrap.dedent("""
        import hashlib, torch
        x = torch.ones(2)
        for _ in range(100):
            x = x + 1
        print("ready", os.getpid(), flush=True)
        hashlib.pbkdf2_hmac("sha256", b"pw", b"salt", 10**9)
        print("finished", flush=True)
    """).replace("import hashlib", "import hashlib, os"))
    proc = subprocess.Popen([*PP, "-o", str(tmp_path / "run"), "--", sys.executable, str(p)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
    ready = proc.stdout.readline().split()
    assert ready[0] == "ready"
    try:
        time.sleep(0.3)
        proc.send_signal(getattr(signal, sig))
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:  # still stuck: leave nothing running
            os.kill(int(ready[1]), signal.SIGKILL)
            proc.wait(timeout=30)
    assert proc.returncode == -getattr(signal, sig), err
    assert "finished" not in out
    assert sum(_adds(tmp_path / "run").values()) == 100  # flushed by the watchdog


def test_an_asyncio_program_keeps_its_signal_handler_and_wakeup_fd(tmp_path):
    p = tmp_path / "aio.py"
    p.write_text(textwrap.dedent("""
        import asyncio, signal, torch
        print("wakeup fd", signal.set_wakeup_fd(-1), flush=True)   # none set, bare
        async def main():
            loop = asyncio.get_running_loop()
            done = asyncio.Event()
            loop.add_signal_handler(signal.SIGTERM, done.set)
            x = torch.ones(2)
            for _ in range(80):
                x = x + 1
            print("ready", flush=True)
            await done.wait()
            loop.remove_signal_handler(signal.SIGTERM)
            print("stopped by SIGTERM", signal.getsignal(signal.SIGTERM), flush=True)
        asyncio.run(main())
    """))
    outs = []
    for cmd in ([sys.executable, str(p)], [*PP, "-o", str(tmp_path / "run"), "--", sys.executable, str(p)]):
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
        first = proc.stdout.readline() + proc.stdout.readline()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
        outs.append((proc.returncode, first + out))
    assert outs[0] == (0, "wakeup fd -1\nready\nstopped by SIGTERM 0\n")
    assert outs[1] == outs[0]
    assert sum(_adds(tmp_path / "run").values()) == 80


DAEMON = textwrap.dedent("""
    import os, signal, sys, tempfile, torch
    x = torch.ones(3)
    for _ in range(100):
        x = x + 1
    fd = os.open(tempfile.mkstemp()[1], os.O_RDWR)  # the number it gets bare: no fd of ours below it
    os.closerange(3, 65536)  # a daemon closing every fd
    print("first fd", fd, flush=True)
    with open(tempfile.mkstemp()[1], "w+") as f:
        for _ in range(100):
            x = x * 1
        signal.signal(signal.SIGUSR1, lambda *a: None)
        os.kill(os.getpid(), signal.SIGUSR1)  # a signal the program handles: nothing written into f
        f.write("mine")
        f.flush()
        f.seek(0)
        print("file", repr(f.read()), flush=True)
    os.kill(os.getpid(), signal.SIGTERM)
""")


def test_a_program_that_closes_every_fd_keeps_its_output_files_and_signals(tmp_path):
    """The wakeup pipe sits at the top of the fd table and is out of reach of os.close and
    os.closerange: the program's fds are numbered as bare, its files get no signal bytes, its
    stderr no "Exception ignored" line, and SIGTERM still flushes."""
    p = tmp_path / "daemon.py"
    p.write_text(DAEMON)
    bare = _start(tmp_path, p, bare=True)
    b_out, b_err = bare.communicate(timeout=60)
    proc = _start(tmp_path, p)
    out, err = proc.communicate(timeout=60)
    assert bare.returncode == proc.returncode == -signal.SIGTERM
    assert out == b_out and "file 'mine'" in out
    assert "Exception ignored" not in err and "Traceback" not in err
    m = json.loads((tmp_path / "run" / "run.json").read_text())
    assert m["program"]["signal"] == "SIGTERM" and m["program"]["unflushed_pids"] == []
    t = pastaprof.load(tmp_path / "run").table("op")
    names = Counter(t["name"].to_pylist())
    assert names["aten::add"] == 100 and names["aten::mul"] == 100


PERSISTENT = textwrap.dedent("""
    import sys, torch
    from torch.utils.data import DataLoader, Dataset

    class DS(Dataset):
        def __len__(self):
            return 24

        def __getitem__(self, i):
            return torch.full((3,), float(i)).add(0.5)  # one aten::add an item, in a worker

    if __name__ == "__main__":
        dl = DataLoader(DS(), batch_size=4, num_workers=2, persistent_workers=True,
                        multiprocessing_context=sys.argv[1])
        print(sum(b.sum().item() for _ in range(3) for b in dl))
""")


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_persistent_dataloader_workers_keep_their_ops(tmp_path, context):
    """multiprocessing ends persistent workers with SIGTERM at exit, and torch's C handler
    _exit(0)s: the workers' ops were all lost (they never lived a flush period)."""
    p = tmp_path / "dl.py"
    p.write_text(PERSISTENT)
    bare = _start(tmp_path, p, context, bare=True)
    b_out, _ = bare.communicate(timeout=120)
    proc = _start(tmp_path, p, context)
    out, err = proc.communicate(timeout=120)
    assert bare.returncode == proc.returncode == 0 and out == b_out, err
    assert "without its final flush" not in err and "without a final flush" not in err
    adds = _adds(tmp_path / "run")
    workers = {pid: n for pid, n in adds.items() if n}
    assert len(workers) == 2 and sum(workers.values()) == 3 * 24, adds


DAEMON_LEFT = textwrap.dedent("""
    import os, sys, time, torch
    x = torch.ones(2) + 1
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:  # the daemon: outlives the program
            fd = os.open(os.devnull, os.O_RDWR)
            for i in (0, 1, 2):
                os.dup2(fd, i)
            time.sleep(4)
            os._exit(0)
        os._exit(0)
    os.wait()
    print("parent exits", flush=True)
""")


def test_a_daemon_the_program_leaves_running_is_not_called_a_crash(tmp_path):
    p = tmp_path / "daemon.py"
    p.write_text(DAEMON_LEFT)
    proc = _start(tmp_path, p)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0 and out == "parent exits\n", err
    m = json.loads((tmp_path / "run" / "run.json").read_text())
    (daemon,) = m["program"]["running_pids"]
    assert m["program"]["unflushed_pids"] == [daemon] and m["program"]["lost_at_most_ms"] == 0
    assert "still running (left behind by the program)" in err and "without a final flush" not in err
    assert "without its final flush" not in err and "still running when the program ended" in err
