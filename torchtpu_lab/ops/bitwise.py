"""Logical and bitwise ops, shifts, ``gcd``/``lcm``: the integer and bool ops. Lowerings (pure JAX), with the
operands promoted as PyTorch promotes them (:func:`.elementwise._promote`)."""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from .elementwise import _div_trunc, _promote
from .registry import aten, lower


@lower(aten.logical_not)
def logical_not(x):
    return x == 0


@lower(aten.logical_and)
def logical_and(x, y):
    return (x != 0) & (y != 0)


@lower(aten.logical_or)
def logical_or(x, y):
    return (x != 0) | (y != 0)


@lower(aten.logical_xor)
def logical_xor(x, y):
    return (x != 0) ^ (y != 0)


@lower(aten.bitwise_not)
def bitwise_not(x):
    return ~x


def _bitwise(op, fn):
    p = getattr(aten, op)
    lower(p.Tensor, p.Scalar, p.Scalar_Tensor)(lambda x, y: fn(*_promote(x, y)))


for _name, _bit in [("bitwise_and", jnp.bitwise_and), ("bitwise_or", jnp.bitwise_or),
                    ("bitwise_xor", jnp.bitwise_xor)]:
    _bitwise(_name, _bit)


def _shift_left(x, y):
    """``x << y``, 0 where the shift is negative or at least the bit width (PyTorch)."""
    x, y = jnp.broadcast_arrays(*_promote(x, y))
    bits = jnp.iinfo(x.dtype).bits
    bad = (y < 0) | (y >= bits)
    return jnp.where(bad, jnp.zeros_like(x), lax.shift_left(x, jnp.where(bad, 0, y).astype(x.dtype)))


def _shift_right(x, y):
    """Arithmetic ``x >> y``; a negative or too-wide shift shifts by ``bits - 1`` (0 for unsigned types)."""
    x, y = jnp.broadcast_arrays(*_promote(x, y))
    bits = jnp.iinfo(x.dtype).bits
    bad = (y < 0) | (y >= bits)
    if jnp.issubdtype(x.dtype, jnp.unsignedinteger):
        return jnp.where(bad, jnp.zeros_like(x), lax.shift_right_logical(x, jnp.where(bad, 0, y).astype(x.dtype)))
    return lax.shift_right_arithmetic(x, jnp.where(bad, bits - 1, y).astype(x.dtype))


lower(aten.bitwise_left_shift.Tensor, aten.bitwise_left_shift.Tensor_Scalar,
      aten.bitwise_left_shift.Scalar_Tensor, aten.__lshift__.Tensor, aten.__lshift__.Scalar)(_shift_left)
lower(aten.bitwise_right_shift.Tensor, aten.bitwise_right_shift.Tensor_Scalar,
      aten.bitwise_right_shift.Scalar_Tensor, aten.__rshift__.Tensor, aten.__rshift__.Scalar)(_shift_right)


@lower(aten.gcd)
def gcd(x, y):
    return jnp.gcd(*_promote(x, y))


@lower(aten.lcm)
def lcm(x, y):
    x, y = _promote(x, y)
    g = jnp.gcd(x, y)
    safe = jnp.where(g == 0, jnp.ones_like(g), g)
    return jnp.where(g == 0, jnp.zeros_like(g), jnp.abs(_div_trunc(x, safe) * y))
