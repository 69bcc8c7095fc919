"""reductions ops."""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from .registry import aten, lower


@lower(aten.sum.dim_IntList)
def sum_dim(x, dim=None, keepdim=False, *, dtype=None):
    axis = None if dim is None or len(dim) == 0 else tuple(dim)
    return jnp.sum(x, axis=axis, keepdims=keepdim)


@lower(aten.sum.default)
def sum_all(x, *, dtype=None):
    return jnp.sum(x)
