"""The precision of float32 matrix products follows PyTorch's ``torch.set_float32_matmul_precision``.

========================  =========================  =====================================================
``torch`` setting         ``jax.lax.Precision``      meaning on TPU
========================  =========================  =====================================================
``"highest"`` (default)   ``HIGHEST``                full float32 (about 6 bf16 passes); matches CPU
``"high"``                ``HIGH``                   bf16x3 (about float32 accuracy, ~TF32-class speed)
``"medium"``              ``DEFAULT``                one bf16 pass (fastest)
========================  =========================  =====================================================

Lowerings of matrix products (``mm``/``bmm``/``addmm``/``dot``..., convolution, the fused attention/transformer
kernels, cdist's matrix-product form) call :func:`matmul_precision` *inside* the lowering body, so the setting is
read when the op is traced, not when this package is imported. A compiled function bakes the precision in: the
runtime adds :func:`key` to its compilation-cache keys, so changing the setting recompiles instead of reusing a
graph traced under the old one.

Products that merely implement an op PyTorch computes exactly whatever the setting (interpolation-weight matrices
of upsampling, adaptive average pooling, the column updates inside a Cholesky factorization, least squares) use
:data:`EXACT` instead. Integer and float64 products are exact at any precision.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax.numpy as jnp
import torch
from jax import lax

#: For products that are an implementation device, not a user-visible matmul: never lowered in precision.
EXACT = lax.Precision.HIGHEST

#: the half types, which PyTorch's CPU kernels carry in float32 (``at::opmath_type``) and round once at the end
HALF_TYPES = (jnp.bfloat16, jnp.float16)


def opmath(x):
    """``x`` in the dtype PyTorch's CPU kernels compute it in: float32 for a half type (running sums and
    products, powers, variances), else its own."""
    return x.astype(jnp.float32) if x.dtype in HALF_TYPES else x


def in_opmath(fn: Callable) -> Callable:
    """Run a pointwise lowering on float32 copies of its half-type arguments, its numbers kept as given: PyTorch's
    CPU activations (``gelu``, ``silu``, ``elu``, ``leaky_relu``...) convert each vector to float32, compute, and
    round once, where a lowering left in bfloat16 would round every intermediate and the number too (a third of
    ``gelu``'s results one ulp off). The output is rounded back by the caller's cast to PyTorch's dtype."""

    @functools.wraps(fn)
    def lowered(*args, **kwargs):
        return fn(*(opmath(a) if hasattr(a, "dtype") else a for a in args), **kwargs)

    return lowered


_PRECISIONS = {
    "highest": lax.Precision.HIGHEST,
    "high": lax.Precision.HIGH,
    "medium": lax.Precision.DEFAULT,
}


def key() -> str:
    """PyTorch's current float32 matmul precision setting (``"highest"``, ``"high"`` or ``"medium"``), for cache
    keys: a graph traced under one setting must not be reused under another."""
    return torch.get_float32_matmul_precision()


def matmul_precision() -> lax.Precision:
    """The ``jax.lax.Precision`` that PyTorch's float32 matmul precision setting asks for; call at trace time."""
    return _PRECISIONS.get(key(), lax.Precision.HIGHEST)
