import torch
import torch.nn as nn
from torch._dynamo.utils import counters

torch.manual_seed(0)
torch.set_num_threads(1)
net = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1))
compiled = torch.compile(net, backend="eager")
opt = torch.optim.SGD(net.parameters(), lr=0.01)
x = torch.randn(4, 8)
losses = []
for _ in range(5):  # optimizer steps open and close a --steps window
    loss = compiled(x).sum()
    loss.backward()
    opt.step()
    opt.zero_grad()
    losses.append(round(loss.item(), 5))
print("losses", losses)
print("stats", dict(counters["stats"]), dict(counters["frames"]), sum(counters["graph_break"].values()), flush=True)
