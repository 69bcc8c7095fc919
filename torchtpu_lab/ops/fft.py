"""FFTs (the three ATen primitives behind ``torch.fft.*`` and ``stft``/``istft``) and the complex-number ops their
forward and backward formulas use.

``normalization`` is PyTorch's ``fft_norm_mode``: 0 = none, 1 = multiply by ``1/sqrt(n)``, 2 = multiply by ``1/n``,
where ``n`` is the product of the signal sizes (the *output's* for ``_fft_c2r``). It is independent of the
direction: ``ifft(x, norm="backward")`` is ``_fft_c2c(x, dim, 2, forward=False)``. So every transform here is the
unnormalized one, followed by that scale.

``view_as_real``/``view_as_complex`` here are the values a compiled graph computes; eager tpu tensors get views of
the same bytes (runtime/view_kernels.py). Copies where PyTorch has views: ``_conj`` and ``_neg_view``. PyTorch marks
a lazily conjugated/negated view with a bit on the tensor, which the tpu kernels do not read, so they return the
conjugated/negated values instead (``is_conj()`` is then ``False``). Reading them is exact; writing through them
does not reach the original, and later writes to the original do not show in them.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
from jax import lax

import torch

from .. import dtypes
from .registry import aten, checks_args, kernel, lower


def _axes(dim, ndim: int) -> list[int]:
    return [d % ndim for d in dim] if ndim else []


def _scale(y, normalization: int, n: int):
    if normalization == 0 or n == 0:
        return y
    factor = 1 / math.sqrt(n) if normalization == 1 else 1 / n
    return y * jnp.asarray(factor, y.real.dtype)


def _complex(x):
    """``x`` as a complex array of matching precision (float32 -> complex64, float64 -> complex128)."""
    if jnp.iscomplexobj(x):
        return x
    return x.astype(jnp.complex128 if x.dtype == jnp.float64 else jnp.complex64)


@lower(aten._fft_c2c.default)
def fft_c2c(x, dim, normalization, forward):
    axes = _axes(dim, x.ndim)
    x = _complex(x)
    if not axes:
        return x
    y = jnp.fft.fftn(x, axes=axes) if forward else jnp.fft.ifftn(x, axes=axes, norm="forward")
    return _scale(y, normalization, math.prod(x.shape[a] for a in axes))


@lower(aten._fft_r2c.default)
def fft_r2c(x, dim, normalization, onesided):
    """Forward transform of a real input; ``onesided`` keeps ``n // 2 + 1`` bins of the last dim in ``dim``."""
    axes = _axes(dim, x.ndim)
    n = math.prod(x.shape[a] for a in axes)
    if not axes:
        return _complex(x)
    if onesided:
        y = jnp.fft.rfftn(x, axes=axes)
    else:
        y = jnp.fft.fftn(_complex(x), axes=axes)
    return _scale(_complex(y), normalization, n)


@lower(aten._fft_c2r.default)
def fft_c2r(x, dim, normalization, last_dim_size):
    """Inverse transform of a one-sided Hermitian input to a real output whose last dim in ``dim`` has
    ``last_dim_size`` points; only its first ``last_dim_size // 2 + 1`` bins are read, and (as pocketfft) the
    imaginary parts of the bins that must be real are ignored."""
    axes = _axes(dim, x.ndim)
    sizes = [x.shape[a] for a in axes[:-1]] + [last_dim_size]
    y = jnp.fft.irfftn(_complex(x), s=sizes, axes=axes, norm="forward")
    return _scale(y, normalization, math.prod(sizes))


@lower(aten.view_as_real.default)
def view_as_real(x):
    return jnp.stack([jnp.real(x), jnp.imag(x)], axis=-1)


@lower(aten.view_as_complex.default)
def view_as_complex(x):
    return lax.complex(x[..., 0], x[..., 1])


@lower(aten._conj.default, aten._conj_physical.default)
def conj(x):
    return jnp.conj(x) if jnp.iscomplexobj(x) else x


@lower(aten._neg_view.default)
def neg_view(x):
    return -x


@kernel(aten.conj_physical_.default)
def conj_physical_(self):
    if self.is_complex():
        self.copy_(aten._conj_physical.default(self))
    return self


def _pair(a, b):
    a, b = jnp.broadcast_arrays(a, b)
    dtype = jnp.result_type(a, b)
    return a.astype(dtype), b.astype(dtype)


@checks_args(aten.complex.default, aten.polar.default)
def _float_parts(op, a, b) -> None:
    """CPU's refusals: no type promotion between the parts (JAX would have promoted them) and no integer parts."""
    if a.dtype not in (torch.float16, torch.float32, torch.float64) or b.dtype not in (
            torch.float16, torch.float32, torch.float64):
        raise RuntimeError("Expected both inputs to be Half, Float or Double tensors but got "
                           f"{dtypes.scalar_name(a.dtype)} and {dtypes.scalar_name(b.dtype)}")
    if a.dtype != b.dtype:
        raise RuntimeError(f"Expected object of scalar type {dtypes.scalar_name(a.dtype)} but got scalar type "
                           f"{dtypes.scalar_name(b.dtype)} for second argument")


@lower(aten.complex.default)
def complex_from_parts(real, imag):
    """Lowered (not decomposed): PyTorch's decomposition writes through ``result.real``/``result.imag``."""
    return lax.complex(*_pair(real, imag))


@lower(aten.polar.default)
def polar(abs, angle):
    abs, angle = _pair(abs, angle)
    return lax.complex(abs * jnp.cos(angle), abs * jnp.sin(angle))
