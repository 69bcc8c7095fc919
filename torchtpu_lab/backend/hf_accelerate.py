"""accelerate (under ``transformers.Trainer``) picks the ``tpu`` device by itself.

accelerate 1.x chooses its device in ``PartialState.default_device`` from a fixed list (MPS, CUDA, NPU, XPU, ...)
and falls back to the CPU; only ``ACCELERATE_TORCH_DEVICE`` names another device. The Trainer (transformers 5)
does put the model on ``tpu`` (it asks ``torch.accelerator``), so the batches accelerate moves to its device
would stay on the CPU. :func:`install` wraps that one property when accelerate is imported: while
``torch.accelerator.current_accelerator()`` is ``tpu`` it is the current tpu device, otherwise accelerate's own
answer. ``use_cpu=True`` still means the CPU (accelerate reads the property only when not told CPU), and
``ACCELERATE_TORCH_DEVICE`` still wins. Listed in :func:`torchtpu_lab.global_changes`.
"""

from __future__ import annotations

import torch

from .after_import import when_imported

_installed: list[str] = []


def _wrap(state_module) -> None:
    cls = state_module.PartialState
    original = cls.__dict__.get("default_device")
    if not isinstance(original, property) or getattr(original.fget, "_torchtpu_lab", False):
        return

    def default_device(self) -> torch.device:
        acc = torch.accelerator.current_accelerator()
        if acc is not None and acc.type == "tpu":
            return torch.device("tpu", torch.accelerator.current_device_index())
        return original.fget(self)

    default_device._torchtpu_lab = True
    default_device.__doc__ = original.__doc__
    cls.default_device = property(default_device)
    _installed.append("accelerate.state.PartialState.default_device")


def install() -> None:
    """Wrap accelerate's device choice now if accelerate is imported, else when it is (idempotent)."""
    when_imported("accelerate.state", _wrap, ready=lambda m: hasattr(m, "PartialState"))


def wrapped() -> list[str]:
    return list(_installed)
