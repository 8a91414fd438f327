"""Records every attribute redirection replaces, so disable() restores each one exactly."""

_MISSING = object()


class Patcher:
    def __init__(self):
        self._undo = []  # callables, run in reverse order by restore_all

    def replace(self, owner, name, value):
        # Read the owner's own namespace, not inherited lookups: restoring then recreates exactly
        # the previous state (an inherited method becomes inherited again).
        namespace = owner.__dict__ if isinstance(owner, type) else vars(owner)
        original = namespace.get(name, _MISSING)
        setattr(owner, name, value)
        self._undo.append(lambda: delattr(owner, name) if original is _MISSING else setattr(owner, name, original))

    def defer(self, undo):
        """Runs undo() at restore_all, in reverse order with the replacements (for changes that are
        not an attribute, such as a finder added to sys.meta_path)."""
        self._undo.append(undo)

    def restore_all(self):
        while self._undo:
            self._undo.pop()()

    def __len__(self):
        return len(self._undo)
