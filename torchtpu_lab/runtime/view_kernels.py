"""Kernels for ATen view ops: new tensors over the same storage, geometry computed by PyTorch on meta tensors.

For every view op we build a meta tensor with the input's real geometry over a flat storage of the base's size,
run the very same op on it, and read the output's size, stride and storage offset. PyTorch thereby decides
every view's geometry (and raises PyTorch's own errors for bad dims), and the result is cached per call shape.

A tpu tensor reports that same geometry as its torch ``stride()`` and ``storage_offset()`` (see
:func:`..device.tensor.make`), so the meta tensor sees exactly what PyTorch code sees: ``view`` of a layout it
cannot view raises PyTorch's error (``reshape`` copies instead, as on CPU), and ``as_strided`` reads sizes,
strides and an absolute offset in the base's storage, as on CPU.
"""

from __future__ import annotations

import torch

from .. import caches
from ..device import tensor, views
from . import growth, recording

aten = torch.ops.aten

VIEW_OPS = (
    aten.view.default,
    aten._unsafe_view.default,
    aten._reshape_alias.default,
    aten.as_strided.default,
    aten.alias.default,
    aten.detach.default,
    aten.lift_fresh.default,
    aten.expand.default,
    aten.permute.default,
    aten.t.default,
    aten.transpose.int,
    aten.select.int,
    aten.slice.Tensor,
    aten.squeeze.default,
    aten.squeeze.dim,
    aten.squeeze.dims,
    aten.unsqueeze.default,
    aten.diagonal.default,
    aten.unfold.default,
    aten.split.Tensor,
    aten.split_with_sizes.default,
    aten.unbind.int,
)
# In-place view ops change the tensor they are called on; each maps to its out-of-place view op.
INPLACE_VIEW_OPS = {
    aten.squeeze_.default: aten.squeeze.default,
    aten.squeeze_.dim: aten.squeeze.dim,
    aten.squeeze_.dims: aten.squeeze.dims,
    aten.unsqueeze_.default: aten.unsqueeze.default,
    aten.t_.default: aten.t.default,
    aten.transpose_.default: aten.transpose.int,
    aten.as_strided_.default: aten.as_strided.default,
}


#: views that merge dims: on a grown tensor's padded strides one can fail where the contiguous tensor PyTorch's
#: ``cat`` makes takes it (runtime/bounded.py: ``compact``)
_RESHAPING = (aten.view.default, aten._unsafe_view.default)


def _hashable(v):
    if isinstance(v, (list, tuple)):
        return tuple(_hashable(x) for x in v)
    if isinstance(v, (bool, int, float)):
        return (type(v), v)
    return v


def _geometry(t: tensor.TpuTensor) -> views.View:
    view = t.tpu_view
    if view is not None:
        return view
    shape = t.tpu_storage.shape
    return views.View(tuple(shape), views.contiguous_strides(shape), 0)


#: Output geometries of view ops by (op, input geometry, arguments), bounded.
_PLANS = caches.cache("view_op_plans", 8192)


def _plan(op, base_shape: tuple, geom: views.View, dtype: torch.dtype, args: tuple, kwargs: dict):
    """Geometries of the outputs (a tuple) of ``op`` applied to a tensor of geometry ``geom`` and dtype ``dtype``."""
    key = (op, base_shape, geom, dtype, _hashable(args), _hashable(tuple(kwargs.items())))
    plan = _PLANS.get(key)
    if plan is None:
        plan = _compute_plan(op, base_shape, geom, dtype, list(args), kwargs)
        _PLANS.put(key, plan)
    return plan


def _compute_plan(op, base_shape: tuple, geom: views.View, dtype: torch.dtype, a: list, k: dict):
    """PyTorch's own answer on a meta tensor of the input's geometry and dtype; an output of another dtype than
    the storage's (``view_as_real``, ``view(dtype)``) gets a cast, one back in the storage's dtype loses it."""
    out = op(views.shadow(base_shape, geom.size, geom.stride, geom.offset, dtype, geom.cast), *a, **k)
    outs = out if isinstance(out, (list, tuple)) else (out,)
    stored = dtype if geom.cast is None else geom.cast[0]
    return tuple(views.canonical(base_shape, o.size(), o.stride(), o.storage_offset(),
                                 None if o.dtype == stored else (stored, o.dtype)) for o in outs)


#: view ops whose output has another dtype: aliases of the same bytes (device/reinterpret.py)
DTYPE_VIEW_OPS = (aten.view.dtype, aten.view_as_real.default, aten.view_as_complex.default)


def make_view_kernel(op):
    multi = op in (aten.split.Tensor, aten.split_with_sizes.default, aten.unbind.int)

    def kernel(self, *args, **kwargs):
        self = tensor.adopt(self)
        storage = self.tpu_storage
        moved = False
        try:
            geoms = _plan(op, storage.shape, _geometry(self), self.dtype, args, kwargs)
        except RuntimeError:
            from .bounded import compact  # a grown tensor's padded strides: compact it and view that (rare)

            if op not in _RESHAPING or not compact(self):
                raise
            storage, moved = self.tpu_storage, True
            geoms = _plan(op, storage.shape, _geometry(self), self.dtype, args, kwargs)
        if torch.is_inference_mode_enabled() and not self.is_inference():
            # a view of a normal tensor is a normal tensor, even inside inference_mode (as on CPU)
            with torch.inference_mode(False):
                outs = [tensor.make(storage, g) for g in geoms]
        else:
            outs = [tensor.make(storage, g) for g in geoms]
        if op is aten.slice.Tensor and geoms[0] is not None and growth.growing_prefix(storage, geoms[0]):
            return outs[0]  # a prefix that may be growing: the next step's slice must come here too
        lesson = recording.lesson_pending
        if not moved and lesson is not None and lesson():  # the recording kernel keyed this call: teach it
            # the geometry (not after a move: the key has the padded geometry, the answer the compact one)
            if multi:
                recording.learn_views(op, storage, geoms)
            else:
                recording.learn_view(op, storage, geoms[0])
        return outs if multi else outs[0]

    kernel.__name__ = f"view_kernel_{op}"
    kernel.recordable_view = True
    return kernel


def recordable_view(op, kernel) -> bool:
    """Whether ``kernel`` is this module's view kernel of ``op`` (the recording kernel can serve it from the
    learned geometry of its output, or of each output of ``split``/``unbind``: :mod:`..runtime.recording`)."""
    return (op in VIEW_OPS or op in DTYPE_VIEW_OPS) and getattr(kernel, "recordable_view", False)


def make_inplace_view_kernel(op):
    functional = INPLACE_VIEW_OPS[op]

    def kernel(self, *args, **kwargs):
        self = tensor.adopt(self)
        storage = self.tpu_storage
        geoms = _plan(functional, storage.shape, _geometry(self), self.dtype, args, kwargs)
        tensor.set_geometry(self, storage, geoms[0])
        return self

    kernel.__name__ = f"inplace_view_kernel_{op}"
    return kernel


def detach_(self):
    """In-place detach only changes autograd metadata, which the autograd layer already did."""
    return self
