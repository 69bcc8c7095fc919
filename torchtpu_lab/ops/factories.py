"""Tensor factories: ``full``/``fill``, ranges, ``eye``, triangle indices, the Kaiser window."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from .. import dtypes
from .registry import aten, checks_args, lower, real_fill_value
from .special import _i0


@lower(aten.full.default)
def full(size, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None):
    """``fill_value`` is a graph input (only ``size`` shapes the program): ``torch.full(shape, step)`` in a loop
    compiles once."""
    if dtype is not None:
        real_fill_value(fill_value, dtypes.to_jax(dtype))
    return jnp.full(tuple(size), fill_value)


@lower(aten.zeros.default)
def zeros(size, *, dtype=None, layout=None, device=None, pin_memory=None):
    """One op, as ``full`` is: PyTorch's composite ``zeros`` is ``empty`` then ``zero_`` (two Python kernels, and
    an eager allocation of the empty storage that ``zero_`` reads), and models make masks and buffers with it
    every step."""
    return jnp.zeros(tuple(size))


@lower(aten.ones.default)
def ones(size, *, dtype=None, layout=None, device=None, pin_memory=None):
    """One op (``empty`` then ``fill_``), as :func:`zeros`."""
    return jnp.ones(tuple(size))


@lower(aten.full_like.default)
def full_like(x, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    real_fill_value(fill_value, x.dtype if dtype is None else dtypes.to_jax(dtype))
    return jnp.full(x.shape, fill_value)


@lower(aten.fill.Scalar, aten.fill.Tensor)
def fill(x, value):
    real_fill_value(value, x.dtype)
    return jnp.full(x.shape, value, dtype=x.dtype)


@lower(aten.scalar_tensor.default)
def scalar_tensor(s, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.asarray(s)


@lower(aten.empty_permuted.default, aten._efficientzerotensor.default)
def zeros_of_size(size, *args, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.zeros(tuple(size), dtypes.to_jax(dtype or torch.get_default_dtype()))


def _is_integral(dtype) -> bool:
    return dtype is not None and not dtype.is_floating_point and not dtype.is_complex


@checks_args(aten.arange.default, aten.arange.start, aten.arange.start_step)
def _finite_range(op, *scalars, **_) -> None:
    """CPU refuses a NaN or infinite end before it compares the ends with the step's sign."""
    ends = (0, scalars[0]) if len(scalars) == 1 else scalars[:2]
    if any(isinstance(v, float) and not math.isfinite(v) for v in scalars[:3]):
        raise RuntimeError(f"unsupported range: {ends[0]:g} -> {ends[1]:g}")


@lower(aten.arange.default, aten.arange.start, aten.arange.start_step, static_scalars=True)
def arange(*scalars, dtype=None, layout=None, device=None, pin_memory=None):
    """PyTorch's rule: values ``start + i * step``, the scalars truncated for an integer result, accumulated in
    double for floats. The length is PyTorch's own meta kernel's, which changed with torch 2.14 for an integer
    result of fractional scalars (``arange(0.5, 10, 1.5, dtype=int64)``: 10 elements in int64 arithmetic up to
    2.13, 7 from 2.14, ``ceil`` in double)."""
    start, end, step = (0, scalars[0], 1) if len(scalars) == 1 else (*scalars, 1)[:3]
    if dtype is None:
        floating = any(isinstance(s, float) for s in (start, end, step))
        dtype = torch.get_default_dtype() if floating else torch.int64
    n = torch.arange(start, end, step, dtype=dtype, device="meta").numel()
    if _is_integral(dtype):
        return int(start) + int(step) * jnp.arange(n, dtype=jnp.int64)
    return float(start) + float(step) * jnp.arange(n, dtype=jnp.float64)


def _space_dtype(dtype, start, end):
    """The result dtype PyTorch infers for ``linspace``/``logspace``: the default dtype, or its complex counterpart
    when an end is complex (``torch.linspace(0, 1j, 5)`` is complex64): computing in the real default would drop
    the imaginary parts before the executor's cast."""
    if dtype is not None:
        return dtype
    if any(jnp.iscomplexobj(v) for v in (start, end)):
        return torch.complex128 if torch.get_default_dtype() == torch.float64 else torch.complex64
    return torch.get_default_dtype()


def _step(span, steps: int, ctype):
    """``span / (steps - 1)`` divided exactly, as CPU divides: XLA turns a division by a constant into a
    multiplication by its reciprocal, one ulp off (126 / 49 became 2.571428571428571), which moves an integer
    ``linspace(1, 127, 50)`` element across an integer (54 for CPU's 55). The divisor behind an optimization
    barrier is no constant to rewrite. A complex span is divided part by part, as c10::complex divides by a
    real number."""
    n = lax.optimization_barrier(jnp.asarray(steps - 1, jnp.real(span).dtype))
    if jnp.iscomplexobj(span):
        return lax.complex(jnp.real(span) / n, jnp.imag(span) / n).astype(ctype)
    return (span / n).astype(ctype)


def _fused(base, step, k):
    """``base + step * k`` rounded once, as a fused multiply-add (CPU's compiled integer linspace contracts to
    one; XLA:CPU does only when LLVM optimizes, and a truncation to an integer sees the difference:
    ``linspace(-5, 20, 96)[38]`` is 4, not 5). ``step`` split into its top 26 bits and the rest makes both
    products with ``k < 2**26`` exact; a two-sum then adds them to ``base`` with one final rounding (short of
    a rare double rounding of the small parts)."""
    bits = lax.bitcast_convert_type(step, jnp.int64)
    high = lax.bitcast_convert_type(bits & ~jnp.int64((1 << 27) - 1), jnp.float64)
    p, q = high * k, (step - high) * k
    s = base + p
    t = s - base
    return s + (((base - (s - t)) + (p - t)) + q)


def _halves(start, end, step, steps: int, ctype, fused: bool = False):
    """CPU's points: ``start + step * i`` for the first half, ``end - step * (steps - 1 - i)`` for the rest
    (``fused``: each rounded once, see :func:`_fused`)."""
    i = jnp.arange(steps, dtype=ctype)
    if fused and steps <= 1 << 26:
        first, second = _fused(start, step, i), -_fused(-end, step, steps - 1 - i)
    else:
        first, second = start + step * i, end - step * (steps - 1 - i)
    return jnp.where(jnp.arange(steps) < steps // 2, first, second)


def _spaced(start, end, steps, dtype):
    """PyTorch's CPU linspace in the result dtype (in double, from integer-cast ends, for integer results)."""
    if _is_integral(dtype):
        jdt = dtypes.to_jax(dtype)
        start = jnp.asarray(start).astype(jdt).astype(jnp.float64)
        end = jnp.asarray(end).astype(jdt).astype(jnp.float64)
        ctype = jnp.float64
    else:
        ctype = dtypes.to_jax(dtype)
        start, end = jnp.asarray(start).astype(ctype), jnp.asarray(end).astype(ctype)
    if steps == 1:
        return start.reshape(1)
    return _halves(start, end, _step(end - start, steps, ctype), steps, ctype, fused=_is_integral(dtype))


_SPACES = (aten.linspace.default, aten.linspace.Tensor_Tensor, aten.linspace.Tensor_Scalar, aten.linspace.Scalar_Tensor,
           aten.logspace.default, aten.logspace.Tensor_Tensor, aten.logspace.Tensor_Scalar, aten.logspace.Scalar_Tensor)


@checks_args(*_SPACES)
def _space_cast(op, start, end, *args, dtype=None, **_) -> None:
    """CPU's wording of a complex range into a real ``dtype`` (PyTorch's meta kernel says it as linspace's, for
    logspace too, and with Python's dtype names)."""
    if dtype is None or dtype.is_complex:
        return
    ends = [v.dtype if isinstance(v, torch.Tensor) else v for v in (start, end)]
    if any(isinstance(v, complex) or (isinstance(v, torch.dtype) and v.is_complex) for v in ends):
        inferred = torch.complex128 if torch.get_default_dtype() == torch.float64 else torch.complex64
        name = op._schema.name.split("::")[-1]
        raise RuntimeError(f"torch.{name}(): inferred dtype {dtypes.TYPE_META_NAMES[inferred]} can't be safely cast "
                           f"to passed dtype {dtypes.scalar_name(dtype)}")


@lower(aten.linspace.default, aten.linspace.Tensor_Tensor, aten.linspace.Tensor_Scalar, aten.linspace.Scalar_Tensor)
def linspace(start, end, steps, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _spaced(start, end, steps, _space_dtype(dtype, start, end))


@lower(aten.logspace.default, aten.logspace.Tensor_Tensor, aten.logspace.Tensor_Scalar, aten.logspace.Scalar_Tensor)
def logspace(start, end, steps, base=10.0, *, dtype=None, layout=None, device=None, pin_memory=None):
    """PyTorch's CPU logspace: real results take the ends cast to the result dtype, their difference there, then
    the step, exponents (halfway rule as in linspace) and ``pow`` in double; complex results compute all of it,
    ``pow`` included, in the complex dtype (one point: ``pow`` in complex double)."""
    dtype = _space_dtype(dtype, start, end)
    jdt = dtypes.to_jax(dtype)
    ctype = jdt if dtype.is_complex else jnp.float64
    if steps == 1:
        wide = jnp.complex128 if dtype.is_complex else jnp.float64
        return jnp.power(jnp.asarray(base, wide), jnp.asarray(start).astype(wide)).reshape(1)
    start, end = jnp.asarray(start).astype(jdt), jnp.asarray(end).astype(jdt)
    step = _step((end - start).astype(ctype), steps, ctype)
    exps = _halves(start.astype(ctype), end.astype(ctype), step, steps, ctype)
    return jnp.power(jnp.asarray(base, ctype), exps)


@lower(aten.eye.default, aten.eye.m)
def eye(n, m=None, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.eye(n, n if m is None else m, dtype=dtypes.to_jax(dtype or torch.get_default_dtype()))


@lower(aten.tril_indices.default)
def tril_indices(row, col, offset=0, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.asarray(np.stack(np.tril_indices(row, offset, col)).astype(np.int64).reshape(2, -1))


@lower(aten.triu_indices.default)
def triu_indices(row, col, offset=0, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.asarray(np.stack(np.triu_indices(row, offset, col)).astype(np.int64).reshape(2, -1))


@lower(aten.kaiser_window.default, aten.kaiser_window.periodic, aten.kaiser_window.beta, static_scalars=True)
def kaiser_window(window_length: int, periodic: bool = True, beta: float = 12.0, *, dtype=None, layout=None,
                  device=None, pin_memory=None):
    """CPU's Kaiser window: ``I0(beta * sqrt(1 - ((i - alpha) / alpha) ** 2)) / I0(beta)`` over the positions of
    an ``arange`` in the result dtype (a periodic window is one point longer, its last point dropped), computed
    in float (double for a float64 window). PyTorch's own kernel of it is a CPU/CUDA stub: the tpu had none, and
    ``torch.kaiser_window(n, device="tpu")`` hit an internal assert."""
    jdt = dtypes.to_jax(dtype if dtype is not None else torch.get_default_dtype())
    if window_length <= 1:
        return jnp.ones((window_length,), jdt)
    n = window_length + 1 if periodic else window_length
    opmath = jnp.float64 if jdt == jnp.float64 else jnp.float32
    alpha, b = jnp.asarray((n - 1) / 2.0, opmath), jnp.asarray(beta, opmath)
    x = jnp.arange(n, dtype=jdt).astype(opmath)
    w = _i0(b * jnp.sqrt(jnp.abs(1 - jnp.square((x - alpha) / alpha)))) / _i0(b)
    return w.astype(jdt)[:window_length]
