"""Shape ops: concatenation, padding, flips and rolls, triangles, copies of views and their ``*_scatter`` inverses.

Pure view ops (``view``, ``permute``, ``select``, ...) are view kernels (see ``runtime/view_kernels.py``); this module
lowers the ops that build new arrays.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from .. import dtypes
from ..device import reinterpret
from .registry import aten, checks_args, checks_calls, lower


def _dim(d: int, ndim: int) -> int:
    return d + ndim if d < 0 else d


@lower(aten.cat.default)
def cat(tensors, dim=0):
    """PyTorch's legacy rule: 1-D empty tensors are skipped, whatever the other inputs' shapes."""
    kept = [t for t in tensors if not (t.ndim == 1 and t.shape[0] == 0)]
    if not kept:
        return jnp.zeros((0,), jnp.result_type(*tensors))
    dtype = jnp.result_type(*kept)
    return jnp.concatenate([t.astype(dtype) for t in kept], axis=_dim(dim, kept[0].ndim))


@lower(aten.stack.default)
def stack(tensors, dim=0):
    dtype = jnp.result_type(*tensors)
    return jnp.stack([t.astype(dtype) for t in tensors], axis=_dim(dim, tensors[0].ndim + 1))


@lower(aten.constant_pad_nd.default)
def constant_pad_nd(x, pad, value=0):
    """``pad`` pairs run from the last dim backwards; negative entries crop."""
    config = [(0, 0, 0)] * x.ndim
    for i in range(len(pad) // 2):
        config[x.ndim - 1 - i] = (pad[2 * i], pad[2 * i + 1], 0)
    return lax.pad(x, jnp.asarray(value).astype(x.dtype), config)


def _pad_mode(x, padding, mode):
    """Reflect/replicate padding of the last ``len(padding) // 2`` dims as a gather: output position ``j`` of a
    dim of size ``n`` padded by ``(lo, hi)`` reads input ``j - lo`` reflected or clamped into ``[0, n)``
    (negative pads crop, as in PyTorch)."""
    for i in range(len(padding) // 2):
        d = x.ndim - 1 - i
        lo, hi, n = padding[2 * i], padding[2 * i + 1], x.shape[d]
        idx = jnp.arange(n + lo + hi) - lo
        if mode == "reflect":
            idx = n - 1 - jnp.abs(n - 1 - jnp.abs(idx))
        else:
            idx = jnp.clip(idx, 0, n - 1)
        x = jnp.take(x, idx, axis=d)
    return x


@lower(aten.reflection_pad1d.default, aten.reflection_pad2d.default, aten.reflection_pad3d.default)
def reflection_pad(x, padding):
    return _pad_mode(x, padding, "reflect")


@lower(aten.replication_pad1d.default, aten.replication_pad2d.default, aten.replication_pad3d.default)
def replication_pad(x, padding):
    return _pad_mode(x, padding, "edge")


def _pad_backward(mode):
    def backward(grad, x, padding):
        _, vjp = jax.vjp(lambda v: _pad_mode(v, padding, mode), x)
        return vjp(grad.astype(x.dtype))[0]

    return backward


lower(
    aten.reflection_pad1d_backward.default, aten.reflection_pad2d_backward.default,
    aten.reflection_pad3d_backward.default,
)(_pad_backward("reflect"))
lower(
    aten.replication_pad1d_backward.default, aten.replication_pad2d_backward.default,
    aten.replication_pad3d_backward.default,
)(_pad_backward("edge"))


@lower(aten.flip.default)
def flip(x, dims):
    """A 0-d tensor is its own flip (PyTorch takes dim 0 or -1 of it)."""
    return jnp.flip(x, axis=tuple(_dim(d, x.ndim) for d in dims)) if dims and x.ndim else x


@checks_args(aten.roll.default)
def _shifts_align(op, x, shifts, dims=()) -> None:
    """CPU checks this before the dims' range (PyTorch's Python reference the other way round)."""
    if shifts and (dims or len(shifts) > 1) and len(shifts) != len(dims):
        raise RuntimeError(f"shifts and dimensions must align. shifts: {len(shifts)}, dims:{len(dims)}")


@lower(aten.roll.default)
def roll(x, shifts, dims=()):
    if not dims:
        return jnp.roll(x.reshape(-1), shifts[0]).reshape(x.shape)
    return jnp.roll(x, tuple(shifts), axis=tuple(_dim(d, x.ndim) for d in dims))


@lower(aten.repeat.default)
def repeat(x, repeats):
    x = x.reshape((1,) * (len(repeats) - x.ndim) + x.shape)
    return jnp.tile(x, tuple(repeats))


@lower(aten.tril.default)
def tril(x, diagonal=0):
    return jnp.tril(x, diagonal)


@lower(aten.triu.default)
def triu(x, diagonal=0):
    return jnp.triu(x, diagonal)


@lower(aten.clone.default, aten.lift_fresh_copy.default, aten.detach_copy.default, aten.alias_copy.default)
def clone(x, *, memory_format=None):
    return x


@lower(aten.narrow_copy.default)
def narrow_copy(x, dim, start, length):
    dim = _dim(dim, x.ndim)
    start = start + x.shape[dim] if start < 0 else start
    return lax.slice_in_dim(x, start, start + length, axis=dim)


@lower(aten.split_copy.Tensor)
def split_copy(x, split_size, dim=0):
    dim = _dim(dim, x.ndim)
    n = x.shape[dim]
    starts = range(0, n, split_size) if n else [0]
    return [lax.slice_in_dim(x, s, min(s + split_size, n), axis=dim) for s in starts]


@lower(aten.split_with_sizes_copy.default)
def split_with_sizes_copy(x, split_sizes, dim=0):
    dim = _dim(dim, x.ndim)
    starts = [0]
    for s in split_sizes:
        starts.append(starts[-1] + s)
    return [lax.slice_in_dim(x, a, b, axis=dim) for a, b in zip(starts[:-1], starts[1:])]


@lower(aten.select_scatter.default)
def select_scatter(x, src, dim, index):
    dim = _dim(dim, x.ndim)
    return x.at[(slice(None),) * dim + (index,)].set(src.astype(x.dtype))


@lower(aten.slice_scatter.default)
def slice_scatter(x, src, dim=0, start=None, end=None, step=1):
    dim = _dim(dim, x.ndim)
    return x.at[(slice(None),) * dim + (slice(start, end, step),)].set(src.astype(x.dtype))


def _diag_indices(n1: int, n2: int, offset: int):
    """Row and column indices of the ``offset`` diagonal of an ``n1 x n2`` matrix."""
    length = max(0, min(n1, n2 - offset) if offset >= 0 else min(n1 + offset, n2))
    i = jnp.arange(length) + max(-offset, 0)
    return i, i + offset


@lower(aten.diagonal_scatter.default)
def diagonal_scatter(x, src, offset=0, dim1=0, dim2=1):
    dim1, dim2 = _dim(dim1, x.ndim), _dim(dim2, x.ndim)
    moved = jnp.moveaxis(x, (dim1, dim2), (-2, -1))
    i, j = _diag_indices(moved.shape[-2], moved.shape[-1], offset)
    moved = moved.at[..., i, j].set(src.astype(x.dtype))
    return jnp.moveaxis(moved, (-2, -1), (dim1, dim2))


@lower(aten.diag_embed.default)
def diag_embed(x, offset=0, dim1=-2, dim2=-1):
    ndim = x.ndim + 1
    dim1, dim2 = _dim(dim1, ndim), _dim(dim2, ndim)
    n = x.shape[-1] + abs(offset)
    out = jnp.zeros(x.shape[:-1] + (n, n), x.dtype)
    i, j = _diag_indices(n, n, offset)
    out = out.at[..., i, j].set(x)
    return jnp.moveaxis(out, (-2, -1), (dim1, dim2))


@lower(aten.as_strided_scatter.default)
def as_strided_scatter(x, src, size, stride, storage_offset=None):
    """Positions are read in ``x``'s own contiguous layout, as the ``as_strided`` view kernel reads them."""
    index = jnp.full(tuple(size), storage_offset or 0, dtype=jnp.int64)
    for d, s in enumerate(stride):
        index = index + lax.broadcasted_iota(jnp.int64, tuple(size), d) * s
    flat = x.reshape(-1).at[index.reshape(-1)].set(src.reshape(-1).astype(x.dtype))
    return flat.reshape(x.shape)


@checks_calls(aten.block_diag.default)
def _one_device(op, tensors) -> None:
    """CPU's own wording for inputs on several devices (the executor's generic one would come first)."""
    for i, t in enumerate(tensors):
        if t.device != tensors[0].device:
            raise RuntimeError(f"torch.block_diag: input tensors must all be on the same device. Input 0 is on device "
                               f"{tensors[0].device} and input {i} is on device {t.device}")


@lower(aten.block_diag.default)
def block_diag(tensors):
    dtype = jnp.result_type(*tensors)
    mats = [t if t.ndim == 2 else t.reshape(1, t.size) for t in tensors]
    out = jnp.zeros((sum(m.shape[0] for m in mats), sum(m.shape[1] for m in mats)), dtype)
    r = c = 0
    for m in mats:
        out = lax.dynamic_update_slice(out, m.astype(dtype), (r, c)) if m.size else out
        r, c = r + m.shape[0], c + m.shape[1]
    return out


@lower(aten.repeat_interleave.Tensor, jit=False)
def repeat_interleave(repeats, *, output_size=None):
    """Data-dependent length unless ``output_size`` is given; runs eagerly, so CPU's checks of the values hold."""
    if repeats.ndim != 1:
        raise RuntimeError("repeat_interleave only accept 1D vector as repeat")
    if repeats.dtype not in (jnp.int32, jnp.int64):
        name = dtypes.scalar_name(repeats.dtype)
        raise NotImplementedError(f'"repeat_interleave_tpu" not implemented for \'{name}\'')
    if output_size is None and repeats.size and int(jnp.min(repeats)) < 0:
        raise RuntimeError("repeats can not be negative")
    total = int(jnp.sum(repeats)) if output_size is None else output_size
    return jnp.repeat(jnp.arange(repeats.shape[0], dtype=repeats.dtype), repeats, total_repeat_length=total)


@lower(aten.view.dtype)
def view_dtype(x, dtype):
    """``x.view(dtype)`` as a value: the same bytes read as ``dtype``, the last dim scaled by the ratio of element
    sizes. Eager tpu tensors take the view kernel (an alias of ``x``'s storage, runtime/view_kernels.py); this is
    the lowering a compiled graph's functional ``view.dtype`` runs."""
    return reinterpret.bits(x, dtypes.to_jax(dtype))
