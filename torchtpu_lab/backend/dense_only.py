"""Sparse, nested and quantized tensors on tpu fail with an error that says so, naming the op.

tpu tensors are dense, of PyTorch's ordinary dtypes (a JAX array behind each storage). Without these fallbacks,
moving a sparse tensor to tpu, printing a nested one or making a quantized one ended in PyTorch's generic "Could
not run 'aten::...' with arguments from the 'Sparsetpu' backend" and a list of a hundred dispatch keys. A backend
fallback only runs for an op that has no kernel at all for the key, so ops that do work (PyTorch's composite
kernels) are untouched: only the message changes.
"""

from __future__ import annotations

import torch
from torch.library import Library

_LAYOUTS = {
    "SparsePrivateUse1": ("sparse COO tensors", "keep the tensor on the CPU, or call .to_dense() before moving it"),
    "SparseCsrPrivateUse1": ("sparse compressed (CSR/CSC/BSR/BSC) tensors",
                             "keep the tensor on the CPU, or call .to_dense() before moving it"),
    "NestedTensorPrivateUse1": ("nested tensors",
                                "pad them into one dense tensor first (torch.nested.to_padded_tensor on the CPU), "
                                "or keep a list of tpu tensors"),
    "QuantizedPrivateUse1": ("quantized tensors (torch.quint8, torch.qint8, torch.qint32 ...)",
                             "dequantize on the CPU (x.dequantize()) and move the float tensor, or keep the quantized "
                             "model on the CPU"),
}

_libraries: list = []


def _refusal(what: str, fix: str):
    def refuse(op, *args, **kwargs):
        raise NotImplementedError(f"{op}: {what} are not supported on tpu (tpu tensors are dense, of ordinary "
                                  f"dtypes); {fix}")

    return refuse


def install() -> None:
    """Register the refusing fallbacks (idempotent; a key that already has a fallback keeps it)."""
    if _libraries:
        return
    lib = Library("_", "IMPL")
    for key, (what, fix) in _LAYOUTS.items():
        if not torch._C._dispatch_has_backend_fallback(getattr(torch._C.DispatchKey, key)):
            lib.fallback(_refusal(what, fix), key)
    _libraries.append(lib)
