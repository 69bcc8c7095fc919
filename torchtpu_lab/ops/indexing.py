"""indexing ops."""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from .registry import aten, lower


@lower(aten.nonzero.default, jit=False)
def nonzero(x):
    return jnp.stack(jnp.nonzero(x), axis=-1).astype(jnp.int64).reshape(-1, x.ndim)
