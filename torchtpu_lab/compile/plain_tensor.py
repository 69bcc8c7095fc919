"""Dynamo sees a tpu tensor as a plain ``torch.Tensor``.

Real tpu tensors are :class:`~torchtpu_lab.device.tensor.TpuTensor` objects: a ``torch.Tensor`` subclass only so
that Python can hold their device data, with ``__torch_function__`` disabled and no ``__torch_dispatch__`` — it
behaves as a plain tensor everywhere. Dynamo, though, models every tensor whose exact type is not
``torch.Tensor`` as a ``__torch_function__`` subclass, and refuses some attribute accesses on those: reading
``.grad`` (which ``loss.backward()`` does when Dynamo traces autograd, and every optimizer does) stopped a
compiled training step with "Unsupported tensor subclass attribute access". Dynamo decides this in one function
(``infer_subclass_type``, ``None`` meaning "a plain tensor"); it is wrapped to answer ``None`` for
``TpuTensor`` too (adopting a moved Parameter first, so its type is final when Dynamo guards on it). Listed in :func:`torchtpu_lab.global_changes`.
"""

from __future__ import annotations


def install() -> None:
    """Wrap Dynamo's ``infer_subclass_type`` (idempotent; Dynamo must be imported)."""
    from torch._dynamo.variables import builder

    from ..device.tensor import TpuTensor, adopt, has_data, on_tpu

    original = builder.infer_subclass_type
    if hasattr(original, "__torchtpu_lab_original__"):
        return

    def infer_subclass_type(value):
        if type(value) is not TpuTensor and on_tpu(value) and has_data(value):
            # a Parameter that Module.to moved in place (``param.data = moved``) becomes a TpuTensor at its
            # first kernel; adopted here, before Dynamo guards on its type, a compiled step does not recompile
            # when that happens inside its first run
            adopt(value)
        if type(value) is TpuTensor:
            return None
        return original(value)

    infer_subclass_type.__torchtpu_lab_original__ = original
    builder.infer_subclass_type = infer_subclass_type


def installed() -> bool:
    import sys

    builder = sys.modules.get("torch._dynamo.variables.builder")
    return builder is not None and hasattr(builder.infer_subclass_type, "__torchtpu_lab_original__")
