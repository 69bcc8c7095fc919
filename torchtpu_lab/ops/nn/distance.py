"""Pairwise distances: ``_cdist_forward``/``_cdist_backward`` and ``_pdist_forward``/``_pdist_backward``.
Lowerings (pure JAX); cdist's matrix-product form runs at :func:`~torchtpu_lab.ops.precision.matmul_precision`,
as PyTorch's uses a matmul.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from ..precision import matmul_precision
from ..registry import aten, lower
from ._common import _acc


def _pnorm(diff, p):
    """The ``p``-norm over the last axis, with PyTorch's p = 0 (count of nonzeros) and p = inf (max) cases."""
    a = jnp.abs(diff)
    if p == 0:
        return jnp.sum((a != 0).astype(diff.dtype), axis=-1)
    if p == 1:
        return jnp.sum(a, axis=-1)
    if p == 2:
        return jnp.sqrt(jnp.sum(a * a, axis=-1))
    if math.isinf(p):
        return jnp.max(a, axis=-1, initial=0)
    return jnp.sum(a ** p, axis=-1) ** (1 / p)


def _pnorm_grad(grad, diff, dist, p):
    """PyTorch's ``d dist / d diff`` times ``grad`` (zero where ``dist`` is zero), ``dist`` broadcast over the last
    axis of ``diff``."""
    g, d = grad[..., None], dist[..., None]
    zero = jnp.zeros((), diff.dtype)
    if p == 0:
        return jnp.zeros_like(diff)
    if p == 1:
        return g * jnp.sign(diff)
    if p == 2:
        return jnp.where(d == 0, zero, g * diff / jnp.where(d == 0, 1, d))
    if math.isinf(p):
        return jnp.where(d == 0, zero, g * jnp.sign(diff) * (jnp.abs(diff) == d))
    safe = jnp.where(d == 0, 1, d)
    if p < 1:
        out = g * jnp.sign(diff) * jnp.abs(diff) ** (p - 1) / safe ** (p - 1)
        return jnp.where((d == 0) | (diff == 0), zero, out)
    if p < 2:
        out = g * jnp.sign(diff) * jnp.abs(diff) ** (p - 1) / safe ** (p - 1)
        return jnp.where(d == 0, zero, out)
    return jnp.where(d == 0, zero, g * diff * jnp.abs(diff) ** (p - 2) / safe ** (p - 1))


@lower(aten._cdist_forward)
def cdist_forward(x1, x2, p, compute_mode):
    """For p = 2 PyTorch uses the matrix-product form (``|a|^2 - 2ab + |b|^2``) when ``compute_mode`` is 1, or is
    None/0 and either side has more than 25 rows; we follow, since its rounding differs from the direct form."""
    x1, x2 = _acc(x1), _acc(x2)
    batch = jnp.broadcast_shapes(x1.shape[:-2], x2.shape[:-2])
    x1 = jnp.broadcast_to(x1, batch + x1.shape[-2:])
    x2 = jnp.broadcast_to(x2, batch + x2.shape[-2:])
    mm = compute_mode == 1 or (compute_mode in (None, 0) and (x1.shape[-2] > 25 or x2.shape[-2] > 25))
    if p == 2 and mm:
        n1 = jnp.sum(x1 * x1, axis=-1, keepdims=True)
        n2 = jnp.sum(x2 * x2, axis=-1, keepdims=True)
        prod = jnp.matmul(x1, jnp.swapaxes(x2, -1, -2), precision=matmul_precision())
        return jnp.sqrt(jnp.maximum(n1 - 2 * prod + jnp.swapaxes(n2, -1, -2), 0))
    return _pnorm(x1[..., :, None, :] - x2[..., None, :, :], p)


@lower(aten._cdist_backward)
def cdist_backward(grad, x1, x2, p, dist):
    batch = dist.shape[:-2]
    a = jnp.broadcast_to(_acc(x1), batch + x1.shape[-2:])
    b = jnp.broadcast_to(_acc(x2), batch + x2.shape[-2:])
    g = _pnorm_grad(_acc(grad), a[..., :, None, :] - b[..., None, :, :], _acc(dist), p)
    return jnp.sum(g, axis=-2)


def _pairs(n):
    return np.triu_indices(n, 1)


@lower(aten._pdist_forward)
def pdist_forward(x, p=2.0):
    i, j = _pairs(x.shape[0])
    x = _acc(x)
    return _pnorm(x[i] - x[j], p)


@lower(aten._pdist_backward)
def pdist_backward(grad, x, p, dist):
    i, j = _pairs(x.shape[0])
    xf = _acc(x)
    g = _pnorm_grad(_acc(grad), xf[i] - xf[j], _acc(dist), p)
    return jnp.zeros_like(xf).at[i].add(g).at[j].add(-g)
