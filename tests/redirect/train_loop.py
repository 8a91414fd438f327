import torch

torch.manual_seed(0)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
x, y = torch.randn(64, 8).cuda(), torch.randn(64, 1).cuda()
for step in range(30):
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
print(f"final loss: {loss.item():.8f}")
print(f"weight sum: {sum(p.sum().item() for p in model.parameters()):.8f}")
print(f"on accelerator: {next(model.parameters()).device.type != 'cpu' or device.type == 'cpu'}")
