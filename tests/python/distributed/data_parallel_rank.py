"""One rank of test_distributed_python.py's torchrun job: torchbridge.distributed.DataParallel
against torch's own DistributedDataParallel on the CPU (bit for bit: both drive c10d's reducer
with the same buckets), on emu against one CPU process on the whole batch, buffers (BatchNorm's
running statistics) after each step, find_unused_parameters, and no_sync. Exits
non-zero naming the first disagreement."""

import sys

import torch
import torch.distributed as dist

import torchbridge
import torchbridge.distributed as tbd

torchbridge.devices.load("emu")  # before the first backward pass of the process
group = tbd.init(timeout=60)
dist.init_process_group("gloo")  # only for torch's DDP, the reference
# The script's own checks gather through a group of their own, destroyed before the interpreter
# exits. torch's default group cannot be: torch.distributed.nn.functional, which torch's DDP imports
# after this init, holds it in its collectives' default arguments, so it and Gloo's worker threads
# stay alive to the end, even after destroy_process_group(). A worker lets go of a finished collective's tensors
# only after the caller's wait returns; tensors whose Python objects died meanwhile, at interpreter
# exit, need the GIL then, and the worker aborts the process ("terminate called without an active
# exception", ProcessGroupGloo::runLoop -> TensorImpl::decref_pyobject -> pthread_exit). A
# five-line torch script ending in all_gather did so in 6 of 14 runs under load.
checks = dist.new_group(backend="gloo")
rank, world = group.rank, group.world_size
assert (rank, world) == (dist.get_rank(), dist.get_world_size())

torch.manual_seed(7)  # the same data on every rank
inputs, targets = torch.randn(24, 8, dtype=torch.float64), torch.randn(24, 4, dtype=torch.float64)
share = 24 // world
x, y = inputs[rank * share:(rank + 1) * share], targets[rank * share:(rank + 1) * share]


def model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4)).double()


def train(wrapped, parameters, backward, x, y, steps=4):
    optimizer = torch.optim.SGD(parameters, lr=0.1)
    for _ in range(steps):
        optimizer.zero_grad()
        backward(torch.nn.functional.mse_loss(wrapped(x), y))
        optimizer.step()


def fail(what):
    print(f"rank {rank}: {what}", file=sys.stderr)
    sys.exit(1)


def trained_against_ddp(build, what=""):
    """Ours and torch's DDP, each wrapping build() (a rank-dependent start: both take rank 0's
    weights), trained alike on this rank's rows; their parameters must be equal bit for bit."""
    ours = tbd.DataParallel(build(), group)
    theirs = torch.nn.parallel.DistributedDataParallel(build())
    train(ours, ours.parameters(), ours.backward, x, y)
    train(theirs, theirs.parameters(), lambda loss: loss.backward(), x, y)
    for a, b in zip(ours.module.parameters(), theirs.module.parameters()):
        if not torch.equal(a, b):
            fail(f"DataParallel{what} differs from DistributedDataParallel by {(a - b).abs().max().item():.3g}")
    return ours, theirs


# CPU: ours against torch's DDP.
trained_against_ddp(lambda: model(100 + rank))

# emu: through host memory, against one CPU process on the whole batch.
on_emu = tbd.DataParallel(model(200 + rank).to("emu:0"), group)
reference = model(200)
train(on_emu, on_emu.parameters(), on_emu.backward, x.to("emu:0"), y.to("emu:0"))
train(reference, reference.parameters(), lambda loss: loss.backward(), inputs, targets)
worst = max((a.cpu() - b).abs().max().item() for a, b in zip(on_emu.module.parameters(), reference.parameters()))
if worst > 1e-12:
    fail(f"DataParallel on emu differs from one CPU process by {worst:.3g}")

# Frozen parameters start from rank 0's too, as DDP broadcasts them (they were left as each rank
# made them: ranks then ran different models).
frozen_model = model(300 + rank)
frozen_model[2].weight.requires_grad_(False)
frozen = tbd.DataParallel(frozen_model.to("emu:0"), group)
weights = frozen.module[2].weight.detach().cpu()
everyone = [torch.empty_like(weights) for _ in range(world)]
dist.all_gather(everyone, weights, group=checks)
if not all(torch.equal(other, model(300)[2].weight.detach()) for other in everyone):
    fail("a frozen parameter was not broadcast from rank 0")

# Buffers: BatchNorm's running statistics, which each rank updates from its own rows. After each
# step every rank holds rank 0's, which are DDP's rank 0's (DDP broadcasts them before each
# forward, so its other ranks hold their own last update); the parameters equal DDP's bit for bit.
def normed_model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.Tanh(),
                               torch.nn.Linear(16, 4)).double()


def buffers_of(module):
    return torch.cat([b.detach().cpu().double().flatten() for b in module.buffers()])


ours, theirs = trained_against_ddp(lambda: normed_model(400 + rank), " with BatchNorm")
theirs_on_rank_0 = buffers_of(theirs.module)
dist.broadcast(theirs_on_rank_0, src=0, group=checks)
if not torch.equal(buffers_of(ours.module), theirs_on_rank_0):
    fail("BatchNorm's running statistics are not rank 0's after a step")
for device, broadcast in (("emu:0", True), ("cpu", False)):
    normed = tbd.DataParallel(normed_model(500).to(device), group, broadcast_buffers=broadcast)
    train(normed, normed.parameters(), normed.backward, x.to(device), y.to(device), steps=2)
    mine = buffers_of(normed.module)
    everyone = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(everyone, mine, group=checks)
    alike = sum(torch.equal(other, mine) for other in everyone)
    if broadcast and alike != world:
        fail(f"on {device} BatchNorm's running statistics differ across ranks after a step")
    if not broadcast and alike != 1:
        fail("broadcast_buffers=False still made the running statistics agree")

# find_unused_parameters: a layer no step uses keeps its weights, the used one trains as DDP's.
class WithAnUnusedLayer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(600 + rank)
        self.used, self.unused = torch.nn.Linear(8, 4).double(), torch.nn.Linear(8, 4).double()

    def forward(self, inputs):
        return self.used(inputs)


ours = tbd.DataParallel(WithAnUnusedLayer(), group, find_unused_parameters=True)
theirs = torch.nn.parallel.DistributedDataParallel(WithAnUnusedLayer(), find_unused_parameters=True)
untouched = ours.module.unused.weight.detach().clone()
train(ours, ours.parameters(), ours.backward, x, y)
train(theirs, theirs.parameters(), lambda loss: loss.backward(), x, y)
if not (torch.equal(ours.module.used.weight, theirs.module.used.weight)
        and torch.equal(ours.module.unused.weight, untouched)):
    fail("DataParallel with find_unused_parameters differs from DistributedDataParallel")

# no_sync keeps gradients local: ranks saw different rows, so their gradients differ.
on_emu.zero_grad()
with on_emu.no_sync():
    on_emu.backward(torch.nn.functional.mse_loss(on_emu(x.to("emu:0")), y.to("emu:0")))
mine = torch.cat([p.grad.cpu().flatten() for p in on_emu.parameters()])
everyone = [torch.empty_like(mine) for _ in range(world)]
dist.all_gather(everyone, mine, group=checks)
if sum(torch.equal(other, mine) for other in everyone) != 1:
    fail("no_sync exchanged gradients")

print(f"rank {rank} of {world}: DataParallel = DDP on the CPU (bit for bit); on emu vs one CPU process: "
      f"max |difference| {worst:.3g}; buffers are rank 0's after each step; no_sync keeps gradients local")
dist.destroy_process_group(checks)
del checks  # its last reference: Gloo's workers are joined now, while the gathered tensors live
dist.destroy_process_group()
