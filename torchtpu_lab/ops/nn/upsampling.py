"""Upsampling: nearest (plain and ``_exact``), linear/bilinear/trilinear, bicubic and the antialiased variants,
with their backward ops. Lowerings (pure JAX).

Interpolation is a per-axis product with a weight matrix built in NumPy at trace time; backwards are
``jax.vjp`` of the forward. The products run at ``precision.EXACT``: PyTorch interpolates exactly whatever its
matmul-precision setting. Source positions and weights are computed in the input's opmath type (double for a
float64 input, float32 otherwise), as PyTorch's CPU kernel computes them: float32 weights put float64 results
~1e-7 off. A ``uint8`` image is resampled in PyTorch's fixed-point arithmetic (:mod:`.upsampling_uint8`); other
integer inputs have no CPU kernel, and get its error.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from ..elementwise import _floating_only
from ..precision import EXACT
from ..registry import aten, lower
from ._common import _acc, _linear_backward
from .upsampling_uint8 import upsample_uint8


def _scale(n_in, n_out, scale, ft=np.float32):
    """PyTorch's ``compute_scales_value`` (in ``ft``, the opmath type): the input step per output step."""
    return ft(1.0 / scale) if scale is not None and scale > 0 else ft(n_in) / ft(n_out)


def _nearest_index(n_in, n_out, scale, exact):
    o = np.arange(n_out)
    if not exact and n_out == n_in:
        return o
    if not exact and n_out == 2 * n_in:
        return o >> 1
    s = _scale(n_in, n_out, scale)
    src = (o.astype(np.float32) + np.float32(0.5)) * s if exact else o.astype(np.float32) * s
    return np.minimum(np.floor(src).astype(np.int64), n_in - 1)


def _upsample_nearest(x, output_size, scales, exact):
    nd = len(output_size)
    for axis, (n_out, scale) in enumerate(zip(output_size, scales)):
        ax = x.ndim - nd + axis
        x = jnp.take(x, jnp.asarray(_nearest_index(x.shape[ax], n_out, scale, exact)), axis=ax)
    return x


def _corner_scale(n_in, n_out, ft):
    """PyTorch's ``area_pixel_compute_scale`` with ``align_corners=True``, in ``ft``."""
    return ft(n_in - 1) / ft(n_out - 1) if n_out > 1 else ft(0)


def _source_index(n_in, n_out, align_corners, scale, cubic, ft):
    """PyTorch's ``area_pixel_compute_source_index`` for every output position (in ``ft``)."""
    o = np.arange(n_out).astype(ft)
    if align_corners:
        return _corner_scale(n_in, n_out, ft) * o
    src = _scale(n_in, n_out, scale, ft) * (o + ft(0.5)) - ft(0.5)
    return src if cubic else np.maximum(src, ft(0))


def _linear_matrix(n_in, n_out, align_corners, scale, ft):
    src = _source_index(n_in, n_out, align_corners, scale, False, ft)
    i0 = np.minimum(np.floor(src).astype(np.int64), n_in - 1)
    lam = np.clip(src - i0, 0, 1).astype(np.float64)
    i1 = i0 + (i0 < n_in - 1)
    m = np.zeros((n_out, n_in))
    np.add.at(m, (np.arange(n_out), i0), 1 - lam)
    np.add.at(m, (np.arange(n_out), i1), lam)
    return m


def _cubic_matrix(n_in, n_out, align_corners, scale, ft):
    a = -0.75
    src = _source_index(n_in, n_out, align_corners, scale, True, ft)
    i = np.floor(src).astype(np.int64)
    t = (src - i).astype(np.float64)

    def near(v):  # |v| <= 1
        return ((a + 2) * v - (a + 3)) * v * v + 1

    def far(v):  # 1 < |v| < 2
        return ((a * v - 5 * a) * v + 8 * a) * v - 4 * a

    coeffs = [far(t + 1), near(t), near(1 - t), far(2 - t)]
    m = np.zeros((n_out, n_in))
    for k, c in enumerate(coeffs):
        np.add.at(m, (np.arange(n_out), np.clip(i - 1 + k, 0, n_in - 1)), c)
    return m


def _int_kernel_name(matrix, output_size) -> str:
    """The CPU kernel whose "not implemented for 'Int'" error an integer input of this interpolation meets (its
    bilinear kernel picks the channels-last loop for small outputs)."""
    if matrix in (_aa_linear, _aa_cubic):
        return "compute_index_ranges_weights"
    if matrix is _cubic_matrix:
        return "compute_indices_weights_cubic"
    if len(output_size) == 2 and sum(output_size) <= 128:
        return "upsample_bilinear2d_channels_last"
    return "compute_indices_weights_linear"


def _upsample_interp(x, output_size, align_corners, scales, matrix):
    nd = len(output_size)
    if x.dtype == jnp.uint8 and nd == 2:
        cubic = matrix in (_cubic_matrix, _aa_cubic)
        return upsample_uint8(x, output_size, align_corners, scales, cubic, matrix in (_aa_linear, _aa_cubic))
    _floating_only(_int_kernel_name(matrix, output_size), x)
    xf = _acc(x)
    ft = np.float64 if xf.dtype == jnp.float64 else np.float32
    for axis, (n_out, scale) in enumerate(zip(output_size, scales)):
        ax = x.ndim - nd + axis
        m = jnp.asarray(matrix(x.shape[ax], n_out, align_corners, scale, ft), xf.dtype)
        xf = jnp.moveaxis(jnp.tensordot(xf, m, axes=([ax], [1]), precision=EXACT), -1, ax)
    return xf


@lower(aten.upsample_nearest1d)
def upsample_nearest1d(x, output_size, scales=None):
    return _upsample_nearest(x, output_size, [scales], False)


@lower(aten.upsample_nearest2d)
def upsample_nearest2d(x, output_size, scales_h=None, scales_w=None):
    return _upsample_nearest(x, output_size, [scales_h, scales_w], False)


@lower(aten.upsample_nearest3d)
def upsample_nearest3d(x, output_size, scales_d=None, scales_h=None, scales_w=None):
    return _upsample_nearest(x, output_size, [scales_d, scales_h, scales_w], False)


@lower(aten._upsample_nearest_exact1d)
def upsample_nearest_exact1d(x, output_size, scales=None):
    return _upsample_nearest(x, output_size, [scales], True)


@lower(aten._upsample_nearest_exact2d)
def upsample_nearest_exact2d(x, output_size, scales_h=None, scales_w=None):
    return _upsample_nearest(x, output_size, [scales_h, scales_w], True)


@lower(aten._upsample_nearest_exact3d)
def upsample_nearest_exact3d(x, output_size, scales_d=None, scales_h=None, scales_w=None):
    return _upsample_nearest(x, output_size, [scales_d, scales_h, scales_w], True)


def _zeros_input(grad, input_size):
    return jnp.zeros(tuple(input_size), _acc(grad).dtype)


def _nearest_backward(exact: bool):
    """Backward of nearest upsampling (plain or ``_exact``) for any rank: the ``scales*`` arguments follow
    ``input_size`` in schema order, one per spatial dim."""

    def backward(grad, output_size, input_size, *scales, **named_scales):
        given = list(scales) + list(named_scales.values())  # keyword scales arrive in schema order
        given += [None] * (len(output_size) - len(given))
        return _linear_backward(lambda v: _upsample_nearest(v, output_size, given, exact), grad,
                                _zeros_input(grad, input_size))

    return backward


for _exact, _ops in ((False, (aten.upsample_nearest1d_backward, aten.upsample_nearest2d_backward,
                              aten.upsample_nearest3d_backward)),
                     (True, (aten._upsample_nearest_exact1d_backward, aten._upsample_nearest_exact2d_backward,
                             aten._upsample_nearest_exact3d_backward))):
    lower(*_ops)(_nearest_backward(_exact))


@lower(aten.upsample_linear1d)
def upsample_linear1d(x, output_size, align_corners, scales=None):
    return _upsample_interp(x, output_size, align_corners, [scales], _linear_matrix)


@lower(aten.upsample_bilinear2d)
def upsample_bilinear2d(x, output_size, align_corners, scales_h=None, scales_w=None):
    return _upsample_interp(x, output_size, align_corners, [scales_h, scales_w], _linear_matrix)


@lower(aten.upsample_trilinear3d)
def upsample_trilinear3d(x, output_size, align_corners, scales_d=None, scales_h=None, scales_w=None):
    return _upsample_interp(x, output_size, align_corners, [scales_d, scales_h, scales_w], _linear_matrix)


@lower(aten.upsample_bicubic2d)
def upsample_bicubic2d(x, output_size, align_corners, scales_h=None, scales_w=None):
    return _upsample_interp(x, output_size, align_corners, [scales_h, scales_w], _cubic_matrix)


@lower(aten.upsample_linear1d_backward)
def upsample_linear1d_backward(grad, output_size, input_size, align_corners, scales=None):
    return _linear_backward(lambda v: _upsample_interp(v, output_size, align_corners, [scales], _linear_matrix),
                            grad, _zeros_input(grad, input_size))


@lower(aten.upsample_bilinear2d_backward)
def upsample_bilinear2d_backward(grad, output_size, input_size, align_corners, scales_h=None, scales_w=None):
    return _linear_backward(
        lambda v: _upsample_interp(v, output_size, align_corners, [scales_h, scales_w], _linear_matrix),
        grad, _zeros_input(grad, input_size))


@lower(aten.upsample_trilinear3d_backward)
def upsample_trilinear3d_backward(grad, output_size, input_size, align_corners, scales_d=None, scales_h=None,
                                  scales_w=None):
    return _linear_backward(
        lambda v: _upsample_interp(v, output_size, align_corners, [scales_d, scales_h, scales_w], _linear_matrix),
        grad, _zeros_input(grad, input_size))


@lower(aten.upsample_bicubic2d_backward)
def upsample_bicubic2d_backward(grad, output_size, input_size, align_corners, scales_h=None, scales_w=None):
    return _linear_backward(
        lambda v: _upsample_interp(v, output_size, align_corners, [scales_h, scales_w], _cubic_matrix),
        grad, _zeros_input(grad, input_size))


# ---- antialiased upsampling (PIL-style separable filters) --------------------------------------------------------


def _aa_matrix(n_in, n_out, align_corners, scale, cubic, ft):
    """PyTorch's antialias weights: a triangle (bilinear) or a=-0.5 cubic filter stretched by the downscale factor,
    each output's taps normalized to sum to one; computed in ``ft`` (the opmath type) as PyTorch's CPU kernel."""
    s = _corner_scale(n_in, n_out, ft) if align_corners else _scale(n_in, n_out, scale, ft)
    half = ft(2.0 if cubic else 1.0)
    support = half * s if s >= 1 else half
    invscale = ft(1) / s if s >= 1 else ft(1)

    def filt(x):
        x = np.abs(x)
        if not cubic:
            return np.where(x < 1, 1 - x, 0)
        a = -0.5
        return np.where(x < 1, ((a + 2) * x - (a + 3)) * x * x + 1,
                        np.where(x < 2, (((x - 5) * x + 8) * x - 4) * a, 0))

    m = np.zeros((n_out, n_in), ft)
    for i in range(n_out):
        center = s * ft(i + 0.5)
        lo = max(int(center - support + ft(0.5)), 0)
        hi = min(int(center + support + ft(0.5)), n_in)
        j = np.arange(lo, hi)
        w = filt((j - center + ft(0.5)).astype(ft) * invscale).astype(ft)
        total = w.sum(dtype=ft)
        m[i, lo:hi] = w / total if total != 0 else w
    return m


def _aa_linear(n_in, n_out, align_corners, scale, ft):
    return _aa_matrix(n_in, n_out, align_corners, scale, False, ft)


def _aa_cubic(n_in, n_out, align_corners, scale, ft):
    return _aa_matrix(n_in, n_out, align_corners, scale, True, ft)


@lower(aten._upsample_bilinear2d_aa)
def upsample_bilinear2d_aa(x, output_size, align_corners, scales_h=None, scales_w=None):
    return _upsample_interp(x, output_size, align_corners, [scales_h, scales_w], _aa_linear)


@lower(aten._upsample_bicubic2d_aa)
def upsample_bicubic2d_aa(x, output_size, align_corners, scales_h=None, scales_w=None):
    return _upsample_interp(x, output_size, align_corners, [scales_h, scales_w], _aa_cubic)


@lower(aten._upsample_bilinear2d_aa_backward)
def upsample_bilinear2d_aa_backward(grad, output_size, input_size, align_corners, scales_h=None, scales_w=None):
    return _linear_backward(lambda v: _upsample_interp(v, output_size, align_corners, [scales_h, scales_w], _aa_linear),
                            grad, _zeros_input(grad, input_size))


@lower(aten._upsample_bicubic2d_aa_backward)
def upsample_bicubic2d_aa_backward(grad, output_size, input_size, align_corners, scales_h=None, scales_w=None):
    return _linear_backward(lambda v: _upsample_interp(v, output_size, align_corners, [scales_h, scales_w], _aa_cubic),
                            grad, _zeros_input(grad, input_size))
