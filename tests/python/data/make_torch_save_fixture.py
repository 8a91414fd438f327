"""Writes torch_save_<version>.pt: a model's state_dict as torch.save writes it (an OrderedDict of
Parameters and buffers in several dtypes, tied weights sharing one storage, a strided view), for
tests/python/test_torch_save_import.py to read back with the torch of the test environment.

Run it under another torch than the project's pin to add that version's file:
    python tests/python/data/make_torch_save_fixture.py tests/python/data
(torch_save_2.14.1.pt and torch_save_2.11.0.pt were written this way on a CPU-only machine by
torch 2.14.1+cu130 from the local wheel cache and torch 2.11.0+cu130 downloaded from PyPI.)"""

import pathlib
import sys

import torch


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(11, 6).to(torch.bfloat16)
        self.proj = torch.nn.Linear(6, 4)
        self.norm = torch.nn.BatchNorm1d(4)
        self.head = torch.nn.Linear(4, 3).half()
        self.register_buffer("proj_t", self.proj.weight.detach().t()[1:])  # a strided view of proj.weight
        self.register_buffer("codes", torch.arange(-4, 4, dtype=torch.int8))
        self.register_buffer("ids", torch.arange(6, dtype=torch.int64).reshape(2, 3))
        self.register_buffer("mask", torch.tensor([True, False, True]))
        self.register_buffer("spectrum", torch.randn(3, dtype=torch.complex64))
        self.register_buffer("scale", torch.tensor(float("nan"), dtype=torch.float64))  # 0-dim


def main(directory: str) -> None:
    torch.manual_seed(0)
    model = Model()
    model.norm.train()(torch.randn(5, 4))  # real running statistics
    model.tied = model.proj  # the same Linear under two names: one storage per tensor, twice
    path = pathlib.Path(directory) / f"torch_save_{torch.__version__.split('+')[0]}.pt"
    torch.save(model.state_dict(), path)
    print(path, path.stat().st_size, "bytes, torch", torch.__version__)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
