"""A model's outputs as a flat list of tensors, and the eval mode they are compared in; shared by
validation, optimization and deployment."""

import contextlib

import torch


def flatten(output, *, skip_non_tensors: bool = False) -> "list[torch.Tensor]":
    """Tensors of an output in the order exporters flatten them (tuples, lists, dict values).

    Exporters need every leaf to be a tensor, hence the error; a comparison of outputs
    (``skip_non_tensors=True``) compares the tensors and leaves other leaves alone."""
    if isinstance(output, torch.Tensor):
        return [output]
    if isinstance(output, (tuple, list)):
        return [t for item in output for t in flatten(item, skip_non_tensors=skip_non_tensors)]
    if isinstance(output, dict):
        return [t for item in output.values() for t in flatten(item, skip_non_tensors=skip_non_tensors)]
    if skip_non_tensors:
        return []
    raise TypeError(f"the model returns a {type(output).__name__}; export needs tensors, or tuples, lists or "
                    "dicts of tensors")


@contextlib.contextmanager
def eval_mode(model: torch.nn.Module):
    """Dropout and batch statistics make training-mode outputs differ run to run, and deployment
    graphs are inference graphs: compare and export in eval mode, then put a training model back."""
    if not hasattr(model, "training"):  # a frozen TorchScript module: an inference graph already
        yield
        return
    # Every module's own mode, not the root's: model.train(True) alone would also unfreeze a
    # submodule the program keeps in eval mode (a frozen BatchNorm), which then updates its
    # statistics. Restored through train(), parents first, so that modules overriding it (LoRA
    # layers merge their weights in eval and unmerge them in training) undo what eval() did.
    modes = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for module, training in modes:
            if module.training != training:
                module.train(training)
