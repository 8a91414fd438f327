"""Running a patch on a module as soon as it is imported, for modules that a program may import
before or after TorchBridge acts (Lightning under redirection, torch's inductor once an SDK device
is loaded): modules already loaded are patched at once; the others through a finder on
sys.meta_path, which finds nothing itself but wraps the loader that the finders after it return."""

import importlib.abc
import sys


def when_imported(names, patch):
    """Calls patch(module) for each module in `names`, now if loaded, else right after its import.
    Returns the finder left on sys.meta_path; remove it to stop patching later imports."""
    for name in names:
        if name in sys.modules:
            patch(sys.modules[name])
    finder = PatchAfterImport(names, patch)
    sys.meta_path.insert(0, finder)
    return finder


class PatchAfterImport(importlib.abc.MetaPathFinder):
    def __init__(self, names, patch):
        self.names, self.patch = frozenset(names), patch

    def find_spec(self, fullname, path, target=None):
        if fullname not in self.names:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _PatchingLoader(spec.loader, self.patch)
                return spec
        return None


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, loader, patch):
        self._loader, self._patch = loader, patch

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        self._patch(module)

    def __getattr__(self, name):  # get_source, get_filename, ... of the real loader
        return getattr(self._loader, name)
