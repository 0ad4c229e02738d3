import socket

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import fully_shard

with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
for layer in model:
    if isinstance(layer, nn.Linear):
        fully_shard(layer)
fully_shard(model)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(5, 8)
for _ in range(3):
    loss = model(x).pow(2).sum()
    loss.backward()
    opt.step()
    opt.zero_grad()
print("fsdp", type(model).__name__, round(loss.item(), 5), sorted(type(m).__name__ for m in model.modules()))
print("grads", [round(p.grad.sum().item(), 5) if p.grad is not None else None for p in model.parameters()])
dist.destroy_process_group()
