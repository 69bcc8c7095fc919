"""``torch.compile(model, backend="tpu")`` (and ``torch.compile(model)`` on tpu tensors, :mod:`.default_backend`):
a Dynamo backend that lowers whole ATen graphs through the eager op
table into one ``jax.jit`` function (:mod:`.backend`, :mod:`.lowering`), with telemetry for Dynamo's compiles,
recompiles and graph breaks (:mod:`.events`).

Importing ``torch._dynamo`` takes seconds, so ``import torchtpu_lab`` does not: :func:`install` registers the
backend the moment anything imports Dynamo (``torch.compile`` does), or at once if it is already imported.
The ``torch_dynamo_backends`` entry point in ``pyproject.toml`` names the same function for tools that look
backends up by entry point.
"""

from __future__ import annotations

import sys

from ..backend.after_import import when_imported
from . import batch_norm, default_backend, device_interface, fused_optimizers, plain_tensor, whole_step

BACKEND_NAME = "tpu"


def tpu_backend(gm, example_inputs, **options):
    """The ``"tpu"`` Dynamo backend (see :mod:`.backend`); the entry point resolves to this function."""
    from .backend import tpu_backend as backend

    return backend(gm, example_inputs, **options)


_NEVER_TRACED = ("torchtpu_lab", "jax", "jaxlib", "ml_dtypes")


def _register_with_dynamo() -> None:
    from torch._dynamo import trace_rules
    from torch._dynamo.backends.registry import _COMPILER_FNS, register_backend

    # Our kernels (and JAX under them) run when a tpu op runs; Dynamo must call them, never trace into them
    # (it would trace JAX's Python when eager code between two graphs touches a tpu tensor). ml_dtypes is JAX's
    # dtype library: its frames run under ours (torch 2.14's Dynamo crashed tracing its finfo).
    for package in _NEVER_TRACED:
        trace_rules.add(package)

    if _COMPILER_FNS.get(BACKEND_NAME) is not tpu_backend:
        _COMPILER_FNS.pop(BACKEND_NAME, None)
        register_backend(tpu_backend, name=BACKEND_NAME)
    default_backend.install()
    batch_norm.install()
    plain_tensor.install()
    whole_step.install()
    fused_optimizers.install()
    device_interface.install()


def changes() -> dict:
    """The process-wide changes made here (for ``torchtpu_lab.global_changes``; the import hook that makes them
    is said by :func:`torchtpu_lab.backend.after_import.changes`)."""
    registered = False
    if "torch._dynamo" in sys.modules:
        from torch._dynamo.backends.registry import _COMPILER_FNS

        registered = _COMPILER_FNS.get(BACKEND_NAME) is tpu_backend
    return {
        f"torch._dynamo: backend 'tpu' registered; {', '.join(_NEVER_TRACED)} in its trace_rules (called, never "
        "traced)": registered,
        "torch._TorchCompileInductorWrapper.__call__ wrapped: torch.compile's default backend compiles graphs on "
        "tpu tensors with 'tpu', all others with Inductor as before": default_backend.installed(),
        "aten.native_batch_norm: a Python kernel at AutogradPrivateUse1 (tracing only): evaluation mode's saved "
        "statistics are empty compiled, as eager": batch_norm.installed(),
        "torch._dynamo.variables.builder.infer_subclass_type wrapped: Dynamo traces a TpuTensor as a plain tensor "
        "(its .grad can be read in a compiled training step)": plain_tensor.installed(),
        "torch._dynamo's graph_break() in Optimizer.step and its _init_group check of pending .grad mutations: "
        "skipped, and its torch.compiler.disable around torch.optim's _fused_adam/_fused_sgd step functions: traced "
        "through, while tracing fullgraph=True an optimizer of tpu parameters (one-graph training steps)":
            whole_step.installed(),
        "aten._fused_sgd_ and the tensor_lr overloads of _fused_adam_/_fused_adamw_: Meta kernels registered where "
        "PyTorch has none (a fake tpu tensor reached the eager kernel while Dynamo traced a fused=True step)":
            bool(fused_optimizers.meta_kernels()),
        "torch._dynamo.device_interface: 'tpu' and 'tpu:i' are torchtpu_lab's device (PyTorch's torch_xla "
        "TpuInterface reported no devices and raised for device_count/synchronize)": device_interface.installed(),
    }


def install() -> None:
    """Make ``backend="tpu"`` available (idempotent)."""
    when_imported("torch._dynamo", lambda _: _register_with_dynamo(),
                  ready=lambda m: hasattr(m, "register_backend"))
