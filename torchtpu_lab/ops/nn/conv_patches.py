"""Convolution as a matrix product of the input's patches (or a sum over kernel taps), where XLA:CPU's own is slow.

XLA:CPU runs a convolution through Eigen's spatial convolution when it can, and otherwise through a generic loop
that is one to two orders of magnitude slower. A window at least as large as the input it slides over (or than the
output it makes) takes the slow loop: a ResNet's last stage on small images (a 3x3 kernel over a 2x2 map: 49 ms
for what PyTorch's CPU kernel does in 0.7 ms), and the input gradient of a stride-2 convolution into it (that
gradient is a convolution of the lhs-dilated output gradient, 19 ms). There the input's patches are gathered with
``kh * kw`` strided slices (an ``lax.pad`` first, whose interior padding is the lhs dilation) and contracted with
the kernel in one ``dot_general``: few positions, so the patches are small, and XLA:CPU's matrix product is fast.
Its gradients, through ``jax.vjp``, are pads, slices and products too, never the slow loop.

Elsewhere (large maps) XLA's convolution is faster than the patches, which grow with ``kh * kw``, so
:func:`window_is_large` keeps them apart. Depthwise convolutions, which XLA:CPU's grouped convolution runs slowly
at every size, are the sum of the same per-tap slices times a weight per channel (:func:`depthwise_conv`). On a
TPU or GPU none of this is used: their convolutions are fast.
"""

from __future__ import annotations

import itertools
import math

from jax import lax
import jax.numpy as jnp

from ._common import _acc


def _geometry(in_sizes, kernel, strides, pads, lhs_dilation, rhs_dilation):
    """Per spatial dim: ``(dilated input size, dilated kernel extent, output size)``."""
    out = []
    for n, k, s, (lo, hi), ld, rd in zip(in_sizes, kernel, strides, pads, lhs_dilation, rhs_dilation):
        dilated, extent = (n - 1) * ld + 1, (k - 1) * rd + 1
        out.append((dilated, extent, (dilated + lo + hi - extent) // s + 1))
    return out


def window_is_large(in_sizes, kernel, strides, pads, lhs_dilation, rhs_dilation) -> bool:
    """Whether some spatial dim's window (a kernel of more than one element) spans its whole input, or is
    longer than the output it makes: XLA:CPU's slow convolution loop (see the module docstring)."""
    return any(extent > 1 and (dilated <= extent or size < extent)
               for dilated, extent, size in _geometry(in_sizes, kernel, strides, pads, lhs_dilation, rhs_dilation))


def _taps(x, kernel, strides, pads, lhs_dilation, rhs_dilation) -> tuple[list, list]:
    """``(columns, output sizes)``: per kernel tap (row-major over the kernel), the input positions it meets at
    each output position, as one strided slice of the padded (and lhs-dilated) input."""
    n, c = x.shape[:2]
    geometry = _geometry(x.shape[2:], kernel, strides, pads, lhs_dilation, rhs_dilation)
    zero = jnp.zeros((), x.dtype)
    x = lax.pad(x, zero, [(0, 0, 0), (0, 0, 0)] + [(lo, hi, ld - 1) for (lo, hi), ld in zip(pads, lhs_dilation)])
    sizes = [size for _, _, size in geometry]
    columns = []
    for offsets in itertools.product(*(range(k) for k in kernel)):
        start = [0, 0] + [o * d for o, d in zip(offsets, rhs_dilation)]
        limit = [n, c] + [b + (size - 1) * s + 1 for b, size, s in zip(start[2:], sizes, strides)]
        columns.append(lax.slice(x, start, limit, [1, 1] + list(strides)))
    return columns, sizes


def patch_conv(x, w, strides, pads, lhs_dilation, rhs_dilation, groups: int, precision):
    """``lax.conv_general_dilated`` for ``NC<spatial>`` inputs and ``OI<spatial>`` kernels, as patches times the
    kernel (one ``dot_general``, the groups its batch dimension)."""
    n, c = x.shape[:2]
    k_out, kernel = w.shape[0], w.shape[2:]
    columns, sizes = _taps(x, kernel, strides, pads, lhs_dilation, rhs_dilation)
    taps = len(columns)
    patches = jnp.stack(columns, axis=2)  # (N, C, taps, *out)
    c_g, k_g, positions = c // groups, k_out // groups, math.prod(sizes)
    patches = patches.reshape(n, groups, c_g * taps, positions)
    weights = w.reshape(groups, k_g, c_g * taps)  # (C_g, *kernel) flattens in the patches' (C_g, taps) order
    # half types summed in float32 and rounded once, as PyTorch's CPU kernels and XLA's convolution do
    out = lax.dot_general(_acc(patches), _acc(weights), (((2,), (2,)), ((1,), (0,))),
                          precision=precision)  # (G, N, P, K_g)
    return jnp.transpose(out, (1, 0, 3, 2)).reshape(n, k_out, *sizes).astype(x.dtype)


def is_depthwise(x, w, groups: int) -> bool:
    """One input channel per group (a depthwise convolution, with any channel multiplier)."""
    return groups > 1 and groups == x.shape[1] and w.shape[1] == 1


def depthwise_conv(x, w, strides, pads, lhs_dilation, rhs_dilation):
    """A depthwise convolution as the sum over kernel taps of each tap's input slice times its weight per
    channel: one elementwise fusion. XLA:CPU's grouped convolution runs a ConvNeXt block's 7x7 depthwise
    convolution at 2 GFLOP/s (2.9 ms forward for an 8x32x16x16 map, 0.2 ms as taps; a 56x56 map 99 ms and
    2.5 ms), and the patches form would stack 49 copies of the input. Where the window spans the map the patches
    serve better (the taps' weight gradient is one reduction per tap), so :mod:`.convolution` asks
    :func:`window_is_large` first."""
    # the input materialized once: else XLA fuses its producer (a layer norm, a transpose) into every tap's slice
    # and computes it once per tap
    columns, sizes = _taps(lax.optimization_barrier(x), w.shape[2:], strides, pads, lhs_dilation, rhs_dilation)
    multiplier = w.shape[0] // x.shape[1]
    per_tap = _acc(w.reshape(w.shape[0], len(columns)))  # (summed in float32 for half types, as in patch_conv)
    out = None
    for t, column in enumerate(columns):
        if multiplier > 1:  # output channel c * m + j reads input channel c
            column = jnp.repeat(column, multiplier, axis=1)
        term = _acc(column) * per_tap[:, t].reshape((1, -1) + (1,) * len(sizes))
        out = term if out is None else out + term
    # its gradient, which every tap's transpose reads, materialized once as well (the barrier's transpose)
    return lax.optimization_barrier(out.astype(x.dtype))
