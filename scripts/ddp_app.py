"""A 2-rank DDP MLP with NCCL: the training job of scripts/gpu_ddp_check.py (run as is by
torchrun) and the model of scripts/record_ddp.py (which imports it).

    torchrun --nproc_per_node 2 scripts/ddp_app.py
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def setup() -> tuple[int, torch.nn.Module, torch.optim.Optimizer, torch.Tensor]:
    """Process group, this rank's GPU, the DDP model, its optimizer and a batch."""
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    torch.cuda.set_device(rank)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)).cuda()
    model = DDP(model, device_ids=[rank])
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    return rank, model, opt, torch.randn(256, 1024, device="cuda")


def step(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor) -> torch.Tensor:
    loss = model(x).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss


def main() -> None:
    rank, model, opt, x = setup()
    for _ in range(4):
        loss = step(model, opt, x)
    torch.cuda.synchronize()
    print(f"rank {rank} loss {loss.item():.6f}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
