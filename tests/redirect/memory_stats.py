import torch

torch.cuda.reset_peak_memory_stats()
before = torch.cuda.memory_allocated()
block = torch.empty(8 * 1024 * 1024, dtype=torch.uint8, device="cuda")
block.fill_(3)
after = torch.cuda.memory_allocated()
print(f"info: allocated {before} -> {after}, peak {torch.cuda.max_memory_allocated()}, "
      f"reserved {torch.cuda.memory_reserved()}")
free, total = torch.cuda.mem_get_info()
print(f"info: {torch.cuda.get_device_name()}: {free} of {total} bytes free")
print(f"allocation visible: {after - before >= 8 * 1024 * 1024 * 0.9}")
print(f"peak covers it: {torch.cuda.max_memory_allocated() >= after}")
print(f"free within total: {0 < free <= total}")
print(f"sum: {block.sum().item()}")
