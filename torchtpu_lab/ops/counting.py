"""Counting ops: ``unique`` (and its ``dim`` and consecutive forms), ``bincount``, ``histc``.

``unique`` and ``bincount`` have output shapes that depend on input values: they are ``jit=False`` and run on
concrete arrays. ``histc``'s shape is its bin count; its range checks are reported (:mod:`.error_flags`).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from .. import dtypes
from .error_flags import report, reports
from .indexing import _dim
from .registry import NoKernel, aten, lower

_EMPTY = np.zeros((0,), np.int64)


@lower(aten._unique2.default, jit=False)
def unique2(x, sorted=True, return_inverse=False, return_counts=False):
    """Always sorted (as PyTorch's CPU kernel); every NaN is its own value."""
    values, inverse, counts = jnp.unique(x.reshape(-1), return_inverse=True, return_counts=True, equal_nan=False)
    return (
        values,
        inverse.astype(jnp.int64).reshape(x.shape) if return_inverse else jnp.asarray(_EMPTY),
        counts.astype(jnp.int64) if return_counts else jnp.asarray(_EMPTY),
    )


@lower(aten._unique.default, jit=False)
def unique(x, sorted=True, return_inverse=False):
    values, inverse, _ = unique2(x, sorted, return_inverse, False)
    return values, inverse


@lower(aten.unique_dim.default, jit=False)
def unique_dim(x, dim, sorted=True, return_inverse=False, return_counts=False):
    dim = _dim(dim, x.ndim)
    values, inverse, counts = jnp.unique(x, return_inverse=True, return_counts=True, axis=dim, equal_nan=False)
    return (
        values,
        inverse.astype(jnp.int64).reshape(-1) if return_inverse else jnp.asarray(_EMPTY),
        counts.astype(jnp.int64) if return_counts else jnp.asarray(_EMPTY),
    )


@lower(aten.unique_consecutive.default, jit=False)
def unique_consecutive(x, return_inverse=False, return_counts=False, dim=None):
    if dim is None:
        rows = x.reshape(-1, 1)
    else:
        dim = _dim(dim, x.ndim)
        rows = jnp.moveaxis(x, dim, 0).reshape(x.shape[dim], x.size // max(x.shape[dim], 1))
    n = rows.shape[0]
    new = jnp.concatenate([jnp.ones((min(n, 1),), bool), jnp.any(rows[1:] != rows[:-1], axis=1)])
    starts = jnp.nonzero(new)[0]
    if dim is None:
        values = x.reshape(-1)[starts]
    else:
        values = jnp.take(x, starts, axis=dim)
    inverse = jnp.cumsum(new.astype(jnp.int64)) - 1
    counts = jnp.diff(jnp.append(starts, n)).astype(jnp.int64)
    return (
        values,
        (inverse.reshape(x.shape) if dim is None else inverse) if return_inverse else jnp.asarray(_EMPTY),
        counts if return_counts else jnp.asarray(_EMPTY),
    )


@lower(aten.bincount.default, jit=False)
def bincount(x, weights=None, minlength=0):
    """Float32 weights give float32 counts, other weights float64, no weights int64 (PyTorch's rule); CPU's
    checks, in its order (run op by op: the values are at hand), where ``jnp.bincount`` counted a negative value
    in bin 0 and refused other input with JAX's errors."""
    if minlength < 0:
        raise RuntimeError("minlength should be >= 0")
    if not jnp.issubdtype(x.dtype, jnp.integer):
        raise NoKernel(f'"bincount_cpu" not implemented for \'{dtypes.scalar_name(x.dtype)}\'')
    if x.ndim == 1 and x.size == 0:
        return jnp.zeros((minlength,), jnp.int64)
    if x.ndim != 1 or int(jnp.min(x)) < 0:
        raise RuntimeError("bincount only supports 1-d non-negative integral inputs.")
    if weights is not None and (weights.ndim != 1 or weights.shape[0] != x.shape[0]):
        raise RuntimeError("weights should be 1-d and have the same length as input")
    length = max(int(jnp.max(x)) + 1, minlength)
    if weights is None:
        return jnp.bincount(x, length=length).astype(jnp.int64)
    dtype = jnp.float32 if weights.dtype == jnp.float32 else jnp.float64
    return jnp.bincount(x, weights.astype(dtype), length=length).astype(dtype)


@reports
@lower(aten.histc.default)
def histc(x, bins=100, min=0, max=0):
    """PyTorch's linear bin rule in the input dtype: ``bin = trunc((v - lo) * bins / (hi - lo))``, the top
    edge falls in the last bin, values outside ``[lo, hi]`` (and NaNs) are dropped; ``lo == hi`` takes the
    data's range, widened by 1 each way if still empty. CPU's checks of the range are reported (the range comes
    from the data, and ``min``/``max`` are graph inputs): not finite (data with an infinity or NaN), or empty."""
    lo, hi = jnp.asarray(min, x.dtype), jnp.asarray(max, x.dtype)
    flat = x.reshape(-1)
    if flat.size:
        auto = lo == hi
        lo = jnp.where(auto, jnp.min(flat), lo)
        hi = jnp.where(auto, jnp.max(flat), hi)
    same = lo == hi
    lo, hi = jnp.where(same, lo - 1, lo), jnp.where(same, hi + 1, hi)
    report(~(jnp.isfinite(lo) & jnp.isfinite(hi)), (lo, hi), error=RuntimeError,
           message="torch.histc: range of [{0}, {1}] is not finite")
    report(jnp.isfinite(lo) & jnp.isfinite(hi) & ~(lo < hi), error=RuntimeError,
           message="torch.histc: max must be larger than min")
    inside = (flat >= lo) & (flat <= hi)
    pos = ((flat - lo) * jnp.asarray(bins, x.dtype) / (hi - lo)).astype(jnp.int64)
    pos = jnp.where(pos == bins, bins - 1, pos)
    pos = jnp.where(inside, pos, bins)
    return jnp.zeros((bins,), jnp.int64).at[pos].add(1, mode="drop").astype(x.dtype)
