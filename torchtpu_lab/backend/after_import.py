"""Run a function right after a module finishes importing, or at once if it already has.

How torchtpu_lab adapts libraries it does not import itself (Dynamo takes seconds to import; accelerate may
not be installed): the adaptation happens the moment the user's code imports them, whichever comes first.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from collections.abc import Callable

#: modules whose loader's ``exec_module`` a finder wrapped (that one import; for :func:`changes`)
_wrapped: list[str] = []


class _AfterImport(importlib.abc.MetaPathFinder):
    """Calls ``callback(module)`` right after ``name`` executes (then removes itself from ``sys.meta_path``)."""

    def __init__(self, name: str, callback: Callable) -> None:
        self.name, self.callback = name, callback

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        original = loader.exec_module

        def exec_module(module):
            original(module)
            self.callback(module)

        loader.exec_module = exec_module
        _wrapped.append(fullname)
        return spec


def when_imported(name: str, callback: Callable, ready: Callable[[object], bool] = lambda m: True) -> None:
    """``callback(module)`` now if ``name`` is imported (and ``ready(module)``), else right after its import
    (idempotent: one pending hook per name)."""
    module = sys.modules.get(name)
    if module is not None and ready(module):
        callback(module)
    elif not any(isinstance(f, _AfterImport) and f.name == name for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(name, callback))


def changes() -> dict:
    """The process-wide changes made here (for ``torchtpu_lab.global_changes``)."""
    return {
        "sys.meta_path finder (waits for a module's import, then removes itself)":
            sorted(f.name for f in sys.meta_path if isinstance(f, _AfterImport)),
        "loader.exec_module wrapped (that one import: adapts the module right after it)": list(_wrapped),
    }
