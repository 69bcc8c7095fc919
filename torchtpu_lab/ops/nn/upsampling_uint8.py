"""Bilinear and bicubic upsampling of ``uint8`` images (plain and antialiased), in PyTorch's fixed-point arithmetic.

PyTorch's CPU kernel does not interpolate a ``uint8`` image in floating point: it computes each axis's weights in
double, rounds them to int16 at the largest precision under which the largest weight fits, and resamples one axis
at a time, width first, rounding each pass back to ``uint8`` (``_compute_index_ranges_int16_weights`` and
``basic_loop_aa_horizontal<uint8_t>`` in ``aten/src/ATen/native/cpu/UpSampleKernel.cpp``). A float interpolation
rounded once at the end differs from it by one in some pixels, so the same steps are taken here: the weights in
NumPy at trace time, each pass an exact int32 product.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np


def _cpp_int(v: float) -> int:
    """C++'s ``static_cast<int64_t>`` of a double: truncation toward zero."""
    return int(math.trunc(v))


def _axis_scale(n_in: int, n_out: int, align_corners: bool, scale) -> float:
    """PyTorch's ``area_pixel_compute_scale<double>``."""
    if align_corners:
        return (n_in - 1) / (n_out - 1) if n_out > 1 else 0.0
    return 1.0 / scale if scale is not None and scale > 0 else n_in / n_out


def _filter(cubic: bool, keys: bool):
    """PyTorch's ``aa_filter``: the triangle, or the cubic convolution with a = -0.5 (antialiased, as PIL) or
    -0.75 (plain, as OpenCV)."""
    a = -0.5 if keys else -0.75

    def f(x: float) -> float:
        x = abs(x)
        if not cubic:
            return 1.0 - x if x < 1.0 else 0.0
        if x < 1.0:
            return ((a + 2) * x - (a + 3)) * x * x + 1
        if x < 2.0:
            return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
        return 0.0

    return f


def _aa_taps(i: int, n_in: int, scale: float, interp: int, f) -> tuple[int, list[float], float]:
    """``_compute_indices_min_size_weights_aa``: first input index, the normalized taps, their largest."""
    support = interp * 0.5 * scale if scale >= 1.0 else interp * 0.5
    max_taps = math.ceil(support) * 2 + 1
    center = scale * (i + 0.5)
    invscale = 1.0 / scale if scale >= 1.0 else 1.0
    xmin = max(_cpp_int(center - support + 0.5), 0)
    xsize = min(max(min(_cpp_int(center + support + 0.5), n_in) - xmin, 0), max_taps)
    w = [f((j + xmin - center + 0.5) * invscale) for j in range(xsize)]
    total = sum(w)
    if total == 0.0:
        return xmin, w, 0.0
    w = [v / total for v in w]
    return xmin, w, max(w, default=0.0)


def _plain_taps(i: int, n_in: int, scale: float, align_corners: bool, interp: int, f) -> tuple[int, list[float], float]:
    """``_compute_indices_min_size_weights``: the taps of the plain (not antialiased) filter, those falling outside
    the input added onto the edge samples; the largest is taken over the running sums, as PyTorch takes it."""
    cubic = interp > 2
    real = scale * i if align_corners else scale * (i + 0.5) - 0.5
    if not align_corners and not cubic and real < 0:
        real = 0.0
    index = min(math.floor(real), n_in - 1)
    lam = min(max(real - index, 0.0), 1.0)
    support = interp // 2
    lo = index - support + 1
    xmin = max(lo, 0)
    xsize = min(max(min(index + support + 1, n_in) - xmin, 0), interp)
    w = [0.0] * interp
    wt_max, slot = 0.0, 0
    for j in range(interp):
        if lo + j <= 0:
            slot = 0
        elif lo + j >= n_in - 1:
            slot = xsize - 1
        w[slot] += f((j + 1 - support) - lam)
        wt_max = max(wt_max, w[slot])
        slot += 1
    return xmin, w[:xsize], wt_max


def _int16_matrix(n_in: int, n_out: int, align_corners: bool, scale, cubic: bool, antialias: bool):
    """One axis's int16 weights as a dense ``[n_out, n_in]`` int32 matrix, and their precision in bits."""
    s = _axis_scale(n_in, n_out, align_corners, scale)
    interp = 4 if cubic else 2
    f = _filter(cubic, keys=antialias)
    rows = [_aa_taps(i, n_in, s, interp, f) if antialias else _plain_taps(i, n_in, s, align_corners, interp, f)
            for i in range(n_out)]
    wt_max = max((r[2] for r in rows), default=0.0)
    precision = 0
    while precision < 22 and _cpp_int(0.5 + wt_max * (1 << (precision + 1))) < (1 << 15):
        precision += 1
    m = np.zeros((n_out, n_in), np.int32)
    for i, (xmin, w, _) in enumerate(rows):
        for k, v in enumerate(w):
            v *= 1 << precision
            m[i, xmin + k] += np.int16(_cpp_int(v - 0.5 if v < 0 else v + 0.5))
    return m, precision


def upsample_uint8(x, output_size, align_corners: bool, scales, cubic: bool, antialias: bool):
    """``x`` (``uint8``, ``[N, C, H, W]``) resampled to ``output_size`` as PyTorch's CPU kernel does: width first,
    then height, an axis whose size does not change left alone, each pass rounded and clamped to ``uint8``."""
    nd = len(output_size)
    for axis in reversed(range(nd)):
        ax = x.ndim - nd + axis
        if x.shape[ax] == output_size[axis]:
            continue
        m, precision = _int16_matrix(x.shape[ax], output_size[axis], align_corners, scales[axis], cubic, antialias)
        acc = jnp.tensordot(x.astype(jnp.int32), jnp.asarray(m), axes=([ax], [1]))
        acc = jnp.right_shift(acc + (1 << (precision - 1)), precision)
        x = jnp.moveaxis(jnp.clip(acc, 0, 255).astype(jnp.uint8), -1, ax)
    return x
