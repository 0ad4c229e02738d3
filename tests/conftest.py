"""Shared fixtures: the real traces recorded on an H200 (tests/data) and raw-JSON facts
computed independently of pastaprof (plain json + gzip), to check the importer against."""

from __future__ import annotations

import gzip
import json
import os
import signal
from pathlib import Path

import pytest

# A suite started in the background by a shell without job control inherits SIGINT and SIGQUIT
# ignored (POSIX), one started under nohup SIGHUP, and every program a test starts would too: the
# signal tests compare with what a program started from a terminal does, so the suite's processes
# start from the defaults.
for _sig, _default in ((signal.SIGINT, signal.default_int_handler), (signal.SIGQUIT, signal.SIG_DFL),
                       (signal.SIGHUP, signal.SIG_DFL)):
    if signal.getsignal(_sig) == signal.SIG_IGN:
        signal.signal(_sig, _default)

DATA = Path(__file__).parent / "data"
TRACES = sorted(DATA.glob("*.pt.trace.json.gz"))
# scripts/gpu-check re-records traces on the GPU and checks the importer on them too
if os.environ.get("PASTAPROF_EXTRA_TRACES"):
    TRACES += sorted(Path(os.environ["PASTAPROF_EXTRA_TRACES"]).glob("*.pt.trace.json.gz"))
FOREIGN = sorted((DATA / "foreign").glob("*.json"))


def raw_events(path: Path) -> list[dict]:
    opener = gzip.open if path.read_bytes()[:2] == b"\x1f\x8b" else open
    with opener(path, "rt") as f:
        doc = json.load(f)
    return doc["traceEvents"] if isinstance(doc, dict) else doc


def dur_ns(e: dict) -> int:
    """Kineto writes dur in microseconds with 3 decimals: exact integer ns."""
    return round(float(e["dur"]) * 1000)


def exact_ns(x: float) -> int:
    """Kineto's decimal microseconds as exact integer ns (repr round-trips the decimal text)."""
    from decimal import Decimal

    return int(Decimal(repr(x)) * 1000)


def interval_ns(e: dict) -> tuple[int, int]:
    """An event's [start, end) in exact ns."""
    s = exact_ns(e["ts"])
    return s, s + exact_ns(e.get("dur", 0))


@pytest.fixture(params=TRACES, ids=lambda p: p.name.split(".")[0])
def trace(request) -> Path:
    return request.param


@pytest.fixture(scope="session")
def example_run():
    import pastaprof

    return pastaprof.load(pastaprof.example_path())


def libcupti_file() -> str | None:
    """The system libcupti the injection library would load, where that file exists."""
    from pastaprof import native

    path = native.system_libcupti()
    return path if path and Path(path).exists() else None


def selftest_driver(tmp_path_factory, name: str, source: str) -> tuple[Path, Path]:
    """A C driver of the injection library's selftest entry points (``source``), built beside a
    fresh build of the library: (driver, library)."""
    import subprocess

    from pastaprof import native

    os.environ.setdefault("PASTAPROF_CACHE", str(tmp_path_factory.mktemp("cache")))
    lib = native.build_inject()
    d = tmp_path_factory.mktemp(name)
    (d / "prog.c").write_text(source)
    subprocess.run(["gcc", "-O1", "-o", str(d / "prog"), str(d / "prog.c"), "-ldl"], check=True, capture_output=True)
    return d / "prog", lib


def injection_env(out: Path, **extra: str) -> dict[str, str]:
    """This process's environment without pastaprof's or CUDA's injection settings, writing to ``out``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PASTAPROF_", "CUDA_INJECTION", "NVTX_INJ"))}
    env.update(PASTAPROF_OUT=str(out), **extra)
    return env


_NEXT_SENTENCE = __import__("re").compile(r"[.!?]\s+[A-Z]")


def assert_finding_contract(f) -> None:
    """What every finding must carry (issue F section 3): an int time at stake >= 0, bytes at stake
    (if any) an int >= 0, a location, one sentence of suggestion; and the JSON has them all."""
    where = (f.tool, f.title)
    assert type(f.impact_ns) is int and f.impact_ns >= 0, where
    assert f.impact_bytes is None or (type(f.impact_bytes) is int and f.impact_bytes >= 0), where
    if f.impact_ns == 0:  # no time at stake: the finding says why
        assert isinstance(f.evidence.get("at_stake"), str), where
    assert isinstance(f.location, str) and f.location.strip(), where
    s = f.suggestion
    assert isinstance(s, str) and s[:1].isupper() and s.endswith(".") and not _NEXT_SENTENCE.search(s), where
    d = f.to_dict()
    assert (d["impact_ns"], d["impact_bytes"], d["location"], d["suggestion"]) == (
        f.impact_ns, f.impact_bytes, f.location, s), where
