import torch


@torch.compile
def gelu_mix(x, y):
    return torch.nn.functional.gelu(x) * torch.sigmoid(y) + 0.5


x = torch.linspace(-2, 2, 64, device="cuda")
y = torch.linspace(1, -1, 64, device="cuda")
out = gelu_mix(x, y)
eager = torch.nn.functional.gelu(x) * torch.sigmoid(y) + 0.5
print(f"matches eager: {torch.allclose(out, eager, atol=1e-6)}")
print(f"sum: {out.sum().item():.5f}")
