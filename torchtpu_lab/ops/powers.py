"""Powers: ``pow`` of tensors and numbers (integer powers by squaring, PyTorch's shortcuts for the exponents
its CPU kernel special-cases). Lowerings (pure JAX)."""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

import torch

from . import complex_special
from .elementwise import _is_int, _no_bool, _promote
from .error_flags import report, reports
from .registry import aten, fixes_meta, lower


def _int_pow(a, b):
    """Integer power by squaring (wrapping on overflow); negative exponents give 0 except for bases 1 and -1."""
    e = jnp.where(b < 0, 0, b)
    one = jnp.ones_like(a)

    def step(_, carry):
        result, base, e = carry
        result = jnp.where((e & 1) == 1, result * base, result)
        return result, base * base, e >> 1

    shape = jnp.broadcast_shapes(a.shape, b.shape)
    result, _, _ = lax.fori_loop(
        0, jnp.iinfo(a.dtype).bits, step, (jnp.broadcast_to(one, shape), jnp.broadcast_to(a, shape), e)
    )
    neg = jnp.where(a == 1, one, jnp.where(a == -1, jnp.where((b & 1) == 1, -one, one), jnp.zeros_like(a)))
    return jnp.where(b < 0, neg, result)


@lower(aten.pow.Tensor_Tensor, aten.pow.Scalar)
def power(x, y):
    return _power(x, y, bools=False)  # CPU has no bool pow of two tensors (a bool tensor ** a number: below)


def _power(x, y, bools: bool = True):
    x, y = _promote(x, y)
    if x.dtype == jnp.bool_:  # a bool tensor to a bool number: x ** True is x, x ** False is all True
        if not bools:
            _no_bool("pow", x)
        return x | ~y
    if _is_int(x):
        return _int_pow(x, y)
    return _general_power(x, y)


def _general_power(x, y):
    """``x ** y`` without a shortcut: XLA's, C's ``cpow`` for complex numbers (CPU's kernel calls it)."""
    return complex_special.cpow(x, y) if jnp.iscomplexobj(x) else jnp.power(x, y)


@fixes_meta(aten.pow.Tensor_Scalar)
def _bool_to_bool_power(op, args: list, kwargs: dict, meta):
    """A bool tensor to a bool power stays bool on CPU (``x ** True`` is ``x``, ``x ** False`` all True): its
    kernel promotes as ``result_type`` does, where PyTorch's meta kernel (the Python reference's bool-to-long
    promotion) says int64 — and an in-place ``pow_(True)`` of a bool tensor would then refuse the cast."""
    base, exponent = args[0], kwargs.get("exponent", args[1] if len(args) > 1 else None)
    if base.dtype == torch.bool and isinstance(exponent, bool):
        return meta.to(torch.bool)
    return meta


#: the exponents PyTorch computes without ``pow`` (``pow_Tensor_Scalar_out``'s 0 and 1, then its CPU kernel's
#: ``pow_tensor_scalar_optimized_kernel``)
#: (the sqrt, rsqrt and reciprocal lowerings' own functions: C's branch cuts and division for complex numbers)
_SPECIAL_POWERS = ((0, jnp.ones_like), (1, lambda x: x), (2, lambda x: x * x), (3, lambda x: x * x * x),
                   (0.5, complex_special.sqrt), (-0.5, complex_special.rsqrt), (-1, complex_special.reciprocal),
                   (-2, lambda x: complex_special.reciprocal(x * x)))


#: up to this many elements every candidate is computed and the exponent selects one (fused with its neighbours);
#: above it a ``lax.switch`` runs only the one it picks, a conditional of its own (~20-30 µs on XLA:CPU: several
#: per decode token of a small model, whose RMSNorms are a few hundred elements)
_SELECTED_POWERS_UP_TO = 16384


@lower(aten.pow.Tensor_Scalar)
@reports
def power_scalar(x, y):
    """``x ** y`` for a number ``y``, with PyTorch's shortcuts for the exponents it special-cases. ``y`` is a
    graph input (a new value compiles nothing), so the shortcut is picked when the program runs: a ``lax.switch``
    on the exponent. Models raise to fixed powers (``x.pow(2)`` in every RMSNorm, ``x ** 3`` in GPT-2's GELU),
    and XLA's general ``pow`` of an input exponent is 6x slower than ``x * x * x`` on XLA:CPU; the switch costs
    ~15 % over a constant exponent there. Small tensors select among all candidates instead (no conditional)."""
    base, exponent = _promote(x, y)
    if not jnp.issubdtype(base.dtype, jnp.inexact):
        if jnp.issubdtype(jnp.result_type(y), jnp.integer):  # the number is a graph input: checked as the op runs
            report(jnp.asarray(y) < 0, error=RuntimeError,
                   message="Integers to negative integer powers are not allowed.")
        return _power(x, y)
    # CPU's bfloat16 kernel multiplies in bfloat16 (``x * x * x`` rounds twice); its float16 kernel in float32
    own = base.astype(jnp.bfloat16) if jnp.result_type(x) == jnp.bfloat16 else base
    if isinstance(y, (int, float)) and not isinstance(y, bool):  # known when traced (a decomposition's constant)
        fn = next((fn for value, fn in _SPECIAL_POWERS if y == value), None)
        return _general_power(base, exponent) if fn is None else fn(own)
    # compared before the cast to the base's dtype, as PyTorch compares the Scalar itself
    if base.size <= _SELECTED_POWERS_UP_TO:
        out = _general_power(base, exponent)
        for value, fn in _SPECIAL_POWERS:
            out = jnp.where(y == value, fn(own), out)
        return out
    index = sum(jnp.where(y == value, k + 1, 0) for k, (value, _) in enumerate(_SPECIAL_POWERS))
    branches = [lambda b, o, e: _general_power(b, e)] + [lambda b, o, e, fn=fn: fn(o).astype(b.dtype)
                                                     for _, fn in _SPECIAL_POWERS]
    return lax.switch(index, branches, base, own, exponent)
