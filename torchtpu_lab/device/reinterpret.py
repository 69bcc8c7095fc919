"""A storage's bytes read as another dtype: what a view that changes the dtype reads and writes.

A tpu storage holds one JAX array of one dtype. ``x.view(torch.int32)``, ``torch.view_as_real``,
``torch.view_as_complex`` and ``x.real``/``x.imag`` (PyTorch's ``view_as_real`` and a ``select``) are views of
another dtype over it: their :class:`~.views.View` carries a *cast*, ``(storage dtype, view dtype)``, and its
geometry is PyTorch's, in elements of the view's dtype over the storage's bytes. Reading one reinterprets the
flattened storage as *words* of the view's dtype (:func:`words`) and reads the geometry from those; writing one
writes the words and reinterprets them back (:func:`restore`), so the storage and every alias of it see the write.

A bool view's words are bytes (``uint8``), read as ``!= 0``: a write through it leaves the bytes it does not write
as they were. The other way round is the one loss: a bool storage holds JAX bools, so a byte other than 0 or 1
written through a ``uint8`` view of it is kept as 1 (on CPU the byte itself stays, and reads as ``True``).
XLA's bitcasts are little-endian, as PyTorch's CPU tensors are.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import torch
from jax import lax

from .. import dtypes

Cast = tuple  # (storage dtype, view dtype), both torch dtypes


def word_dtype(dtype: torch.dtype):
    """The JAX dtype a view of ``dtype`` is read and written in: ``uint8`` for bool (see the module's note)."""
    return jnp.dtype(jnp.uint8) if dtype == torch.bool else jnp.dtype(dtypes.to_jax(dtype))


def length(base_shape: tuple, cast: Cast) -> int:
    """How many elements of the view's dtype a storage of ``base_shape`` holds (rounded up: a view of a wider
    dtype may cover the start of a storage whose byte size it does not divide)."""
    storage, view = cast
    return -(-math.prod(base_shape) * storage.itemsize // view.itemsize)


def words(base, cast: Cast):
    """The storage array ``base`` (of ``cast[0]``) as a flat array of :func:`length` words of ``cast[1]``."""
    flat = base.reshape(-1)
    storage, view = cast
    if view.itemsize > storage.itemsize:
        k = view.itemsize // storage.itemsize
        spare = -flat.shape[0] % k
        if spare:
            flat = jnp.concatenate([flat, jnp.zeros((spare,), flat.dtype)])
    return bits(flat, word_dtype(view))


def restore(flat, cast: Cast, base_shape: tuple):
    """Words written through a view (:func:`words`' array, updated) as the storage's array again."""
    storage, _ = cast
    values = bits(flat, jnp.dtype(dtypes.to_jax(storage)))
    n = math.prod(base_shape)
    return (values if values.shape[0] == n else values[:n]).reshape(base_shape)


def _as_real_pairs(x):
    """A complex array as its real components, interleaved along the last dim (memory order)."""
    pairs = jnp.stack([jnp.real(x), jnp.imag(x)], axis=-1)
    return pairs.reshape(*x.shape[:-1], x.shape[-1] * 2) if x.ndim else pairs


_UINTS = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint64}


def _regroup(x, have: int, want: int):
    """``x``'s bits as unsigned words of ``want`` bytes along its last dim, in memory (little-endian) order.
    Shifts and masks, not XLA's width-changing bitcast: XLA:CPU's simplifier merged two of those in a row (a write
    through an ``int16`` view, then a read as ``uint8``) into an instruction its own verifier rejects."""
    u = lax.bitcast_convert_type(x, _UINTS[have])
    if have > want:  # each element splits into have // want words
        k, bits_per = have // want, 8 * want
        parts = [((u >> (bits_per * j)) & ((1 << bits_per) - 1)).astype(_UINTS[want]) for j in range(k)]
        return jnp.stack(parts, axis=-1).reshape(*x.shape[:-1], x.shape[-1] * k)
    k, bits_per = want // have, 8 * have
    groups = u.reshape(*x.shape[:-1], x.shape[-1] // k, k).astype(_UINTS[want])
    out = groups[..., 0]
    for j in range(1, k):
        out = out | (groups[..., j] << (bits_per * j))
    return out


def bits(x, target):
    """``x``'s bytes read as ``target`` (a JAX dtype) along its last dim, which scales by the ratio of element sizes
    (PyTorch's ``x.view(dtype)``; its meta kernel checked that the last dim divides)."""
    target = jnp.dtype(target)
    if x.dtype == target:
        return x
    if jnp.iscomplexobj(x):
        x = _as_real_pairs(x)
    if x.dtype == jnp.bool_:
        x = x.astype(jnp.uint8)
    wanted = target
    if target == jnp.bool_:
        wanted = jnp.dtype(jnp.uint8)
    elif jnp.issubdtype(target, jnp.complexfloating):
        wanted = jnp.dtype(jnp.float32 if target == jnp.complex64 else jnp.float64)
    have, want = x.dtype.itemsize, wanted.itemsize
    y = lax.bitcast_convert_type(x if have == want else _regroup(x, have, want), wanted)
    if target == jnp.bool_:
        return y != 0
    if jnp.issubdtype(target, jnp.complexfloating):
        return lax.complex(y[..., 0::2], y[..., 1::2]) if y.ndim else y
    return y
