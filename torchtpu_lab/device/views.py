"""Reading and writing a strided view of a storage, as JAX functions that trace into any graph.

Decision (views and mutation): we keep PyTorch's own model rather than functionalization. Every
storage holds one JAX array in its base shape (row-major). A tensor is a storage plus a :class:`View` — size,
stride and element offset into the flattened storage, exactly PyTorch's geometry — or ``None`` when it *is*
the base. Reading a view gathers from the storage; writing through a view scatters into a new storage array,
which then replaces the old one, so every alias sees the write. Because the geometry is PyTorch's, every view op
(``view``, ``t``, ``select``, ``as_strided``, ``unfold`` ...) is computed by asking PyTorch itself on a meta
tensor (see :mod:`torchtpu_lab.runtime.view_kernels`).

The torch-level ``stride()`` of a tpu tensor is always contiguous (as with PyTorch/XLA): PyTorch's pure-Python
backend API gives a tensor no storage to stride into. The real geometry lives in the :class:`View`.

Reads and writes pick the cheapest exact XLA expression: a slice for contiguous views, a strided slice plus a
transpose and a broadcast when each view dimension maps onto one base dimension, and a gather only otherwise.
"""

from __future__ import annotations


import math
from typing import NamedTuple

import jax.numpy as jnp
from jax import lax

from .. import caches


class View(NamedTuple):
    """PyTorch geometry of a tensor relative to its flattened storage."""

    size: tuple
    stride: tuple
    offset: int


def contiguous_strides(shape) -> tuple:
    strides, acc = [], 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(strides))


def canonical(base_shape: tuple, size: tuple, stride: tuple, offset: int) -> View | None:
    """``None`` when the geometry is the whole base, else the :class:`View`."""
    size, stride = tuple(size), tuple(stride)
    if size == tuple(base_shape) and offset == 0 and _is_contiguous(size, stride):
        return None
    return View(size, stride, int(offset))


def _is_contiguous(size, stride) -> bool:
    expected = 1
    for n, s in zip(reversed(size), reversed(stride)):
        if n != 1 and s != expected:
            return False
        expected *= n
    return True


class _Plan(NamedTuple):
    kind: str  # "contig" | "slice" | "gather"
    starts: tuple = ()
    limits: tuple = ()
    steps: tuple = ()
    sliced_shape: tuple = ()  # shape of the slice with unused base dims dropped
    perm: tuple = ()  # transpose from base-dim order to view order (non-broadcast, non-unit dims)
    pre_broadcast: tuple = ()  # view shape with broadcast dims set to 1


@caches.memoize("view_read_plans", 8192)
def _plan(base_shape: tuple, view: View) -> _Plan:
    size, stride, offset = view
    if _is_contiguous(size, stride):
        return _Plan("contig")
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
    pre_broadcast = tuple(1 if (s == 0 and n != 1) else n for n, s in zip(size, stride))
    return _Plan("slice", tuple(starts), tuple(limits), tuple(steps), sliced_shape, perm, pre_broadcast)


def _gather_index(view: View):
    size, stride, offset = view
    idx = jnp.full(size, offset, dtype=jnp.int32 if _max_index(view) < 2**31 else jnp.int64)
    for d, (n, s) in enumerate(zip(size, stride)):
        if n > 1 and s:
            idx = idx + lax.broadcasted_iota(idx.dtype, size, d) * s
    return idx


def _max_index(view: View) -> int:
    return view.offset + sum((n - 1) * s for n, s in zip(view.size, view.stride) if n > 0)


def read(base, base_shape: tuple, view: View | None):
    """The values of ``view`` over ``base`` (an array of ``base_shape``)."""
    if view is None:
        return base
    size = view.size
    if math.prod(size) == 0:
        return jnp.zeros(size, base.dtype)
    plan = _plan(tuple(base_shape), view)
    flat = base.reshape(-1)
    if plan.kind == "contig":
        n = math.prod(size)
        return lax.slice(flat, (view.offset,), (view.offset + n,)).reshape(size)
    if plan.kind == "slice":
        x = lax.slice(base, plan.starts, plan.limits, plan.steps).reshape(plan.sliced_shape)
        x = jnp.transpose(x, plan.perm) if plan.perm != tuple(range(len(plan.perm))) else x
        return jnp.broadcast_to(x.reshape(plan.pre_broadcast), size)
    return flat[_gather_index(view)]


def write(base, base_shape: tuple, view: View | None, value):
    """A new base array equal to ``base`` with ``view`` overwritten by ``value`` (already the view's shape)."""
    if view is None:
        return jnp.broadcast_to(value, base_shape).astype(base.dtype)
    size = view.size
    value = jnp.broadcast_to(value, size).astype(base.dtype)
    if math.prod(size) == 0:
        return base
    plan = _plan(tuple(base_shape), view)
    flat = base.reshape(-1)
    if plan.kind == "contig":
        return lax.dynamic_update_slice(flat, value.reshape(-1), (view.offset,)).reshape(base_shape)
    if plan.kind == "slice":
        # a write through a broadcast (stride-0) dim keeps the first element along it, as every element aliases
        index = tuple(slice(0, 1) if (n != 1 and s == 0) else slice(None) for n, s in zip(size, view.stride))
        v = value[index].reshape(tuple(n for n, s in zip(size, view.stride) if n != 1 and s != 0))
        inverse = tuple(sorted(range(len(plan.perm)), key=lambda k: plan.perm[k]))
        v = jnp.transpose(v, inverse) if plan.perm != tuple(range(len(plan.perm))) else v
        shape_in_base = tuple(len(range(s, l, st)) for s, l, st in zip(plan.starts, plan.limits, plan.steps))
        v = v.reshape(shape_in_base)
        if all(st == 1 for st in plan.steps):
            return lax.dynamic_update_slice(base, v, plan.starts)
        slices = tuple(slice(s, l, st) for s, l, st in zip(plan.starts, plan.limits, plan.steps))
        return base.at[slices].set(v)
    return flat.at[_gather_index(view).reshape(-1)].set(value.reshape(-1)).reshape(base_shape)
