"""``native_batch_norm`` in evaluation mode gives the same saved statistics compiled as eager: empty ones.

PyTorch's CPU kernel (and our eager kernel, which follows it) returns empty ``save_mean``/``save_invstd`` when
``training=False``. While AOTAutograd traces, the op is instead decomposed by a Python kernel that PyTorch
registers at the ``Autograd`` alias key, into ``_native_batch_norm_legit_no_training``, whose saved statistics
are ``[C]``-shaped: the same call answered differently compiled and eager. A Python kernel at the more specific
``AutogradPrivateUse1`` key (tpu tensors only, and only where PyTorch's Python dispatcher runs: tracing) takes
precedence and returns what eager returns; training mode is left to PyTorch's decomposition.
"""

from __future__ import annotations

import torch
from torch._C import DispatchKey

aten = torch.ops.aten
_OP = aten.native_batch_norm.default
_KEY = DispatchKey.AutogradPrivateUse1


def _native_batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps):
    if training or running_mean is None or running_var is None:
        return _OP.py_kernels[DispatchKey.Autograd](x, weight, bias, running_mean, running_var, training,
                                                      momentum, eps)
    out = aten._native_batch_norm_legit_no_training(x, weight, bias, running_mean, running_var, momentum, eps)[0]
    return out, x.new_empty((0,)), x.new_empty((0,))


def install() -> None:
    """Register the kernel (idempotent); PyTorch's decomposition must be there already (``torch._decomp``)."""
    import torch._decomp.decompositions  # noqa: F401 — registers the Autograd-key kernel this one defers to

    if _KEY not in _OP.py_kernels:
        _OP.py_impl(_KEY)(_native_batch_norm)


def installed() -> bool:
    return _OP.py_kernels.get(_KEY) is _native_batch_norm
