"""Complex functions at infinities and NaNs as CPU's kernels give them.

CPU's complex kernels call C's ``cexp``/``clog`` (C99 Annex G), which define a result for every infinite or NaN
part; XLA's complex ``exp`` and ``log`` compute ``exp(re) * cis(im)`` and ``log|z| + i arg z`` and give NaN where C
gives an infinity or a zero (``exp(-inf + inf j)`` is 0 in C). A lowering that composes them handles those points
here, so ordinary values keep XLA's arithmetic and only the special ones are selected.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax


def is_nan(z):
    """Whether either part of ``z`` is NaN (``at::_isnan`` of a complex)."""
    return jnp.isnan(z.real) | jnp.isnan(z.imag)


def exp_of_infinite(z):
    """``cexp(z)`` for a real part of ``+inf``: ``inf * cis(imag)`` with a zero part where the cosine or sine is
    exactly zero (not ``inf * 0``), and ``(inf, nan)`` for an infinite or NaN imaginary part."""
    cos, sin = jnp.cos(z.imag), jnp.sin(z.imag)
    inf = jnp.asarray(jnp.inf, z.real.dtype)
    re = jnp.where(cos == 0, jnp.zeros_like(cos), inf * cos)
    im = jnp.where(sin == 0, jnp.zeros_like(sin), inf * sin)
    finite = jnp.isfinite(z.imag)
    return lax.complex(jnp.where(finite, re, inf), jnp.where(finite, im, jnp.nan))


def cexp(z):
    """C's ``cexp``: XLA's ``exp`` except for an infinite real part: ``-inf`` gives 0 whatever the imaginary part
    (XLA: NaN for an infinite or NaN one), ``+inf`` as :func:`exp_of_infinite`."""
    vanishes = (z.real == -jnp.inf) & ~jnp.isfinite(z.imag)
    out = jnp.where(vanishes, jnp.zeros_like(z), jnp.exp(z))
    return jnp.where(z.real == jnp.inf, exp_of_infinite(z), out)


def exp(x):
    """``torch.exp``: C's ``cexp`` for complex tensors, XLA's ``exp`` otherwise."""
    return cexp(x) if jnp.iscomplexobj(x) else jnp.exp(x)


def clog(z):
    """C's ``clog``: a real part of ``+inf`` wherever a part of ``z`` is infinite (XLA: NaN when the other is)."""
    infinite = jnp.isinf(z.real) | jnp.isinf(z.imag)
    return lax.complex(jnp.where(infinite, jnp.inf, jnp.log(jnp.abs(z))), jnp.arctan2(z.imag, z.real))


def logaddexp(x, y):
    """CPU's complex ``logaddexp`` (``_log_add_exp_helper``): ``log1p(exp(low - high)) + high`` with the operands
    ordered by real part, a NaN part making both parts NaN, and equal infinite real parts apart: ``-inf`` gives
    the lower operand, ``+inf`` the log of the sum of the exponentials."""
    y_nan, x_nan, x_lower = is_nan(y), is_nan(x), x.real < y.real
    low = jnp.where(y_nan, y, jnp.where(x_nan | x_lower, x, y))
    high = jnp.where(y_nan, y, jnp.where(x_nan | ~x_lower, x, y))
    usual = jnp.log1p(cexp(low - high)) + high
    same_infinity = ~jnp.isfinite(low.real) & (low.real == high.real)
    both_up = clog(exp_of_infinite(low) + exp_of_infinite(high))
    out = jnp.where(same_infinity, jnp.where(low.real < 0, low, both_up), usual)
    return jnp.where(is_nan(low), jnp.full_like(out, complex(jnp.nan, jnp.nan)), out)
