import copy
import inspect
import pickle
import sys
import warnings

import torch
import torch.nn as nn
from torch.nn.modules import module as nn_module

torch.manual_seed(0)
torch.set_num_threads(1)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))

    def forward(self, x):
        return self.body(x).tanh()


class Tail(nn.Module):
    def forward(self, x):
        return torch.sigmoid(x)


class Outer(nn.Module):
    def __init__(self):
        super().__init__()
        self.tail = Tail()

    def forward(self, x):
        return self.tail(x) * 2


def show(*a):
    print(*a, flush=True)


net, x = Net(), torch.randn(3, 4)
show("import system", [type(f).__name__ for f in sys.meta_path], "exec_module" in vars(torch.__spec__.loader))
call = nn.Module.__call__
show("identity", call is nn.Module._wrapped_call_impl, net.__call__.__func__ is call, net.__call__.__self__ is net)
show("names", call.__qualname__, call.__module__, call.__code__.co_name, call.__code__.co_varnames[:1],
     hasattr(call, "__wrapped__"), call.__code__.co_filename.endswith("torch/nn/modules/module.py"))
show("signature", inspect.signature(net.__call__), inspect.signature(call))
show("pickle fn", pickle.loads(pickle.dumps(call)) is call)
seen = []
h1 = nn_module.register_module_forward_pre_hook(lambda m, a: seen.append(type(m).__name__))
h2 = nn_module.register_module_forward_hook(lambda m, a, o: o * 2 if isinstance(m, nn.Linear) else None)
y = net(x)
h1.remove()
h2.remove()
show("global hooks", seen, round(y.sum().item(), 5))
grads = []
hb = net.body[0].register_full_backward_hook(lambda m, gi, go: grads.append(round(go[0].sum().item(), 5)))
net(x).sum().backward()
hb.remove()
show("backward hook", grads, round(net.body[0].weight.grad.sum().item(), 5))
with torch.no_grad():
    show("pickle/deepcopy", torch.equal(pickle.loads(pickle.dumps(net))(x), net(x)),
         torch.equal(copy.deepcopy(net)(x), net(x)))
    s, t = torch.jit.script(net), torch.jit.trace(net, x)
    show("jit", torch.allclose(s(x), net(x)), torch.allclose(t(x), net(x)), s.code.strip().splitlines()[-1].strip())
    gm = torch.fx.symbolic_trace(net)
    show("fx", [n.op + ":" + str(n.target) for n in gm.graph.nodes], torch.equal(gm(x), net(x)))
with torch.profiler.profile(with_stack=True) as prof:
    z = net(x).sum()
show("profiler", round(z.item(), 5), sorted({e.name for e in prof.events() if e.name.startswith("nn.Module")}),
     sum(e.name == "aten::tanh" for e in prof.events()))
outer = Outer()
with torch.no_grad():
    show("tail", [round(outer(x).sum().item(), 5) for _ in range(4)])
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    outer(x)
show("warnings", [str(w.message)[:40] for w in caught])
