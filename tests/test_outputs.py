"""Outputs never destroy what they were not asked to replace (the real CLI, real traces, real files).

Run directories (import/analyze/run -o) are claimed atomically: of two writers one wins, a
directory that appears meanwhile survives, --force replaces a link and never what it points at.
Files (--json, export -o, --uvm-plan) go to what was named: stdout, FIFOs and devices are
written into, links followed to their regular file, new files get the umask's mode; a failure
is one line that blames the output, with no temp file left behind.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import resource
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import DATA, raw_events

PY = [sys.executable, "-m", "pastaprof.cli"]
MLP = DATA / "mlp_train_3steps.pt.trace.json.gz"
GPT2 = DATA / "gpt2_small2l_train_3steps.pt.trace.json.gz"
MLP_KERNELS = sum(1 for e in raw_events(MLP) if e.get("cat") == "kernel")
GPT2_KERNELS = sum(1 for e in raw_events(GPT2) if e.get("cat") == "kernel")


def cli(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([*PY, *map(str, args)], capture_output=True, text=True, timeout=300, **kw)


def one_error_line(r: subprocess.CompletedProcess, *words: str) -> str:
    """The run failed with exit 2 and one 'pastaprof: error:' line holding ``words``."""
    assert r.returncode == 2, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pastaprof: error: "), r.stderr
    assert "Traceback" not in r.stderr
    for w in words:
        assert w in lines[0], (w, lines[0])
    return lines[0]


def kernels_in(run_dir: Path) -> int:
    return sum(pq.read_table(p).num_rows for p in (run_dir / "kernel").glob("*.parquet"))


def leftovers(d: Path) -> list[str]:
    """Hidden temp files or directories pastaprof may have left in ``d``."""
    return sorted(p.name for p in d.iterdir() if p.name.startswith("."))


@pytest.fixture(scope="module")
def mlp_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("runs") / "mlp"
    r = cli("import", MLP, "-o", out)
    assert r.returncode == 0, r.stderr
    return out


# --- run directories ----------------------------------------------------------------------

def _start_import(out: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([*PY, "import", str(GPT2), "-o", str(out), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_until_writing(p: subprocess.Popen, parent: Path) -> None:
    """Until the import ``p`` has created its hidden partial run beside ``out`` in ``parent``."""
    deadline = time.monotonic() + 60
    while not any(n.startswith(".out.partial") for n in os.listdir(parent)):
        assert time.monotonic() < deadline and p.poll() is None, "the import never started writing"
        time.sleep(0.005)


def test_two_concurrent_imports_to_one_out_exactly_one_wins(tmp_path):
    for attempt in range(3):
        out = tmp_path / f"run{attempt}"
        procs = [_start_import(out), _start_import(out)]
        results = [(p.wait(timeout=300), *p.communicate()) for p in procs]
        codes = sorted(r[0] for r in results)
        assert codes == [0, 2], results
        loser = next(r for r in results if r[0] == 2)
        assert len(loser[2].strip().splitlines()) == 1 and "Traceback" not in loser[2]
        # the winner's run is whole: every kernel of the trace, a readable manifest
        assert kernels_in(out) == GPT2_KERNELS
        assert json.loads((out / "run.json").read_text())["rows"]["kernel"] == GPT2_KERNELS
        assert leftovers(tmp_path) == []
        # the second refused at its start (the first's claim is locked), or the two raced to publish
        assert "another pastaprof is writing a run there now" in loser[2] or "appeared while" in loser[2], loser
        if attempt:
            return


def test_two_concurrent_runs_to_one_out_the_second_exits_2_before_its_program(tmp_path):
    """`pastaprof run -o r` twice at once: the second sees the first's locked claim and refuses
    before starting its program (it used to run it and exit 0 with a warning that nothing was stored)."""
    out, first_ran, second_ran = tmp_path / "r", tmp_path / "first", tmp_path / "second"

    def program(marker: Path, wait: float) -> list[str]:
        return [sys.executable, "-c", f"import time; open({str(marker)!r}, 'w'); time.sleep({wait})"]

    first = subprocess.Popen([*PY, "run", "-o", str(out), "--", *program(first_ran, 4)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not first_ran.exists():
        assert first.poll() is None and time.monotonic() < deadline, first.communicate()
        time.sleep(0.02)
    second = cli("run", "-o", out, "--force", "--", *program(second_ran, 0))
    one_error_line(second, f"{out}: another pastaprof is writing a run there now")
    assert not second_ran.exists()
    assert first.wait(timeout=120) == 0, first.communicate()
    assert (out / "run.json").is_file() and leftovers(tmp_path) == []
    # a claim left by a writer that was killed (its directory no longer locked) does not block,
    # and one older than a minute is removed (pastaprof's own hidden leftover); a recent one stays
    old = tmp_path / ".r2.partial-0000000000000001-dead"
    recent = tmp_path / f".r2.partial-{time.time_ns() - 5 * 10**9:016x}-dead"
    for d in (old, recent):
        d.mkdir()
        (d / "op").mkdir()
    r = cli("run", "-o", tmp_path / "r2", "--", *program(tmp_path / "third", 0))
    assert r.returncode == 0 and (tmp_path / "r2" / "run.json").is_file(), r.stderr
    assert not old.exists() and (recent / "op").is_dir()


def test_an_old_claim_still_locked_by_its_writer_is_left_to_it(tmp_path):
    """A writer that has run for over a minute holds its claim's lock: a second import to the
    same -o refuses and removes nothing of it."""
    import fcntl

    claim = tmp_path / ".r.partial-0000000000000001-live"
    claim.mkdir()
    (claim / "run.json").write_text("{}")
    fd = os.open(claim, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        r = cli("import", DATA / "mlp_train_3steps.pt.trace.json.gz", "-o", tmp_path / "r")
        one_error_line(r, f"{tmp_path / 'r'}: another pastaprof is writing a run there now")
        assert (claim / "run.json").read_text() == "{}" and not (tmp_path / "r").exists()
    finally:
        os.close(fd)


def test_a_directory_that_appears_during_an_import_survives(tmp_path):
    out = tmp_path / "out"
    p = _start_import(out)
    _wait_until_writing(p, tmp_path)
    out.mkdir()
    (out / "mine.txt").write_text("precious")
    code = p.wait(timeout=300)
    err = p.stderr.read()
    assert code == 2 and "appeared while" in err and len(err.strip().splitlines()) == 1, err
    assert os.listdir(out) == ["mine.txt"] and (out / "mine.txt").read_text() == "precious"
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_during_an_import_leaves_nothing_half_written(tmp_path, sig):
    out = tmp_path / "out"
    p = _start_import(out)
    _wait_until_writing(p, tmp_path)
    p.send_signal(sig)
    assert p.wait(timeout=120) == -sig  # died of the signal, as the sender expects
    assert os.listdir(tmp_path) == []  # no hidden partial run, no run


def test_force_on_a_symlink_replaces_the_link_never_its_target(tmp_path):
    target = tmp_path / "target"
    target.mkdir()
    (target / "keep.txt").write_text("precious")
    (target / "run.json").write_text("{}")  # looks like a run: still not what -o named
    link = tmp_path / "link"
    link.symlink_to(target)
    r = cli("import", MLP, "-o", link, "--force")
    assert r.returncode == 0, r.stderr
    assert not link.is_symlink() and link.is_dir() and kernels_in(link) == MLP_KERNELS
    assert sorted(os.listdir(target)) == ["keep.txt", "run.json"]
    assert (target / "keep.txt").read_text() == "precious"
    assert leftovers(tmp_path) == []


def test_symlink_or_dangling_link_at_out_without_force_is_refused(tmp_path):
    link = tmp_path / "dangling"
    link.symlink_to(tmp_path / "nowhere")
    one_error_line(cli("import", MLP, "-o", link), "already exists", "symbolic link")
    assert link.is_symlink() and not (tmp_path / "nowhere").exists()
    r = cli("import", MLP, "-o", link, "--force")
    assert r.returncode == 0, r.stderr
    assert not link.is_symlink() and kernels_in(link) == MLP_KERNELS and not (tmp_path / "nowhere").exists()


def test_force_replaces_a_run_and_a_file_but_not_a_foreign_directory(tmp_path, mlp_run):
    old = tmp_path / "old"
    assert cli("import", MLP, "-o", old).returncode == 0
    r = cli("import", GPT2, "-o", old, "--force")
    assert r.returncode == 0, r.stderr
    assert kernels_in(old) == GPT2_KERNELS
    f = tmp_path / "file"
    f.write_text("x")
    one_error_line(cli("import", MLP, "-o", f), "already exists")
    assert f.read_text() == "x"
    assert cli("import", MLP, "-o", f, "--force").returncode == 0 and kernels_in(f) == MLP_KERNELS
    home = tmp_path / "home"
    (home / "docs").mkdir(parents=True)
    (home / "docs" / "thesis.tex").write_text("years of work")
    one_error_line(cli("import", MLP, "-o", home, "--force"), "not a pastaprof run")
    assert (home / "docs" / "thesis.tex").read_text() == "years of work"
    assert leftovers(tmp_path) == []


def test_import_and_analyze_create_parents_and_blame_unwritable_outputs(tmp_path):
    deep = tmp_path / "a" / "b" / "run"
    assert cli("import", MLP, "-o", deep).returncode == 0 and kernels_in(deep) == MLP_KERNELS
    empty = tmp_path / "empty"
    empty.mkdir()  # an empty directory is taken without --force: nothing in it to lose
    assert cli("import", MLP, "-o", empty).returncode == 0 and kernels_in(empty) == MLP_KERNELS
    one_error_line(cli("import", MLP, "-o", "/etc/passwd/run"), "cannot write /etc/passwd/run", "not a directory")
    one_error_line(cli("import", MLP, "-o", "/proc/pastaprof-run"), "cannot write /proc/pastaprof-run")
    one_error_line(cli("analyze", MLP, "-q", "-o", "/proc/self/pastaprof"), "cannot write /proc/self/pastaprof")


# --- files --------------------------------------------------------------------------------

def _json_kernels(doc: dict) -> int:
    return doc["tools"]["kernels"]["summary"]["kernels"]


@pytest.mark.parametrize("name", ["-", "/dev/stdout", "/proc/self/fd/1"])
def test_json_to_standard_output_alone_tables_to_stderr(name, mlp_run, tmp_path):
    r = cli("analyze", mlp_run, "-t", "kernels", "--json", name, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert _json_kernels(json.loads(r.stdout)) == MLP_KERNELS  # stdout is the JSON and nothing else
    heads = [ln.strip("─ ") for ln in r.stderr.splitlines() if ln.startswith("─")]
    assert "kernels" in heads, heads  # the tables went to stderr (after the findings, if any)
    assert os.listdir(tmp_path) == []  # no file named '-'


def test_json_to_dev_stdout_redirected_to_a_file_keeps_what_came_before(tmp_path, mlp_run):
    log = tmp_path / "log.txt"
    with open(log, "w") as f:
        f.write("before\n")
        f.flush()
        r = subprocess.run([*PY, "analyze", str(mlp_run), "-t", "kernels", "--json", "/dev/stdout"],
                           stdout=f, stderr=subprocess.PIPE, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    text = log.read_text()
    assert text.startswith("before\n{")  # appended after what was there, not truncated, not replaced
    assert _json_kernels(json.loads(text[len("before\n"):])) == MLP_KERNELS
    assert log.is_file() and not log.is_symlink()


def test_export_and_plan_to_standard_output(mlp_run, tmp_path):
    r = subprocess.run([*PY, "export", str(mlp_run), "-o", "-"], capture_output=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout[:1] == b"\x0a" and r.stderr.startswith(b"wrote -")  # a Trace's first packet; the note on stderr
    size = int(re.search(rb"bytes=(\d+)", r.stderr)[1])
    assert len(r.stdout) == size
    r = cli("analyze", mlp_run, "-t", "uvm_advisor", "-q", "--uvm-plan", "-", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["actions"] == [] and os.listdir(tmp_path) == []


def test_long_output_names_stay_writable(tmp_path, mlp_run):
    name = "r" * 250  # legal (255 at most); a hidden sibling of it must be too
    r = cli("import", MLP, "-o", tmp_path / name)
    assert r.returncode == 0, r.stderr
    assert kernels_in(tmp_path / name) == MLP_KERNELS
    r = cli("analyze", mlp_run, "-t", "kernels", "-q", "--json", tmp_path / (name[:245] + ".json"))
    assert r.returncode == 0, r.stderr
    one_error_line(cli("analyze", mlp_run, "-t", "kernels", "-q", "--json", tmp_path / ("j" * 300)), "cannot write")
    assert leftovers(tmp_path) == []


def test_json_into_a_fifo_reaches_its_reader(tmp_path, mlp_run):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    r = cli("analyze", mlp_run, "-t", "kernels", "-q", "--json", fifo)
    reader.join(timeout=60)
    assert r.returncode == 0, r.stderr
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)  # still the FIFO, not a file put in its place
    assert got and _json_kernels(json.loads(got[0])) == MLP_KERNELS
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("verb", ["analyze", "export", "report", "diff"])
def test_a_fifo_that_nothing_reads_is_one_line_not_a_hang(tmp_path, mlp_run, verb):
    """`--json FIFO` with no reader: the open waits a few seconds for one, then fails (it used
    to block forever in open(2)); the FIFO stays a FIFO and nothing else is written."""
    from pastaprof.store.outputs import FIFO_READER_WAIT

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    args = {"analyze": ["analyze", mlp_run, "-t", "kernels", "-q", "--json", fifo],
            "export": ["export", mlp_run, "-o", fifo],
            "report": ["report", mlp_run, "-t", "kernels", "-q", "-o", fifo],
            "diff": ["diff", mlp_run, mlp_run, "-q", "--json", fifo]}[verb]
    t0 = time.monotonic()
    r = subprocess.run([*PY, *map(str, args)], capture_output=True, text=True, timeout=120,
                       stdin=subprocess.DEVNULL)
    one_error_line(r, f"cannot write {fifo}", "a FIFO that nothing reads")
    assert time.monotonic() - t0 >= FIFO_READER_WAIT
    assert os.listdir(tmp_path) == ["pipe"] and stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_a_fifo_reader_that_comes_late_gets_the_json(tmp_path, mlp_run):
    from pastaprof.store.outputs import write_output

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []

    def late_reader() -> None:
        time.sleep(1.0)  # the writer is already waiting for a reader
        got.append(fifo.read_bytes())

    reader = threading.Thread(target=late_reader, daemon=True)
    reader.start()
    write_output(fifo, b"x" * 200_000)  # more than a pipe buffer: the blocking writes reach the reader
    reader.join(timeout=30)
    assert got == [b"x" * 200_000]


def test_export_to_dev_null_and_a_fifo(tmp_path, mlp_run):
    r = cli("export", mlp_run, "-o", "/dev/null")
    assert r.returncode == 0, r.stderr
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    fifo = tmp_path / "trace.pftrace.gz"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    r = cli("export", mlp_run, "-o", fifo)
    reader.join(timeout=60)
    assert r.returncode == 0, r.stderr
    counts = dict(kv.split("=", 1) for kv in r.stdout.strip().split("(", 1)[1].rstrip(")").split(", ")
                  if "=" in kv and not kv.startswith("memory_peaks"))
    assert int(counts["kernels"]) == MLP_KERNELS
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and got
    assert len(got[0]) == int(counts["bytes"]) and gzip.decompress(got[0])  # a whole gzip stream


def test_json_through_a_symlink_writes_its_target_and_keeps_the_link(tmp_path, mlp_run):
    real = tmp_path / "real.json"
    real.write_text("old")
    real.chmod(0o640)
    link = tmp_path / "link.json"
    link.symlink_to(real)
    r = cli("analyze", mlp_run, "-t", "kernels", "-q", "--json", link)
    assert r.returncode == 0, r.stderr
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert _json_kernels(json.loads(real.read_text())) == MLP_KERNELS
    assert stat.S_IMODE(real.stat().st_mode) == 0o640  # a replaced file keeps its mode
    dangling = tmp_path / "dangling.json"
    dangling.symlink_to(tmp_path / "missing" / "f.json")
    one_error_line(cli("analyze", mlp_run, "-t", "kernels", "-q", "--json", dangling), "dangling")
    assert dangling.is_symlink()
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("umask,mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_new_json_and_trace_files_get_the_umask_mode(tmp_path, mlp_run, umask, mode):
    out, trace = tmp_path / "f.json", tmp_path / "t.pftrace"
    r1 = cli("analyze", mlp_run, "-t", "kernels", "-q", "--json", out, preexec_fn=lambda: os.umask(umask))
    r2 = cli("export", mlp_run, "-o", trace, preexec_fn=lambda: os.umask(umask))
    assert r1.returncode == 0 and r2.returncode == 0, r1.stderr + r2.stderr
    assert stat.S_IMODE(out.stat().st_mode) == mode and stat.S_IMODE(trace.stat().st_mode) == mode
    assert _json_kernels(json.loads(out.read_text())) == MLP_KERNELS


def _file_size_limit(limit: int):
    def pre() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return pre


@pytest.mark.parametrize("verb", ["json", "export"])
def test_file_size_limit_is_one_line_blaming_the_output_and_leaves_nothing(tmp_path, mlp_run, verb):
    out = tmp_path / ("f.json" if verb == "json" else "t.pftrace")
    args = ["analyze", mlp_run, "-q", "--json", out] if verb == "json" else ["export", mlp_run, "-o", out]
    r = cli(*args, preexec_fn=_file_size_limit(2048))
    one_error_line(r, f"cannot write {out}", "file too large")
    assert os.listdir(tmp_path) == []  # neither the output nor a temp file


def test_capture_stopped_by_a_file_size_limit_is_one_line_and_the_program_is_unharmed(tmp_path):
    prog = "import torch\nx = torch.ones(10)\nfor _ in range(30000):\n    x.add_(1)\nprint('done', int(x[0]))\n"
    r = cli("run", "-o", tmp_path / "run", "--", sys.executable, "-c", prog, preexec_fn=_file_size_limit(200 * 1024))
    assert r.returncode == 0 and r.stdout == "done 30001\n", (r.returncode, r.stdout, r.stderr)
    stopped = [ln for ln in r.stderr.splitlines() if "capture stopped" in ln and "stored" not in ln]
    assert len(stopped) == 1 and "output cannot be written (File too large)" in stopped[0], r.stderr
    assert "warning" not in r.stderr and "Errno" not in r.stderr and "crash" not in r.stderr, r.stderr
    summary = [ln for ln in r.stderr.splitlines() if "run stored" in ln]
    assert len(summary) == 1 and "capture stopped early in 1 process" in summary[0], r.stderr


def test_run_writer_under_a_file_size_limit_leaves_no_partial_run(tmp_path):
    code = (
        "import pyarrow as pa\n"
        "from pastaprof.errors import OutputError\n"
        "from pastaprof.store.writer import RunWriter\n"
        f"w = RunWriter({str(tmp_path / 'run')!r})\n"
        "try:\n"
        "    w.write('kernel', 0, pa.table({'x': list(range(200_000))}))\n"
        "    w.commit({})\n"
        "except OutputError as e:\n"
        "    w.abort(); print(e)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       preexec_fn=_file_size_limit(16384))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"cannot write {tmp_path / 'run'}: file too large (the file size limit, ulimit -f, " \
                               "was reached)"
    assert os.listdir(tmp_path) == []


def test_unwritable_json_targets(tmp_path, mlp_run):
    base = ["analyze", mlp_run, "-t", "kernels", "-q", "--json"]
    one_error_line(cli(*base, "/etc/passwd/f.json"), "cannot write /etc/passwd/f.json")
    one_error_line(cli(*base, "/proc/version"), "cannot write /proc/version", "kernel's files")
    hostname = Path("/proc/sys/kernel/hostname").read_text()
    one_error_line(cli(*base, "/proc/sys/kernel/hostname"), "kernel's files")  # root could write it
    link = tmp_path / "link"
    link.symlink_to("/proc/sys/kernel/hostname")
    one_error_line(cli(*base, link), "kernel's files")
    assert Path("/proc/sys/kernel/hostname").read_text() == hostname and link.is_symlink()
    link.unlink()
    link.symlink_to("/dev/stdout")  # a pipe reached through /proc's links is still written into
    r = cli(*base, link)
    assert r.returncode == 0 and _json_kernels(json.loads(r.stdout)) == MLP_KERNELS, r.stderr
    link.unlink()
    one_error_line(cli(*base, tmp_path), "is a directory")
    one_error_line(cli(*base, tmp_path / "no" / "f.json"), "does not exist")
    import socket

    sock_path = tmp_path / "sock"
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(sock_path))
        one_error_line(cli(*base, sock_path), "not a regular file, FIFO or character device")
    sock_path.unlink()
    one_error_line(cli("export", mlp_run, "-o", "/proc/self/x.pftrace"), "cannot write /proc/self/x.pftrace")
    assert Path("/proc/version").read_text().startswith("Linux")
    assert os.listdir(tmp_path) == []


def _read_only_dir(tmp_path: Path) -> Path:
    d = tmp_path / "ro"
    d.mkdir()
    if os.geteuid() != 0:
        d.chmod(0o555)
        return d
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(d)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"as root, chmod does not stop writes and a read-only mount is not allowed here: {r.stderr!r}")
    return d


def test_read_only_directory(tmp_path, mlp_run):
    d = _read_only_dir(tmp_path)
    try:
        one_error_line(cli("analyze", mlp_run, "-t", "kernels", "-q", "--json", d / "f.json"),
                       f"cannot write {d / 'f.json'}")
        one_error_line(cli("import", MLP, "-o", d / "run"), f"cannot write {d / 'run'}")
        one_error_line(cli("export", mlp_run, "-o", d / "t.pftrace"), f"cannot write {d / 't.pftrace'}")
        marker = tmp_path / "program-ran"
        r = cli("run", "-o", d / "run", "--", sys.executable, "-c", f"open({str(marker)!r}, 'w')")
        one_error_line(r, f"cannot write {d / 'run'}")
        assert not marker.exists()  # refused before the program started
        assert os.listdir(d) == []
    finally:
        if os.geteuid() == 0:
            subprocess.run(["umount", str(d)], check=False)
        else:
            d.chmod(0o755)


@pytest.fixture
def full_disk(tmp_path):
    """A 64 KiB file system: a real ENOSPC (as root a tmpfs mount; else skipped)."""
    d = tmp_path / "full"
    d.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(d)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"no tmpfs mount allowed here for a small file system: {r.stderr!r}")
    yield d
    subprocess.run(["umount", str(d)], check=False)


def test_dev_full_is_one_line_and_stays_a_device(mlp_run):
    for args in (["analyze", mlp_run, "-t", "kernels", "-q", "--json", "/dev/full"],
                 ["export", mlp_run, "-o", "/dev/full"]):
        one_error_line(cli(*args), "cannot write /dev/full", "no space left on device")
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode)


def test_full_disk_is_one_line_blaming_the_output(full_disk, tmp_path):
    big = tmp_path / "gpt2"
    assert cli("import", GPT2, "-o", big).returncode == 0
    for args, out in ((["import", GPT2, "-o"], "run"), (["analyze", big, "-q", "--json"], "f.json"),
                      (["export", big, "-o"], "t.pftrace")):
        one_error_line(cli(*args, full_disk / out), f"cannot write {full_disk / out}", "no space left on device")
        assert os.listdir(full_disk) == []
    filler = full_disk / "filler"
    with open(filler, "wb") as f:  # leave no room for a run's manifest
        try:
            f.write(b"x" * (64 << 10))
        except OSError:
            pass
    program = "import sys; sys.stdout.write('ran'); raise SystemExit(5)"
    r = cli("run", "-o", full_disk / "r", "--", sys.executable, "-c", program)
    assert r.returncode == 5 and r.stdout == "ran", r.stderr  # the program's own
    assert "run stored in" not in r.stderr and "the run was not stored" in r.stderr, r.stderr
    assert os.listdir(full_disk) == ["filler"]


# --- pastaprof run -o ---------------------------------------------------------------------

PROGRAM = [sys.executable, "-c", "print('program output')"]


def _fifo_and_device(tmp_path: Path) -> list[Path]:
    """A FIFO and, where this user may make one, a character device (a copy of /dev/null's node)."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    made = [fifo]
    try:
        os.mknod(tmp_path / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        made.append(tmp_path / "null")
    except OSError:
        pass
    return made


@pytest.mark.parametrize("force", [False, True])
def test_run_dir_outputs_never_replace_a_fifo_or_device(tmp_path, force):
    """`import/run -o /dev/null --force` turned /dev/null into a directory: a device node, FIFO or
    socket at -o is refused, --force or not, and the program does not start."""
    marker = tmp_path / "program-ran"
    program = [sys.executable, "-c", f"open({str(marker)!r}, 'w')"]
    extra = ["--force"] if force else []
    nodes = _fifo_and_device(tmp_path)
    for node in nodes:
        kind = "a FIFO" if stat.S_ISFIFO(os.lstat(node).st_mode) else "a character device"
        for args in (["import", MLP, "-o", node, *extra], ["run", "-o", node, *extra, "--", *program]):
            one_error_line(cli(*args, stdin=subprocess.DEVNULL), f"{node}: is {kind}", "not replacing it")
        mode = os.lstat(node).st_mode
        assert stat.S_ISFIFO(mode) or stat.S_ISCHR(mode)
    assert not marker.exists()
    assert sorted(os.listdir(tmp_path)) == sorted(p.name for p in nodes)  # no run, no hidden temp dir


def test_run_out_creates_parents(tmp_path):
    out = tmp_path / "runs" / "nested" / "a"
    r = cli("run", "-o", out, "--", *PROGRAM)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "program output\n"
    assert (out / "run.json").is_file() and "run stored in" in r.stderr
    assert leftovers(out.parent) == []


def test_run_out_file_with_force_replaces_the_file_and_says_so_truly(tmp_path):
    f = tmp_path / "out"
    f.write_text("x")
    r = cli("run", "-o", f, "--force", "--", *PROGRAM)
    assert r.returncode == 0 and r.stdout == "program output\n", r.stderr
    assert f.is_dir() and json.loads((f / "run.json").read_text())["exit_code"] == 0
    assert f"run stored in {f}" in r.stderr and "warning" not in r.stderr
    assert leftovers(tmp_path) == []


def test_run_force_on_a_symlink_keeps_the_target(tmp_path):
    target = tmp_path / "target"
    target.mkdir()
    (target / "keep.txt").write_text("precious")
    link = tmp_path / "link"
    link.symlink_to(target)
    r = cli("run", "-o", link, "--force", "--", *PROGRAM)
    assert r.returncode == 0, r.stderr
    assert os.listdir(target) == ["keep.txt"] and (target / "keep.txt").read_text() == "precious"
    assert not link.is_symlink() and (link / "run.json").is_file()


def test_run_that_loses_its_out_says_so_and_keeps_the_exit_code(tmp_path):
    out = tmp_path / "out"
    program = (f"import os, pathlib; p = pathlib.Path({str(out)!r}); p.mkdir(); "
               "(p / 'mine.txt').write_text('precious'); raise SystemExit(3)")
    r = cli("run", "-o", out, "--", sys.executable, "-c", program)
    assert r.returncode == 3, r.stderr  # the program's own exit code
    assert "run stored in" not in r.stderr and "the run was not stored" in r.stderr and "appeared while" in r.stderr
    assert os.listdir(out) == ["mine.txt"]
    assert leftovers(tmp_path) == []
