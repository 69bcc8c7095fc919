"""Pointwise ops: arithmetic, comparisons, math functions, bitwise and logical ops.

Binary ops first bring their operands to the dtype PyTorch would compute in (:func:`_promote`: PyTorch's
promotion rules, where a dimensioned tensor outranks a 0-dim one, which outranks a Python scalar of the same
category), so values match CPU even where JAX's own promotion would differ (``nextafter``, integer division).
Unary float math computes integer inputs in the default float dtype, as PyTorch does.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import jax.scipy.special as jsp
from jax import lax
import torch
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND as _KIND
from torch._prims_common import elementwise_dtypes

from .. import dtypes
from . import complex_special
from .error_flags import report, reports
from .precision import HALF_TYPES
from .registry import NoKernel, aten, checks_args, lower

# ---- promotion helpers -------------------------------------------------------------------------------------


def _sample(x):
    """A stand-in PyTorch's promotion logic accepts: a Python scalar, or a meta tensor of ``x``'s dtype/rank."""
    if isinstance(x, (bool, int, float, complex)):
        return x
    x = jnp.asarray(x)
    dt = dtypes.to_torch(x.dtype)
    if getattr(x, "weak_type", False):  # a Scalar argument, traced
        return 1j if dt.is_complex else 1.0 if dt.is_floating_point else True if dt == torch.bool else 1
    return torch.empty((1,) * x.ndim, dtype=dt, device="meta")


def _promote(*xs, kind=_KIND.DEFAULT, rounds: bool = True, opmath: bool = True):
    """``xs`` as JAX arrays of the dtype PyTorch computes this op in. Where that is float32 for a half-type
    result, each operand is first rounded to the half type: CPU's TensorIterator casts every operand, a Python
    number or a 0-dim tensor too, to the common dtype before the kernel reads it (``bf16 + 1.7`` adds 1.703125).
    ``mul``, ``div`` and the ops with a scaling number (``lerp``, ``addcmul``) read the number's own value in
    float32 instead (``rounds=False``). Kernels that compute in the half type itself take ``opmath=False``."""
    samples = [_sample(x) for x in xs]
    compute = dtypes.to_jax(elementwise_dtypes(*samples, type_promotion_kind=kind)[0])
    common = dtypes.to_jax(elementwise_dtypes(*samples, type_promotion_kind=_KIND.NO_OPMATH)[1])
    half = common in HALF_TYPES and compute != common
    first = common if half and rounds else compute
    compute = common if half and not opmath else compute
    out = tuple(jnp.asarray(x).astype(first).astype(compute) for x in xs)
    return out if len(out) > 1 else out[0]


def _float(*xs, rounds: bool = True, opmath: bool = True):
    """Like :func:`_promote`, with integers and bools computed in the default float dtype."""
    return _promote(*xs, kind=_KIND.INT_TO_FLOAT, rounds=rounds, opmath=opmath)


def _is_number(x) -> bool:
    """Whether ``x`` is a Python number (as given, or traced as a graph input: weakly typed)."""
    return isinstance(x, (bool, int, float, complex)) or getattr(x, "weak_type", False)


def _is_int(x) -> bool:
    return not jnp.issubdtype(x.dtype, jnp.inexact)


def _no_kernel_for(kernel: str, x, refused) -> None:
    """PyTorch's CPU kernel has no version for ``x``'s dtype where ``refused(x)``: raise its error, never a number
    (:class:`~.registry.NoKernel`: not run on the CPU instead, which would only raise it again)."""
    if refused(x):
        raise NoKernel(f'"{kernel}" not implemented for \'{dtypes.scalar_name(x.dtype)}\'')


def _floating_only(kernel: str, x) -> None:
    """No integer or bool version (``lerp``, ``frac``, ``nextafter``)."""
    _no_kernel_for(kernel, x, _is_int)


def _no_bool(kernel: str, x) -> None:
    """No bool version (``remainder``, ``fmod``, ``pow`` of tensors)."""
    _no_kernel_for(kernel, x, lambda v: v.dtype == jnp.bool_)


# ---- arithmetic ---------------------------------------------------------------------------------------------


@checks_args(aten.add.Tensor, aten.add.Scalar)
def _alpha_fits(op, x, y, alpha=1) -> None:
    """CPU's ``alpha_check`` (PyTorch's Python reference raises a ValueError of its own wording, or nothing)."""
    result = torch.result_type(x, y)
    if isinstance(alpha, bool) and result != torch.bool:
        raise RuntimeError("Boolean alpha only supported for Boolean results.")
    if isinstance(alpha, float) and not (result.is_floating_point or result.is_complex):
        raise RuntimeError("For integral input tensors, argument alpha must not be a floating point number.")
    if isinstance(alpha, complex) and not result.is_complex:
        raise RuntimeError("For non-complex input tensors, argument alpha must not be a complex number.")


_BOOL_SUBTRACTION = ("Subtraction, the `-` operator, with a bool tensor is not supported. "
                     "If you are trying to invert a mask, use the `~` or `logical_not()` operator instead.")


@functools.cache
def _bool_subtraction_error() -> type[Exception]:
    """The exception class for a bool subtraction: CPU's ``sub_check`` raises ``RuntimeError`` up to torch 2.13
    and ``NotImplementedError`` from 2.14 (asked of PyTorch's own meta kernel, which runs the same check). The
    latter as :class:`NoKernel`, which reaches the caller as PyTorch's plain ``NotImplementedError``: any other
    ``NotImplementedError`` from a lowering's checks means "not covered here" and would run the op on the CPU."""
    b = torch.empty(1, dtype=torch.bool, device="meta")
    try:
        torch.sub(b, b)
    except NotImplementedError:
        return NoKernel
    except Exception as e:  # noqa: BLE001 — whatever class it is, that is the answer
        return type(e)
    return RuntimeError


@checks_args(aten.sub.Tensor, aten.sub.Scalar, aten.rsub.Tensor, aten.rsub.Scalar)
def _no_bool_subtraction(op, x, y, alpha=1) -> None:
    """CPU's ``sub_check`` (in its kernel: PyTorch's meta kernel makes it for two tensors only), at the call,
    not when a fused graph runs; then the alpha checks."""
    bools = [t.dtype == torch.bool if isinstance(t, torch.Tensor) else isinstance(t, bool) for t in (x, y)]
    if all(bools):
        raise _bool_subtraction_error()("Subtraction, the `-` operator, with two bool tensors is not supported. "
                                        "Use the `^` or `logical_xor()` operator instead.")
    if any(bools):
        raise _bool_subtraction_error()(_BOOL_SUBTRACTION)
    _alpha_fits(op, x, y, alpha)


def _check_sub(x, y) -> None:
    """The same check where a lowering is called without the op's argument check (a foreach op's per-tensor
    lowering, ``_foreach_sub(xs, True)``): raised while the op is traced."""
    if jnp.result_type(x) == jnp.bool_ or jnp.result_type(y) == jnp.bool_:
        raise _bool_subtraction_error()(_BOOL_SUBTRACTION)


def _plus_scaled(x, y, alpha):
    """``x + alpha * y`` as CPU's kernels compute it (``sub`` with ``-alpha``). A complex ``alpha`` multiplies
    even when it is 1, as ``c10::complex`` does: ``(1 + 0j) * (inf + 1j)`` is ``inf + nan j``, so CPU's
    ``(inf + 1j) + (inf + 1j)`` is ``inf + nan j``; XLA folds a constant factor of 1 away."""
    x, y, alpha = _promote(x, y, alpha)
    if not jnp.iscomplexobj(y):
        return x + y * alpha
    a = jnp.asarray(alpha, y.dtype)
    return x + lax.complex(y.real * a.real - y.imag * a.imag, y.real * a.imag + y.imag * a.real)


@lower(aten.add.Tensor, aten.add.Scalar)
def add(x, y, alpha=1):
    px, py, palpha = _promote(x, y, alpha)
    return _plus_scaled(x, y, alpha) if jnp.iscomplexobj(px) else px + py * palpha


# sub(x, y, alpha) is CPU's add(x, y, -alpha): the number negated before it becomes complex ((-1 + 0j), not -0j)
@lower(aten.sub.Tensor, aten.sub.Scalar)
def sub(x, y, alpha=1):
    _check_sub(x, y)
    px, py, palpha = _promote(x, y, alpha)
    return _plus_scaled(x, y, -alpha) if jnp.iscomplexobj(px) else px - py * palpha


@lower(aten.rsub.Tensor, aten.rsub.Scalar)
def rsub(x, y, alpha=1):
    _check_sub(x, y)
    px, py, palpha = _promote(x, y, alpha)
    return _plus_scaled(y, x, -alpha) if jnp.iscomplexobj(px) else py - px * palpha


@lower(aten.mul.Tensor, aten.mul.Scalar)
def mul(x, y):
    x, y = _promote(x, y, rounds=False)
    if x.dtype == jnp.bool_:
        return x & y
    return x * y


def _no_int_zero_division(x, y) -> None:
    """Integer division by zero is an error on CPU (``ZeroDivisionError``); XLA would return garbage."""
    if _is_int(x) and x.dtype != jnp.bool_:
        report(y == 0, error=RuntimeError, message="ZeroDivisionError")


def _divisor_array(x, y):
    """``x`` and ``y`` broadcast together, ``y`` kept an array XLA cannot see through: its simplifier turns a
    division by a broadcast value into a product with the reciprocal, one ulp off a true quotient, which a
    truncated or floored quotient turns into a whole unit at an exact boundary (``8.5 // 1.7`` gave 4, CPU 5)."""
    x, wide = jnp.broadcast_arrays(x, y)
    return x, (wide if jnp.shape(y) == wide.shape else lax.optimization_barrier(wide))


def _div_trunc(x, y):
    x, y = _divisor_array(x, y)
    if _is_int(x):
        _no_int_zero_division(x, y)
        return lax.div(x, y)  # C division: rounds toward zero
    return jnp.trunc(x / y)


def _div_floor(x, y):
    """PyTorch's floor division: Python semantics for integers; for floats, ``c10::div_floor_floating``."""
    x, y = _divisor_array(x, y)
    if _is_int(x):
        _no_int_zero_division(x, y)
        q = lax.div(x, y)
        r = lax.rem(x, y)
        return jnp.where((r != 0) & ((r < 0) != (y < 0)), q - 1, q)
    mod = lax.rem(x, y)
    div = (x - mod) / y
    div = jnp.where((mod != 0) & ((y < 0) != (mod < 0)), div - 1, div)
    floordiv = jnp.floor(div)
    floordiv = jnp.where(div - floordiv > 0.5, floordiv + 1, floordiv)
    floordiv = jnp.where(div == 0, jnp.copysign(jnp.zeros_like(div), x / y), floordiv)
    return jnp.where(y == 0, x / y, floordiv)


@lower(aten.div.Tensor, aten.div.Scalar)
def div(x, y):
    x, y = _float(x, y, rounds=False)
    return complex_special.divide(x, y) if jnp.iscomplexobj(x) else x / y


def _rounded_division_operands(kernel: str, x, y):
    """CPU's truncated and floored division of a half type reads a number divisor in float32 and computes there,
    but divides two tensors in the half type itself (the quotient rounded before it is truncated); no bool one."""
    x, y = _promote(x, y, rounds=False, opmath=_is_number(y))
    _no_bool(kernel, x)
    return x, y


@lower(aten.div.Tensor_mode, aten.div.Scalar_mode)
@reports
def div_mode(x, y, *, rounding_mode=None):
    if rounding_mode is None:
        return div(x, y)
    x, y = _rounded_division_operands(f"div_{rounding_mode}_cpu", x, y)
    return _div_trunc(x, y) if rounding_mode == "trunc" else _div_floor(x, y)


@checks_args(aten.floor_divide.default, aten.floor_divide.Scalar)
def _no_bool_floor_divide(op, x, y) -> None:
    """CPU's error (PyTorch's meta kernel raises a RuntimeError of its own wording first)."""
    if torch.result_type(x, y) == torch.bool:
        raise NoKernel('"div_floor_cpu" not implemented for \'Bool\'')


@lower(aten.floor_divide.default, aten.floor_divide.Scalar)
@reports
def floor_divide(x, y):
    return _div_floor(*_rounded_division_operands("div_floor_cpu", x, y))


@lower(aten.remainder.Tensor, aten.remainder.Scalar, aten.remainder.Scalar_Tensor)
@reports
def remainder(x, y):
    """Python's modulus: the result takes the sign of the divisor."""
    x, y = _promote(x, y)
    _no_bool("remainder_cpu", x)
    _no_int_zero_division(x, y)
    r = jnp.fmod(x, y)
    return jnp.where((r != 0) & ((r < 0) != (y < 0)), r + y, r)


@lower(aten.fmod.Tensor, aten.fmod.Scalar)
@reports
def fmod(x, y):
    """C's fmod: the result takes the sign of the dividend."""
    x, y = _promote(x, y)
    _no_bool("fmod_cpu", x)
    _no_int_zero_division(x, y)
    return jnp.fmod(x, y)


@lower(aten.neg)
def neg(x):
    return -x


@lower(aten.abs)
def absolute(x):
    return complex_special.abs(x)


@checks_args(aten.abs_.default)
def _abs_in_place_args(op, x) -> None:
    if x.is_complex():  # the float result would be cast back into the complex tensor
        raise RuntimeError("In-place abs is not supported for complex tensors.")


@lower(aten.reciprocal)
def reciprocal(x):
    return complex_special.reciprocal(_float(x))


@lower(aten.sign, aten.sgn)
def sign(x):
    """Zero for NaN, as PyTorch's ``(0 < x) - (x < 0)``."""
    if x.dtype == jnp.bool_:
        return x
    if jnp.issubdtype(x.dtype, jnp.complexfloating):
        return jnp.where(x == 0, 0, x / jnp.abs(x))
    return (x > 0).astype(x.dtype) - (x < 0).astype(x.dtype)


@lower(aten.signbit)
def signbit(x):
    return jnp.signbit(x) if not _is_int(x) else x < 0


@lower(aten.lerp.Scalar, aten.lerp.Tensor)
def lerp(x, end, weight):
    """PyTorch's two-sided formula, exact at both ends."""
    _floating_only("lerp_kernel_scalar" if _is_number(weight) else "lerp_kernel_tensor", jnp.asarray(x))
    x, end, weight = _promote(x, end, weight, rounds=False)
    diff = end - x
    return jnp.where(jnp.abs(weight) < 0.5, x + weight * diff, end - diff * (1 - weight))


@lower(aten.addcmul)
def addcmul(x, t1, t2, *, value=1):
    x, t1, t2, value = _promote(x, t1, t2, value, rounds=False)
    return x + value * t1 * t2


@checks_args(aten.addcdiv)
def _no_integer_addcdiv(op, x, t1, t2, *, value=1) -> None:
    """CPU's error (PyTorch's meta kernel raises it with a tuple for its message)."""
    if not (t1.is_floating_point() or t1.is_complex()) and not (t2.is_floating_point() or t2.is_complex()):
        raise RuntimeError(
            "Integer division with addcdiv is no longer supported, and in a future  release addcdiv will perform a "
            "true division of tensor1 and tensor2. The historic addcdiv behavior can be implemented as (input + "
            "value * torch.trunc(tensor1 / tensor2)).to(input.dtype) for integer inputs and as (input + value * "
            "tensor1 / tensor2) for float inputs. The future addcdiv behavior is just the latter implementation: "
            "(input + value * tensor1 / tensor2), for all dtypes.")


@lower(aten.addcdiv)
def addcdiv(x, t1, t2, *, value=1):
    x, t1, t2, value = _promote(x, t1, t2, value, rounds=False)
    return x + value * (t1 / t2)


# ---- rounding -----------------------------------------------------------------------------------------------


def _int_identity(fn):
    return lambda x: x if _is_int(x) else fn(x)


lower(aten.ceil)(_int_identity(jnp.ceil))
lower(aten.floor)(_int_identity(jnp.floor))
lower(aten.trunc)(_int_identity(jnp.trunc))
lower(aten.round)(_int_identity(jnp.round))  # half to even, like nearbyint


@lower(aten.round.decimals)
def round_decimals(x, *, decimals):
    if _is_int(x):
        return x
    ten_pow = jnp.asarray(10.0 ** abs(decimals), dtype=x.dtype)
    if decimals < 0:
        return jnp.round(x / ten_pow) * ten_pow
    return jnp.round(x * ten_pow) / ten_pow


@lower(aten.frac)
def frac(x):
    _floating_only("frac_cpu", x)
    return x - jnp.trunc(x)


@lower(aten.frexp.Tensor)
def frexp(x):
    mantissa, exponent = jnp.frexp(x)
    return mantissa, exponent.astype(jnp.int32)


# ---- float math ---------------------------------------------------------------------------------------------


def _unary(op, fn):
    lower(op)(lambda x: fn(_float(x)))


_C = complex_special  # C's complex functions (CPU's kernels call them); their real halves, XLA's or exponentials'
for _op, _fn in [
    (aten.exp, _C.exp), (aten.exp2, _C.exp2), (aten.expm1, jnp.expm1), (aten.log, _C.log), (aten.log1p, jnp.log1p),
    (aten.log2, jnp.log2), (aten.log10, jnp.log10), (aten.sqrt, _C.sqrt), (aten.rsqrt, _C.rsqrt), (aten.sin, _C.sin),
    (aten.cos, _C.cos), (aten.tan, _C.tan), (aten.asin, _C.asin), (aten.acos, _C.acos), (aten.atan, _C.atan),
    (aten.sinh, _C.sinh), (aten.cosh, _C.cosh), (aten.tanh, _C.tanh), (aten.asinh, _C.asinh), (aten.acosh, _C.acosh),
    (aten.atanh, _C.atanh), (aten.sigmoid, _C.sigmoid),
    (aten.erf, jsp.erf), (aten.erfc, jsp.erfc),
    (aten.erfinv, jsp.erfinv), (aten.lgamma, jsp.gammaln), (aten.i0, jsp.i0), (aten.special_i0e, jsp.i0e),
    (aten.special_i1, jsp.i1), (aten.special_i1e, jsp.i1e), (aten.special_ndtri, jsp.ndtri),
    (aten.special_log_ndtr, jsp.log_ndtr), (aten.special_erfcx, jsp.erfcx), (aten.special_entr, jsp.entr),
]:
    _unary(_op, _fn)


@lower(aten.mvlgamma)
def mvlgamma(x, p):
    x = _float(x)
    terms = sum(jsp.gammaln(x - i / 2) for i in range(p))
    return terms + p * (p - 1) / 4 * math.log(math.pi)


@lower(aten.sinc)
def sinc(x):
    x = _float(x)
    px = math.pi * x
    return jnp.where(x == 0, jnp.ones_like(x), jnp.sin(px) / px)


@lower(aten.special_spherical_bessel_j0)
def spherical_bessel_j0(x):
    x = _float(x)
    safe = jnp.where(x == 0, jnp.ones_like(x), x)
    return jnp.where(x == 0, jnp.ones_like(x), jnp.where(jnp.isinf(x), 0.0, jnp.sin(safe) / safe))


@lower(aten.logit)
def logit(x, eps=None):
    x = _float(x)
    if eps is not None:
        x = jnp.clip(x, eps, 1 - eps)
    return jnp.log(x / (1 - x))


@lower(aten.deg2rad)
def deg2rad(x):
    return _float(x) * (math.pi / 180)


@lower(aten.rad2deg)
def rad2deg(x):
    return _float(x) * (180 / math.pi)


@lower(aten.angle)
def angle(x):
    if jnp.issubdtype(x.dtype, jnp.complexfloating):
        return jnp.angle(x)
    x = _float(x)
    return jnp.where(jnp.isnan(x), x, jnp.where(x < 0, jnp.pi, 0.0).astype(x.dtype))


@lower(aten.nan_to_num)
def nan_to_num(x, nan=None, posinf=None, neginf=None):
    if _is_int(x):
        return x
    info = jnp.finfo(x.dtype)
    x = jnp.where(jnp.isnan(x), 0.0 if nan is None else nan, x)
    x = jnp.where(x == jnp.inf, info.max if posinf is None else posinf, x)
    return jnp.where(x == -jnp.inf, info.min if neginf is None else neginf, x)


@lower(aten.atan2)
def atan2(x, y):
    return jnp.arctan2(*_float(x, y))


@lower(aten.hypot)
def hypot(x, y):
    return jnp.hypot(*_float(x, y))


@lower(aten.copysign.Tensor, aten.copysign.Scalar)
def copysign(x, y):
    return jnp.copysign(*_float(x, y))


@lower(aten.nextafter)
def nextafter(x, y):
    x, y = _promote(x, y, opmath=False)  # the half type's own neighbour
    _floating_only("nextafter_cpu", x)
    return jnp.nextafter(x, y)


@lower(aten.logaddexp)
def logaddexp(x, y):
    x, y = _float(x, y)
    return complex_special.logaddexp(x, y) if jnp.iscomplexobj(x) else jnp.logaddexp(x, y)


@lower(aten.logaddexp2)
def logaddexp2(x, y):
    return jnp.logaddexp2(*_float(x, y))


@lower(aten.xlogy.Tensor, aten.xlogy.Scalar_Self, aten.xlogy.Scalar_Other)
def xlogy(x, y):
    """0 where ``x == 0`` unless ``y`` is NaN. A half type's log is rounded before the product, as on CPU."""
    x, y = _float(x, y, opmath=False)
    out = jnp.where(x == 0, jnp.zeros_like(x), x * jnp.log(y))
    return jnp.where(jnp.isnan(y), y, out)


@lower(aten.special_xlog1py.default, aten.special_xlog1py.self_scalar, aten.special_xlog1py.other_scalar)
def xlog1py(x, y):
    x, y = _float(x, y, opmath=False)
    out = jnp.where(x == 0, jnp.zeros_like(x), x * jnp.log1p(y))
    return jnp.where(jnp.isnan(y), y, out)


@lower(aten.ldexp.Tensor)
def ldexp(x, e):
    x, e = _float(x, e)
    return x * jnp.power(jnp.asarray(2, x.dtype), e)


# ---- min/max, clamping, selection ---------------------------------------------------------------------------


@lower(aten.maximum)
def maximum(x, y):
    return jnp.maximum(*_promote(x, y))


@lower(aten.minimum)
def minimum(x, y):
    return jnp.minimum(*_promote(x, y))


@lower(aten.fmax)
def fmax(x, y):
    return jnp.fmax(*_promote(x, y))


@lower(aten.fmin)
def fmin(x, y):
    return jnp.fmin(*_promote(x, y))


@checks_args(aten.clamp.default, aten.clamp.Tensor)
def _a_bound(op, x, min=None, max=None) -> None:
    if min is None and max is None:  # CPU's wording (PyTorch's Python reference raises a ValueError)
        raise RuntimeError("torch.clamp: At least one of 'min' or 'max' must not be None")


@lower(aten.clamp.default, aten.clamp.Tensor)
def clamp(x, min=None, max=None):
    """NaN-propagating; where ``min > max`` every element becomes ``max``."""
    if any(jnp.iscomplexobj(a) for a in (x, min, max) if a is not None):
        raise RuntimeError("clamp is not supported for complex types")
    args = [a for a in (x, min, max) if a is not None]
    args = _promote(*args) if len(args) > 1 else (args[0],)
    x = args[0]
    i = 1
    if min is not None:
        x = jnp.maximum(x, args[i])
        i += 1
    if max is not None:
        x = jnp.minimum(x, args[i])
    return x


@lower(aten.clamp_min.default, aten.clamp_min.Tensor)
def clamp_min(x, min):
    return jnp.maximum(*_promote(x, min))


@lower(aten.clamp_max.default, aten.clamp_max.Tensor)
def clamp_max(x, max):
    return jnp.minimum(*_promote(x, max))


@checks_args(aten.heaviside.default, aten.heaviside.out)
def _heaviside_args(op, x, values, *, out=None) -> None:
    """CPU's checks (in its kernel; PyTorch's meta kernel makes neither), a complex ``out=`` included."""
    if x.is_complex() or values.is_complex() or (out is not None and out.is_complex()):
        raise RuntimeError("heaviside is not yet implemented for complex tensors.")
    if x.dtype != values.dtype:
        raise RuntimeError("heaviside is not yet implemented for tensors with different dtypes.")


@lower(aten.heaviside)
def heaviside(x, values):
    x, values = _promote(x, values)
    return jnp.where(x == 0, values, (x > 0).astype(x.dtype))


@lower(aten.where.self)
def where(cond, x, y):
    x, y = _promote(x, y)
    return jnp.where(cond.astype(jnp.bool_), x, y)


# ---- classification -----------------------------------------------------------------------------------------


@lower(aten.isnan)
def isnan(x):
    return jnp.isnan(x) if not _is_int(x) else jnp.zeros(x.shape, jnp.bool_)


@lower(aten.isinf)
def isinf(x):
    return jnp.isinf(x) if not _is_int(x) else jnp.zeros(x.shape, jnp.bool_)


@lower(aten.isposinf)
def isposinf(x):
    return x == jnp.inf if not _is_int(x) else jnp.zeros(x.shape, jnp.bool_)


@lower(aten.isneginf)
def isneginf(x):
    return x == -jnp.inf if not _is_int(x) else jnp.zeros(x.shape, jnp.bool_)


# ---- comparisons --------------------------------------------------------------------------------------------


def _compare(op, fn):
    lower(getattr(aten, op).Tensor, getattr(aten, op).Scalar)(lambda x, y: fn(*_promote(x, y)))


for _name, _cmp in [
    ("eq", jnp.equal), ("ne", jnp.not_equal), ("lt", jnp.less), ("le", jnp.less_equal),
    ("gt", jnp.greater), ("ge", jnp.greater_equal),
]:
    _compare(_name, _cmp)
