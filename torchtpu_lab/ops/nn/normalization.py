"""Layer, batch and group normalization and their backward ops. Lowerings (pure JAX).

The batch-norm ops that update ``running_mean``/``running_var`` in place are torch-level kernels in
:mod:`.torch_kernels`; they run the pure ``_native_batch_norm_legit_functional`` lowering defined here.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
from jax import lax

import torch

from ..precision import HALF_TYPES
from ..registry import aten, fixes_meta, lower
from ._common import _acc


#: the half types as torch dtypes (meta kernels' outputs are torch tensors; HALF_TYPES are JAX's)
_TORCH_HALF_TYPES = (torch.float16, torch.bfloat16)


def _kept_dtype(x, weight, running_mean):
    """The dtype batch norm keeps its statistics in on CPU: the parameters' (the weight's, else the running
    mean's), else the input's. For JAX arrays and torch (meta) tensors alike."""
    return next((p.dtype for p in (weight, running_mean) if p is not None), x.dtype)


def _channel(v, ndim):
    """A per-channel vector shaped to broadcast against an (N, C, ...) tensor of ``ndim`` dims."""
    return v.reshape((1, -1) + (1,) * (ndim - 2)) if ndim > 1 else v


@fixes_meta(aten.native_layer_norm.default)
def _layer_norm_saves_in_the_models_dtype(op, args: list, kwargs: dict, meta):
    """CPU saves ``mean`` and ``rstd`` in the parameters' dtype (``param_scalar_type``): the input's, unless a
    half-type input meets float32 weights (its "mixed type"), where PyTorch's meta kernel says float32 for every
    half-type input. The forward's output is computed from the unrounded statistics either way."""
    x, weight, bias = args[0], args[2] if len(args) > 2 else None, args[3] if len(args) > 3 else None
    out, mean, rstd = meta
    if x.dtype not in _TORCH_HALF_TYPES:
        return meta
    mixed = any(p is not None and p.dtype != x.dtype for p in (weight, bias))
    return meta if mixed else (out, mean.to(x.dtype), rstd.to(x.dtype))


@lower(aten.native_layer_norm)
def native_layer_norm(x, normalized_shape, weight, bias, eps):
    axes = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    xf = _acc(x)
    mean = jnp.mean(xf, axis=axes, keepdims=True)
    var = jnp.mean(jnp.square(xf - mean), axis=axes, keepdims=True)
    rstd = lax.rsqrt(var + eps)
    out = (xf - mean) * rstd
    if weight is not None:
        out = out * weight
    if bias is not None:
        out = out + bias
    return out, mean, rstd


@lower(aten.native_layer_norm_backward)
def native_layer_norm_backward(grad, x, normalized_shape, mean, rstd, weight, bias, output_mask):
    """CPU's formula (``LayerNormBackwardKernelImplInternal``): ``dx = a * dy * w + b * x + c`` with ``a`` the
    saved ``rstd`` and ``b``, ``c`` from the row sums ``ds = sum(dy * w * x)`` and ``db = sum(dy * w)``, over the
    statistics as saved (in a half-type model's dtype: rounded, which the forward's output was not). The
    textbook form ``rstd * (g - mean(g) - xhat * mean(g * xhat))`` is the same number in exact arithmetic, but a
    gradient that nearly cancels (a loss whose gradient is almost constant along the row) keeps different
    residues."""
    axes = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    outer = tuple(range(x.ndim - len(normalized_shape)))
    grad, xf = _acc(grad), _acc(x)
    mean, rstd = _acc(mean), _acc(rstd)
    g = grad * _acc(weight) if weight is not None else grad
    gi = gw = gb = None
    if output_mask[0]:
        n = math.prod(x.shape[a] for a in axes)
        scale = 1.0 / n if n else 0.0  # no elements to normalize: nothing reads it
        ds = jnp.sum(g * xf, axis=axes, keepdims=True)
        db = jnp.sum(g, axis=axes, keepdims=True)
        b = (db * mean - ds) * rstd * rstd * rstd * scale
        c = -b * mean - db * rstd * scale
        gi = rstd * g + b * xf + c
    if output_mask[1] and weight is not None:
        gw = jnp.sum(grad * ((xf - mean) * rstd), axis=outer)
    if output_mask[2] and bias is not None:
        gb = jnp.sum(grad, axis=outer)
    return gi, gw, gb


def _batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps):
    axes = (0,) + tuple(range(2, x.ndim))
    xf = _acc(x)
    if training:
        mean = jnp.mean(xf, axis=axes)
        var = jnp.mean(jnp.square(xf - _channel(mean, x.ndim)), axis=axes)
        rstd = lax.rsqrt(var + eps)
        new_mean, new_var = running_mean, running_var
        if running_mean is not None:
            new_mean = momentum * mean + (1 - momentum) * running_mean
        if running_var is not None:
            n = x.size / x.shape[1]
            new_var = momentum * var * (n / (n - 1)) + (1 - momentum) * running_var
        # CPU normalizes with the statistics it saves, in the parameters' dtype: rounded for a half-type model
        kept = _kept_dtype(x, weight, running_mean)
        if kept in HALF_TYPES:
            mean, rstd = (s.astype(kept).astype(s.dtype) for s in (mean, rstd))
    else:
        mean, new_mean, new_var = running_mean, running_mean, running_var
        rstd = lax.rsqrt(_acc(running_var) + eps)
    out = (xf - _channel(mean, x.ndim)) * _channel(rstd, x.ndim)
    if weight is not None:
        out = out * _channel(weight, x.ndim)
    if bias is not None:
        out = out + _channel(bias, x.ndim)
    return out, mean, rstd, new_mean, new_var


@fixes_meta(aten._native_batch_norm_legit_functional.default, aten._native_batch_norm_legit.no_stats)
def _batch_norm_saves_in_the_models_dtype(op, args: list, kwargs: dict, meta):
    """CPU returns the saved ``mean`` and ``invstd`` of a training step in the parameters' dtype (the values
    :func:`_batch_norm` rounds to it), where PyTorch's meta kernel says float32 for every half-type input."""
    x, weight = args[0], args[1]
    running = args[3] if op is aten._native_batch_norm_legit_functional.default else None
    kept = _kept_dtype(x, weight, running)
    if x.dtype not in _TORCH_HALF_TYPES or kept != x.dtype:
        return meta
    return (meta[0], meta[1].to(kept), meta[2].to(kept), *meta[3:])


@lower(aten._native_batch_norm_legit_functional)
def native_batch_norm_legit_functional(x, weight, bias, running_mean, running_var, training, momentum, eps):
    return _batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps)


@lower(aten._native_batch_norm_legit.no_stats)
def native_batch_norm_legit_no_stats(x, weight, bias, training, momentum, eps):
    return _batch_norm(x, weight, bias, None, None, True, momentum, eps)[:3]


@lower(aten._native_batch_norm_legit_no_training)
def native_batch_norm_legit_no_training(x, weight, bias, running_mean, running_var, momentum, eps):
    return _batch_norm(x, weight, bias, running_mean, running_var, False, momentum, eps)[:3]


@lower(aten.native_batch_norm_backward)
def native_batch_norm_backward(grad, x, weight, running_mean, running_var, save_mean, save_invstd, train, eps,
                               output_mask):
    axes = (0,) + tuple(range(2, x.ndim))
    grad, xf = _acc(grad), _acc(x)
    if train:
        mean, invstd = save_mean, save_invstd
    else:
        mean, invstd = running_mean, lax.rsqrt(_acc(running_var) + eps)
    mean, invstd = _channel(mean, x.ndim), _channel(invstd, x.ndim)
    xhat = (xf - mean) * invstd
    w = _channel(weight, x.ndim) if weight is not None else 1.0
    gi = gw = gb = None
    if output_mask[0]:
        if train:
            gi = w * invstd * (grad - jnp.mean(grad, axis=axes, keepdims=True)
                               - xhat * jnp.mean(grad * xhat, axis=axes, keepdims=True))
        else:
            gi = grad * invstd * w
    if output_mask[1]:
        gw = jnp.sum(grad * xhat, axis=axes)
    if output_mask[2]:
        gb = jnp.sum(grad, axis=axes)
    return gi, gw, gb


@lower(aten.native_group_norm)
def native_group_norm(x, weight, bias, N, C, HxW, group, eps):
    per_group = (N, group, C // group * HxW)  # explicit sizes: a batch of 0 has no -1 to infer
    xf = _acc(x).reshape(per_group)
    mean = jnp.mean(xf, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(xf - mean), axis=-1, keepdims=True)
    rstd = lax.rsqrt(var + eps)
    out = ((xf - mean) * rstd).reshape(N, C, HxW)
    if weight is not None:
        out = out * weight.reshape(1, C, 1)
    if bias is not None:
        out = out + bias.reshape(1, C, 1)
    return out.reshape(x.shape), mean.reshape(N, group), rstd.reshape(N, group)


@lower(aten.native_group_norm_backward)
def native_group_norm_backward(grad, x, mean, rstd, weight, N, C, HxW, group, output_mask):
    per_group = (N, group, C // group * HxW)
    grad3, x3 = _acc(grad).reshape(N, C, HxW), _acc(x).reshape(N, C, HxW)
    mean, rstd = mean.reshape(N, group, 1), rstd.reshape(N, group, 1)
    xhat = ((x3.reshape(per_group) - mean) * rstd).reshape(N, C, HxW)
    gi = gw = gb = None
    if output_mask[0]:
        g = (grad3 * weight.reshape(1, C, 1) if weight is not None else grad3).reshape(per_group)
        xh = xhat.reshape(per_group)
        gi = rstd * (g - jnp.mean(g, axis=-1, keepdims=True) - xh * jnp.mean(g * xh, axis=-1, keepdims=True))
        gi = gi.reshape(x.shape)
    if output_mask[1]:
        gw = jnp.sum(grad3 * xhat, axis=(0, 2))
    if output_mask[2]:
        gb = jnp.sum(grad3, axis=(0, 2))
    return gi, gw, gb
