import torch

host = torch.arange(1 << 20, dtype=torch.float32)
side, main = torch.cuda.Stream(), torch.cuda.current_stream()
with torch.cuda.stream(side):
    staged = host.to("cuda", non_blocking=True)
    doubled = staged * 2
main.wait_stream(side)
result = doubled + 1
torch.cuda.synchronize()
print(f"sum: {result.sum().item():.1f}")
print(f"last: {result[-1].item():.1f}")
