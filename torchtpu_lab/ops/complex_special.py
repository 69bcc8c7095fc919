"""Complex functions at infinities and NaNs as CPU's kernels give them.

CPU's complex kernels call C's ``cexp``/``csqrt``/``cabs``/``clog`` (C99 Annex G), which define a result for every
infinite or NaN part and follow the sign of a zero imaginary part across a branch cut; XLA's compute
``exp(re) * cis(im)``, ``log|z| + i arg z`` and the like, and give NaN where C gives an infinity or a zero
(``exp(-inf + inf j)`` is 0 in C) and ``+1.732j`` for ``sqrt(-3 - 0j)``. These functions keep XLA's arithmetic for
ordinary values and select C's results at the special points. A reciprocal (``rsqrt``, ``sigmoid``) divides
as ``c10::complex`` does (NumPy's scaled division), whose results at infinities are not C's either.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax

from . import exponentials


def is_nan(z):
    """Whether either part of ``z`` is NaN (``at::_isnan`` of a complex)."""
    return jnp.isnan(z.real) | jnp.isnan(z.imag)


def complex_or_real(complex_fn, real_fn):
    """A lowering's function: ``complex_fn`` for complex arrays, ``real_fn`` otherwise."""
    return lambda x: complex_fn(x) if jnp.iscomplexobj(x) else real_fn(x)


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


def _log_modulus64(z):
    """``log |z|`` of a complex64 as glibc's ``clogf`` takes it: the log of the correctly rounded modulus, and
    near ``|z| = 1`` half the ``log1p`` of ``x**2 + y**2 - 1`` (here in float64, rounded once). XLA's float32 real
    part was an ulp off CPU's for 28 % of values; 7 % now."""
    ax, ay = jnp.abs(z.real), jnp.abs(z.imag)
    big, small = jnp.maximum(ax, ay), jnp.minimum(ax, ay)
    b64, s64 = big.astype(jnp.float64), small.astype(jnp.float64)
    near_one = ((big == 1) | ((big > 1) & (big < 2) & (small < 1))
                | ((big >= 0.5) & (big < 1) & (b64 * b64 + s64 * s64 >= 0.5)))
    d2m1 = (b64 - 1) * (b64 + 1) + s64 * s64
    return jnp.where(near_one, (0.5 * jnp.log1p(d2m1)).astype(jnp.float32), jnp.log(_cabs(z)))


def clog(z):
    """C's ``clog``: XLA's ``log`` (its real part as glibc's for complex64), with a real part of ``+inf`` wherever
    a part of ``z`` is infinite (XLA: NaN when the other is NaN)."""
    infinite = jnp.isinf(z.real) | jnp.isinf(z.imag)
    special = lax.complex(jnp.full_like(z.real, jnp.inf), jnp.arctan2(z.imag, z.real))
    usual = jnp.log(z)
    if z.dtype == jnp.complex64:
        usual = lax.complex(_log_modulus64(z), usual.imag)
    return jnp.where(infinite, special, usual)


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


def _c_multiply(z, w):
    """C's complex ``*`` (GCC's ``__mulsc3``): each product rounded on its own (XLA:CPU fuses ``a*c - b*d`` into
    one rounding, which moves ``cpow``'s results by several ulps: the barrier keeps the products apart), and
    Annex G's recovery of an infinite product that the formula made ``nan + nan j``."""
    a, b, c, d = z.real, z.imag, w.real, w.imag
    ac, bd, ad, bc = lax.optimization_barrier((a * c, b * d, a * d, b * c))
    re, im = ac - bd, ad + bc

    def box(v, infinite):  # an infinite factor as a signed 1 or 0; NaNs in the other factor as signed zeros
        return jnp.copysign(jnp.where(infinite, 1, 0).astype(v.dtype), v)

    def zero_nan(v, when):
        return jnp.where(when & jnp.isnan(v), jnp.copysign(jnp.zeros_like(v), v), v)

    z_inf, w_inf = jnp.isinf(a) | jnp.isinf(b), jnp.isinf(c) | jnp.isinf(d)
    overflow = ~z_inf & ~w_inf & (jnp.isinf(ac) | jnp.isinf(bd) | jnp.isinf(ad) | jnp.isinf(bc))
    a2, b2 = jnp.where(z_inf, box(a, jnp.isinf(a)), a), jnp.where(z_inf, box(b, jnp.isinf(b)), b)
    c2, d2 = zero_nan(c, z_inf | overflow), zero_nan(d, z_inf | overflow)
    c2, d2 = jnp.where(w_inf, box(c2, jnp.isinf(c)), c2), jnp.where(w_inf, box(d2, jnp.isinf(d)), d2)
    a2, b2 = zero_nan(a2, w_inf | overflow), zero_nan(b2, w_inf | overflow)
    recalc = jnp.isnan(re) & jnp.isnan(im) & (z_inf | w_inf | overflow)
    inf = jnp.asarray(jnp.inf, re.dtype)
    re = jnp.where(recalc, inf * (a2 * c2 - b2 * d2), re)
    im = jnp.where(recalc, inf * (a2 * d2 + b2 * c2), im)
    return lax.complex(re, im)


def cpow(x, y):
    """C's ``cpow`` (glibc's ``cexp(y * clog(x))``, which CPU's complex ``pow`` calls): ``0 ** 0`` is NaN there
    (XLA: 1), and ``(-501 - 501j) ** (-501 + 501j)`` 0 (XLA: NaN)."""
    x, y = jnp.broadcast_arrays(x, y)
    return cexp(_c_multiply(y, clog(x)))


def _cexp2(z):
    """``cexp(z * ln 2)`` (XLA's ``exp2`` gives NaN at a real part of ``-inf``)."""
    ln2 = jnp.asarray(0.6931471805599453, z.real.dtype)
    return cexp(lax.complex(z.real * ln2, z.imag * ln2))  # a complex product would make NaNs of infinities


def _cabs(x):
    """C's ``cabs`` (``hypot``): ``inf`` when a part is infinite, even with a NaN other part (XLA: NaN), and a
    complex64's modulus rounded once from float64 parts (``hypot`` is correctly rounded; XLA's float32 modulus is
    an ulp off for some values, ``|-3 + 0.5j|`` one of them; no complex128, which a TPU lacks, and no overflow:
    a float32's square fits a float64)."""
    if x.dtype == jnp.complex64:
        re, im = x.real.astype(jnp.float64), x.imag.astype(jnp.float64)
        modulus = jnp.sqrt(re * re + im * im).astype(jnp.float32)
    else:
        modulus = jnp.abs(x)
    infinite = jnp.isinf(x.real) | jnp.isinf(x.imag)
    return jnp.where(infinite, jnp.asarray(jnp.inf, x.real.dtype), modulus)


def _upper_csqrt(z):
    """``csqrt`` of ``z`` with a non-negative imaginary part (its sign folded away by :func:`sqrt`): XLA's value,
    and C's at infinities: ``inf + inf j`` for an infinite imaginary part whatever the real one, ``0 + inf j``
    for a real part of ``-inf`` (``nan + inf j`` with a NaN imaginary part), ``inf + 0j`` for ``+inf``
    (``inf + nan j``)."""
    re, im = z.real, z.imag
    inf, nan, zero = (jnp.full_like(re, v) for v in (jnp.inf, jnp.nan, 0.0))
    finite_im = jnp.isfinite(im)
    out = jnp.sqrt(z)
    out = jnp.where((re == -inf) & finite_im, lax.complex(zero, inf), out)
    out = jnp.where((re == -inf) & jnp.isnan(im), lax.complex(nan, inf), out)
    out = jnp.where((re == inf) & finite_im, lax.complex(inf, zero), out)
    out = jnp.where((re == inf) & jnp.isnan(im), lax.complex(inf, nan), out)
    return jnp.where(jnp.isinf(im), lax.complex(inf, im), out)


def _conjugate_symmetric(f):
    """``f`` for a function with ``f(conj z) == conj f(z)`` (``sqrt``, ``acos``, ``acosh``): computed on
    ``conj z`` where ``z``'s imaginary part has its sign bit set, so the branch cut on the real axis follows the
    sign of a zero imaginary part (``sqrt(-3 - 0j)`` is ``-1.732j`` in C; XLA gives ``+1.732j``)."""
    def folded(z):
        w = f(lax.complex(z.real, jnp.abs(z.imag)))
        return jnp.where(jnp.signbit(z.imag), jnp.conj(w), w)
    return folded


def _odd_and_conjugate_symmetric(f):
    """``f`` for an odd function with ``f(conj z) == conj f(z)`` that maps the first quadrant into itself
    (``asin``, ``asinh``, ``atanh``): computed there and given the signs of ``z``'s parts, so both cuts follow
    the sign of a zero part."""
    def folded(z):
        w = f(lax.complex(jnp.abs(z.real), jnp.abs(z.imag)))
        return lax.complex(jnp.copysign(w.real, z.real), jnp.copysign(w.imag, z.imag))
    return folded


_csqrt = _conjugate_symmetric(_upper_csqrt)


def divide(x, z):
    """``x / z`` as ``c10::complex``'s division computes it (NumPy's, Smith's: scaled by the larger part), which
    CPU's complex kernels use (``div``, ``reciprocal``, ``rsqrt``, ``sigmoid``): ``1 / (0 - inf j)`` is
    ``-0 + 0j``, ``1 / (inf - inf j)`` NaN, ``1 / 0`` is ``inf + nan j``, ``1 / (1e30 j)`` keeps its last bits
    (XLA's division, ``x * conj(z) / |z|**2``, loses them, and gives ``-inf`` for ``1 / (-0 + 0j)``)."""
    x, z = jnp.broadcast_arrays(x, z)
    a, b, c, d = x.real, x.imag, z.real, z.imag  # the numerator's parts stay in every term, for NaN's sake
    c_larger = jnp.abs(c) >= jnp.abs(d)
    both_zero = (c == 0) & (d == 0)
    rat = jnp.where(c_larger, d / c, c / d)
    scale = 1 / jnp.where(c_larger, c + d * rat, d + c * rat)
    re = jnp.where(c_larger, (a + b * rat) * scale, (a * rat + b) * scale)
    im = jnp.where(c_larger, (b - a * rat) * scale, (b * rat - a) * scale)
    re = jnp.where(both_zero, a / jnp.abs(c), re)
    im = jnp.where(both_zero, b / jnp.abs(d), im)
    return lax.complex(re, im)


def _reciprocal(z):
    return divide(jnp.ones_like(z), z)


def _sin_cos(y):
    """``(sin y, cos y)``, with ``(y, 1)`` for a ``|y|`` below the smallest normal (glibc's shortcut)."""
    tiny = jnp.abs(y) <= jnp.finfo(y.dtype).tiny
    return jnp.where(tiny, y, jnp.sin(y)), jnp.where(tiny, 1, jnp.cos(y))


def _ctanh(z):
    """C's ``ctanh`` (glibc's, which CPU's complex ``tanh`` calls):
    ``(sinh x cosh x + i sin y cos y) / (sinh(x)**2 + cos(y)**2)``, a denominator without cancellation (XLA's
    ``cosh 2x + cos 2y`` loses digits near the poles at ``y = pi/2 + k pi``: 5e-6 relative for complex64), scaled
    past ``|x| > t`` so nothing overflows, and C's values at infinities and NaNs."""
    x, y = z.real, z.imag
    info = jnp.finfo(x.dtype)
    t = 44 if x.dtype == jnp.float32 else 354  # int((max_exp - 1) * ln 2 / 2), glibc's
    small_x = jnp.abs(x) <= info.tiny
    sin_y, cos_y = _sin_cos(y)
    sh = jnp.where(small_x, x, exponentials.sinh(x))
    ch = jnp.where(small_x, 1, exponentials.cosh(x))
    den = jnp.where(jnp.abs(sh) > jnp.abs(cos_y) * info.eps, sh * sh + cos_y * cos_y, cos_y * cos_y)
    re, im = sh * ch / den, sin_y * cos_y / den
    far = jnp.abs(x) - t  # |x| > t: the real part is +-1, the imaginary 4 sin y cos y / exp(2 |x|), in two steps
    exp_2t = jnp.asarray(math.exp(2 * t), x.dtype)
    tail = 4 * sin_y * cos_y / exp_2t
    tail = jnp.where(far > t, tail / exp_2t, tail / jnp.exp(2 * jnp.minimum(far, t)))
    one = jnp.copysign(jnp.ones_like(x), x)
    re, im = jnp.where(far > 0, one, re), jnp.where(far > 0, tail, im)
    # an infinite real part: +-1 with a signed zero; else a zero imaginary part keeps z; else NaN (0 stays 0)
    wide = jnp.isfinite(y) & (jnp.abs(y) > 1)
    inf_im = jnp.copysign(jnp.zeros_like(y), jnp.where(wide, jnp.sin(y) * jnp.cos(y), y))
    odd_re = jnp.where(jnp.isinf(x), one, jnp.where((y == 0) | (x == 0), x, jnp.nan))
    odd_im = jnp.where(jnp.isinf(x), inf_im, jnp.where(y == 0, y, jnp.nan))
    finite = jnp.isfinite(x) & jnp.isfinite(y)
    return lax.complex(jnp.where(finite, re, odd_re), jnp.where(finite, im, odd_im))


def _hyperbolic(z, odd: bool):
    """C's ``csinh`` (``odd``) or ``ccosh`` (glibc's, which CPU's complex kernels call):
    ``sinh x cos y + i cosh x sin y`` (``cosh x cos y + i sinh x sin y``) with float32 ``sinh``/``cosh`` within 3 ulps
    (XLA's complex ones were 12 ulps off at ``x = 50``), scaled past ``|x| > t`` where ``cosh x`` alone would
    overflow, and C's values at infinities and NaNs."""
    x, y = z.real, z.imag
    t = 88 if x.dtype == jnp.float32 else 709  # int((max_exp - 1) * ln 2), glibc's
    sin_y, cos_y = _sin_cos(y)
    sh, ch = exponentials.sinh(x), exponentials.cosh(x)
    re, im = (sh * cos_y, ch * sin_y) if odd else (ch * cos_y, sh * sin_y)
    # |x| > t: exp(t) / 2 * exp(|x| - t) times cis(y) (the sign of x on the odd part); past 2t it overflows
    # (glibc's further steps give inf, or the factor's own zero): selected, not multiplied out, as XLA would fold
    # the constant factors into an infinity that makes 0 * inf of a zero factor
    neg = jnp.signbit(x)
    big_cos = (jnp.where(neg, -cos_y, cos_y) if odd else cos_y) * jnp.asarray(math.exp(t) / 2, x.dtype)
    big_sin = (sin_y if odd else jnp.where(neg, -sin_y, sin_y)) * jnp.asarray(math.exp(t) / 2, x.dtype)
    rx = jnp.abs(x) - t
    grow = jnp.exp(jnp.minimum(rx, t))
    beyond = rx > t

    def scaled(v):
        return jnp.where(beyond, jnp.where(v == 0, v, jnp.copysign(jnp.inf, v)), v * grow)

    far = rx > 0
    re, im = jnp.where(far, scaled(big_cos), re), jnp.where(far, scaled(big_sin), im)
    # C's special values
    inf, nan = jnp.full_like(x, jnp.inf), jnp.full_like(x, jnp.nan)
    sign_x = jnp.copysign(jnp.ones_like(x), x)
    y_nan = y - y  # NaN for an infinite or NaN y
    if odd:
        finite_x_re = jnp.where(x == 0, jnp.copysign(jnp.zeros_like(x), x), nan)
        finite_x_im = jnp.where(x == 0, y_nan, nan)
        inf_re = jnp.where(y == 0, sign_x * inf, jnp.where(jnp.isfinite(y), sign_x * jnp.copysign(inf, cos_y), inf))
        inf_im = jnp.where(y == 0, y, jnp.where(jnp.isfinite(y), jnp.copysign(inf, sin_y), y_nan))
    else:
        finite_x_re = y_nan
        finite_x_im = jnp.where(x == 0, jnp.zeros_like(x), nan)
        inf_re = jnp.where((y == 0) | ~jnp.isfinite(y), inf, jnp.copysign(inf, cos_y))
        inf_im = jnp.where(y == 0, y * sign_x, jnp.where(jnp.isfinite(y), jnp.copysign(inf, sin_y) * sign_x, y_nan))
    nan_im = jnp.where(y == 0, y, nan)
    finite_y = jnp.isfinite(y)
    odd_re = jnp.where(jnp.isinf(x), inf_re, jnp.where(jnp.isnan(x), nan, finite_x_re))
    odd_im = jnp.where(jnp.isinf(x), inf_im, jnp.where(jnp.isnan(x), nan_im, finite_x_im))
    usual = jnp.isfinite(x) & finite_y
    return lax.complex(jnp.where(usual, re, odd_re), jnp.where(usual, im, odd_im))


def _csinh(z):
    return _hyperbolic(z, odd=True)


def _ccosh(z):
    return _hyperbolic(z, odd=False)


def _times_i(z):
    return lax.complex(-z.imag, z.real)


def _rotated(g):
    """C's ``f(z) = -i g(i z)`` (``csin`` of ``csinh``, ``ctan`` of ``ctanh``, ``catan`` of ``catanh``)."""
    def f(z):
        w = g(_times_i(z))
        return lax.complex(w.imag, -w.real)
    return f


_csin = _rotated(_csinh)


def _ccos(z):
    """C's ``ccos(z) = ccosh(i z)``."""
    return _ccosh(_times_i(z))


_ctan = _rotated(_ctanh)


def _first_quadrant_catanh(z):
    """C's ``catanh`` for ``z`` in the first quadrant: XLA's ``arctanh`` for finite parts; ``0 + i pi/2`` for an
    infinite part, ``0 + i NaN`` for ``inf + i NaN`` and for ``0 + i NaN``, NaN otherwise."""
    a, b = z.real, z.imag
    zero, nan, half_pi = (jnp.full_like(a, v) for v in (0.0, jnp.nan, jnp.pi / 2))
    special = lax.complex(jnp.where(jnp.isinf(b) | jnp.isinf(a) | (a == 0), zero, nan),
                          jnp.where(jnp.isinf(b) | (jnp.isinf(a) & ~jnp.isnan(b)), half_pi, nan))
    return jnp.where(jnp.isfinite(a) & jnp.isfinite(b), jnp.arctanh(z), special)


_catanh = _odd_and_conjugate_symmetric(_first_quadrant_catanh)


_catan = _rotated(_catanh)


# The lowerings' functions: C's results (CPU's, for rsqrt and sigmoid) for complex tensors, and for real ones
# XLA's, or exponentials' where XLA's lose ulps
exp = complex_or_real(cexp, jnp.exp)
exp2 = complex_or_real(_cexp2, exponentials.exp2)
abs = complex_or_real(_cabs, jnp.abs)  # noqa: A001 — torch.abs
sqrt = complex_or_real(_csqrt, jnp.sqrt)
rsqrt = complex_or_real(lambda z: _reciprocal(_csqrt(z)), lax.rsqrt)  # CPU's 1 / sqrt(z)
sigmoid = complex_or_real(lambda z: _reciprocal(1 + cexp(-z)), jax.nn.sigmoid)  # CPU's 1 / (1 + exp(-z))
acos = complex_or_real(_conjugate_symmetric(jnp.arccos), jnp.arccos)
acosh = complex_or_real(_conjugate_symmetric(jnp.arccosh), jnp.arccosh)
asin = complex_or_real(_odd_and_conjugate_symmetric(jnp.arcsin), jnp.arcsin)
asinh = complex_or_real(_odd_and_conjugate_symmetric(jnp.arcsinh), jnp.arcsinh)
atanh = complex_or_real(_catanh, jnp.arctanh)
atan = complex_or_real(_catan, jnp.arctan)
tanh = complex_or_real(_ctanh, jnp.tanh)
tan = complex_or_real(_ctan, jnp.tan)
log = complex_or_real(clog, jnp.log)
sinh = complex_or_real(_csinh, exponentials.sinh)
cosh = complex_or_real(_ccosh, exponentials.cosh)
sin = complex_or_real(_csin, jnp.sin)
cos = complex_or_real(_ccos, jnp.cos)
reciprocal = complex_or_real(_reciprocal, lambda x: 1 / x)
