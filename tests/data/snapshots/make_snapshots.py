"""Build the schema-built memory snapshots of this folder (python make_snapshots.py).

No GPU was lent when these were made, so they are NOT recorded by PyTorch: a small model of
the caching allocator writes what ``torch.cuda.memory._dump_snapshot()`` writes -- the
``segments`` (blocks with state and allocation frames) and ``device_traces`` (alloc /
free_requested / free_completed / segment_alloc / segment_free / oom entries with
``addr``, ``size``, ``stream``, ``time_us``, ``frames``), ``external_annotations`` of
record_function ranges -- following the TypedDicts in torch/cuda/memory.py
``_snapshot``.  ``scripts/record_snapshots.py`` records the real ones on a CUDA machine
(same scenarios, same file names).

* ``train_step.pickle``: 3 steps of a 3-layer MLP (weights, Adam state, activations, grads).
* ``leak.pickle``: 6 steps; ``leaky_cache_append`` keeps 2 MiB per step; the history ring
  buffer holds only the last ``MAX_ENTRIES`` entries (the start of the run is dropped).
* ``oom.pickle``: 256 MiB chunks under a 2 GiB cap until the allocator refuses one.
* ``leak_protocol5.pickle``: the leak snapshot pickled with protocol 5.
"""

from __future__ import annotations

import pickle
import sys
from pathlib import Path

TORCH = "/opt/torch/.venv/lib/python3.12/site-packages/torch"
USER = "/root/work/scripts/record_snapshots.py"
SMALL, LARGE_ROUND, SMALL_SEG = 1 << 20, 2 << 20, 2 << 20
MAX_ENTRIES = 40


def fr(file: str, line: int, name: str) -> dict:
    return {"filename": file, "line": line, "name": name}


class Allocator:
    """Enough of the caching allocator: size classes, segments, reuse of freed blocks."""

    def __init__(self, cap: int | None = None) -> None:
        self.t = 1_764_600_000_000_000  # time_us
        self.trace: list[dict] = []
        self.segments: dict[int, dict] = {}
        self.free: dict[int, list[int]] = {}       # rounded size -> freed block addresses
        self.blocks: dict[int, dict] = {}          # address -> block
        self.next_addr = 0x7F0000000000
        self.bump: dict[str, tuple[int, int]] = {}  # segment kind -> (segment address, used)
        self.cap = cap
        self.ann: list[dict] = []

    def tick(self, us: int = 1) -> int:
        self.t += us
        return self.t

    def _segment(self, size: int, kind: str, frames: list) -> int | None:
        reserved = sum(s["total_size"] for s in self.segments.values())
        if self.cap is not None and reserved + size > self.cap:
            return None
        addr = self.next_addr
        self.next_addr += size + (1 << 21)
        self.segments[addr] = {"device": 0, "address": addr, "total_size": size, "stream": 0, "segment_type": kind,
                               "segment_pool_id": (0, 0), "allocated_size": 0, "active_size": 0, "blocks": []}
        self.trace.append({"action": "segment_alloc", "addr": addr, "size": size, "stream": 0,
                           "time_us": self.tick(), "frames": frames})
        return addr

    def alloc(self, nbytes: int, frames: list) -> int:
        size = -(-nbytes // 512) * 512 if nbytes < SMALL else -(-nbytes // LARGE_ROUND) * LARGE_ROUND
        if self.free.get(size):
            addr = self.free[size].pop()
        else:
            kind = "small" if size < SMALL else "large"
            seg, used = self.bump.get(kind, (None, 0))
            if kind == "large" or seg is None or used + size > self.segments[seg]["total_size"]:
                seg = self._segment(SMALL_SEG if kind == "small" else size, kind, frames)
                if seg is None:
                    reserved = sum(s["total_size"] for s in self.segments.values())
                    self.trace.append({"action": "oom", "size": size, "stream": 0, "time_us": self.tick(),
                                       "device_free": self.cap - reserved, "frames": frames})
                    raise MemoryError(size)
                used = 0
            addr = seg + used
            self.bump[kind] = (seg, used + size)
            self.blocks[addr] = {"segment": seg, "size": size}
        self.blocks[addr].update(state="active_allocated", frames=frames, requested_size=nbytes)
        self.trace.append({"action": "alloc", "addr": addr, "size": size, "stream": 0, "time_us": self.tick(),
                           "frames": frames})
        return addr

    def release(self, addr: int, frames: list, completed: bool = True) -> None:
        """free_requested, then (unless another stream still uses the block: record_stream)
        free_completed; until then the block is active_awaiting_free and not reusable."""
        b = self.blocks[addr]
        for action in ("free_requested", "free_completed") if completed else ("free_requested",):
            self.trace.append({"action": action, "addr": addr, "size": b["size"], "stream": 0,
                               "time_us": self.tick(0), "frames": frames})
        b["state"] = "inactive" if completed else "active_awaiting_free"
        if completed:
            self.free.setdefault(b["size"], []).append(addr)

    def annotate(self, name: str, stage: str) -> None:
        self.ann.append({"device": 0, "name": name, "stage": stage, "time_us": self.tick()})

    def snapshot(self, max_entries: int | None = None) -> dict:
        for s in self.segments.values():
            s["blocks"] = []
        for addr, b in sorted(self.blocks.items()):
            seg = self.segments[b["segment"]]
            seg["blocks"].append({"address": addr, "size": b["size"], "requested_size": b.get("requested_size", 0),
                                  "state": b["state"], "frames": b["frames"] if b["state"] != "inactive" else []})
            if b["state"] != "inactive":
                seg["allocated_size"] += b["size"]
                seg["active_size"] += b["size"]
        trace = self.trace[-max_entries:] if max_entries else self.trace
        return {"segments": list(self.segments.values()), "device_traces": [trace], "external_annotations": self.ann,
                "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": ""}}


LINEAR = [fr(f"{TORCH}/nn/modules/linear.py", 134, "forward"), fr(f"{TORCH}/nn/modules/module.py", 1784, "_call_impl")]


def user(line: int, name: str) -> list:
    return [fr(USER, line, name), fr(USER, 200, "main"), fr(USER, 210, "<module>")]


def train_step() -> dict:
    a = Allocator()
    width, batch = 512, 256
    weights = [a.alloc(width * width * 4, [fr(f"{TORCH}/nn/modules/linear.py", 106, "__init__"), *user(70, "_mlp")])
               for _ in range(3)]
    state: list[int] = []
    for step in range(3):
        a.annotate(f"train_step_{step}", "START")
        acts = [a.alloc(batch * width * 4, LINEAR + user(83, "train_step")) for _ in range(3)]
        loss = a.alloc(512, user(83, "train_step"))
        grads = [a.alloc(width * width * 4, [fr(f"{TORCH}/autograd/graph.py", 829, "_engine_run_backward"),
                                             *user(84, "train_step")]) for _ in weights]
        for x in acts + [loss]:
            a.release(x, [fr(f"{TORCH}/autograd/graph.py", 829, "_engine_run_backward"), *user(84, "train_step")])
        if not state:
            state = [a.alloc(width * width * 4, [fr(f"{TORCH}/optim/adam.py", 190, "_init_group"),
                                                 *user(85, "train_step")]) for _ in range(6)]
        tmp = a.alloc(width * width * 4, [fr(f"{TORCH}/optim/adam.py", 420, "_single_tensor_adam"), *user(85, "train_step")])
        a.release(tmp, user(85, "train_step"))
        for g in grads:
            a.release(g, [fr(f"{TORCH}/optim/optimizer.py", 980, "zero_grad"), *user(86, "train_step")])
        a.annotate(f"train_step_{step}", "END")
    side = a.alloc(batch * width * 4, user(90, "copy_on_side_stream"))
    a.release(side, user(91, "copy_on_side_stream"), completed=False)  # still used by another stream at the dump
    return a.snapshot()


def leak() -> dict:
    a = Allocator()
    weights = [a.alloc(256 * 256 * 4, user(70, "_mlp")) for _ in range(2)]
    del weights
    for step in range(6):
        a.annotate(f"train_step_{step}", "START")
        y = a.alloc(128 * 256 * 4, LINEAR + user(100, "leak"))
        a.alloc(2 << 20, [fr(USER, 92, "leaky_cache_append"), *user(101, "leak")])   # kept: the leak
        g = a.alloc(256 * 256 * 4, user(102, "leak"))
        a.release(y, user(102, "leak"))
        a.release(g, user(103, "leak"))
        a.annotate(f"train_step_{step}", "END")
    return a.snapshot(max_entries=MAX_ENTRIES)


def oom() -> dict:
    a = Allocator(cap=2 << 30)
    try:
        while True:
            a.alloc(256 << 20, [fr(USER, 112, "grow_until_oom"), *user(124, "oom")])
    except MemoryError:
        pass
    return a.snapshot()


def main(out: Path) -> None:
    for name, fn in (("train_step", train_step), ("leak", leak), ("oom", oom)):
        (out / f"{name}.pickle").write_bytes(pickle.dumps(fn(), protocol=4))
    (out / "leak_protocol5.pickle").write_bytes(pickle.dumps(leak(), protocol=5))


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent)
