import torch
from torch.utils.data import DataLoader, TensorDataset

dataset = TensorDataset(torch.arange(96, dtype=torch.float32).view(24, 4), torch.arange(24))
loader = DataLoader(dataset, batch_size=6, pin_memory=True, num_workers=2)
total = torch.zeros(4, device="cuda")
count = 0
for features, labels in loader:
    features = features.cuda(non_blocking=True)
    labels = labels.cuda(non_blocking=True)
    total += features.sum(0)
    count += int(labels.numel())
torch.cuda.synchronize()
print(f"total: {total.tolist()}")
print(f"count: {count}")
