"""Op outputs in CPU's memory layout: the strides PyTorch's kernels give a result, not always row-major ones.

CPU's elementwise kernels (TensorIterator), ``clone``/``*_like`` (``preserve_format``), ``.contiguous(
memory_format=torch.channels_last)`` and convolutions of channels-last inputs lay a result out in the order of
their inputs' strides: ``x.t() * 2`` has strides ``(1, 3)``, ``x.permute(0, 2, 3, 1) + 1`` keeps the permuted
order. PyTorch's meta kernels compute the same strides. A program's array is always row-major, so a result whose
meta strides are a permutation of a dense layout is stored as its elements *in that order* (the lowering's value
transposed, which XLA fuses into the op) and the tensor is a view of that storage with the meta strides: what
``.stride()``, ``.is_contiguous()`` and a later ``.view(...)`` see is CPU's. Results that are row-major, or whose
meta strides overlap or leave gaps, keep a storage of their own shape.
"""

from __future__ import annotations

import jax.numpy as jnp
import torch

from ..device.views import View, dense_order


def of(meta) -> View | None:
    """The geometry of an op's tensor output ``meta`` (its meta kernel's) over a storage holding its elements in
    memory order (:func:`storage_order`), or ``None`` where the output is row-major or not a dense permutation."""
    if type(meta) is not torch.Tensor or meta.is_contiguous():
        return None
    size, stride = tuple(meta.shape), tuple(meta.stride())
    if 0 in size or _order(size, stride) is None:
        return None
    return View(size, stride, 0)


def _order(size: tuple, stride: tuple) -> tuple | None:
    """The dims of a tensor, outermost in memory first (size-1 dims first, where any stride addresses nothing),
    where its strides are a dense row-major layout of them in that order; else ``None``."""
    dims = dense_order(size, stride)
    ones = tuple(d for d, n in enumerate(size) if n == 1)
    if dims is None or len(ones) + len(dims) != len(size):  # a broadcast dim is no layout
        return None
    return ones + tuple(dims)


def storage_order(view: View) -> tuple:
    """The transpose taking an output's logical dims to the storage's (memory) order."""
    return _order(view.size, view.stride)


def whole_order(storage_shape: tuple, view: View | None) -> tuple | None:
    """The storage order of ``view`` where it is a layout (:func:`of`): all of its storage, from offset 0, its
    dims in another order; else ``None``."""
    if view is None or view.offset != 0 or view.cast is not None:
        return None
    order = _order(tuple(view.size), tuple(view.stride))
    if order is None or tuple(view.size[d] for d in order) != tuple(storage_shape):
        return None
    return order


def to_storage(value, view: View | None):
    """An op's computed ``value`` as its storage holds it: in memory order under a layout ``view``."""
    return value if view is None else jnp.transpose(value, storage_order(view))


def outputs(meta):
    """Per tensor output of an op's meta outputs (``meta``: a tensor, or a list/tuple of tensors and ``None``s),
    its layout view or ``None``, in the same structure; ``None`` where every output is row-major."""
    if isinstance(meta, (list, tuple)):
        found = [of(m) for m in meta]
        return found if any(v is not None for v in found) else None
    return of(meta)


def apply(value, layout):
    """``value`` (an op's outputs, structured as its meta) in its storages' memory order (:func:`outputs`)."""
    if layout is None:
        return value
    if isinstance(layout, list):
        return type(value)([to_storage(v, l) if v is not None else v for v, l in zip(value, layout)])
    return to_storage(value, layout)
