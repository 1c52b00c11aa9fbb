"""Run a callback once a module has been imported, now or later, with the standard library only.

``import polymixer`` must not import transformers (seconds, and optional), yet polymixer's models must be known to
transformers' Auto classes whichever of the two a program imports first. :func:`when_imported` does what
``wrapt.register_post_import_hook`` does: if the module is loaded it calls back at once; otherwise a finder on
``sys.meta_path`` wraps the module's loader so that the callback runs right after the module's body has executed.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
from types import ModuleType
from typing import Callable, Dict, List, Optional, Sequence

__all__ = ["when_imported"]

Callback = Callable[[ModuleType], None]

_lock = threading.RLock()
_pending: Dict[str, List[Callback]] = {}


def when_imported(name: str, callback: Callback) -> None:
    """Call ``callback(module)`` once the top-level or dotted module ``name`` is imported (at once if it already
    is). Each callback runs once."""
    with _lock:
        module = sys.modules.get(name)
        if module is None:
            _pending.setdefault(name, []).append(callback)
            if not any(isinstance(f, _PostImportFinder) for f in sys.meta_path):
                sys.meta_path.insert(0, _PostImportFinder())
            return
    callback(module)


def _fire(name: str, module: ModuleType) -> None:
    with _lock:
        callbacks = _pending.pop(name, [])
        if not _pending:
            sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _PostImportFinder)]
    for cb in callbacks:
        cb(module)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for a watched name it asks the finders after it and wraps the loader they return."""

    def find_spec(self, fullname: str, path: Optional[Sequence[str]], target: Optional[ModuleType] = None
                  ) -> Optional[importlib.machinery.ModuleSpec]:
        if fullname not in _pending:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _PostImportLoader(spec.loader, fullname)
                return spec
        return None


class _PostImportLoader(importlib.abc.Loader):
    """Delegates to the real loader, then fires the module's callbacks."""

    def __init__(self, loader: importlib.abc.Loader, name: str) -> None:
        self._loader, self._name = loader, name

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Optional[ModuleType]:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        # the module's own loader, for anything (pkgutil, importlib.resources) that inspects __loader__ / __spec__
        module.__loader__ = self._loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        _fire(self._name, sys.modules.get(self._name, module))

    def __getattr__(self, name: str) -> object:  # get_resource_reader, is_package, get_code, …
        return getattr(self._loader, name)
