"""factories ops."""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from .registry import aten, lower


@lower(aten.full.default, static_scalars=True)
def full(size, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.full(tuple(size), fill_value)


@lower(aten.fill.Scalar, aten.fill.Tensor)
def fill(x, value):
    return jnp.full(x.shape, value, dtype=x.dtype)


@lower(aten.scalar_tensor.default)
def scalar_tensor(s, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.asarray(s)
