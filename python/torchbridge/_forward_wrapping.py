"""Replacing a module's forward for one instance (autocast, compile, checkpointing, OOM retry) so
that a copy of the module stays itself. A closure over the module, or a bound method of it given
to torch.compile, kept calling the original after ``copy.deepcopy``: the copy computed with the
original's weights and sent its gradients there. Here the replacement is a method bound to the
module, which deepcopy binds to the copy, around the forward as a function of the module."""

import types


def unbound_forward(module):
    """The module's forward so far, as a function of (module, *args, **kwargs)."""
    current = module.__dict__.get("forward")
    if current is None:
        return type(module).forward
    if isinstance(current, types.MethodType) and current.__self__ is module:
        return current.__func__
    # Installed by someone else as a plain callable: called as it is.
    return lambda _module, *args, **kwargs: current(*args, **kwargs)


def wrap_forward(module, make):
    """Sets ``module.forward`` to ``make(inner)`` bound to the module, where ``inner(module, ...)``
    runs its forward so far. Returns what ``make`` returned."""
    replacement = make(unbound_forward(module))
    module.forward = types.MethodType(replacement, module)
    return replacement
