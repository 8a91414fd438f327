import torch

start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
a = torch.arange(256 * 256, dtype=torch.float32, device="cuda").view(256, 256) / 1000
start.record()
b = a @ a
end.record()
torch.cuda.synchronize()
elapsed = start.elapsed_time(end)
print(f"info: matmul took {elapsed:.3f} ms")
print(f"elapsed positive: {elapsed > 0}")
print(f"checksum: {b.sum().item():.4f}")
