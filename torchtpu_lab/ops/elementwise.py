"""Pointwise ops: arithmetic, comparisons, math functions, bitwise and logical ops."""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from .registry import aten, lower


@lower(aten.add.Tensor, aten.add.Scalar)
def add(x, y, alpha=1):
    return x + y * alpha if not (isinstance(alpha, int) and alpha == 1) else x + y


@lower(aten.sub.Tensor, aten.sub.Scalar)
def sub(x, y, alpha=1):
    return x - y * alpha if not (isinstance(alpha, int) and alpha == 1) else x - y


@lower(aten.rsub.Tensor, aten.rsub.Scalar)
def rsub(x, y, alpha=1):
    return y - x * alpha


@lower(aten.mul.Tensor, aten.mul.Scalar)
def mul(x, y):
    return x * y


@lower(aten.neg)
def neg(x):
    return -x


@lower(aten.exp)
def exp(x):
    return jnp.exp(x)


@lower(aten.where.self)
def where(cond, x, y):
    return jnp.where(cond, x, y)
