import torch


# nestings around the recursion limit, one level at a time and from four stack depths: wherever
# the limit strikes (torch's frames, a hook's), the program's own except clause must see it
def call(m, pad):
    return call(m, pad - 1) if pad else m(torch.ones(1))


ok, deep = 0, 0
for n in range(150, 270):
    m = torch.nn.Identity()
    for _ in range(n):
        m = torch.nn.Sequential(m)
    for pad in range(4):
        try:
            call(m, pad)
            ok += 1
        except RecursionError:
            deep += 1
print("called", ok + deep, "past the limit", deep > 0)
