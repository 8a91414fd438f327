import torch

torch.cuda.set_device(1)  # written for a machine with at least two GPUs
x = torch.ones(5, device="cuda")
with torch.cuda.device(0):
    y = torch.full((5,), 2.0, device="cuda")
print(f"device count >= 1: {torch.cuda.device_count() >= 1}")
print(f"sum: {(x.cpu() + y.cpu()).sum().item()}")
