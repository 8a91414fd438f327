"""Replacing a model's layers in place (``convert_to_fp8``, the ``int8_weights`` step) so that a
layer registered under several names, by one parent (``self.alias = self.fc``) or by several (one
Linear shared by two blocks), is replaced at every name by one replacement: ``named_children``
gives each module once, so the other names kept calling the old layer, and converting it again
under another parent split one layer into two."""

from typing import Callable, Optional

from torch import nn


def replace_layers(model: nn.Module,
                   replacement_for: Callable[[str, nn.Module, nn.Module], Optional[nn.Module]]) -> "list[tuple[str, str]]":
    """Calls ``replacement_for(name, parent, child)`` once per distinct module registered anywhere
    under ``model`` (not ``model`` itself), at the first qualified name it is registered under; a
    module it returns takes the child's place at every name. Returns (other name, first name) for
    each further name a replaced module had."""
    decided = {}  # id(child) -> (first name, replacement or None); the child is kept alive by the model
    aliases = []
    for parent_name, parent in list(model.named_modules(remove_duplicate=False)):
        for child_name, child in list(parent._modules.items()):
            if child is None:
                continue
            name = f"{parent_name}.{child_name}" if parent_name else child_name
            if id(child) not in decided:
                decided[id(child)] = (name, replacement_for(name, parent, child))
                replacement = decided[id(child)][1]
            else:
                first_name, replacement = decided[id(child)]
                if replacement is not None:
                    aliases.append((name, first_name))
            if replacement is not None:
                setattr(parent, child_name, replacement)
    return aliases


def hooks_reason(module: nn.Module) -> Optional[str]:
    """Why a layer holding hooks is left as it is, or None when it holds none: a replacement is a
    new module, so the hooks would silently stop running (a pre-hook that changed the layer's
    input changed the model's output when it was dropped)."""
    held = [name for name, hooks in (("forward hooks", module._forward_hooks),
                                     ("forward pre-hooks", module._forward_pre_hooks),
                                     ("backward hooks", module._backward_hooks),
                                     ("backward pre-hooks", module._backward_pre_hooks)) if hooks]
    if not held:
        return None
    return f"it has {' and '.join(held)}, which a replacement layer would not run; remove them to convert it"
