"""One vocabulary to narrow capture: ranges, kernel regex, sampling, step window, ranks.

The same settings come from environment variables (how ``pastaprof run`` hands
them to the target and its children) or from keyword arguments of
``pastaprof.profile(...)``; CLI flags of ``pastaprof run`` mirror them:

==================  =======================  ==========================================
env var             flag                     meaning
==================  =======================  ==========================================
PASTAPROF_RANGES    --ranges a,b*            record only inside these ranges (globs)
PASTAPROF_KERNELS   --kernels REGEX          record only kernels whose name matches
PASTAPROF_SAMPLE    --sample N               record every Nth kernel launch
PASTAPROF_STEPS     --steps 10:20            record only steps 10..19 (``pastaprof.step()``
                                             or optimizer steps); ``5`` = step 5 only
PASTAPROF_RANKS     --ranks 0,2-3            record only these ranks
PASTAPROF_SHAPES    --shapes sample|all      ops' input shapes/dtypes/pointers: of sampled calls
                    --no-shapes              (default ``sample``; ``all``: every op's, also the
                                             default when the memory tool is chosen; ``none``)
PASTAPROF_CALL_SITES --no-call-sites         ops without Python call sites (default 1)
PASTAPROF_UVM       --uvm                    unified-memory counters (faults, migrations); also
                                             on when a chosen tool consumes them (uvm_advisor)
PASTAPROF_UVM_PLAN  --apply-uvm-plan FILE    apply a uvm_advisor plan (prefetch/advise) in the program
PASTAPROF_PROCESS   --process gpu|cpu        where instruction-level accesses are reduced (tools
                                             working_set, hotness, coalescing, heatmap): on the
                                             GPU (default) or, from raw records, on the CPU
PASTAPROF_PAGE      --page-bytes N           page size of the access hotness histograms (65536)
PASTAPROF_PROBE     --probe SPEC             eBPF probes (``;``-separated SPECs: ``LIB:FUNCTION``,
                                             ``usdt:BINARY:PROVIDER:PROBE``, ``:args=N``; the
                                             probe handler's setting, docs/probes.md)
PASTAPROF_TOOLS     -t kernels,ops           tools whose reports print at exit
PASTAPROF_OUT       -o DIR                   the run directory
PASTAPROF_FLUSH_MS  (env only)               flush period (default 1000); a flush also starts when
                                             the last one is older than two periods, whatever
                                             the machine's load (see live/flush.py)
PASTAPROF_BUFFER_MB (env only)               op rows held in memory between flushes (default 16):
                                             past it a flush writes them to disk; past 16x that
                                             (no flush could run) rows are dropped and counted
PASTAPROF_OFF       (env only)               switch capture mechanisms off, for overhead
                                             breakdowns (bench/overhead.py --breakdown): any of
                                             kernels, api, ext, ops, modules, tensors, memory,
                                             copies (CUPTI memcpy/memset), sync,
                                             callbacks (launch calls as activity records),
                                             gate (no gating at the source: the op observer
                                             and CUPTI record throughout, the store gates)
==================  =======================  ==========================================

Handlers add their own variables (``settings`` of handlers/base.py, listed by
``pastaprof handlers``): the sanitizer's tuning knobs are environment-only
(docs/instruction-level.md): ``PASTAPROF_SAN_PCS`` (per-PC slots, 0 = none),
``PASTAPROF_SAN_PAGES`` (page counters), ``PASTAPROF_SAN_RAW_MB`` (raw buffer),
``PASTAPROF_SAN_SHARDS`` (counter copies per SM shard, 1-64, default 16),
``PASTAPROF_HEATMAP_CTA``, ``PASTAPROF_SAN_UNPATCH`` (0 keeps modules patched outside the
windows).

Bad values are a ``UsageError`` raised before the target starts (exit code 2).
Allocations are always tracked; the settings gate only what is *recorded*, so a
free inside a range of memory allocated before it is still understood.
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from pastaprof.errors import UsageError

ENV_PREFIX = "PASTAPROF_"
RANK_ENV = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID")  # torchrun, Open MPI, MPICH, Slurm


def current_rank(env: Mapping[str, str] | None = None) -> int:
    """This process's rank from the launcher's variables (``env``: default this process's),
    else 0; a value that is no int32 is no rank."""
    env = os.environ if env is None else env
    for var in RANK_ENV:
        v = env.get(var, "")
        if v.isascii() and v.isdigit() and int(v) < 1 << 31:
            return int(v)
    return 0

# What PASTAPROF_OFF can switch off: CUPTI kernel records, launch-call records (without them
# kernels keep no launch time and no op), the op id per launch, the op observer, the module
# hooks, allocator (tensor) events, CUPTI MEMORY2/MEMORY_POOL records, CUPTI MEMCPY/MEMSET
# records ("copies") and SYNCHRONIZATION records ("sync"); "callbacks" records
# launch calls as CUPTI activity records instead of through its callback API; "gate" keeps the
# op observer and CUPTI recording outside the --steps/--ranges windows (the store still gates:
# the A/B check that gating at the source loses nothing inside a window).
#: the variables CaptureConfig reads itself (others: the handlers' settings), and the launcher's own
CORE_SETTINGS = frozenset(("OUT", "TOOLS", "RANGES", "KERNELS", "SAMPLE", "STEPS", "RANKS", "FLUSH_MS", "BUFFER_MB",
                           "SHAPES", "CALL_SITES", "UVM", "UVM_PLAN", "PROCESS", "PAGE", "OFF", "RUN_PARENT", "EAGER",
                           "FOUND_HANDLERS", "HIDE_ENV", "LAUNCHER"))
OFF_PARTS = ("kernels", "api", "ext", "ops", "modules", "tensors", "memory", "copies", "sync", "callbacks", "gate")


RANK_LIST_MAX = 1 << 20  # ranks one list may name: a job's, never a range of all the integers
_RANK_PART = re.compile(r"^([0-9]{1,10})(?:-([0-9]{1,10}))?$")  # ASCII digits: int() takes "١" and "1_0"


def parse_rank_list(value: str, what: str = "PASTAPROF_RANKS") -> tuple[int, ...]:
    """'0,2,4-7' -> (0, 2, 4, 5, 6, 7): ranks 0..2**31-1 (the event schema's int32), ranges
    low to high, at most ``RANK_LIST_MAX`` ranks, counted before any is made."""
    spans: list[tuple[int, int]] = []
    for part in value.split(","):
        part = part.strip()
        if not part:
            continue
        m = _RANK_PART.match(part)
        if not m:
            raise UsageError(f"{what}={value!r}: expected a rank list like 0,2,4-7")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo
        if hi < lo:
            raise UsageError(f"{what}={value!r}: the range {part} runs backwards (low-high, like 4-7)")
        if hi > 2**31 - 1:
            raise UsageError(f"{what}={value!r}: ranks are at most {2**31 - 1}")
        spans.append((lo, hi))
    if not spans:
        raise UsageError(f"{what}={value!r}: expected a rank list like 0,2,4-7")
    if sum(hi - lo + 1 for lo, hi in spans) > RANK_LIST_MAX:
        raise UsageError(f"{what}={value!r}: more than {RANK_LIST_MAX:,} ranks; name the ones wanted")
    return tuple(sorted({r for lo, hi in spans for r in range(lo, hi + 1)}))


def parse_steps(value: str, what: str = "PASTAPROF_STEPS") -> tuple[int, int | None]:
    """'10:20' -> (10, 20) (end exclusive); '10:' -> (10, None); ':5' -> (0, 5); '7' -> (7, 8)."""
    try:
        if ":" in value:
            a, b = value.split(":", 1)
            start = int(a) if a.strip() else 0
            end = int(b) if b.strip() else None
        else:
            start = int(value)
            end = start + 1
    except ValueError:
        raise UsageError(f"{what}={value!r}: expected a step window like 10:20, 10: or 7") from None
    if start < 0 or (end is not None and end <= start):
        raise UsageError(f"{what}={value!r}: the window is empty or negative")
    return start, end


SHAPES_MODES = ("sample", "all", "none")


def shapes_mode(value: bool | str, tools: tuple[str, ...] = ()) -> str:
    """PASTAPROF_SHAPES / ``shapes=`` as one of SHAPES_MODES.  True (the default) samples, except
    when the memory tool is chosen: its uses and patterns need every op's input pointers."""
    if value is True:
        return "all" if "memory" in tools else "sample"
    if value is False:
        return "none"
    v = str(value).strip().lower()
    if v in SHAPES_MODES:
        return v
    if v in ("1", "true", "yes", "on"):
        return shapes_mode(True, tools)
    if v in ("0", "false", "no", "off"):
        return "none"
    raise UsageError(f"PASTAPROF_SHAPES={value!r}: expected sample, all or none")


@dataclass(frozen=True)
class CaptureConfig:
    """What to record.  Empty/None fields mean "everything"."""

    out: str | None = None
    tools: tuple[str, ...] = ()
    ranges: tuple[str, ...] = ()
    kernels: str | None = None
    sample: int = 1
    steps: tuple[int, int | None] | None = None
    ranks: tuple[int, ...] | None = None
    flush_ms: int = 1000
    buffer_mb: int = 16
    shapes: bool | str = True  # normalized to SHAPES_MODES: True -> sample (all with the memory tool)
    call_sites: bool = True
    uvm: bool = False
    uvm_plan: str | None = None
    process: str = "gpu"
    page_bytes: int = 65536  # 4 KiB pages cost 1.6x more per launch (docs/benchmarks.md, issue D)
    off: tuple[str, ...] = ()
    #: values of the settings handlers declare (name without the prefix -> value), as found
    #: in the environment or given to pastaprof.start(); read with setting()
    handler_settings: tuple[tuple[str, str], ...] = ()
    _kernel_re: re.Pattern | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "shapes", shapes_mode(self.shapes, self.tools))
        if self.sample < 1:
            raise UsageError(f"PASTAPROF_SAMPLE={self.sample}: must be a positive integer")
        if self.process not in ("gpu", "cpu"):
            raise UsageError(f"PASTAPROF_PROCESS={self.process!r}: expected gpu or cpu")
        if self.page_bytes < 32 or self.page_bytes & (self.page_bytes - 1):
            raise UsageError(f"PASTAPROF_PAGE={self.page_bytes}: must be a power of two, at least 32")
        bad = [p for p in self.off if p not in OFF_PARTS]
        if bad:
            raise UsageError(f"PASTAPROF_OFF={','.join(self.off)!r}: unknown part {bad[0]!r} "
                             f"(expected some of {', '.join(OFF_PARTS)})")
        if self.flush_ms < 10:
            raise UsageError(f"PASTAPROF_FLUSH_MS={self.flush_ms}: must be at least 10")
        if self.buffer_mb < 1:
            raise UsageError(f"PASTAPROF_BUFFER_MB={self.buffer_mb}: must be at least 1")
        if self.uvm_plan is not None:
            from pastaprof.live.uvm_plan import load_plan

            load_plan(self.uvm_plan)  # a plan that cannot fit is refused before the program starts
        if self.kernels is not None:
            try:
                object.__setattr__(self, "_kernel_re", re.compile(self.kernels))
            except re.error as e:
                raise UsageError(f"PASTAPROF_KERNELS={self.kernels!r}: not a regular expression ({e})") from None

    # -- parsing -----------------------------------------------------------
    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> CaptureConfig:
        env = os.environ if env is None else env

        def get(name: str) -> str | None:
            v = env.get(ENV_PREFIX + name)
            return v if v not in (None, "") else None

        def integer(name: str, default: int) -> int:
            v = get(name)
            if v is None:
                return default
            try:
                return int(v)
            except ValueError:
                raise UsageError(f"{ENV_PREFIX}{name}={v!r}: expected an integer") from None

        def boolean(name: str, default: bool = True) -> bool:
            v = get(name)
            if v is None:
                return default
            if v.lower() in ("1", "true", "yes", "on"):
                return True
            if v.lower() in ("0", "false", "no", "off"):
                return False
            raise UsageError(f"{ENV_PREFIX}{name}={v!r}: expected 0 or 1")

        # the settings handlers declare (handlers/base.py Setting; the sanitizer's table sizes
        # and switches among them): checked here, so that a bad value stops `pastaprof run`
        # before the program starts
        found: dict[str, str] = {}
        if any(k.startswith(ENV_PREFIX) and k[len(ENV_PREFIX):] not in CORE_SETTINGS and env[k] for k in env):
            # only then: the handlers' modules (pyarrow, numpy) are not loaded by `pastaprof run`
            # before the program starts when no handler setting is there to check
            from pastaprof.handlers.registry import check_settings

            found = check_settings(env)
        tools = tuple(t.strip() for t in (get("TOOLS") or "").split(",") if t.strip())
        ranges = tuple(r.strip() for r in (get("RANGES") or "").split(",") if r.strip())
        return cls(
            out=get("OUT"), tools=tools, ranges=ranges, kernels=get("KERNELS"),
            sample=integer("SAMPLE", 1),
            steps=parse_steps(get("STEPS")) if get("STEPS") else None,  # type: ignore[arg-type]
            ranks=parse_rank_list(get("RANKS")) if get("RANKS") else None,  # type: ignore[arg-type]
            flush_ms=integer("FLUSH_MS", 1000), buffer_mb=integer("BUFFER_MB", 16), shapes=get("SHAPES") or True, call_sites=boolean("CALL_SITES"),
            uvm=boolean("UVM", False), uvm_plan=get("UVM_PLAN"), process=(get("PROCESS") or "gpu").lower(),
            page_bytes=integer("PAGE", 65536),
            off=tuple(p.strip() for p in (get("OFF") or "").split(",") if p.strip()),
            handler_settings=tuple(sorted(found.items())),
        )

    def to_env(self) -> dict[str, str]:
        """The environment that reproduces this config in a child process."""
        env = {"TOOLS": ",".join(self.tools), "RANGES": ",".join(self.ranges), "KERNELS": self.kernels or "",
               "SAMPLE": str(self.sample), "FLUSH_MS": str(self.flush_ms),
               "BUFFER_MB": str(self.buffer_mb), "OUT": self.out or "",
               "SHAPES": str(self.shapes), "CALL_SITES": "" if self.call_sites else "0",
               "UVM": "1" if self.uvm else "", "UVM_PLAN": self.uvm_plan or "", "PROCESS": self.process,
               "PAGE": str(self.page_bytes), "OFF": ",".join(self.off), **dict(self.handler_settings)}
        if self.steps is not None:
            env["STEPS"] = f"{self.steps[0]}:{'' if self.steps[1] is None else self.steps[1]}"
        if self.ranks is not None:
            env["RANKS"] = ",".join(map(str, self.ranks))
        return {ENV_PREFIX + k: v for k, v in env.items() if v}

    # -- decisions -----------------------------------------------------------
    def setting(self, name: str, default: str | None = None) -> str | None:
        """A handler setting's value (``name`` without the PASTAPROF_ prefix), or ``default``."""
        return dict(self.handler_settings).get(name, default)

    def is_off(self, part: str) -> bool:
        """Whether PASTAPROF_OFF switched this capture mechanism off."""
        return part in self.off

    def rank_selected(self, rank: int) -> bool:
        return self.ranks is None or rank in self.ranks

    def step_selected(self, step: int) -> bool:
        if self.steps is None:
            return True
        lo, hi = self.steps
        return step >= lo and (hi is None or step < hi)

    def range_selected(self, open_ranges: list[str]) -> bool:
        """With PASTAPROF_RANGES set, record only while one of them is open."""
        if not self.ranges:
            return True
        return any(fnmatch.fnmatchcase(name, pat) for name in open_ranges for pat in self.ranges)

    def kernel_selected(self, name: str) -> bool:
        return self._kernel_re is None or self._kernel_re.search(name) is not None
