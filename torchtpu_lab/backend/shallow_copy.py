"""``Module.to("tpu")`` moves parameters in place, as ``.to("cuda")`` does, so tied weights stay tied.

``Module._apply`` moves a parameter with ``param.data = moved`` when ``torch._has_compatible_shallow_copy_type``
says the two TensorImpls may be shallow-copied into each other; otherwise it makes a new ``Parameter`` per module,
which unties shared weights (an embedding and the output head of GPT-2, T5, BERT). PyTorch's built-in answer
covers the dense backends it knows (CPU, CUDA, ...), and leaves PrivateUse1 backends to register the operator
themselves (what PyTorch's reference backend OpenReg does). We say yes for strided tensors on CPU or tpu: a tpu
TensorImpl is a plain one whose torch storage carries our device data (see :mod:`torchtpu_lab.device.tensor`,
whose ``data`` setter and ``adopt`` keep the Python attributes in step with the moved impl).

This replaces the process-wide ``torch.__future__.set_swap_module_params_on_conversion(True)`` switched on
before, which failed to move a module whose parameter autograd still referenced (a CPU forward output alive).
"""

from __future__ import annotations

import torch

_DEVICES = frozenset({"cpu", "tpu"})
_lib: list = []


def compatible(self: torch.Tensor, other: torch.Tensor) -> bool:
    """Whether ``self`` and ``other`` may be shallow-copied into each other (what ``param.data = other`` and
    ``Module._apply`` ask)."""
    return (self.layout == other.layout == torch.strided and self.device.type in _DEVICES
            and other.device.type in _DEVICES)


def install() -> None:
    """Register :func:`compatible` as ``aten::_has_compatible_shallow_copy_type`` for tpu tensors (idempotent)."""
    if _lib:
        return
    lib = torch.library.Library("aten", "IMPL")
    lib.impl("_has_compatible_shallow_copy_type", compatible, "PrivateUse1")
    _lib.append(lib)
