import torch

torch.manual_seed(1)
model = torch.nn.Linear(16, 4).to("cuda")
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
scaler = torch.amp.GradScaler("cuda")
# Data drawn on the host, so every target trains on the same numbers (device generators differ).
x, target = torch.randn(32, 16).to("cuda"), torch.randint(0, 4, (32,)).to("cuda")
for step in range(5):
    optimizer.zero_grad()
    with torch.autocast(device_type="cuda", dtype=torch.float16):
        logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits, target)
    print(f"step {step}: logits dtype {logits.dtype}, loss {loss.item():.5f}")
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
print(f"scale: {scaler.get_scale()}")
