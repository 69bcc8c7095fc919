"""Tensor factories: ``full``/``fill``, ranges, ``eye``, triangle indices."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
import torch

from .. import dtypes
from .registry import aten, lower, real_fill_value


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


@lower(aten.arange.default, aten.arange.start, aten.arange.start_step, static_scalars=True)
def arange(*scalars, dtype=None, layout=None, device=None, pin_memory=None):
    """PyTorch's rule: length ``ceil((end - start) / step)``, in int64 arithmetic (scalars truncated) for an
    int64 result and in double otherwise; values ``start + i * step`` accumulated in double for floats."""
    start, end, step = (0, scalars[0], 1) if len(scalars) == 1 else (*scalars, 1)[:3]
    if dtype is None:
        floating = any(isinstance(s, float) for s in (start, end, step))
        dtype = torch.get_default_dtype() if floating else torch.int64
    if dtype == torch.int64:
        n = math.ceil((int(end) - int(start)) / int(step))
    else:
        n = math.ceil((float(end) - float(start)) / float(step))
    n = max(n, 0)
    if _is_integral(dtype):
        return int(start) + int(step) * jnp.arange(n, dtype=jnp.int64)
    return float(start) + float(step) * jnp.arange(n, dtype=jnp.float64)


def _space_dtype(dtype):
    return dtype or torch.get_default_dtype()


def _spaced(start, end, steps, dtype):
    """PyTorch's CPU linspace: ``start + step * i`` for the first half, ``end - step * (steps - 1 - i)`` for
    the rest, in the result dtype (in double, from integer-cast ends, for integer results)."""
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
    step = (end - start) / jnp.asarray(steps - 1, ctype)
    i = jnp.arange(steps, dtype=ctype)
    return jnp.where(jnp.arange(steps) < steps // 2, start + step * i, end - step * (steps - 1 - i))


@lower(aten.linspace.default, aten.linspace.Tensor_Tensor, aten.linspace.Tensor_Scalar, aten.linspace.Scalar_Tensor)
def linspace(start, end, steps, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _spaced(start, end, steps, _space_dtype(dtype))


@lower(aten.logspace.default, aten.logspace.Tensor_Tensor, aten.logspace.Tensor_Scalar, aten.logspace.Scalar_Tensor)
def logspace(start, end, steps, base=10.0, *, dtype=None, layout=None, device=None, pin_memory=None):
    """PyTorch's CPU logspace: ends cast to the result dtype, their difference taken there, then the step,
    exponents (halfway rule as in linspace) and ``pow`` in double."""
    if steps == 1:
        return jnp.power(jnp.float64(base), jnp.asarray(start).astype(jnp.float64)).reshape(1)
    jdt = dtypes.to_jax(_space_dtype(dtype))
    start, end = jnp.asarray(start).astype(jdt), jnp.asarray(end).astype(jdt)
    step = (end - start).astype(jnp.float64) / max(steps - 1, 1)
    start, end = start.astype(jnp.float64), end.astype(jnp.float64)
    i = jnp.arange(steps, dtype=jnp.float64)
    exps = jnp.where(jnp.arange(steps) < steps // 2, start + step * i, end - step * (steps - 1 - i))
    return jnp.power(jnp.float64(base), exps)


@lower(aten.eye.default, aten.eye.m)
def eye(n, m=None, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.eye(n, n if m is None else m, dtype=dtypes.to_jax(dtype or torch.get_default_dtype()))


@lower(aten.tril_indices.default)
def tril_indices(row, col, offset=0, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.asarray(np.stack(np.tril_indices(row, offset, col)).astype(np.int64).reshape(2, -1))


@lower(aten.triu_indices.default)
def triu_indices(row, col, offset=0, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.asarray(np.stack(np.triu_indices(row, offset, col)).astype(np.int64).reshape(2, -1))
