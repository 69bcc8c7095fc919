"""``torch.accelerator`` for the ``tpu`` device: what PyTorch's device-generic API asks of the current accelerator.

``torch.accelerator.current_accelerator()``, ``device_count()``, ``current_device_index()`` work through the
PrivateUse1 registration alone. Synchronizing and memory statistics go to C++ device-guard and allocator hooks.
With the native core, the guard's synchronize calls ``torch.tpu.synchronize``; without it (a Python backend's
hook classes expose only ``is_available`` and friends) ``torch.accelerator.synchronize()`` would raise "Backend
doesn't support synchronizing". ``torch.accelerator.memory_*`` would raise "Allocator for tpu is not a
DeviceAllocator" in both modes (tpu tensors allocate no memory through PyTorch). :func:`install` wraps exactly
those functions: when the current accelerator is ``tpu`` they call ``torch.tpu``; otherwise the original runs. The
wrapping is listed in :func:`torchtpu_lab.global_changes`.
"""

from __future__ import annotations

import functools

import torch

from .. import native
from . import tpu_module

_WRAPPED: dict[str, object] = {}


def _is_tpu() -> bool:
    acc = torch.accelerator.current_accelerator()
    return acc is not None and acc.type == "tpu"


def _wrap(module, name: str, replacement) -> None:
    original = getattr(module, name, None)
    if original is None or getattr(original, "_torchtpu_lab", False):
        return

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        if _is_tpu():
            return replacement(*args, **kwargs)
        return original(*args, **kwargs)

    wrapper._torchtpu_lab = True
    setattr(module, name, wrapper)
    _WRAPPED[f"{module.__name__}.{name}"] = original


def _memory_stats(device_index=None, /) -> dict:
    return tpu_module.memory_stats(device_index)


def _reset_peak(device_index=None, /) -> None:
    tpu_module.reset_peak_memory_stats(device_index)


def _memory_info(device_index=None, /) -> tuple[int, int]:
    info = tpu_module.mem_get_info(device_index)
    if info is None:
        raise RuntimeError("torch.accelerator.get_memory_info: XLA reports no memory limit for this tpu device "
                           f"({tpu_module.platform_name()})")
    return info


def install() -> None:
    """Route ``torch.accelerator``'s synchronize and memory functions to ``torch.tpu`` (idempotent)."""
    acc = torch.accelerator
    if native.module() is None:  # with the core, PyTorch's own synchronize reaches torch.tpu through the guard
        _wrap(acc, "synchronize", lambda device=None, /: tpu_module.synchronize(device))
    memory = getattr(acc, "memory", None)
    for module in (acc, memory):
        if module is None:
            continue
        # memory_allocated & co. call memory_stats through their module's globals
        _wrap(module, "memory_stats", _memory_stats)
        _wrap(module, "empty_cache", lambda: tpu_module.empty_cache())
        _wrap(module, "reset_peak_memory_stats", _reset_peak)
        _wrap(module, "get_memory_info", _memory_info)


def wrapped() -> list[str]:
    """The ``torch.accelerator`` functions :func:`install` wrapped."""
    return sorted(_WRAPPED)
