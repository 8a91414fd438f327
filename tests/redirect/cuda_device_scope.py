import torch

last = torch.cuda.device_count() - 1
x = torch.ones(4, device="cuda")
with torch.cuda.device(last):
    y = torch.ones(2, device="cuda")
    print(f"info: current device inside the scope: {torch.cuda.current_device()}")
print(f"a scope's 'cuda' tensors are on its device: {y.device == torch.empty(0, device=f'cuda:{last}').device}")
print(f"the scope ends: {torch.cuda.current_device() == 0}")
with torch.cuda.device_of(x):
    print(f"device_of makes the tensor's device current: {torch.cuda.current_device() == max(x.get_device(), 0)}")
summary = torch.cuda.memory_summary()
print(f"info: memory summary of {len(summary.splitlines())} lines")
print(f"memory summary is text: {isinstance(summary, str) and len(summary) > 0}")
# Total memory, not what is in use: with the CPU as the target that is the process's resident set,
# which moves between two calls.
print(f"torch.cuda.memory agrees: {torch.cuda.memory.mem_get_info()[1] == torch.cuda.mem_get_info()[1]}")
print(f"sum: {(x * 3).sum().item() + y.sum().item()}")
