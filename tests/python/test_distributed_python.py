"""torchbridge.distributed from Python, under torchrun with 2 and 3 ranks (the checks themselves
are in distributed/data_parallel_rank.py, one process per rank), and its bad input."""

import os
import pathlib
import subprocess
import sys

import pytest
import torch

import torchbridge.distributed as tbd

RANK_SCRIPT = pathlib.Path(__file__).parent / "distributed" / "data_parallel_rank.py"


@pytest.mark.parametrize("ranks", [2, 3])
def test_data_parallel_under_torchrun(ranks):
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                          str(ranks), str(RANK_SCRIPT)], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.count("DataParallel = DDP on the CPU (bit for bit)") == ranks, run.stdout


RESTARTED_JOB = """
import os, socket, sys, torch, torch.multiprocessing as mp
from datetime import timedelta

def rank_of(rank, port, attempt):
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), TORCHELASTIC_USE_AGENT_STORE="True",
                      TORCHELASTIC_RESTART_COUNT=str(attempt))
    import torchbridge.distributed as tbd
    group = tbd.init(timeout=20)
    group.barrier()
    tbd.DataParallel(torch.nn.Linear(2, 2), group)
    print(f"attempt {attempt} rank {rank} joined", flush=True)

if __name__ == "__main__":
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # The agent's store, as torchrun's elastic agent keeps it across the job's attempts.
    store = torch.distributed.TCPStore("127.0.0.1", port, 3, True, timedelta(seconds=60), wait_for_workers=False)
    for attempt in range(3):
        mp.spawn(rank_of, args=(port, attempt), nprocs=2)
"""


SEVERAL_GROUPS = """
import gc, torch, torchbridge.distributed as tbd

def trained_gradient(group):
    model = tbd.DataParallel(torch.nn.Linear(3, 1, bias=False), group)
    model.backward(model(torch.full((2, 3), float(group.rank + 1))).sum())
    return model.module.weight.grad.tolist()

first, second = tbd.init(timeout=15), tbd.init(timeout=15)  # two live groups
second.barrier()
first.barrier()
print(f"two groups {trained_gradient(first)} {trained_gradient(second)}", flush=True)  # one write per line
del first, second
gc.collect()
for phase in range(2):  # a group made, used and dropped, then another: training phases
    group = tbd.init(timeout=15)
    print(f"phase {phase} {trained_gradient(group)}", flush=True)
    del group
    gc.collect()
"""


def test_several_groups_in_one_process_each_meet_their_own_ranks(tmp_path):
    # Every group used one store prefix: a second init read the first group's Gloo addresses and
    # liveness keys ("Connection refused", "rank 0 has left the group", barriers timing out) in 5
    # of 5 runs of the phases and most runs of two live groups.
    script = tmp_path / "several_groups.py"
    script.write_text(SEVERAL_GROUPS)
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                          str(script)], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert run.returncode == 0, run.stderr[-3000:]
    average = [[3.0, 3.0, 3.0]]  # (2 x 1 + 2 x 2) / 2
    assert run.stdout.count(f"two groups {average} {average}") == 2, run.stdout
    for phase in range(2):
        assert run.stdout.count(f"phase {phase} {average}") == 2, run.stdout


def test_a_restarted_job_joins_again_on_the_agents_store(tmp_path):
    # Every attempt of a torchelastic job shares the agent's store; the group's keys were under one
    # fixed prefix, so a restarted rank read the dead attempt's Gloo address ("Connection refused"
    # in 4 of 6 runs). Each attempt now has its own prefix, as torch's groups do.
    script = tmp_path / "restarted_job.py"
    script.write_text(RESTARTED_JOB)
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert run.returncode == 0, run.stderr[-3000:]
    for attempt in range(3):
        for rank in range(2):
            assert f"attempt {attempt} rank {rank} joined" in run.stdout, run.stdout


STEPS_ON_EMU = """
import torch, torchbridge, torchbridge.distributed as tbd
torchbridge.devices.load("emu")
group = tbd.init()
model = torch.nn.ParameterList([torch.nn.Parameter(torch.zeros(1)) for _ in range(2000)]).to("emu")
parallel = tbd.DataParallel(model, group)

def resident_mib():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20

for step in range(180):
    if step == 30:
        before = resident_mib()
    parallel.backward(torch.stack(list(model)).sum())
print(resident_mib() - before)
"""


def test_steps_through_host_staging_do_not_grow_the_process():
    # c10d's reducer recorded every parameter of every step for a bucket rebuild that host staging
    # never makes: 2000 parameters grew the process by about 16 bytes each per step (4.8 MB over
    # these 150 steps, 15 MB over 500); now it stays flat (0.6 MB over 500 steps).
    environment = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    run = subprocess.run([sys.executable, "-c", STEPS_ON_EMU], capture_output=True, text=True, timeout=300,
                         env=dict(environment, OMP_NUM_THREADS="1"))
    assert run.returncode == 0, run.stderr[-3000:]
    assert float(run.stdout.split()[-1]) < 2.0, run.stdout


@pytest.fixture
def without_torchrun(monkeypatch):
    """No launcher's variables: init() makes a world of one."""
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)


def test_a_world_of_one_without_torchrun(without_torchrun):
    group = tbd.init()
    assert (group.rank, group.world_size) == (0, 1)
    model = torch.nn.Linear(4, 2)
    wrapped = tbd.DataParallel(model, group)
    x = torch.randn(3, 4)
    wrapped.backward(wrapped(x).sum())
    expected = torch.nn.Linear(4, 2)
    expected.load_state_dict(model.state_dict())
    expected(x).sum().backward()
    assert torch.equal(model.weight.grad, expected.weight.grad)


def test_gradients_as_bucket_views_equal_plain_backward_and_share_the_bucket(without_torchrun):
    group = tbd.init()
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    expected = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    expected.load_state_dict(model.state_dict())
    wrapped = tbd.DataParallel(model, group, gradient_as_bucket_view=True)
    for _ in range(3):
        for p in model.parameters():
            if p.grad is not None:
                p.grad.zero_()
        expected.zero_grad(set_to_none=True)
        x = torch.randn(3, 4)
        wrapped.backward(wrapped(x).square().mean())
        expected(x).square().mean().backward()
        for got, want in zip(model.parameters(), expected.parameters()):
            assert torch.equal(got.grad, want.grad)
        grads = [p.grad for p in model.parameters()]
        assert all(g.untyped_storage().data_ptr() == grads[0].untyped_storage().data_ptr() for g in grads)


def test_bad_input_is_refused():
    for timeout in (0, -1.0, float("inf"), float("nan"), 1e12, 0.0009):  # 0.0009 was "positive, got 0 ms"
        with pytest.raises(ValueError, match=f"must be a finite number of seconds from 0.001 .* got {timeout!r}"):
            tbd.init(timeout=timeout)
    group = tbd.init()
    # bool("no") is True: a string turned an option on.
    for option in ("gradient_as_bucket_view", "broadcast_buffers", "find_unused_parameters"):
        with pytest.raises(TypeError, match=f"{option} must be True or False, got str 'no'"):
            tbd.DataParallel(torch.nn.Linear(2, 2), group, **{option: "no"})
    with pytest.raises(TypeError, match="wraps a torch.nn.Module, got int"):
        tbd.DataParallel(3, group)
    for timeout in (True, "5", None):
        with pytest.raises(TypeError, match=f"timeout must be a number of seconds, got {type(timeout).__name__}"):
            tbd.init(timeout=timeout)
    for device in ("bogus", "", "nccl"):
        with pytest.raises(ValueError, match=f"the distributed device '{device}' does not name a backend"):
            tbd.init(device=device)
    with pytest.raises(ValueError, match="the distributed device's index"):
        tbd.init(device="cpu:x")
    for size in (0, -1, float("inf"), float("nan"), 1e13):
        with pytest.raises(ValueError, match=f"bucket_cap_mb must be positive and below 2\\*\\*43 MiB, got {size!r}"):
            tbd.DataParallel(torch.nn.Linear(2, 2), group, bucket_cap_mb=size)
    with pytest.raises(TypeError, match="first_bucket_mb must be a number of MiB, got str"):
        tbd.DataParallel(torch.nn.Linear(2, 2), group, first_bucket_mb="1")
    with pytest.raises(ValueError, match="needs a loss tensor"):
        tbd.DataParallel(torch.nn.Linear(2, 2), group).backward(torch.zeros(()))
    sparse = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.EmbeddingBag(4, 2, sparse=True))
    with pytest.raises(ValueError, match="module '1' makes sparse gradients"):
        tbd.DataParallel(sparse, group)
    # A frozen sparse embedding makes no gradient: accepted, as before.
    frozen = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Embedding.from_pretrained(torch.ones(4, 2), sparse=True))
    tbd.DataParallel(frozen, group)
    assert tbd.init(device=torch.device("cpu")).world_size == 1  # a torch.device names its backend too


class BranchOnRequest(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, 4), torch.nn.Linear(8, 4)

    def forward(self, x, use_b):
        return self.a(x) + (self.b(x) if use_b else 0)


def test_find_unused_parameters_follows_a_set_that_changes_between_steps(without_torchrun):
    # Step 1 leaves b unused, step 2 uses it, step 3 not again: c10d's reducer reports the change
    # to its logger, which DataParallel did not give it (a segmentation fault in step 2).
    torch.manual_seed(0)
    wrapped = tbd.DataParallel(BranchOnRequest(), tbd.init(), find_unused_parameters=True)
    reference = BranchOnRequest()
    reference.load_state_dict(wrapped.module.state_dict())
    for use_b in (False, True, False):
        wrapped.zero_grad()
        reference.zero_grad()
        x = torch.randn(3, 8)
        wrapped.backward(wrapped(x, use_b).sum())
        reference(x, use_b).sum().backward()
        for got, want in zip(wrapped.module.parameters(), reference.parameters()):
            if want.grad is None:  # unused this step: no gradient, or the reducer's zeros
                assert got.grad is None or not got.grad.any()
            else:
                assert torch.equal(got.grad, want.grad)


MISMATCHED_RANKS = """
import sys, torch, torchbridge, torchbridge.distributed as tbd
torchbridge.devices.load("emu")
group = tbd.init(timeout=60)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
if sys.argv[1] == "frozen" and group.rank == 1:
    model[2].weight.requires_grad_(False)
if sys.argv[1] == "device" and group.rank == 1:
    model.to("emu:0")
if sys.argv[1] == "untrained" and group.rank == 1:
    model.requires_grad_(False)
if sys.argv[1] == "sparse" and group.rank == 1:
    model.append(torch.nn.Embedding(4, 2, sparse=True))
try:
    tbd.DataParallel(model, group)
except ValueError as e:
    print(f"rank {group.rank} refused: {e}", flush=True)
    sys.exit(0)
print(f"rank {group.rank} accepted", flush=True)
"""


AGREEMENT = "the model differs across ranks"


@pytest.mark.parametrize("difference, rank_0_says, rank_1_says", [
    ("frozen", AGREEMENT, "parameter '2.weight' is Float [4, 16] frozen on cpu on rank 1, Float [4, 16] trained on "
                          "cpu on rank 0"),
    ("device", AGREEMENT, "parameter '0.weight' is Float [16, 8] trained on emu on rank 1, Float [16, 8] trained on "
                          "cpu on rank 0"),
    # Refused by rank 1 alone, before any exchange: rank 0 was left in the agreement's gather, to fail
    # there on a lost peer or the timeout, not saying why.
    ("untrained", "rank 1 refused, so this rank stops too. Rank 1 said: DataParallel: the module has no parameter",
     "DataParallel: the module has no parameter that requires a gradient"),
    ("sparse", "rank 1 refused, so this rank stops too. Rank 1 said: DataParallel: module '3' makes sparse gradients",
     "DataParallel: module '3' makes sparse gradients"),
])
def test_ranks_that_train_different_parameters_or_devices_are_refused(tmp_path, difference, rank_0_says,
                                                                      rank_1_says):
    # A parameter frozen on one rank only made Gloo abort the process (its reducer's buckets
    # differed in size); ranks on emu and on the CPU trained to wrong gradients (host staging
    # averages after the all-reduce, the CPU before it).
    program = tmp_path / "ranks.py"
    program.write_text(MISMATCHED_RANKS)
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                          str(program), difference], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert run.returncode == 0, run.stderr[-3000:]
    if rank_0_says == AGREEMENT:  # the agreement's verdict: every rank says the same
        for rank in (0, 1):
            assert f"rank {rank} refused: DataParallel, rank {rank} of 2: {AGREEMENT}" in run.stdout, run.stdout
        assert rank_1_says in run.stdout, run.stdout
    else:
        assert f"rank 0 refused: DataParallel, rank 0 of 2: {rank_0_says}" in run.stdout, run.stdout
        assert f"rank 1 refused: {rank_1_says}" in run.stdout, run.stdout


UNUSED_PARAMETERS_ON_EMU = """
import torch, torchbridge, torchbridge.distributed as tbd
torchbridge.devices.load("emu")
try:
    tbd.DataParallel(torch.nn.Linear(2, 2).to("emu:0"), tbd.init(), find_unused_parameters=True)
except ValueError as e:
    print(e)
"""


def test_find_unused_parameters_is_refused_on_an_sdk_device(without_torchrun):
    # c10d's reducer would exchange its unused-parameter map as an emu tensor, which Gloo cannot take.
    run = subprocess.run([sys.executable, "-c", UNUSED_PARAMETERS_ON_EMU], capture_output=True, text=True,
                         timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert run.returncode == 0, run.stderr[-3000:]
    assert "find_unused_parameters is not supported on emu:0" in run.stdout, run.stdout
