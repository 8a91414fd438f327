"""A model's outputs as a flat list of tensors, shared by validation and deployment."""

import torch


def flatten(output) -> "list[torch.Tensor]":
    """Tensors of an output in the order exporters flatten them (tuples, lists, dict values)."""
    if isinstance(output, torch.Tensor):
        return [output]
    if isinstance(output, (tuple, list)):
        return [t for item in output for t in flatten(item)]
    if isinstance(output, dict):
        return [t for item in output.values() for t in flatten(item)]
    raise TypeError(f"the model returns a {type(output).__name__}; export needs tensors, or tuples, lists or "
                    "dicts of tensors")
