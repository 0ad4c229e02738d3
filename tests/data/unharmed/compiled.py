import torch
import torch.nn as nn
from torch._dynamo.utils import counters

torch.manual_seed(0)
torch.set_num_threads(1)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        return torch.relu(self.lin(x)) + x


net = nn.Sequential(Block(), Block())
x = torch.randn(4, 8)
full = torch.compile(net, backend="eager", fullgraph=True)
print("fullgraph", round(full(x).sum().item(), 4), round(full(x * 2).sum().item(), 4), flush=True)
net2 = nn.Sequential(Block(), Block())
net2.compile(backend="eager")
print("module.compile", round(net2(x).sum().item(), 4), flush=True)
print("stats", dict(counters["stats"]), sum(counters["graph_break"].values()), flush=True)
