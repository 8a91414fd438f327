import os
import tempfile

import torch
import torch.nn as nn
from torch.profiler import ProfilerActivity, profile, record_function

torch.manual_seed(0)
device = torch.device("cuda:0")
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
inputs = torch.randn(64, 16).to(device)
labels = torch.randint(0, 4, (64,)).to(device)


def train_step():
    optimizer.zero_grad()
    loss = nn.functional.cross_entropy(model(inputs), labels)
    loss.backward()
    optimizer.step()
    return loss.item()


# The profiler as its tutorial shows it, with the CUDA activity.
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
    for _ in range(3):
        with record_function("train_step"):
            loss = train_step()
print(f"loss after 3 profiled steps: {loss:.5f}")
names = {event.key for event in prof.key_averages()}
print(f"profiled: train_step {'train_step' in names}, addmm {'aten::addmm' in names}")
print("info:", prof.key_averages().table(sort_by="cuda_time_total", row_limit=3).splitlines()[3])

# The older spelling: the autograd profiler with use_cuda=True.
with torch.autograd.profiler.profile(use_cuda=True) as legacy:
    loss = train_step()
print(f"loss after the legacy-profiled step: {loss:.5f}")
print(f"legacy profiler saw backward: {any('backward' in event.key.lower() for event in legacy.key_averages())}")

# Save, then resume the way GPU checkpoints are usually loaded.
with tempfile.TemporaryDirectory() as directory:
    path = os.path.join(directory, "checkpoint.pt")
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)
    resumed = torch.load(path, map_location={"cuda:1": "cuda:0"})
    model.load_state_dict(resumed["model"])
    optimizer.load_state_dict(resumed["optimizer"])
    resumed_cpu = torch.load(path, map_location=lambda storage, location: storage)
print(f"resumed weight on the model's device: {model[0].weight.device == inputs.device}")
print(f"CPU copy equal: {torch.equal(resumed_cpu['model']['0.weight'], model[0].weight.detach().cpu())}")

# Random numbers drawn under a forked RNG leave the program's stream of random numbers as it was.
torch.cuda.manual_seed(7)
expected = torch.rand(3, device=device)
torch.cuda.manual_seed(7)
with torch.random.fork_rng(devices=[0]):
    torch.cuda.manual_seed(123)
    torch.rand(3, device=device)
print(f"forked RNG left the stream as it was: {torch.equal(torch.rand(3, device=device), expected)}")
print(f"loss after resuming: {train_step():.5f}")
