"""Replacing a module's forward for one instance (autocast, compile, checkpointing, OOM retry) so
that a copy of the module stays itself, and a pickled one too.

- A closure over the module, or a bound method of it given to torch.compile, kept calling the
  original after ``copy.deepcopy``: the copy computed with the original's weights and sent its
  gradients there. So every replacement is a function of (module, *args, **kwargs), called with
  the module the forward belongs to.
- A bound method in the instance's ``__dict__`` is pickled as ``getattr(module, name)``, which on
  loading (before the module's state is back) finds the class's forward: ``torch.save(model)``
  then ``torch.load`` gave the model without its autocast or compile, silently computing in
  float32. So ``module.forward`` is a ``WrappedForward``, which pickles as the steps that made it
  and makes them again when loaded.
"""

import copy
import types


class WrappedForward:
    """``module.forward`` after ``wrap_forward``: the forward it replaced with ``steps`` applied,
    each ``(make, arguments)`` giving ``make(inner, *arguments)``. The forward it replaced
    (``base``) is None for the class's, ``("method", f)`` for a method of the module the instance
    held (called as ``f(module, ...)``), ``("callable", c)`` for any other callable it held.
    ``make`` and the arguments are pickled by reference or value, so each ``make`` is a
    module-level function."""

    __name__ = "forward"

    def __init__(self, module, base, steps, replacement):
        self._module, self._base, self._steps, self._replacement = module, base, steps, replacement

    def __call__(self, *args, **kwargs):
        return self._replacement(self._module, *args, **kwargs)

    # What a bound method offers, for code that rebinds a module's forward to another module
    # (accelerate's compile_regions, unwrap_model): MethodType(forward.__func__, other) runs the
    # steps with the other module.
    @property
    def __func__(self):
        return self._replacement

    @property
    def __self__(self):
        return self._module

    @property
    def __wrapped__(self):
        # What inspect.signature reports (Hugging Face's Trainer reads the forward's parameters).
        if self._base is None:
            return types.MethodType(type(self._module).forward, self._module)
        kind, function = self._base
        return types.MethodType(function, self._module) if kind == "method" else function

    def __repr__(self):
        made = ", ".join(make.__name__.lstrip("_") for make, _ in self._steps)
        return f"<forward of {type(self._module).__name__} wrapped by TorchBridge ({made})>"

    def __reduce__(self):
        return _rebuild, (self._module, self._base, self._steps)

    def __deepcopy__(self, memo):
        module = copy.deepcopy(self._module, memo)
        if self._base is not None and self._base[0] == "callable":
            # The replacement calls that callable (bound to the original, as likely as not), so
            # the copy's is made again around the copy's own.
            return _rebuild(module, ("callable", copy.deepcopy(self._base[1], memo)), self._steps)
        # The replacement takes the module as an argument, so the copy shares it (and a compiled
        # one's cache) with the original.
        return WrappedForward(module, self._base, self._steps, self._replacement)


def _base_of(module):
    """What the module's forward is before any wrapping: see WrappedForward."""
    current = module.__dict__.get("forward")
    if current is None:
        return None
    if isinstance(current, types.MethodType) and current.__self__ is module:
        return None if current.__func__ is type(module).forward else ("method", current.__func__)
    return ("callable", current)


def _unbound(module, base):
    if base is None:
        return type(module).forward
    kind, function = base
    if kind == "method":
        return function
    return lambda _module, *args, **kwargs: function(*args, **kwargs)


def _rebuild(module, base, steps):
    # Runs while loading, before the module's state is back: the steps only wrap functions.
    replacement = _unbound(module, base)
    for make, arguments in steps:
        replacement = make(replacement, *arguments)
    return WrappedForward(module, base, steps, replacement)


def wrap_forward(module, make, *arguments):
    """Sets ``module.forward`` to ``make(inner, *arguments)`` called with the module, where
    ``inner(module, ...)`` runs its forward so far. ``make`` must be a module-level function and
    the arguments picklable, so that a pickled module is made again as it is."""
    current = module.__dict__.get("forward")
    if isinstance(current, WrappedForward) and current._module is module:
        base, steps, inner = current._base, current._steps, current._replacement
    else:
        base, steps = _base_of(module), ()
        inner = _unbound(module, base)
    module.forward = WrappedForward(module, base, steps + ((make, arguments),), make(inner, *arguments))
