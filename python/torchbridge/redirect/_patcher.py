"""Records every attribute redirection replaces, so disable() restores each one exactly."""

_MISSING = object()


class Patcher:
    def __init__(self):
        self._saved = []  # (owner, name, original value in owner's own namespace or _MISSING)

    def replace(self, owner, name, value):
        # Read the owner's own namespace, not inherited lookups: restoring then recreates exactly
        # the previous state (an inherited method becomes inherited again).
        namespace = owner.__dict__ if isinstance(owner, type) else vars(owner)
        self._saved.append((owner, name, namespace.get(name, _MISSING)))
        setattr(owner, name, value)

    def restore_all(self):
        for owner, name, original in reversed(self._saved):
            if original is _MISSING:
                delattr(owner, name)
            else:
                setattr(owner, name, original)
        self._saved.clear()

    def __len__(self):
        return len(self._saved)
