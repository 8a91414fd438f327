import copy

import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
alone = copy.deepcopy(model).cuda()
parallel = torch.nn.DataParallel(model).cuda()  # every device the machine has
x, y = torch.randn(32, 8).cuda(), torch.randn(32, 1).cuda()
optimizers = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (parallel, alone)]
for step in range(10):
    for m, optimizer in zip((parallel, alone), optimizers):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(m(x), y)
        loss.backward()
        optimizer.step()
difference = max((a - b).abs().max().item() for a, b in zip(model.parameters(), alone.parameters()))
print(f"info: replicas on devices {parallel.device_ids}, largest parameter difference {difference:.3g}")
print(f"final loss: {loss.item():.5f}")
print(f"equal to training on one device: {difference < 1e-6}")
print(f"parameters on the accelerator: {next(model.parameters()).device == x.device}")
