"""Helpers shared by several ``ops/nn`` modules (argument normalization, accumulation dtype, linear backward)."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def _tup(v, n):
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    return tuple(v * n if len(v) == 1 else v)


def _acc(x):
    """``x`` in the dtype PyTorch accumulates it in (float32 for half types)."""
    return x.astype(jnp.float32) if x.dtype in (jnp.float16, jnp.bfloat16) else x


def _linear_backward(forward, grad, x):
    _, vjp = jax.vjp(forward, _acc(x))
    return vjp(grad.astype(_acc(x).dtype))[0]
