"""Make ``tpu`` a real PyTorch device: PrivateUse1 renamed, ``torch.tpu`` registered, kernels installed.

The device guard and hooks come from the native core (:mod:`torchtpu_lab.native`) when it builds and loads;
otherwise from the Python classes below, through PyTorch's Python backend API (one device for autograd, no
generators, no pinned memory). PyTorch takes PrivateUse1 hooks once per process, so exactly one of the two is
registered, here, and the ``torch.backends`` autoload path comes through here too.
"""

from __future__ import annotations

import itertools
import sys

import torch
from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

from .. import interrupts, native, platform
from ..device import storage, tensor
from ..runtime import bounded, core_kernels, growth, recording, values
from . import (
    accelerator,
    dense_only,
    device_wait,
    dispatch,
    fake,
    foreach_types,
    fork_guard,
    hf_accelerate,
    hf_generation,
    linear_grad,
    serialization,
    shallow_copy,
    tpu_module,
)

_BACKEND = "tpu"


class _DeviceGuard(torch._C._acc.DeviceGuard):
    """The device guard PyTorch's C++ asks (``PythonDeviceGuard::getStream`` and friends, some ``noexcept``).

    Its methods are C callables, not Python functions: a pending Ctrl-C is handled only where the interpreter
    runs bytecode, so it can never be raised inside them (a Python method would receive it on entry, and an
    exception there aborts the process: ``terminate called without an active exception``)."""

    type_ = itertools.repeat(torch._C._autograd.DeviceType.PrivateUse1).__next__


class _Hooks(torch._C._acc.PrivateUse1Hooks):
    """PrivateUse1 hooks, called from C++ (autograd's engine, generators); C callables like :class:`_DeviceGuard`."""

    is_available = itertools.repeat(True).__next__
    is_built = itertools.repeat(True).__next__
    has_primary_context = (-1).__lt__  # ``dev_id > -1``: every device index has its (implicit) context


def _guard_gc_callbacks() -> None:
    """JAX frees XLA buffers from a ``gc`` callback, which runs wherever a collection starts (inside C++ too)."""
    import gc

    for cb in gc.callbacks:
        if getattr(cb, "__module__", "").startswith(("jax", "jaxlib")):
            interrupts.guard(cb)
    interrupts.install_unraisable_hook()


def _register_native(core) -> None:
    """What ``_setup_privateuseone_for_python_backend`` does, with the core's C++ guard and hooks."""
    torch.utils.rename_privateuse1_backend(_BACKEND)
    torch.utils.generate_methods_for_privateuse1_backend()
    torch._register_device_module(_BACKEND, tpu_module)
    core.register()
    core.set_synchronize(tpu_module.synchronize)  # torch.accelerator/Stream synchronize wait for real
    if hasattr(core, "set_event_hook"):  # torch.Event synchronize/query land non-blocking copies to the host
        core.set_event_hook(device_wait.event_reached)
    if hasattr(core, "configure_ledger"):  # memory accounting's writes in C (device/storage.py)
        storage.use_native_ledger(core)
    if hasattr(core, "new_tensor"):  # every op's output tensor made in one C++ call (device/tensor.py)
        tensor.use_native_factory(core.new_tensor, (core.storage_ref, core.set_storage_ref))
    if hasattr(core, "install_tensor_class"):  # data attributes read from the torch storage (device/tensor.py)
        tensor.use_attributes_in_storage(core.install_tensor_class(tensor.TpuTensor))
    if platform.started():  # the platform is already known: tell the guard its device count
        native.set_device_count(len(platform.info().devices))


def register() -> None:
    """Register the ``tpu`` device (idempotent: a second call, or a second import, does nothing)."""

    if torch._C._get_privateuse1_backend_name() == _BACKEND and getattr(torch, _BACKEND, None) is tpu_module:
        return
    current = torch._C._get_privateuse1_backend_name()
    if current not in ("privateuseone", _BACKEND):
        raise RuntimeError(
            f"PrivateUse1 is already taken by the {current!r} backend in this process; torchtpu_lab needs it"
        )
    platform.configure_cpu_codegen()  # before JAX starts its CPU client (float16 rounded per op)
    platform.configure_x64()
    core = native.load()
    if core is None:
        _setup_privateuseone_for_python_backend(_BACKEND, backend_module=tpu_module, hook=_Hooks(),
                                                device_guard=_DeviceGuard())
    else:
        _register_native(core)
    _guard_gc_callbacks()
    interrupts.ensure_installed()
    sys.modules[f"torch.{_BACKEND}"] = tpu_module
    recorder = core if recording.available(core) else None
    if recorder is not None:
        recording.configure(recorder, values.set_array, growth, bounded, core_kernels.from_host)
        values.use_native_writes(recorder.write_placeholders)
    dispatch.install(recorder)
    linear_grad.install(recorder)  # after the PrivateUse1 kernels: its forward runs through them
    shallow_copy.install()  # Module.to("tpu") moves parameters in place: tied weights stay tied
    fake.install()
    foreach_types.install()  # optimizers take their foreach path on tpu parameters
    accelerator.install()
    serialization.install()  # torch.load(map_location="tpu"); storage calls that cannot work raise, never crash
    hf_accelerate.install()
    hf_generation.install()
    fork_guard.install()  # a child forked after the device started refuses tpu work instead of hanging
    dense_only.install()  # sparse, nested and quantized tensors: an error naming the op and the layout
