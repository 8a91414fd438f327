import torch

torch.manual_seed(42)
normal = torch.distributions.Normal(torch.zeros(3, device="cuda"), torch.ones(3, device="cuda"))
samples = normal.sample((4,))
categorical = torch.distributions.Categorical(logits=torch.tensor([0.1, 0.5, 2.0], device="cuda"))
draws = categorical.sample((8,))
print(f"normal samples: {[round(v, 6) for v in samples.flatten().tolist()]}")
print(f"log_prob: {normal.log_prob(samples).sum().item():.6f}")
print(f"categorical: {draws.tolist()}")
