"""``torch.compile(model, backend="tpu")``: a Dynamo backend that lowers whole ATen graphs through the eager op
table into one ``jax.jit`` function (:mod:`.backend`, :mod:`.lowering`), with telemetry for Dynamo's compiles,
recompiles and graph breaks (:mod:`.events`).

Importing ``torch._dynamo`` takes seconds, so ``import torchtpu_lab`` does not: :func:`install` registers the
backend the moment anything imports Dynamo (``torch.compile`` does), or at once if it is already imported.
The ``torch_dynamo_backends`` entry point in ``pyproject.toml`` names the same function for tools that look
backends up by entry point.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys

BACKEND_NAME = "tpu"
_wrapped_loaders: list = []  # the loader of torch._dynamo whose exec_module the finder wrapped (at most one)


def tpu_backend(gm, example_inputs, **options):
    """The ``"tpu"`` Dynamo backend (see :mod:`.backend`); the entry point resolves to this function."""
    from .backend import tpu_backend as backend

    return backend(gm, example_inputs, **options)


def _register_with_dynamo() -> None:
    from torch._dynamo import trace_rules
    from torch._dynamo.backends.registry import _COMPILER_FNS, register_backend

    # Our kernels (and JAX under them) run when a tpu op runs; Dynamo must call them, never trace into them
    # (it would trace JAX's Python when eager code between two graphs touches a tpu tensor).
    for package in ("torchtpu_lab", "jax", "jaxlib"):
        trace_rules.add(package)

    if _COMPILER_FNS.get(BACKEND_NAME) is not tpu_backend:
        _COMPILER_FNS.pop(BACKEND_NAME, None)
        register_backend(tpu_backend, name=BACKEND_NAME)


class _AfterDynamoImport(importlib.abc.MetaPathFinder):
    """Registers the backend right after ``torch._dynamo`` finishes importing (then removes itself)."""

    def find_spec(self, fullname, path, target=None):
        if fullname != "torch._dynamo":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        original = loader.exec_module

        def exec_module(module):
            original(module)
            _register_with_dynamo()

        loader.exec_module = exec_module
        _wrapped_loaders.append(loader)
        return spec


def changes() -> dict:
    """The process-wide changes made here (for ``torchtpu_lab.global_changes``)."""
    registered = False
    if "torch._dynamo" in sys.modules:
        from torch._dynamo.backends.registry import _COMPILER_FNS

        registered = _COMPILER_FNS.get(BACKEND_NAME) is tpu_backend
    return {
        "sys.meta_path finder (waits for torch._dynamo's import, then removes itself)":
            any(isinstance(f, _AfterDynamoImport) for f in sys.meta_path),
        "torch._dynamo's loader.exec_module wrapped (that one import: registers the backend after it)":
            bool(_wrapped_loaders),
        "torch._dynamo: backend 'tpu' registered; torchtpu_lab, jax, jaxlib in its trace_rules (called, never traced)":
            registered,
    }


def install() -> None:
    """Make ``backend="tpu"`` available (idempotent)."""
    if "torch._dynamo" in sys.modules and hasattr(sys.modules["torch._dynamo"], "register_backend"):
        _register_with_dynamo()
    elif not any(isinstance(f, _AfterDynamoImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterDynamoImport())
