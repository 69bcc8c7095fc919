"""Make ``tpu`` a real PyTorch device: PrivateUse1 renamed, ``torch.tpu`` registered, kernels installed."""

from __future__ import annotations

import sys

import torch
from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

from .. import platform
from . import accelerator, dispatch, fake, tpu_module

_BACKEND = "tpu"


def register() -> None:
    """Register the ``tpu`` device (idempotent: a second call, or a second import, does nothing)."""

    if torch._C._get_privateuse1_backend_name() == _BACKEND and getattr(torch, _BACKEND, None) is tpu_module:
        return
    current = torch._C._get_privateuse1_backend_name()
    if current not in ("privateuseone", _BACKEND):
        raise RuntimeError(
            f"PrivateUse1 is already taken by the {current!r} backend in this process; torchtpu_lab needs it"
        )
    platform.configure_x64()
    # Module.to("cuda") keeps tied weights tied because CPU and CUDA tensors are "shallow-copy compatible" and
    # Module._apply moves each Parameter in place; PrivateUse1 tensors are not, so it would make one new
    # Parameter per module and silently untie them. Swapping the converted tensors into the existing Parameter
    # objects (PyTorch's announced future default) keeps every reference, and so every tie, intact.
    torch.__future__.set_swap_module_params_on_conversion(True)
    _setup_privateuseone_for_python_backend(_BACKEND, backend_module=tpu_module)
    sys.modules[f"torch.{_BACKEND}"] = tpu_module
    dispatch.install()
    fake.install()
    accelerator.install()
