import torch

accelerator = torch.empty(0, device="cuda").device
torch.set_default_device("cuda")
steps = torch.arange(6.0) * 2
torch.set_default_device(None)
with torch.device("cuda"):
    layer = torch.nn.Linear(4, 2)
print(f"sum: {steps.sum().item()}")
print(f"set_default_device places factories on the accelerator: {steps.device == accelerator}")
print(f"with torch.device places modules on the accelerator: {layer.weight.device == accelerator}")
print(f"the default is the CPU again: {torch.zeros(1).device.type == 'cpu'}")
