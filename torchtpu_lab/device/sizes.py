"""Validate a tensor's sizes before anything reaches XLA, with PyTorch's CPU messages.

XLA aborts the whole process (``BadStatusOrAccess ... overflow in static extent product``) on a shape whose
element count overflows, and PyTorch's data-less PrivateUse1 tensors fail with a bare "Expected cond to be
True" on a negative size. CPU raises ``RuntimeError: Storage size calculation overflowed with sizes=[...]`` and
``Trying to create tensor with negative dimension -1: [-1]``; so do we, wherever a tpu tensor or an op output
gets a shape (:func:`torchtpu_lab.device.tensor.make`, and the runtime on every op's predicted outputs).
"""

from __future__ import annotations

import torch

_MAX_BYTES = (1 << 63) - 1


def check(size, dtype: torch.dtype | None = None) -> None:
    """Raise as CPU PyTorch does if ``size`` has a negative dimension or needs more than 2**63-1 bytes."""
    nbytes = 1 if dtype is None else dtype.itemsize
    overflow = False
    for n in size:
        if n < 0:
            raise RuntimeError(f"Trying to create tensor with negative dimension {n}: {list(size)}")
        nbytes *= n
        overflow = overflow or nbytes > _MAX_BYTES
    if overflow and nbytes:
        raise RuntimeError(f"Storage size calculation overflowed with sizes={list(size)}")


def check_outputs(meta) -> None:
    """:func:`check` every tensor (or ShapeDtypeStruct) in an op's predicted outputs."""
    if isinstance(meta, torch.Tensor):
        check(tuple(meta.shape), meta.dtype)
    elif isinstance(meta, (list, tuple)):
        for m in meta:
            check_outputs(m)
    elif hasattr(meta, "shape") and hasattr(meta, "dtype"):
        itemsize = getattr(meta.dtype, "itemsize", 1)
        check(tuple(meta.shape), None)
        if itemsize > 1:
            _check_bytes(tuple(meta.shape), itemsize)


def _check_bytes(size, itemsize: int) -> None:
    total = itemsize
    for n in size:
        total *= n
    if total > _MAX_BYTES:
        raise RuntimeError(f"Storage size calculation overflowed with sizes={list(size)}")


def broadcast(a, b) -> tuple | None:
    """The shape two sizes broadcast to, or ``None`` where they do not: ``torch.broadcast_shapes``'s answer for
    two shapes, which costs ~30 us of Python (``torch._refs``) per call, on a path run per layer per token."""
    if len(a) < len(b):
        a, b = b, a
    out = list(a)
    offset = len(a) - len(b)
    for i, m in enumerate(b):
        n = out[offset + i]
        if m != n:
            if n == 1:
                out[offset + i] = m
            elif m != 1:
                return None
    return tuple(out)


def broadcast_error(a, b) -> str:
    """PyTorch's message for sizes ``a`` and ``b`` that do not broadcast (``at::infer_size``'s: the first
    mismatch from the last dimension)."""
    ndim = max(len(a), len(b))
    for i in range(ndim - 1, -1, -1):
        offset = ndim - 1 - i
        m = a[len(a) - 1 - offset] if offset < len(a) else 1
        n = b[len(b) - 1 - offset] if offset < len(b) else 1
        if m != n and m != 1 and n != 1:
            return f"The size of tensor a ({m}) must match the size of tensor b ({n}) at non-singleton dimension {i}"
    raise ValueError(f"{tuple(a)} and {tuple(b)} broadcast")
