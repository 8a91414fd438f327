"""A rank lost in the middle of data-parallel training: every other rank must exit non-zero within
the collective timeout, naming the lost rank, never hang.

torchrun cannot show this: its agent kills the surviving ranks as soon as one dies. So this test is
the launcher: it starts ``distributed_worker lose-rank VICTIM kill|stop|finish TIMEOUT_MS`` once per
rank with torchrun's environment contract, and at step 3 the victim kills (SIGKILL) or stops
(SIGSTOP, a hung process) itself, or returns as if it had fewer steps to run."""

import os
import pathlib
import signal
import socket
import subprocess
import time

import pytest

WORKER = os.environ.get("TORCHBRIDGE_DISTRIBUTED_WORKER",
                        str(pathlib.Path(__file__).resolve().parents[2] / "build" / "bin" / "distributed_worker"))
TIMEOUT_MS = 10_000
# The survivors' deadline: the collective timeout (a stopped rank is noticed only by it), the
# diagnosis (three heartbeats of 500 ms) and start-up, with room for a loaded machine.
DEADLINE_S = TIMEOUT_MS / 1000 + 20


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(world_size: int, victim: int, how: str):
    port = free_port()
    ranks = []
    for rank in range(world_size):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
                   LOCAL_WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   OMP_NUM_THREADS="1")
        ranks.append(subprocess.Popen([WORKER, "lose-rank", str(victim), how, str(TIMEOUT_MS)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    return ranks


@pytest.mark.parametrize("world_size,victim,how", [
    (2, 1, "kill"),
    (3, 2, "kill"),   # rank 1 may hear of it only through rank 0 giving up: it must still name rank 2
    (2, 0, "kill"),   # rank 0 also serves the rendezvous store
    (3, 1, "stop"),   # a hung rank: only the timeout reveals it
    (2, 1, "finish"),  # not lost: it ran fewer steps and left
])
def test_survivors_exit_naming_the_lost_rank(world_size, victim, how):
    assert pathlib.Path(WORKER).exists(), f"build distributed_worker first ({WORKER})"
    ranks = launch(world_size, victim, how)
    start = time.monotonic()
    try:
        for rank, process in enumerate(ranks):
            if rank == victim:
                continue
            remaining = DEADLINE_S - (time.monotonic() - start)
            try:
                _, stderr = process.communicate(timeout=max(remaining, 0.1))
            except subprocess.TimeoutExpired:
                pytest.fail(f"rank {rank} still running {DEADLINE_S} s after start: it hangs on the lost rank {victim}")
            assert process.returncode == 1, f"rank {rank} exited with {process.returncode}: {stderr}"
            expected = (f"rank {victim} has left the group while this rank still expected it: its program finished or "
                        "stopped on an error"
                        if how == "finish" else f"rank {victim} was lost" if victim != 0 else
                        "rank 0 was lost: the rendezvous store it serves at 127.0.0.1:")
            assert expected in stderr, f"rank {rank} does not name the lost rank {victim}: {stderr}"
            assert f"rank {rank} of {world_size}: DataParallel backward with gradient all-reduce failed" in stderr, stderr
        if how == "stop":
            assert ranks[victim].poll() is None, "the stopped rank should still exist"
        elif how == "finish":
            assert ranks[victim].wait(timeout=10) == 0
        else:
            assert ranks[victim].wait(timeout=10) == -signal.SIGKILL
    finally:
        for process in ranks:
            if process.poll() is None:
                process.kill()
                process.wait()


# Gradients of an SDK device's parameters reach Gloo through a host copy (a comm hook): its
# callback ignored the all-reduce's failure, so a survivor's next backward returned its own
# gradient divided by the world size, and the job trained on and exited 0.
SDK_DEVICE_RANK = """
import os, sys, time, torch
import torchbridge, torchbridge.distributed as tbd
torchbridge.devices.load("emu")
group = tbd.init(timeout=10)
model = tbd.DataParallel(torch.nn.Linear(4, 1, bias=False).to("emu:0"), group)
x = torch.full((2, 4), float(group.rank + 1), device="emu:0")
model.backward(model(x).sum())
print("step 1 gradient", model.module.weight.grad.cpu().tolist(), flush=True)
if group.rank == 1:
    os._exit(0)
time.sleep(2)
model.zero_grad()
model.backward(model(x).sum())
print("step 2 returned", model.module.weight.grad.cpu().tolist(), flush=True)
"""


def test_survivors_on_an_sdk_device_exit_naming_the_lost_rank():
    import sys

    port = free_port()
    ranks = [subprocess.Popen([sys.executable, "-c", SDK_DEVICE_RANK], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=dict(os.environ, RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank),
                                                  LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                                                  MASTER_PORT=str(port), OMP_NUM_THREADS="1"))
             for rank in range(2)]
    try:
        outputs = [process.communicate(timeout=DEADLINE_S) for process in ranks]
    finally:
        for process in ranks:
            if process.poll() is None:
                process.kill()
                process.wait()
    for stdout, _ in outputs:
        assert "step 1 gradient [[3.0, 3.0, 3.0, 3.0]]" in stdout  # (2 x 1 + 2 x 2) / 2: averaged
    survivor_out, survivor_err = outputs[0]
    assert ranks[0].returncode == 1 and "step 2 returned" not in survivor_out, survivor_out
    assert "rank 0 of 2: DataParallel backward with gradient all-reduce failed: rank 1 was lost" in survivor_err, \
        survivor_err
