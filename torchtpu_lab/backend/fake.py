"""Fake and meta tensors of device ``tpu`` stay in PyTorch's meta kernels and never reach our kernels.

A ``FakeTensor`` on ``tpu`` is a meta tensor that carries the tpu dispatch keys (so autograd and autocast treat
it as a tpu tensor). ``FakeTensorMode`` runs every op on it with the Meta key forced on, so PyTorch's meta
kernels answer — but an op that *aliases* its input (``t``, ``view``, ``transpose``...) hands back a meta
tensor that inherited those tpu keys. ``FakeTensor`` then wraps that output and, while doing so, calls
``detach`` on it outside the meta context, which dispatches to the tpu backend. For CUDA that ``detach`` is a
C++ composite kernel and nothing happens; for our pure-Python backend it would reach a Python kernel with a
tensor that has no device data ("a tpu tensor without device data reached a kernel"), and even answering it
from Python would bind the output to a Python object that ``FakeTensor`` can no longer claim.

So whenever such a meta tensor is wrapped, we give ``FakeTensor`` an equivalent clean meta tensor: the same meta
storage (aliasing, which AOTAutograd's view and mutation analysis reads, is kept), offset, sizes and strides,
but only the Meta dispatch key.

``torch.tensor(data, device="tpu")`` (and ``torch.as_tensor``, and every constant a model builds inside a traced
region) is a C++ factory that makes the tensor on the device first and then calls ``aten.lift_fresh`` on it.
``FakeTensorMode`` avoids that only while no accelerator is available (its ``avoid_device_init``): then the
data is made on the CPU, lifted to a fake CPU constant, and moved by a ``_to_copy`` that the meta kernels
answer. PyTorch counts any registered PrivateUse1 backend as an available accelerator, so with ours it made a
real :class:`~torchtpu_lab.device.tensor.TpuTensor` (a tensor subclass) that ``FakeTensorMode`` then declines
to lift (``Multiple dispatch failed for aten.lift_fresh.default``). Our device is not a reason to initialise a
device during fake tracing (its tensors need no device context), so ``avoid_device_init`` is answered as if it
were not there; CUDA, XPU and HPU keep their meaning.

These are the places torchtpu_lab patches PyTorch for ``torch.compile``; :func:`torchtpu_lab.global_changes`
lists them.
"""

from __future__ import annotations

import functools

import torch

_TPU_KEY = torch._C.DispatchKey.PrivateUse1
_installed = False


def _clean_meta(t: torch.Tensor) -> torch.Tensor:
    """``t`` (a meta tensor carrying tpu dispatch keys) as a plain meta tensor over the same storage."""
    from torch.fx.experimental.proxy_tensor import disable_proxy_modes_tracing

    # Built below every Python mode (FunctionalTensorMode, proxy tracing): this tensor is plumbing, not an op.
    # With symbolic sizes (compiled autograd traces the backward so) ``set_``'s bounds check compares SymInts,
    # which a proxy tracer would try to record: none is active while the plumbing is built.
    with torch._C._DisableTorchDispatch(), torch.no_grad(), disable_proxy_modes_tracing():
        clean = torch.empty((0,), dtype=t.dtype, device="meta")
        clean.set_(t.untyped_storage(), t.storage_offset(), t.size(), t.stride())
    clean.requires_grad_(t.requires_grad)
    return clean


def _needs_cleaning(t) -> bool:
    return isinstance(t, torch.Tensor) and t.device.type == "meta" and torch._C._dispatch_keys(t).has(_TPU_KEY)


def install() -> None:
    """Wrap ``FakeTensor.__new__`` (every fake tensor is built there, from many places in PyTorch) so that a
    meta tensor with tpu keys is cleaned first (idempotent)."""
    global _installed
    if _installed:
        return
    from torch._subclasses.fake_tensor import FakeTensor

    original = FakeTensor.__new__

    @functools.wraps(original)
    def __new__(cls, fake_mode_or_elem=None, elem=None, *args, **kwargs):
        if _needs_cleaning(elem):
            elem = _clean_meta(elem)
        elif _needs_cleaning(fake_mode_or_elem):
            fake_mode_or_elem = _clean_meta(fake_mode_or_elem)
        return original(cls, fake_mode_or_elem, elem, *args, **kwargs)

    __new__.__torchtpu_lab_original__ = original
    FakeTensor.__new__ = staticmethod(__new__)
    _lift_constants_on_cpu()
    _handle_tpu_tensors_in_aot_runtime()
    _installed = True


def _handle_tpu_tensors_in_aot_runtime() -> None:
    """AOTAutograd checks a compiled graph's custom ops for aliasing on its first call, under a dispatch mode
    that declines (returns ``NotImplemented`` for) every tensor whose exact type it does not know — and a real
    tpu tensor is a :class:`~torchtpu_lab.device.tensor.TpuTensor`, a plain ``torch.Tensor`` subclass without
    dispatch behaviour of its own. Declaring it known lets ``aot_eager`` (and our own backend) run."""
    import sys

    from torch.fx.experimental import proxy_tensor  # imported by torch itself; torch._dynamo is not

    from ..device.tensor import TpuTensor

    # AOTAutograd's runtime wrappers copy the tuple when torch._dynamo is first imported; patch that copy too if
    # it already happened. ProxyTorchDispatchMode reads the same tuple, with the same meaning ("a plain tensor").
    for module in (proxy_tensor, sys.modules.get("torch._functorch._aot_autograd.runtime_wrappers")):
        handled = getattr(module, "HANDLED_TYPES", None)
        if isinstance(handled, tuple) and TpuTensor not in handled:
            module.HANDLED_TYPES = handled + (TpuTensor,)


def _lift_constants_on_cpu() -> None:
    """``FakeTensorMode.avoid_device_init`` as PyTorch computes it, with our PrivateUse1 backend not counted as a
    device to initialise (see the module docstring)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    original = FakeTensorMode.avoid_device_init

    def avoid_device_init(self) -> bool:
        if original.fget(self):
            return True
        if torch.xpu._is_compiled():
            return False  # the original answered from XPU's availability alone
        return not (torch.cuda.is_available() or (hasattr(torch, "hpu") and torch.hpu.is_available()))

    avoid_device_init.__torchtpu_lab_original__ = original
    FakeTensorMode.avoid_device_init = property(avoid_device_init, doc=original.__doc__)


def lifts_constants_on_cpu() -> bool:
    """Whether ``FakeTensorMode.avoid_device_init`` is ours (:func:`_lift_constants_on_cpu`)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    return hasattr(FakeTensorMode.avoid_device_init.fget, "__torchtpu_lab_original__")


def installed() -> bool:
    return _installed


def handled_types_patched() -> list[str]:
    """The modules whose ``HANDLED_TYPES`` include :class:`TpuTensor` (:func:`_handle_tpu_tensors_in_aot_runtime`)."""
    import sys

    from ..device.tensor import TpuTensor

    return [name for name in ("torch.fx.experimental.proxy_tensor", "torch._functorch._aot_autograd.runtime_wrappers")
            if TpuTensor in getattr(sys.modules.get(name), "HANDLED_TYPES", ())]
