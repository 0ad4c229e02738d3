"""Synthetic N-rank training jobs in Kineto's trace format, with planted causes whose truth is known.

Why: cross-rank analyses (the ``ranks`` tool) must be checked against jobs where the answer is
known -- which rank straggled, in which step, by how much and why -- and real multi-rank traces
with a known cause are rare.  :func:`make_job` simulates a data-parallel (optionally 2-D:
tensor x data parallel) training loop on N ranks and writes what ``torch.profiler`` would write
on each rank: ``rank-R.pt.trace.json.gz`` with ``distributedInfo``, ``ProfilerStep#k`` ranges,
``aten`` ops with their ``cudaLaunchKernel`` calls, kernels, ``record_param_comms`` ops and NCCL
kernels carrying the collective's metadata (``Collective name``, ``In msg nelems``, process group).

The simulation: every rank's host launches the step's work (after its data loading range) and
synchronizes with the GPU at the step's end; a GPU runs its kernels in order, each no earlier than
its launch; a collective's kernel starts on each member when that member's GPU reaches it (its
*arrival*) and ends on all members together, ``transfer`` after the last arrival (plus up to
``END_JITTER_NS``).  The workload is :func:`default_workload` or :func:`workload_from_trace` (the
kernels and collectives of one step of a real single-rank trace).

Planted causes (any combination): :class:`Straggler` (one rank, one step, host delay or extra
compute), :class:`SlowLink` (longer transfers of the collectives a rank takes part in, in one
step), :class:`ClockSkew` (each rank's clock offset), :class:`SlowRank` (one rank's compute slower
in every step), :class:`Imbalance` (per-rank, per-step compute multipliers: different shapes).
:class:`Job` (returned) holds the truth: clock offsets relative to the lowest rank and, per
collective instance and rank, the arrival and the wait, from the simulation itself.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas"
ELEMENTWISE = "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl, std::array<char*, 2ul> >"
SOFTMAX = "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float>"
NCCL_NAMES = {"allreduce": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
              "allgather": "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
              "reduce_scatter": "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
              "broadcast": "ncclDevKernel_Broadcast_RING_LL(ncclDevKernelArgsStorage<4096ul>)"}
LOADER = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
BASE_NS = 1_000_000_000_000    # the simulated job's true start (ns after baseTimeNanoseconds)
BASE_TIME_NS = 1_790_000_000_000_000_000
OP_NS, LAUNCH_NS, LAUNCH_LATENCY_NS = 30_000, 8_000, 4_000
LOAD_NS = 200_000              # the data loading range of every step
END_JITTER_NS = 1_000          # members of a collective end within this of each other
STEP_GAP_NS = 20_000


@dataclass
class Straggler:
    """Rank ``rank`` is ``delay_ns`` late in step ``step``: ``cause`` "host" (its data loading
    takes longer, its GPU idles) or "compute" (its first GEMM before the first collective runs longer)."""

    rank: int
    step: int
    delay_ns: int
    cause: str = "compute"


@dataclass
class SlowLink:
    """In step ``step``, every collective rank ``rank`` takes part in transfers ``extra_ns`` longer."""

    rank: int
    step: int
    extra_ns: int


@dataclass
class ClockSkew:
    """Rank r's clock reads true time + ``offsets_ns[r]`` (ranks not listed: 0); with ``spread_ns``
    instead, each rank's offset is drawn uniformly from [-spread_ns, spread_ns]."""

    offsets_ns: dict[int, int] = field(default_factory=dict)
    spread_ns: int = 0


@dataclass
class SlowRank:
    """Rank ``rank``'s compute takes ``factor`` times as long in every step (a slow GPU)."""

    rank: int
    factor: float


@dataclass
class Imbalance:
    """Each rank's compute in each step is multiplied by a factor drawn from [1 - spread, 1 + spread]
    (different sequence lengths per rank); the drawn factors are in ``Job.compute_factor``."""

    spread: float


@dataclass
class Phase:
    """A compute phase (``kernels``: (name, ns) in order) or a collective (``kind``, ``bytes``,
    ``group``: "dp", "tp" or "world", ``transfer_ns``)."""

    kernels: list[tuple[str, int]] = field(default_factory=list)
    kind: str | None = None
    bytes: int = 0
    group: str = "dp"
    transfer_ns: int = 0


@dataclass
class Job:
    """The truth of a generated job (times are true times, before clock skew)."""

    path: Path
    ranks: int
    steps: int
    offsets_ns: dict[int, int]            # clock offset of each rank relative to the lowest rank
    groups: dict[str, list[list[int]]]    # group kind -> member lists
    collectives: list[dict[str, Any]]     # per instance: step, phase, kind, group, members, arrival, end
    compute_factor: np.ndarray            # [rank, step] multiplier of compute time
    step_end_ns: np.ndarray               # [rank, step] GPU end of each step (true time)
    plants: list[Any] = field(default_factory=list)

    def waits(self) -> dict[tuple[int, int], int]:
        """(step, rank that arrived last) -> total wait it caused on the other members, summed over
        the step's collectives where it was the last to arrive (the ground truth of impact)."""
        out: dict[tuple[int, int], int] = {}
        for c in self.collectives:
            arr = np.asarray(c["arrival"])
            last = int(np.argmax(arr))
            key = (c["step"], c["members"][last])
            out[key] = out.get(key, 0) + int((arr.max() - arr).sum())
        return out


def default_workload(kernel_ns: int = 1_500_000, kernels: int = 8, bucket_bytes: int = 25 << 20,
                     transfer_ns: int = 1_000_000, tp: bool = False) -> list[Phase]:
    """A forward pass and a backward pass in two buckets, each bucket followed by its gradient
    all-reduce (with ``tp``: a tensor-parallel all-reduce inside the forward pass too)."""
    def block(n: int) -> list[tuple[str, int]]:
        names = [GEMM, ELEMENTWISE, GEMM, SOFTMAX]
        return [(names[i % 4], kernel_ns if names[i % 4] == GEMM else kernel_ns // 3) for i in range(n)]

    phases = [Phase(block(kernels))]
    if tp:
        phases.append(Phase(kind="allreduce", bytes=bucket_bytes // 4, group="tp", transfer_ns=transfer_ns // 2))
        phases.append(Phase(block(kernels // 2)))
    for _ in range(2):
        phases.append(Phase(block(kernels)))
        phases.append(Phase(kind="allreduce", bytes=bucket_bytes, group="dp", transfer_ns=transfer_ns))
    return phases


def workload_from_trace(path: str | Path) -> list[Phase]:
    """The phases of one step of a real single-rank trace: its kernels in order, each NCCL kernel
    a collective (kind from the name, bytes from ``record_param_comms``, transfer = the shortest
    duration of that collective kind in the trace).  Uses the trace's second step when there are
    several (the first is often warm-up)."""
    import pyarrow.compute as pc

    from pastaprof.api import load
    from pastaprof.tools.ranks.collectives import kernel_kind
    from pastaprof.tools.steps import Steps

    run = load(path)
    tool = Steps()
    for kind in tool.consumes:
        for b in run.table(kind).to_batches():
            tool.on_batch(kind, b)
    steps = tool.report().tables.get("steps")
    k = run.table("kernel").sort_by("start_ns")
    if steps is not None and steps.num_rows:
        row = min(1, steps.num_rows - 1)
        lo, hi = steps["start_ns"][row].as_py(), steps["end_ns"][row].as_py()
        k = k.filter(pc.and_(pc.greater_equal(k["start_ns"], lo), pc.less(k["start_ns"], hi)))
    coll = run.table("collective")
    size = dict(zip(coll["op_id"].to_pylist(), coll["bytes"].to_pylist()))
    names, starts, ends, ops = (k[c].to_pylist() for c in ("name", "start_ns", "end_ns", "op_id"))
    shortest: dict[str, int] = {}
    for name, s, e in zip(names, starts, ends):
        kind = kernel_kind(name)
        if kind:
            shortest[kind] = min(shortest.get(kind, e - s), e - s)
    phases: list[Phase] = []
    for name, s, e, op in zip(names, starts, ends, ops):
        kind = kernel_kind(name)
        if kind:
            phases.append(Phase(kind=kind, bytes=int(size.get(op) or 0), group="dp",
                                transfer_ns=max(1_000, shortest[kind])))
        else:
            if not phases or phases[-1].kind is not None:
                phases.append(Phase())
            phases[-1].kernels.append((str(name), max(1_000, int(e - s))))
    if not any(p.kind for p in phases):
        raise ValueError(f"{path}: no NCCL kernel in the chosen step: not a distributed trace")
    return phases


def _groups(n: int, tp: int | None) -> dict[str, list[list[int]]]:
    world = [list(range(n))]
    if not tp or tp >= n:
        return {"world": world, "dp": world, "tp": world}
    if n % tp:
        raise ValueError(f"tp={tp} does not divide {n} ranks")
    return {"world": world, "tp": [list(range(i, i + tp)) for i in range(0, n, tp)],
            "dp": [list(range(i, n, tp)) for i in range(tp)]}


def make_job(out: str | Path, ranks: int = 16, steps: int = 4, *, plants: list[Any] = (),
             workload: list[Phase] | None = None, tp: int | None = None, seed: int = 0,
             jitter: float = 0.002, gzip_files: bool = True) -> Job:
    """Write an N-rank job to the folder ``out`` (created) and return its truth.

    ``plants``: :class:`Straggler`, :class:`SlowLink`, :class:`ClockSkew`, :class:`SlowRank`,
    :class:`Imbalance` objects.  ``tp``: tensor-parallel group size (2-D groups; None: one
    data-parallel group of all ranks).  ``jitter``: relative noise on kernel durations.
    """
    if ranks < 1 or steps < 1:
        raise ValueError("a job needs at least one rank and one step")
    rng = np.random.default_rng(seed)
    phases = workload if workload is not None else default_workload(tp=bool(tp) and tp < ranks)
    groups = _groups(ranks, tp)
    factor = np.ones((ranks, steps))
    offsets = np.zeros(ranks, np.int64)
    for p in plants:
        if isinstance(p, SlowRank):
            factor[p.rank] *= p.factor
        elif isinstance(p, Imbalance):
            factor *= rng.uniform(1 - p.spread, 1 + p.spread, size=(ranks, steps))
        elif isinstance(p, ClockSkew):
            if p.spread_ns:
                offsets += rng.integers(-p.spread_ns, p.spread_ns + 1, size=ranks)
            for r, o in p.offsets_ns.items():
                offsets[r] += o
    sim = _Simulation(ranks, steps, phases, groups, factor, list(plants), rng, jitter)
    events = sim.run()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for r in range(ranks):
        _write_rank(out, r, ranks, events[r], int(offsets[r]), groups, gzip_files)
    rel = {r: int(offsets[r] - offsets[0]) for r in range(ranks)}
    return Job(out, ranks, steps, rel, groups, sim.collectives, factor, sim.step_end, list(plants))


class _Simulation:
    """The lock-step simulation of all ranks, one step and one phase at a time."""

    def __init__(self, n: int, steps: int, phases: list[Phase], groups: dict[str, list[list[int]]],
                 factor: np.ndarray, plants: list[Any], rng: np.random.Generator, jitter: float) -> None:
        self.n, self.steps, self.phases, self.groups = n, steps, phases, groups
        self.factor, self.plants, self.rng, self.jitter = factor, plants, rng, jitter
        self.events: list[list[dict[str, Any]]] = [[] for _ in range(n)]
        self.collectives: list[dict[str, Any]] = []
        self.step_end = np.zeros((n, steps), np.int64)
        self.ext = np.zeros(n, np.int64)    # External id counters
        self.corr = np.zeros(n, np.int64)   # correlation counters
        self.seq: dict[tuple[str, int], int] = {}

    def _next(self, counter: np.ndarray, r: int) -> int:
        counter[r] += 1
        return int(counter[r])

    def _emit(self, r: int, cat: str, name: str, start: int, end: int, tid: int, args: dict[str, Any]) -> None:
        gpu = cat == "kernel"
        self.events[r].append({"ph": "X", "cat": cat, "name": name, "pid": r if gpu else 1000 + r,
                               "tid": 7 if gpu else tid, "ts": start, "dur": end - start, "args": args})

    def run(self) -> list[list[dict[str, Any]]]:
        host = np.full(self.n, BASE_NS, np.int64)
        gpu = np.full(self.n, BASE_NS, np.int64)
        for s in range(self.steps):
            host, gpu = self._step(s, host, gpu)
        return self.events

    def _delay(self, r: int, s: int, cause: str) -> int:
        return sum(p.delay_ns for p in self.plants if isinstance(p, Straggler) and p.rank == r and p.step == s
                   and p.cause == cause)

    def _step(self, s: int, host: np.ndarray, gpu: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        n = self.n
        step_start = host.copy()
        launches: list[list[int]] = [[] for _ in range(n)]   # launch time of each kernel, in phase order
        corrs: list[list[tuple[int, int]]] = [[] for _ in range(n)]
        for r in range(n):
            t = int(host[r])
            load_end = t + LOAD_NS + self._delay(r, s, "host")
            self._emit(r, "user_annotation", LOADER, t, load_end, 1, {})
            t = load_end + 2_000
            for ph in self.phases:
                for name, _ in (ph.kernels if ph.kind is None else [(NCCL_NAMES.get(ph.kind, ph.kind), 0)]):
                    e, c = self._next(self.ext, r), self._next(self.corr, r)
                    op = "record_param_comms" if ph.kind else ("aten::mm" if name == GEMM else "aten::gelu")
                    args: dict[str, Any] = {"External id": e}
                    if ph.kind:
                        args.update(self._comm_args(ph, r))
                    self._emit(r, "cpu_op", op, t, t + OP_NS, 1, args)
                    self._emit(r, "cuda_runtime", "cudaLaunchKernel", t + 5_000, t + 5_000 + LAUNCH_NS, 1,
                               {"External id": e, "correlation": c})
                    launches[r].append(t + 5_000)
                    corrs[r].append((e, c))
                    t += OP_NS + 2_000
            host[r] = t
        k = 0
        for pi, ph in enumerate(self.phases):
            if ph.kind is None:
                for ki, (name, ns) in enumerate(ph.kernels):
                    for r in range(n):
                        start = max(int(gpu[r]), launches[r][k] + LAUNCH_LATENCY_NS)
                        dur = ns * self.factor[r, s] * (1 + self.jitter * self.rng.standard_normal())
                        if pi == self._first_compute() and ki == self._first_gemm():
                            dur += self._delay(r, s, "compute")
                        end = start + max(1_000, int(dur))
                        self._kernel(r, name, start, end, corrs[r][k], {})
                        gpu[r] = end
                    k += 1
            else:
                self._collective(s, pi, ph, gpu, launches, corrs, k)
                k += 1
        for r in range(n):  # the host waits for the GPU (loss.item()), then the next step begins
            self.step_end[r, s] = gpu[r]
            sync_end = max(int(host[r]), int(gpu[r])) + 5_000
            self._emit(r, "cuda_runtime", "cudaDeviceSynchronize", int(host[r]), sync_end, 1, {})
            self._emit(r, "user_annotation", f"ProfilerStep#{s}", int(step_start[r]), sync_end + 10_000, 1, {})
            host[r] = sync_end + 10_000 + STEP_GAP_NS
        return host, gpu

    def _first_compute(self) -> int:
        """The compute phase just before the first collective (where extra compute is planted)."""
        first_coll = next(i for i, p in enumerate(self.phases) if p.kind)
        return max(i for i in range(first_coll) if self.phases[i].kind is None) if first_coll else -1

    def _first_gemm(self) -> int:
        ks = self.phases[self._first_compute()].kernels
        return next((i for i, (name, _) in enumerate(ks) if name == GEMM), 0)

    def _comm_args(self, ph: Phase, r: int) -> dict[str, Any]:
        members = next(g for g in self.groups[ph.group] if r in g)
        pg = {"world": 0, "dp": 1, "tp": 2}[ph.group] if len(self.groups["tp"]) > 1 else 0
        pg_name = f"{pg}:{members[0]}" if pg else "0"
        return {"Collective name": ph.kind, "In msg nelems": ph.bytes // 2, "Out msg nelems": ph.bytes // 2,
                "Group size": len(members), "dtype": "BFloat16", "Process Group Name": pg_name,
                "Process Group Description": "default_pg" if pg_name == "0" else ph.group,
                "Process Group Ranks": json.dumps(members)}

    def _kernel(self, r: int, name: str, start: int, end: int, ec: tuple[int, int], extra: dict[str, Any]) -> None:
        e, c = ec
        self._emit(r, "kernel", name, start, end, 7, {"External id": e, "device": r % 8, "stream": 7,
                                                     "correlation": c, "grid": [132, 1, 1], "block": [256, 1, 1],
                                                     "registers per thread": 128, "shared memory": 0, **extra})

    def _collective(self, s: int, pi: int, ph: Phase, gpu: np.ndarray, launches: list[list[int]],
                    corrs: list[list[tuple[int, int]]], k: int) -> None:
        for members in self.groups[ph.group]:
            arrival = [max(int(gpu[r]), launches[r][k] + LAUNCH_LATENCY_NS) for r in members]
            extra = sum(p.extra_ns for p in self.plants if isinstance(p, SlowLink) and p.step == s
                        and p.rank in members)
            end = max(arrival) + ph.transfer_ns + extra
            key = (ph.group, members[0])
            seq = self.seq[key] = self.seq.get(key, -1) + 1
            ends = []
            for r, a in zip(members, arrival):
                e_r = end + int(self.rng.integers(0, END_JITTER_NS + 1))
                self._kernel(r, NCCL_NAMES.get(ph.kind, ph.kind), a, e_r, corrs[r][k], self._comm_args(ph, r))
                gpu[r] = e_r
                ends.append(e_r)
            self.collectives.append({"step": s, "phase": pi, "kind": ph.kind, "group": ph.group, "seq": seq,
                                     "members": list(members), "arrival": arrival, "end": ends,
                                     "transfer_ns": ph.transfer_ns + extra, "bytes": ph.bytes})


def _write_rank(out: Path, r: int, n: int, events: list[dict[str, Any]], offset: int,
                groups: dict[str, list[list[int]]], gz: bool) -> None:
    trace_events = []
    for ev in events:
        ev = dict(ev)
        ev["ts"] = round((ev["ts"] + offset) / 1000, 3)
        ev["dur"] = round(ev["dur"] / 1000, 3)
        trace_events.append(ev)
    pg_config = [{"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cuda:nccl", "pg_size": n,
                  "ranks": list(range(n))}]
    doc = {"schemaVersion": 1, "deviceProperties": [{"id": r % 8, "name": "NVIDIA H200"}],
           "distributedInfo": {"backend": "nccl", "rank": r, "world_size": n, "pg_count": len(pg_config),
                               "pg_config": pg_config, "nccl_version": "2.28.9"},
           "displayTimeUnit": "ms", "baseTimeNanoseconds": BASE_TIME_NS, "traceEvents": trace_events}
    data = json.dumps(doc, separators=(",", ":")).encode()
    path = out / f"rank-{r}.pt.trace.json{'.gz' if gz else ''}"
    if gz:
        with gzip.open(path, "wb", compresslevel=1) as f:
            f.write(data)
    else:
        path.write_bytes(data)
