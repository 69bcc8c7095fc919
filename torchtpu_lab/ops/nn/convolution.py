"""Convolution (plain, transposed, grouped; 1-3 spatial dims) and its backward. Lowerings (pure JAX).

The backward is ``jax.vjp`` of the forward lowering, so both share one definition of the geometry. The products
run at :func:`~torchtpu_lab.ops.precision.matmul_precision` (PyTorch's float32 matmul precision setting).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch
from jax import lax
from torch._prims_common import suggest_memory_format

from ... import platform
from ..precision import matmul_precision
from ..registry import aten, fixes_meta, lower
from . import conv_patches
from ._common import _tup


def _conv(x, w, stride, padding, dilation, transposed, output_padding, groups):
    nd = w.ndim - 2
    stride, padding, dilation = _tup(stride, nd), _tup(padding, nd), _tup(dilation, nd)
    if x.dtype != w.dtype:
        dt = jnp.result_type(x, w)
        x, w = x.astype(dt), w.astype(dt)
    if not transposed:
        return _windowed(x, w, stride, [(p, p) for p in padding], (1,) * nd, dilation, groups)
    output_padding = _tup(output_padding, nd)
    cin, cout_g, k = w.shape[0], w.shape[1], w.shape[2:]
    # (G*Cin_g, Cout_g, k) -> (G*Cout_g, Cin_g, k), spatially flipped
    w = w.reshape(groups, cin // groups, cout_g, *k).swapaxes(1, 2).reshape(groups * cout_g, cin // groups, *k)
    w = jnp.flip(w, axis=tuple(range(2, 2 + nd)))
    pads = [(d * (kk - 1) - p, d * (kk - 1) - p + op) for kk, p, d, op in zip(k, padding, dilation, output_padding)]
    return _windowed(x, w, (1,) * nd, pads, stride, dilation, groups)


def _windowed(x, w, strides, pads, lhs_dilation, rhs_dilation, groups):
    """The convolution of ``NC<spatial>`` ``x`` with ``OI<spatial>`` ``w``: XLA's, except on XLA:CPU for
    depthwise convolutions and the windows its convolution loop is slow on (:mod:`.conv_patches`)."""
    precision = matmul_precision()
    if platform.info().platform == "cpu":
        if conv_patches.window_is_large(x.shape[2:], w.shape[2:], strides, pads, lhs_dilation, rhs_dilation):
            return conv_patches.patch_conv(x, w, strides, pads, lhs_dilation, rhs_dilation, groups, precision)
        if conv_patches.is_depthwise(x, w, groups):
            return conv_patches.depthwise_conv(x, w, strides, pads, lhs_dilation, rhs_dilation)
    spatial = "DHW"[3 - (w.ndim - 2):]
    dn = lax.conv_dimension_numbers(x.shape, w.shape, ("NC" + spatial, "OI" + spatial, "NC" + spatial))
    return lax.conv_general_dilated(x, w, strides, pads, lhs_dilation=lhs_dilation, rhs_dilation=rhs_dilation,
                                    dimension_numbers=dn, feature_group_count=groups, precision=precision)


@lower(aten.convolution)
def convolution(x, w, bias, stride, padding, dilation, transposed, output_padding, groups):
    out = _conv(x, w, stride, padding, dilation, transposed, output_padding, groups)
    if bias is not None:
        out = out + bias.reshape((1, -1) + (1,) * (out.ndim - 2))
    return out


@fixes_meta(aten.convolution)
def _channels_last_as_cpu(op, args: list, kwargs: dict, meta):
    """CPU's convolution lays its result out channels-last when its input or weight is (oneDNN's rule, and its
    slow path's for 2-d); PyTorch's meta kernel always says row-major. The result's strides are CPU's
    (runtime/layouts.py), so a channels-last model's activations stay channels-last, as on CPU (3-d: not for
    float64, which CPU's slow path keeps row-major)."""
    x, w = args[0], args[1]
    fmt = {4: torch.channels_last, 5: torch.channels_last_3d}.get(meta.dim())
    if fmt is None or (fmt is torch.channels_last_3d and meta.dtype == torch.float64):
        return meta
    if suggest_memory_format(x) == fmt or suggest_memory_format(w) == fmt:
        return meta.contiguous(memory_format=fmt)
    return meta


@lower(aten.convolution_backward)
def convolution_backward(grad, x, w, bias_sizes, stride, padding, dilation, transposed, output_padding, groups,
                         output_mask):
    gi = gw = gb = None
    if output_mask[0] or output_mask[1]:
        _, vjp = jax.vjp(lambda a, b: _conv(a, b, stride, padding, dilation, transposed, output_padding, groups), x, w)
        gi, gw = vjp(grad.astype(jnp.result_type(x, w)))
    if output_mask[2]:
        gb = jnp.sum(grad, axis=(0,) + tuple(range(2, grad.ndim)))
    return gi if output_mask[0] else None, gw if output_mask[1] else None, gb
