"""Helpers shared by several ``ops/nn`` modules (argument normalization, accumulation dtype, linear backward)."""

from __future__ import annotations

import jax

from ..precision import opmath as _acc  # noqa: F401  (the ops/nn modules import it from here)


def _tup(v, n):
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    return tuple(v * n if len(v) == 1 else v)


def _linear_backward(forward, grad, x):
    _, vjp = jax.vjp(forward, _acc(x))
    return vjp(grad.astype(_acc(x).dtype))[0]
