"""PyTorch's foreach paths accept tpu tensors: optimizers (``foreach=None`` picks them) and ``clip_grad_norm_``.

Why. A real tpu tensor is a :class:`~torchtpu_lab.device.tensor.TpuTensor`, a plain ``torch.Tensor`` subclass
(parameters become one when the runtime adopts them), and PyTorch allows the foreach path only for tensors
whose exact type is in ``_foreach_supported_types`` (``torch.optim.optimizer`` and ``torch.utils._foreach_utils``
each keep a list). So ``torch.optim.AdamW`` on a tpu model took the single-tensor path: a Python loop of ~7
ops per parameter, each a dispatcher round trip from Python. On the foreach path each kind of update is one
``_foreach_*`` call, which is one recorded op (:mod:`torchtpu_lab.runtime.foreach_kernels`) whose program applies
the per-tensor op PyTorch's own fallback would call to every element: the values are the same.

What changes: ``TpuTensor`` appended to both lists (said by :func:`torchtpu_lab.global_changes`).
"""

from __future__ import annotations

import sys

_MODULES = ("torch.optim.optimizer", "torch.utils._foreach_utils")


def install() -> None:
    """Add :class:`TpuTensor` to PyTorch's foreach-supported types (idempotent)."""
    import torch.optim.optimizer
    import torch.utils._foreach_utils  # noqa: F401

    from ..device.tensor import TpuTensor

    for name in _MODULES:
        types = sys.modules[name]._foreach_supported_types
        if TpuTensor not in types:
            types.append(TpuTensor)


def installed() -> list[str]:
    """The modules whose foreach-supported types include :class:`TpuTensor`."""
    from ..device.tensor import TpuTensor

    return [name for name in _MODULES
            if TpuTensor in getattr(sys.modules.get(name), "_foreach_supported_types", ())]
