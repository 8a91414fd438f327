import torch

cuda = torch.cuda.is_available()
Tensor = torch.cuda.FloatTensor if cuda else torch.FloatTensor
valid = Tensor(4, 1).fill_(1.0)
labels = torch.cuda.LongTensor([1, 0, 2])
half = valid.type(torch.cuda.HalfTensor)
doubled = labels.type("torch.cuda.DoubleTensor") * 2
print(f"valid: {valid.sum().item()}")
print(f"labels: {labels.tolist()}, doubled: {doubled.tolist()}")
print(f"dtypes: {valid.dtype} {labels.dtype} {half.dtype} {doubled.dtype}")
print(f"isinstance FloatTensor: {isinstance(valid, torch.cuda.FloatTensor)}")
print(f"a LongTensor is no FloatTensor: {not isinstance(labels, torch.cuda.FloatTensor)}")
print(f"on the accelerator: {valid.device == torch.empty(0, device='cuda').device}")
