"""Cost per probed call of ``pastaprof run --probe`` (handlers/probe.py): N calls of a C
program with and without the probe attached, side by side in interleaved rounds.

* ``malloc``: examples/usdt/mallocs.c calls malloc+free N times; probed with the
  uprobe+uretprobe pair on libc's malloc (``libc.so.6:malloc:args=1``);
* ``usdt``: examples/usdt/ticks.c fires its USDT probe N times (``:args=2``); unprobed, a
  USDT site is one nop.

Each probed round runs the program under one bpftrace (the session pastaprof's probe
handler starts), waits until bpftrace has written every call, and checks that the calls
recorded plus those bpftrace reported lost equal N.  Reported per mode: the program's wall
time bare and probed (median of the rounds), the cost per call ((probed - bare) / N), and
the calls lost.  Two more rows split the malloc cost: bpftrace only counting the calls in
the kernel, with the uprobe alone and with the uprobe+uretprobe pair (the traps' cost,
without the line per call that pastaprof's recording writes).  Usage: ``python bench/probe_cost.py [--calls N] [--rounds R] [--json F]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pastaprof.handlers.probe_session import BpftraceSession, unavailable
from pastaprof.handlers.probe_spec import parse_specs

ROOT = Path(__file__).resolve().parents[1]


def build(d: Path) -> dict[str, Path]:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        sys.exit("probe_cost: no C compiler")
    out = {}
    for name in ("mallocs", "ticks"):
        subprocess.run([cc, "-O2", "-o", str(d / name), str(ROOT / "examples" / "usdt" / f"{name}.c")], check=True)
        out[name] = d / name
    return out


def timed(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def probed(spec: str, cmd: list[str]) -> tuple[float, int, int]:
    """(the program's wall seconds, calls recorded, calls lost) under one bpftrace."""
    s = BpftraceSession(parse_specs(spec), os.getpid(), 0, include_root=False)
    s.start()
    try:
        wall = timed(cmd)
        s.stop()
        t = s.read(final=True)
        return wall, t.num_rows, s.lost + s.missing()
    finally:
        s.close()


def counted_only(lib: str, cmd: list[str], rounds: int, both: bool) -> float:
    """The program's wall seconds (best of ``rounds``) under a bpftrace that only counts the
    calls in the kernel (no line per call): the cost of the uprobe (``both``: and the
    uretprobe) trap alone."""
    comm = Path(cmd[0]).name[:15]
    prog = f'uprobe:{lib}:malloc /comm == "{comm}"/ {{ ' + ("@s[tid] = nsecs; } " if both else "@n = count(); } ")
    if both:
        prog += f"uretprobe:{lib}:malloc /@s[tid]/ {{ @n = count(); delete(@s[tid]); }}"
    p = subprocess.Popen(["bpftrace", "-B", "line", "-e", 'BEGIN { printf("R\\n"); } ' + prog], stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, text=True)
    try:
        while p.stdout is not None and p.stdout.readline().strip() != "R":
            pass
        return min(timed(cmd) for _ in range(rounds))
    finally:
        p.send_signal(2)
        p.communicate(timeout=30)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    why = unavailable()
    if why:
        sys.exit(f"probe_cost: {why}")
    with tempfile.TemporaryDirectory() as d:
        exe = build(Path(d))
        modes = {"malloc": ("libc.so.6:malloc:args=1", [str(exe["mallocs"]), str(a.calls), "4242"]),
                 "usdt": (f"usdt:{exe['ticks']}:pastaprof_demo:tick:args=2", [str(exe["ticks"]), str(a.calls)])}
        result = {}
        for mode, (spec, cmd) in modes.items():
            bare, under, lost, rows = [], [], 0, 0
            for _ in range(a.rounds):  # interleaved: bare, probed, bare, probed ...
                bare.append(timed(cmd))
                w, n, n_lost = probed(spec, cmd)
                under.append(w)
                rows, lost = rows + n, lost + n_lost
                if n + n_lost != a.calls:
                    print(f"warning: {mode}: {n} recorded + {n_lost} lost != {a.calls}", file=sys.stderr)
            b, p = statistics.median(bare), statistics.median(under)
            result[mode] = {"calls": a.calls, "rounds": a.rounds, "bare_s": round(b, 6), "probed_s": round(p, 6),
                            "us_per_call": round((p - b) / a.calls * 1e6, 3), "recorded": rows, "lost": lost}
            print(f"{mode:7s} {a.calls} calls: bare {b * 1e3:8.1f} ms  probed {p * 1e3:8.1f} ms  "
                  f"{result[mode]['us_per_call']:6.2f} us/call  recorded {rows}  lost {lost}")
        lib = parse_specs("libc.so.6:malloc")[0].lib
        cmd = modes["malloc"][1]
        for label, both in (("uprobe_count_only", False), ("uprobe_uretprobe_count_only", True)):
            b = min(timed(cmd) for _ in range(a.rounds))
            p = counted_only(lib, cmd, a.rounds, both)
            result[label] = {"calls": a.calls, "bare_s": round(b, 6), "probed_s": round(p, 6),
                             "us_per_call": round((p - b) / a.calls * 1e6, 3)}
            print(f"{label}: bare {b * 1e3:8.1f} ms  probed {p * 1e3:8.1f} ms  {result[label]['us_per_call']:6.2f} us/call")
    if a.json:
        a.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
