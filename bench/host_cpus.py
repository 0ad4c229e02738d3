"""The host's side of a GPU benchmark: which CPUs sit next to the GPU, and time stolen from them.

A fresh process on a many-core host may land on any core; on a two-socket or multi-NUMA host the
GPU's doorbell writes and the launch path then cross the interconnect, and the step time moves with
where the scheduler put the process.  Pinning every variant to the GPU's NUMA-local CPUs
(``gpu_local_cpus``), as launchers such as torchrun or SLURM bind ranks, takes that out of the
comparison.  ``steal_jiffies`` reads the hypervisor's steal time, so a benchmark can say how much
of a step the host took away (a VM's noisy neighbours).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


def parse_cpulist(text: str) -> set[int]:
    """'0-3,8,10-11' -> {0, 1, 2, 3, 8, 10, 11}."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def gpu_local_cpus(index: int = 0) -> set[int]:
    """The CPUs of GPU ``index``'s NUMA node (its PCI device's local_cpulist), within this
    process's allowed set; empty when that cannot be read (no nvidia-smi, no sysfs entry)."""
    try:
        bus = subprocess.run(["nvidia-smi", f"--id={index}", "--query-gpu=pci.bus_id", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return set()
    if not bus:
        return set()
    domain, _, rest = bus.lower().partition(":")
    path = Path("/sys/bus/pci/devices") / f"{domain[-4:]}:{rest}" / "local_cpulist"
    try:
        cpus = parse_cpulist(path.read_text())
    except (OSError, ValueError):
        return set()
    return cpus & os.sched_getaffinity(0)


def steal_jiffies() -> int:
    """The host's steal time so far, all CPUs (USER_HZ ticks; 0 where /proc/stat has none)."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()
        return int(fields[8]) if len(fields) > 8 else 0
    except (OSError, ValueError):
        return 0
