"""Reading and writing a strided view of a storage, as JAX functions that trace into any graph.

Decision (views and mutation): we keep PyTorch's own model rather than functionalization. Every
storage holds one JAX array in its base shape (row-major). A tensor is a storage plus a :class:`View` — size,
stride and element offset into the flattened storage, exactly PyTorch's geometry — or ``None`` when it *is*
the base. Reading a view gathers from the storage; writing through a view scatters into a new storage array,
which then replaces the old one, so every alias sees the write. Because the geometry is PyTorch's, every view op
(``view``, ``t``, ``select``, ``as_strided``, ``unfold`` ...) is computed by asking PyTorch itself on a meta
tensor (see :mod:`torchtpu_lab.runtime.view_kernels`).

A tpu tensor's torch-level ``stride()`` and ``storage_offset()`` are its :class:`View`'s (set on the TensorImpl by
:func:`torchtpu_lab.device.tensor.make`), so PyTorch code sees CPU's view semantics; a base tensor is row-major.

Reads and writes pick the cheapest exact XLA expression: a slice for contiguous views, a strided slice plus a
transpose and a broadcast when each view dimension maps onto one base dimension, a slice of one contiguous block
transposed and broadcast when the view reads such a block in another dim order, and a gather only otherwise.

A view whose dtype differs from its storage's (``x.view(torch.int32)``, ``torch.view_as_real``, ``x.real``) carries
a *cast*: its geometry counts elements of its own dtype over the storage's bytes, and reads and writes go through
the storage reinterpreted as such elements (:mod:`.reinterpret`), so it is an alias like any other view.

A view's *offset* is a graph input, not part of any executable's key: :func:`dynamic` splits a :class:`View`
into a :class:`DynView` (size, stride and the shape of the read — everything that decides the program) and the
offset, which the program reads as a traced scalar (``dynamic_slice`` / ``dynamic_update_slice``). So
``tokens[:, pos]`` for a moving ``pos`` — a decode loop writing into a preallocated buffer, a static KV cache —
runs one compiled program for every position instead of one per position.
"""

from __future__ import annotations


import math
from typing import NamedTuple

import jax.numpy as jnp
import torch
from jax import lax

from .. import caches
from . import reinterpret


class View(NamedTuple):
    """PyTorch geometry of a tensor relative to its flattened storage; ``cast``: ``(storage dtype, view dtype)``
    for a view of another dtype (its geometry then counts elements of the view's dtype), else ``None``."""

    size: tuple
    stride: tuple
    offset: int
    cast: tuple | None = None


def shadow(base_shape: tuple, size: tuple, stride: tuple, offset: int, dtype: torch.dtype = torch.float32,
           cast: tuple | None = None):
    """A meta tensor of this geometry over a flat storage of the base's size (in elements of the view's dtype,
    for a view with a ``cast``): what PyTorch's meta kernels are asked about a view (its geometry as a view op
    computes it, its checks as ``x.view(dtype)`` makes them)."""
    n = math.prod(base_shape) if cast is None else reinterpret.length(base_shape, cast)
    return torch.empty(n, dtype=dtype, device="meta").as_strided(size, stride, offset)


def contiguous_strides(shape) -> tuple:
    strides, acc = [], 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(strides))


def canonical(base_shape: tuple, size: tuple, stride: tuple, offset: int, cast: tuple | None = None) -> View | None:
    """``None`` when the geometry is the whole base in its own dtype, else the :class:`View`."""
    size, stride = tuple(size), tuple(stride)
    if cast is None and size == tuple(base_shape) and offset == 0 and is_contiguous(size, stride):
        return None
    return View(size, stride, int(offset), cast)


def reshapes_base(base_shape: tuple, view: View) -> bool:
    """Whether ``view`` reads every element of its base in the base's order: the base in another shape (how
    PyTorch's ``sum_to_size`` hands a bias its gradient, ``[1, n]`` viewed as ``[n]``)."""
    return (view.cast is None and view.offset == 0 and math.prod(view.size) == math.prod(base_shape)
            and is_contiguous(view.size, view.stride))


def drops_leading_ones(base_shape: tuple, view: View) -> bool:
    """Whether ``view`` is all of its base with leading size-1 dims left out (``[1, n]`` seen as ``[n]``, how
    ``sum_to_size`` hands a bias its gradient): a pointwise op on it is the same op on the base, whose operands
    broadcast alike (the recording kernel's ``drops_leading_ones`` and ``reshapes_storage`` are the same test)."""
    lead = len(base_shape) - len(view.size)
    return (lead >= 0 and all(n == 1 for n in base_shape[:lead]) and tuple(base_shape[lead:]) == tuple(view.size)
            and reshapes_base(base_shape, view))


def is_contiguous(size: tuple, stride: tuple) -> bool:
    """Whether ``stride`` is the row-major layout of ``size`` (dims of size 1 may have any stride)."""
    expected = 1
    for n, s in zip(reversed(size), reversed(stride)):
        if n != 1 and s != expected:
            return False
        expected *= n
    return True


class _Plan(NamedTuple):
    kind: str  # "contig" | "slice" | "permuted" | "gather"
    starts: tuple = ()
    limits: tuple = ()
    steps: tuple = ()
    sliced_shape: tuple = ()  # shape of the slice with unused base dims dropped
    perm: tuple = ()  # transpose from base-dim order to view order (non-broadcast, non-unit dims)
    pre_broadcast: tuple = ()  # view shape with broadcast dims set to 1
    base: tuple = ()  # "slice": the base's shape with dims split where the view's strides split them


@caches.memoize("view_read_plans", 8192)
def _plan(base_shape: tuple, view: View) -> _Plan:
    size, stride = view.size, view.stride
    if is_contiguous(size, stride):
        return _Plan("contig")
    plan = _slice_plan(base_shape, view)
    return plan if plan.kind != "gather" else (_permuted_plan(size, stride) or plan)


def _pre_broadcast(size: tuple, stride: tuple) -> tuple:
    return tuple(1 if (s == 0 and n != 1) else n for n, s in zip(size, stride))


def dense_order(size: tuple, stride: tuple) -> list | None:
    """The dims that address memory (not size 1, not broadcast), outermost first, where their strides lay them
    out densely row-major in that order (one contiguous block read in another dim order); else ``None``."""
    dims = sorted((d for d, (n, s) in enumerate(zip(size, stride)) if n != 1 and s != 0), key=lambda d: -stride[d])
    expected = 1
    for d in reversed(dims):
        if stride[d] != expected:
            return None
        expected *= size[d]
    return dims


def _permuted_plan(size: tuple, stride: tuple) -> _Plan | None:
    """A view that reads one contiguous block of its storage in another dim order (and may broadcast): a
    transpose of a reshape, such as attention's ``view(b, s, h, d).transpose(1, 2)`` over a ``[b, s, h * d]``
    storage or a weight gradient's ``[tokens, features]`` seen transposed. Its dims need not map onto the base's
    (which :func:`_slice_plan` asks), so without this plan it was a gather of every element (1.4 ms for a
    512x512 transpose on XLA:CPU, where the transpose costs a few µs)."""
    order = dense_order(size, stride)
    if order is None:
        return None
    return _Plan("permuted", sliced_shape=tuple(size[d] for d in order),
                 perm=tuple(sorted(range(len(order)), key=lambda k: order[k])),
                 pre_broadcast=_pre_broadcast(size, stride))


def _split_dims(base_shape: tuple, strides) -> tuple:
    """``base_shape`` with each dim split in two where one of ``strides`` falls inside it: a view whose dims
    subdivide a base dim (the heads of a ``[b, s, 3 * h * d]`` projection's slice, seen ``[b, h, s, d]``) then maps
    each of its dims onto one dim of the split base, which is the same array reshaped."""
    shape = list(base_shape)
    split = True
    while split:
        split = False
        for bd, (bn, bs) in enumerate(zip(shape, contiguous_strides(shape))):
            inner = next((s for s in strides if bs < s < bs * bn and s % bs == 0 and (bs * bn) % s == 0), None)
            if inner is not None:
                shape[bd:bd + 1] = [bs * bn // inner, inner // bs]
                split = True
                break
    return tuple(shape)


def _slice_plan(base_shape: tuple, view: View) -> _Plan:
    """A strided slice of the base, transposed and broadcast, where each view dim maps onto one base dim (of the
    base with its dims split by the view's strides, :func:`_split_dims`)."""
    size, stride, offset = view[:3]
    base_shape = _split_dims(base_shape, {s for n, s in zip(size, stride) if n != 1 and s != 0})
    base_strides = contiguous_strides(base_shape)
    starts = [(offset // bs) % max(n, 1) for n, bs in zip(base_shape, base_strides)]
    if sum(s * bs for s, bs in zip(starts, base_strides)) != offset:
        return _Plan("gather")
    dims = [(s, n, vd) for vd, (n, s) in enumerate(zip(size, stride)) if n != 1 and s != 0]
    used: dict[int, tuple] = {}
    for s, n, vd in sorted(dims, reverse=True):
        for bd, (bn, bs) in enumerate(zip(base_shape, base_strides)):
            if bd in used or s % bs:
                continue
            step = s // bs
            if starts[bd] + step * (n - 1) < bn:
                used[bd] = (vd, step, n)
                break
        else:
            return _Plan("gather")
    limits, steps = [], []
    for bd, st in enumerate(starts):
        if bd in used:
            _, step, n = used[bd]
            limits.append(st + step * (n - 1) + 1)
            steps.append(step)
        else:
            limits.append(st + 1)
            steps.append(1)
    order = sorted(used)  # base dims kept after the slice, in base order
    sliced_shape = tuple(used[bd][2] for bd in order)
    view_dims_in_base_order = [used[bd][0] for bd in order]
    perm = tuple(sorted(range(len(order)), key=lambda k: view_dims_in_base_order[k]))
    return _Plan("slice", tuple(starts), tuple(limits), tuple(steps), sliced_shape, perm,
                 _pre_broadcast(size, stride), base_shape)


class DynView(NamedTuple):
    """A view's geometry without its offset: what a compiled read or write of it depends on. ``span`` is the
    extent of the read window in each base dimension (``"slice"`` plans); ``moves``: whether more than one
    offset is possible (a view that spans its whole base has offset 0, and needs no offset input)."""

    size: tuple
    stride: tuple
    kind: str
    steps: tuple
    span: tuple
    sliced_shape: tuple
    perm: tuple
    pre_broadcast: tuple
    moves: bool
    split: tuple = ()  # "slice": the base's shape as the plan splits it (the same array, reshaped)
    cast: tuple | None = None  # the View's: the plan is over the storage's flat words of the view's dtype


@caches.memoize("dynamic_views", 8192)
def _dynamic(base_shape: tuple, view: View) -> DynView:
    if view.cast is not None:
        words = _dynamic((reinterpret.length(base_shape, view.cast),), view._replace(cast=None))
        return words._replace(cast=view.cast)
    plan = _plan(base_shape, view)
    size = view.size
    # a size-1 dim's stride addresses nothing, and a view op derives it from its neighbours' sizes (`x[:, None]`
    # of a grown tensor gets the length there): keyed as 0, so such a view reads with one program at every length
    stride = tuple(0 if n == 1 else s for n, s in zip(size, view.stride))
    if plan.kind == "slice":
        span = tuple(l - s for s, l in zip(plan.starts, plan.limits))
        moves = span != plan.base
    elif plan.kind == "permuted":
        span = ()
        moves = math.prod(plan.sliced_shape) != math.prod(base_shape)
    else:
        span = ()
        moves = plan.kind == "gather" or math.prod(size) != math.prod(base_shape)
    return DynView(size, stride, plan.kind, plan.steps, span, plan.sliced_shape, plan.perm, plan.pre_broadcast,
                   moves, plan.base)


def dynamic(base_shape: tuple, view: View) -> tuple[DynView, int | None]:
    """Split ``view`` (over a base of ``base_shape``) into its offset-free key and its offset (``None`` when the
    geometry fixes the offset: the program then needs no offset input)."""
    key = _dynamic(tuple(base_shape), view)
    return key, (view.offset if key.moves else None)


def _starts(base_shape: tuple, offset) -> list:
    """Per-base-dimension start indices of a (possibly traced) flat offset."""
    return [(offset // bs) % max(n, 1) for n, bs in zip(base_shape, contiguous_strides(base_shape))]


def _gather_index(key: DynView, base_shape: tuple, offset):
    size, stride = key.size, key.stride
    idx = jnp.full(size, 0, dtype=jnp.int32 if math.prod(base_shape) < 2**31 else jnp.int64) + offset
    for d, (n, s) in enumerate(zip(size, stride)):
        if n > 1 and s:
            idx = idx + lax.broadcasted_iota(idx.dtype, size, d) * s
    return idx


def _resolve(base_shape: tuple, view, offset):
    """``(DynView, offset)`` for either a :class:`View` (its own offset) or a :class:`DynView` plus ``offset``."""
    if isinstance(view, View):
        key, _ = dynamic(base_shape, view)
        return key, view.offset
    return view, (0 if offset is None else offset)


def read(base, base_shape: tuple, view: View | DynView | None, offset=None):
    """The values of ``view`` over ``base`` (an array of ``base_shape``). ``offset``: the (traced) offset of a
    :class:`DynView`; a :class:`View` carries its own."""
    if view is None:
        return base
    cast = view.cast
    if cast is None:
        return _read(base, tuple(base_shape), view, offset)
    words = reinterpret.words(base, cast)
    value = _read(words, words.shape, view._replace(cast=None), offset)
    return value != 0 if cast[1] == torch.bool else value


def _read(base, base_shape: tuple, view: View | DynView, offset):
    size = view.size
    if math.prod(size) == 0:
        return jnp.zeros(size, base.dtype)
    key, offset = _resolve(base_shape, view, offset)
    if key.kind == "contig":
        n = math.prod(size)
        return lax.dynamic_slice(base.reshape(-1), (offset,), (n,)).reshape(size)
    if key.kind == "slice":
        x = lax.dynamic_slice(base.reshape(key.split), _starts(key.split, offset), key.span)
        if any(st != 1 for st in key.steps):
            x = lax.slice(x, (0,) * len(key.span), key.span, key.steps)
    elif key.kind == "permuted":
        x = lax.dynamic_slice(base.reshape(-1), (offset,), (math.prod(key.sliced_shape),))
    else:
        return base.reshape(-1)[_gather_index(key, base_shape, offset)]
    x = x.reshape(key.sliced_shape)
    x = jnp.transpose(x, key.perm) if key.perm != tuple(range(len(key.perm))) else x
    return jnp.broadcast_to(x.reshape(key.pre_broadcast), size)


def write(base, base_shape: tuple, view: View | DynView | None, value, offset=None):
    """A new base array equal to ``base`` with ``view`` overwritten by ``value`` (already the view's shape).
    ``offset`` as for :func:`read`."""
    if view is None:
        return jnp.broadcast_to(value, base_shape).astype(base.dtype)
    cast = view.cast
    if cast is None:
        return _write(base, tuple(base_shape), view, value, offset)
    words = reinterpret.words(base, cast)
    words = _write(words, words.shape, view._replace(cast=None), value, offset)
    return reinterpret.restore(words, cast, tuple(base_shape))


def _write(base, base_shape: tuple, view: View | DynView, value, offset):
    size = view.size
    value = jnp.broadcast_to(value, size).astype(base.dtype)
    if math.prod(size) == 0:
        return base
    key, offset = _resolve(base_shape, view, offset)
    if key.kind == "contig":
        return lax.dynamic_update_slice(base.reshape(-1), value.reshape(-1), (offset,)).reshape(base_shape)
    if key.kind in ("slice", "permuted"):
        # a write through a broadcast (stride-0) dim keeps the first element along it, as every element aliases
        index = tuple(slice(0, 1) if (n != 1 and s == 0) else slice(None) for n, s in zip(size, key.stride))
        v = value[index].reshape(tuple(n for n, s in zip(size, key.stride) if n != 1 and s != 0))
        inverse = tuple(sorted(range(len(key.perm)), key=lambda k: key.perm[k]))
        v = jnp.transpose(v, inverse) if key.perm != tuple(range(len(key.perm))) else v
        if key.kind == "permuted":
            return lax.dynamic_update_slice(base.reshape(-1), v.reshape(-1), (offset,)).reshape(base_shape)
        v = v.reshape(tuple(len(range(0, sp, st)) for sp, st in zip(key.span, key.steps)))
        starts, split = _starts(key.split, offset), base.reshape(key.split)
        if all(st == 1 for st in key.steps):
            return lax.dynamic_update_slice(split, v, starts).reshape(base_shape)
        window = lax.dynamic_slice(split, starts, key.span)
        window = window.at[tuple(slice(0, sp, st) for sp, st in zip(key.span, key.steps))].set(v)
        return lax.dynamic_update_slice(split, window, starts).reshape(base_shape)
    flat = base.reshape(-1)
    return flat.at[_gather_index(key, base_shape, offset).reshape(-1)].set(value.reshape(-1)).reshape(base_shape)
