"""Neural-network ops: convolution, softmax, normalization, pooling, activations, losses, embedding, upsampling.

Backward ops that are linear in ``grad_output`` (convolution, pooling, upsampling) are lowered as ``jax.vjp`` of
the forward lowering, so forward and backward share one definition of the op's geometry.

The batch-norm ops that update ``running_mean``/``running_var`` in place cannot be pure lowerings: they are plain
Python kernels that run the pure ``_native_batch_norm_legit_functional`` lowering and assign the new statistics.
"""

from __future__ import annotations

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from .checks import report, reports
from .registry import aten, kernel, lower

HIGHEST = lax.Precision.HIGHEST


def _tup(v, n):
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    return tuple(v * n if len(v) == 1 else v)


def _acc(x):
    """``x`` in the dtype PyTorch accumulates it in (float32 for half types)."""
    return x.astype(jnp.float32) if x.dtype in (jnp.float16, jnp.bfloat16) else x


def _reduce(loss, reduction):
    if reduction == 1:
        return jnp.mean(loss)
    if reduction == 2:
        return jnp.sum(loss)
    return loss


def _reduce_backward(grad, shape, reduction):
    """The gradient of ``_reduce`` w.r.t. its elementwise input of ``shape``."""
    if reduction == 1:
        return jnp.broadcast_to(grad / math.prod(shape), shape)
    return jnp.broadcast_to(grad, shape)


# ---- convolution -------------------------------------------------------------------------------------------------


def _conv(x, w, stride, padding, dilation, transposed, output_padding, groups):
    nd = w.ndim - 2
    stride, padding, dilation = _tup(stride, nd), _tup(padding, nd), _tup(dilation, nd)
    spatial = "DHW"[3 - nd:]
    dn = lax.conv_dimension_numbers(x.shape, w.shape, ("NC" + spatial, "OI" + spatial, "NC" + spatial))
    if x.dtype != w.dtype:
        dt = jnp.result_type(x, w)
        x, w = x.astype(dt), w.astype(dt)
    if not transposed:
        return lax.conv_general_dilated(
            x, w, stride, [(p, p) for p in padding], rhs_dilation=dilation, dimension_numbers=dn,
            feature_group_count=groups, precision=HIGHEST,
        )
    output_padding = _tup(output_padding, nd)
    cin, cout_g, k = w.shape[0], w.shape[1], w.shape[2:]
    # (G*Cin_g, Cout_g, k) -> (G*Cout_g, Cin_g, k), spatially flipped
    w = w.reshape(groups, cin // groups, cout_g, *k).swapaxes(1, 2).reshape(groups * cout_g, cin // groups, *k)
    w = jnp.flip(w, axis=tuple(range(2, 2 + nd)))
    pads = [(d * (kk - 1) - p, d * (kk - 1) - p + op) for kk, p, d, op in zip(k, padding, dilation, output_padding)]
    return lax.conv_general_dilated(
        x, w, (1,) * nd, pads, lhs_dilation=stride, rhs_dilation=dilation, dimension_numbers=dn,
        feature_group_count=groups, precision=HIGHEST,
    )


@lower(aten.convolution)
def convolution(x, w, bias, stride, padding, dilation, transposed, output_padding, groups):
    out = _conv(x, w, stride, padding, dilation, transposed, output_padding, groups)
    if bias is not None:
        out = out + bias.reshape((1, -1) + (1,) * (out.ndim - 2))
    return out


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


# ---- softmax -----------------------------------------------------------------------------------------------------


def _along(fn, x, dim):
    """Apply ``fn(x, axis)`` along ``dim``, treating a 0-dim ``x`` as one element."""
    if x.ndim == 0:
        return fn(x.reshape(1), 0).reshape(())
    return fn(x, dim % x.ndim)


@lower(aten._softmax)
def softmax(x, dim, half_to_float):
    return _along(lambda v, a: jax.nn.softmax(_acc(v), axis=a), x, dim)


@lower(aten._log_softmax)
def log_softmax(x, dim, half_to_float):
    return _along(lambda v, a: jax.nn.log_softmax(_acc(v), axis=a), x, dim)


@lower(aten._softmax_backward_data)
def softmax_backward_data(grad, out, dim, input_dtype):
    def fn(g, a):
        y = out.reshape(g.shape)
        return y * (g - jnp.sum(g * y, axis=a, keepdims=True))

    return _along(fn, grad, dim)


@lower(aten._log_softmax_backward_data)
def log_softmax_backward_data(grad, out, dim, input_dtype):
    def fn(g, a):
        return g - jnp.exp(out.reshape(g.shape)) * jnp.sum(g, axis=a, keepdims=True)

    return _along(fn, grad, dim)


# ---- normalization -----------------------------------------------------------------------------------------------


def _channel(v, ndim):
    """A per-channel vector shaped to broadcast against an (N, C, ...) tensor of ``ndim`` dims."""
    return v.reshape((1, -1) + (1,) * (ndim - 2)) if ndim > 1 else v


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
    axes = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    outer = tuple(range(x.ndim - len(normalized_shape)))
    grad, xf = _acc(grad), _acc(x)
    xhat = (xf - mean) * rstd
    g = grad * weight if weight is not None else grad
    gi = gw = gb = None
    if output_mask[0]:
        gi = rstd * (g - jnp.mean(g, axis=axes, keepdims=True)
                     - xhat * jnp.mean(g * xhat, axis=axes, keepdims=True))
    if output_mask[1] and weight is not None:
        gw = jnp.sum(grad * xhat, axis=outer)
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
    else:
        mean, new_mean, new_var = running_mean, running_mean, running_var
        rstd = lax.rsqrt(_acc(running_var) + eps)
    out = (xf - _channel(mean, x.ndim)) * _channel(rstd, x.ndim)
    if weight is not None:
        out = out * _channel(weight, x.ndim)
    if bias is not None:
        out = out + _channel(bias, x.ndim)
    return out, mean, rstd, new_mean, new_var


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
    xf = _acc(x).reshape(N, group, -1)
    mean = jnp.mean(xf, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(xf - mean), axis=-1, keepdims=True)
    rstd = lax.rsqrt(var + eps)
    out = ((xf - mean) * rstd).reshape(N, C, -1)
    if weight is not None:
        out = out * weight.reshape(1, C, 1)
    if bias is not None:
        out = out + bias.reshape(1, C, 1)
    return out.reshape(x.shape), mean.reshape(N, group), rstd.reshape(N, group)


@lower(aten.native_group_norm_backward)
def native_group_norm_backward(grad, x, mean, rstd, weight, N, C, HxW, group, output_mask):
    grad3, x3 = _acc(grad).reshape(N, C, -1), _acc(x).reshape(N, C, -1)
    mean, rstd = mean.reshape(N, group, 1), rstd.reshape(N, group, 1)
    xhat = ((x3.reshape(N, group, -1) - mean) * rstd).reshape(N, C, -1)
    gi = gw = gb = None
    if output_mask[0]:
        g = (grad3 * weight.reshape(1, C, 1) if weight is not None else grad3).reshape(N, group, -1)
        xh = xhat.reshape(N, group, -1)
        gi = rstd * (g - jnp.mean(g, axis=-1, keepdims=True) - xh * jnp.mean(g * xh, axis=-1, keepdims=True))
        gi = gi.reshape(x.shape)
    if output_mask[1]:
        gw = jnp.sum(grad3 * xhat, axis=(0, 2))
    if output_mask[2]:
        gb = jnp.sum(grad3, axis=(0, 2))
    return gi, gw, gb


# Batch norm in training mode updates the running statistics in place: plain Python kernels, not lowerings.


def _update_stats(x, weight, bias, running_mean, running_var, training, momentum, eps):
    if running_mean is None or running_var is None:
        if running_mean is not None or running_var is not None:
            raise RuntimeError("running_mean and running_var must both be given or both be None")
        return aten._native_batch_norm_legit.no_stats(x, weight, bias, training, momentum, eps)
    if not training:  # PyTorch's CPU kernels return empty saved statistics in evaluation mode
        out = aten._native_batch_norm_legit_no_training(x, weight, bias, running_mean, running_var, momentum, eps)[0]
        return out, x.new_empty((0,)), x.new_empty((0,))
    out, save_mean, save_rstd, new_mean, new_var = aten._native_batch_norm_legit_functional(
        x, weight, bias, running_mean, running_var, True, momentum, eps
    )
    running_mean.copy_(new_mean)
    running_var.copy_(new_var)
    return out, save_mean, save_rstd


@kernel(aten.native_batch_norm.default)
def native_batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps):
    return _update_stats(x, weight, bias, running_mean, running_var, training, momentum, eps)


@kernel(aten._native_batch_norm_legit.default)
def native_batch_norm_legit(x, weight, bias, running_mean, running_var, training, momentum, eps):
    return _update_stats(x, weight, bias, running_mean, running_var, training, momentum, eps)


@kernel(aten._batch_norm_with_update.default)
def batch_norm_with_update(x, weight, bias, running_mean, running_var, momentum, eps):
    out, save_mean, save_rstd = _update_stats(x, weight, bias, running_mean, running_var, True, momentum, eps)
    return out, save_mean, save_rstd, torch.empty(0, dtype=torch.uint8, device=x.device)


# ---- pooling -----------------------------------------------------------------------------------------------------


def _pool_out(size, k, s, p, d, ceil_mode):
    """PyTorch's pooling output length (``pooling_output_shape``)."""
    num = size + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil_mode else 0)
    out = num // s + 1
    if ceil_mode and (out - 1) * s >= size + p:
        out -= 1
    return out


def _pool_geometry(shape, kernel_size, stride, padding, dilation, ceil_mode, nd):
    k = _tup(kernel_size, nd)
    s = _tup(stride, nd) if stride else k
    p, d = _tup(padding, nd), _tup(dilation, nd)
    size = shape[-nd:]
    out = tuple(_pool_out(n, kk, ss, pp, dd, ceil_mode) for n, kk, ss, pp, dd in zip(size, k, s, p, d))
    return k, s, p, d, size, out


def _windows(x, k, s, p, d, size, out, fill):
    """Yield, per kernel offset, the strided input slice (``x`` padded with ``fill``), its flat input index and
    its validity mask (numpy arrays over the output positions)."""
    nd = len(k)
    lead = x.ndim - nd
    hi = [max(0, (o - 1) * ss + (kk - 1) * dd - pp - n + 1) for o, ss, kk, dd, pp, n in zip(out, s, k, d, p, size)]
    xp = jnp.pad(x, [(0, 0)] * lead + list(zip(p, hi)), constant_values=fill)
    flat_strides = [math.prod(size[i + 1:]) for i in range(nd)]
    for offs in itertools.product(*[range(kk) for kk in k]):
        start = [0] * lead + [o * dd for o, dd in zip(offs, d)]
        limit = [x.shape[i] for i in range(lead)] + [st + (o - 1) * ss + 1 for st, o, ss in zip(start[lead:], out, s)]
        patch = lax.slice(xp, start, limit, [1] * lead + list(s))
        pos = [np.arange(o) * ss - pp + off * dd for o, ss, pp, off, dd in zip(out, s, p, offs, d)]
        grids = np.meshgrid(*pos, indexing="ij")
        valid = np.ones(out, bool)
        index = np.zeros(out, np.int64)
        for g, n, fs in zip(grids, size, flat_strides):
            valid &= (g >= 0) & (g < n)
            index += g * fs
        yield patch, index, valid


def _max_pool(x, kernel_size, stride, padding, dilation, ceil_mode, nd):
    k, s, p, d, size, out = _pool_geometry(x.shape, kernel_size, stride, padding, dilation, ceil_mode, nd)
    best = idx = have = None
    for patch, index, valid in _windows(x, k, s, p, d, size, out, 0):
        if best is None:
            best, idx, have = patch, jnp.zeros(patch.shape, jnp.int64), jnp.zeros(out, bool)
        valid = jnp.asarray(valid)
        # PyTorch's scan: the first valid position, then any greater value or NaN replaces the maximum
        take = valid & (~have | (patch > best) | jnp.isnan(patch))
        best, idx, have = jnp.where(take, patch, best), jnp.where(take, index, idx), have | valid
    return best, idx


@lower(aten.max_pool2d_with_indices)
def max_pool2d_with_indices(x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    return _max_pool(x, kernel_size, stride, padding, dilation, ceil_mode, 2)


@lower(aten.max_pool3d_with_indices)
def max_pool3d_with_indices(x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    return _max_pool(x, kernel_size, stride, padding, dilation, ceil_mode, 3)


def _scatter_to_input(grad, x, indices, nd):
    """Sum ``grad`` into a zero tensor shaped like ``x`` at the flat spatial ``indices`` (pooling backward)."""
    lead = x.shape[:-nd]
    g = grad.reshape(math.prod(lead), -1)
    i = indices.reshape(math.prod(lead), -1)
    z = jnp.zeros((g.shape[0], math.prod(x.shape[-nd:])), grad.dtype)
    z = jax.vmap(lambda zz, ii, gg: zz.at[ii].add(gg))(z, i, g)
    return z.reshape(x.shape)


@lower(aten.max_pool2d_with_indices_backward)
def max_pool2d_with_indices_backward(grad, x, kernel_size, stride, padding, dilation, ceil_mode, indices):
    return _scatter_to_input(grad, x, indices, 2)


@lower(aten.max_pool3d_with_indices_backward)
def max_pool3d_with_indices_backward(grad, x, kernel_size, stride, padding, dilation, ceil_mode, indices):
    return _scatter_to_input(grad, x, indices, 3)


@lower(aten.adaptive_max_pool2d_backward)
def adaptive_max_pool2d_backward(grad, x, indices):
    return _scatter_to_input(grad, x, indices, 2)


@lower(aten.adaptive_max_pool3d_backward)
def adaptive_max_pool3d_backward(grad, x, indices):
    return _scatter_to_input(grad, x, indices, 3)


def _avg_pool(x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, nd):
    k, s, p, _, size, out = _pool_geometry(x.shape, kernel_size, stride, padding, 1, ceil_mode, nd)
    xf = _acc(x)
    total = None
    for patch, _, _ in _windows(xf, k, s, p, (1,) * nd, size, out, 0):
        total = patch if total is None else total + patch
    if divisor_override:
        return total / divisor_override
    # PyTorch's divisor: the window clipped to the padded input (count_include_pad) or to the input itself
    div = np.ones(out, np.float64)
    for axis, (o, kk, ss, pp, n) in enumerate(zip(out, k, s, p, size)):
        start = np.arange(o) * ss - pp
        end = np.minimum(start + kk, n + pp)
        length = end - start if count_include_pad else np.minimum(end, n) - np.maximum(start, 0)
        div = div * length.reshape((-1,) + (1,) * (nd - axis - 1))
    return total / jnp.asarray(div, xf.dtype)


@lower(aten.avg_pool2d)
def avg_pool2d(x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None):
    return _avg_pool(x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, 2)


@lower(aten.avg_pool3d)
def avg_pool3d(x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None):
    return _avg_pool(x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, 3)


def _linear_backward(forward, grad, x):
    _, vjp = jax.vjp(forward, _acc(x))
    return vjp(grad.astype(_acc(x).dtype))[0]


@lower(aten.avg_pool2d_backward)
def avg_pool2d_backward(grad, x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    return _linear_backward(
        lambda v: _avg_pool(v, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, 2),
        grad, x)


@lower(aten.avg_pool3d_backward)
def avg_pool3d_backward(grad, x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    return _linear_backward(
        lambda v: _avg_pool(v, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, 3),
        grad, x)


def _adaptive_ranges(n, o):
    start = (np.arange(o) * n) // o
    end = -((-(np.arange(o) + 1) * n) // o)
    return start, end


def _adaptive_avg(x, output_size, nd):
    xf = _acc(x)
    for axis, (n, o) in enumerate(zip(x.shape[-nd:], _tup(output_size, nd))):
        start, end = _adaptive_ranges(n, o)
        m = np.zeros((o, n))
        for i in range(o):
            m[i, start[i]:end[i]] = 1.0 / (end[i] - start[i])
        ax = x.ndim - nd + axis
        xf = jnp.moveaxis(jnp.tensordot(xf, jnp.asarray(m, xf.dtype), axes=([ax], [1]), precision=HIGHEST), -1, ax)
    return xf


@lower(aten._adaptive_avg_pool2d)
def adaptive_avg_pool2d(x, output_size):
    return _adaptive_avg(x, output_size, 2)


@lower(aten._adaptive_avg_pool3d)
def adaptive_avg_pool3d(x, output_size):
    return _adaptive_avg(x, output_size, 3)


@lower(aten._adaptive_avg_pool2d_backward)
def adaptive_avg_pool2d_backward(grad, x):
    return _linear_backward(lambda v: _adaptive_avg(v, grad.shape[-2:], 2), grad, x)


@lower(aten._adaptive_avg_pool3d_backward)
def adaptive_avg_pool3d_backward(grad, x):
    return _linear_backward(lambda v: _adaptive_avg(v, grad.shape[-3:], 3), grad, x)


def _adaptive_max(x, output_size, nd):
    size, out = x.shape[-nd:], _tup(output_size, nd)
    ranges = [_adaptive_ranges(n, o) for n, o in zip(size, out)]
    flat_strides = [math.prod(size[i + 1:]) for i in range(nd)]
    best = idx = None
    for offs in itertools.product(*[range(int(np.max(e - s))) for s, e in ranges]):
        pos = [np.minimum(s + off, e - 1) for (s, e), off in zip(ranges, offs)]  # clipped: repeats a valid one
        grids = np.meshgrid(*pos, indexing="ij")
        fresh = np.ones(out, bool)
        for (s, e), off, axis in zip(ranges, offs, range(nd)):
            fresh = fresh & (s + off < e).reshape((-1,) + (1,) * (nd - axis - 1))
        patch = x[(Ellipsis,) + tuple(jnp.asarray(g) for g in grids)]
        index = sum(g * fs for g, fs in zip(grids, flat_strides))
        if best is None:
            best, idx = patch, jnp.broadcast_to(jnp.asarray(index), patch.shape)
            continue
        take = jnp.asarray(fresh) & ((patch > best) | jnp.isnan(patch))
        best, idx = jnp.where(take, patch, best), jnp.where(take, index, idx)
    return best, idx


@lower(aten.adaptive_max_pool2d)
def adaptive_max_pool2d(x, output_size):
    return _adaptive_max(x, output_size, 2)


@lower(aten.adaptive_max_pool3d)
def adaptive_max_pool3d(x, output_size):
    return _adaptive_max(x, output_size, 3)


# ---- activations and their backward helpers ------------------------------------------------------------------


@lower(aten.relu)
def relu(x):
    return jnp.maximum(x, jnp.zeros((), x.dtype)) if x.dtype != jnp.bool_ else x


@lower(aten.threshold)
def threshold(x, threshold, value):
    return jnp.where(x <= threshold, value, x)


@lower(aten.threshold_backward)
def threshold_backward(grad, x, threshold):
    return jnp.where(x <= threshold, jnp.zeros((), grad.dtype), grad)


_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


@lower(aten.gelu)
def gelu(x, *, approximate="none"):
    if approximate == "tanh":
        return 0.5 * x * (1 + jnp.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)))
    return 0.5 * x * (1 + lax.erf(x * (1 / math.sqrt(2.0))))


@lower(aten.gelu_backward)
def gelu_backward(grad, x, *, approximate="none"):
    if approximate == "tanh":
        inner = _SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)
        t = jnp.tanh(inner)
        d = 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * _SQRT_2_OVER_PI * (1 + 3 * 0.044715 * x * x)
        return grad * d
    cdf = 0.5 * (1 + lax.erf(x * (1 / math.sqrt(2.0))))
    pdf = jnp.exp(-0.5 * x * x) * (1 / math.sqrt(2 * math.pi))
    return grad * (cdf + x * pdf)


@lower(aten.silu)
def silu(x):
    return x * jax.nn.sigmoid(x)


@lower(aten.silu_backward)
def silu_backward(grad, x):
    s = jax.nn.sigmoid(x)
    return grad * s * (1 + x * (1 - s))


@lower(aten.mish)
def mish(x):
    return x * jnp.tanh(jax.nn.softplus(x))


@lower(aten.hardtanh)
def hardtanh(x, min_val=-1, max_val=1):
    return jnp.minimum(jnp.maximum(x, min_val), max_val).astype(x.dtype)


@lower(aten.hardtanh_backward)
def hardtanh_backward(grad, x, min_val, max_val):
    return jnp.where((x <= min_val) | (x >= max_val), jnp.zeros((), grad.dtype), grad)


@lower(aten.leaky_relu)
def leaky_relu(x, negative_slope=0.01):
    return jnp.where(x > 0, x, x * negative_slope)


@lower(aten.leaky_relu_backward)
def leaky_relu_backward(grad, x, negative_slope, self_is_result):
    return jnp.where(x > 0, grad, grad * negative_slope)


@lower(aten.elu)
def elu(x, alpha=1, scale=1, input_scale=1):
    return jnp.where(x > 0, x * scale, alpha * scale * jnp.expm1(x * input_scale))


@lower(aten.elu_backward)
def elu_backward(grad, alpha, scale, input_scale, is_result, self_or_result):
    y = self_or_result
    if is_result:
        return jnp.where(y <= 0, grad * input_scale * (y + alpha * scale), grad * scale)
    return jnp.where(y <= 0, grad * input_scale * alpha * scale * jnp.exp(y * input_scale), grad * scale)


@lower(aten.softplus)
def softplus(x, beta=1, threshold=20):
    xb = x * beta
    return jnp.where(xb > threshold, x, jnp.log1p(jnp.exp(xb)) / beta)


@lower(aten.softplus_backward)
def softplus_backward(grad, x, beta, threshold):
    xb = x * beta
    return jnp.where(xb > threshold, grad, grad * jax.nn.sigmoid(xb))


@lower(aten.hardswish)
def hardswish(x):
    return x * jnp.clip(x + 3, 0, 6) / 6


@lower(aten.hardswish_backward)
def hardswish_backward(grad, x):
    return jnp.where(x < -3, jnp.zeros((), grad.dtype), jnp.where(x <= 3, grad * (x / 3 + 0.5), grad))


@lower(aten.hardsigmoid)
def hardsigmoid(x):
    return jnp.clip(x + 3, 0, 6) / 6


@lower(aten.hardsigmoid_backward)
def hardsigmoid_backward(grad, x):
    return jnp.where((x > -3) & (x < 3), grad / 6, jnp.zeros((), grad.dtype))


@lower(aten.hardshrink)
def hardshrink(x, lambd=0.5):
    return jnp.where((x >= -lambd) & (x <= lambd), jnp.zeros((), x.dtype), x)


@lower(aten.hardshrink_backward)
def hardshrink_backward(grad, x, lambd):
    return jnp.where((x >= -lambd) & (x <= lambd), jnp.zeros((), grad.dtype), grad)


@lower(aten.softshrink)
def softshrink(x, lambd=0.5):
    return jnp.where(x > lambd, x - lambd, jnp.where(x < -lambd, x + lambd, jnp.zeros((), x.dtype)))


@lower(aten.softshrink_backward)
def softshrink_backward(grad, x, lambd):
    return jnp.where((x >= -lambd) & (x <= lambd), jnp.zeros((), grad.dtype), grad)


@lower(aten.log_sigmoid_forward)
def log_sigmoid_forward(x):
    z = jnp.exp(-jnp.abs(x))
    return jnp.minimum(x, 0) - jnp.log1p(z), z


@lower(aten.log_sigmoid_backward)
def log_sigmoid_backward(grad, x, buffer):
    z = jnp.exp(-jnp.abs(x))
    return grad * jnp.where(x < 0, 1 - z / (1 + z), z / (1 + z))


@lower(aten.glu)
def glu(x, dim=-1):
    a, b = jnp.split(x, 2, axis=dim)
    return a * jax.nn.sigmoid(b)


@lower(aten.glu_backward)
def glu_backward(grad, x, dim):
    a, b = jnp.split(x, 2, axis=dim)
    sb = jax.nn.sigmoid(b)
    return jnp.concatenate([grad * sb, grad * a * sb * (1 - sb)], axis=dim)


@lower(aten._prelu_kernel)
def prelu_kernel(x, weight):
    return jnp.where(x > 0, x, weight * x)


@lower(aten._prelu_kernel_backward)
def prelu_kernel_backward(grad, x, weight):
    """The weight gradient keeps the broadcast shape: autograd sums it down to the weight's shape."""
    gi = jnp.where(x > 0, grad, weight * grad)
    gw = jnp.where(x > 0, jnp.zeros((), grad.dtype), x * grad)
    return gi, gw


# ---- embedding and losses ------------------------------------------------------------------------------------


@lower(aten.embedding)
@reports
def embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    report((indices < 0) | (indices >= weight.shape[0]), message="index out of range in self")
    return jnp.take(weight, indices, axis=0)


@lower(aten.embedding_dense_backward)
def embedding_dense_backward(grad, indices, num_weights, padding_idx, scale_grad_by_freq):
    idx = indices.reshape(-1)
    g = grad.reshape(idx.shape[0], -1)
    if scale_grad_by_freq:
        counts = jnp.zeros((num_weights,), g.dtype).at[idx].add(1)
        g = g / counts[idx][:, None]
    if padding_idx >= 0:
        g = jnp.where((idx == padding_idx)[:, None], jnp.zeros((), g.dtype), g)
    return jnp.zeros((num_weights, g.shape[1]), g.dtype).at[idx].add(g)


@lower(aten.embedding_renorm)
def embedding_renorm(weight, indices, max_norm, norm_type):
    """Rows that ``indices`` names and whose ``norm_type``-norm exceeds ``max_norm`` are scaled to
    ``max_norm / (norm + 1e-7)``, as PyTorch does (each row once, however often it is named)."""
    w = _acc(weight)
    named = jnp.zeros((weight.shape[0],), bool).at[indices.reshape(-1)].set(True)
    norm = jnp.linalg.norm(w, ord=norm_type, axis=1) if norm_type != 2 else jnp.sqrt(jnp.sum(w * w, axis=1))
    scale = jnp.where(named & (norm > max_norm), max_norm / (norm + 1e-7), 1)
    return w * scale[:, None].astype(w.dtype)


def _nll_terms(x, target, weight, ignore_index):
    """Per-element ``-x[target] * w[target]`` and weights ``w[target]`` (zero where ignored); class dim is 1
    (or 0 for an unbatched input)."""
    cls = 1 if x.ndim > 1 else 0
    keep = target != ignore_index
    report(keep & ((target < 0) | (target >= x.shape[cls])), target, message="Target {value} is out of bounds.")
    t = jnp.where(keep, target, 0)
    picked = jnp.take_along_axis(x, jnp.expand_dims(t, cls), axis=cls).squeeze(cls)
    w = jnp.take(weight, t) if weight is not None else jnp.ones(t.shape, x.dtype)
    w = jnp.where(keep, w, jnp.zeros((), w.dtype))
    return -picked * w, w


def _nll_forward(x, target, weight, reduction, ignore_index):
    loss, w = _nll_terms(x, target, weight, ignore_index)
    total = jnp.sum(w)
    if reduction == 0:
        return loss, jnp.zeros((), x.dtype)
    if reduction == 1:
        return jnp.sum(loss) / total, total
    return jnp.sum(loss), total


def _nll_backward(grad, x, target, weight, reduction, ignore_index, total_weight):
    _, w = _nll_terms(x, target, weight, ignore_index)
    cls = 1 if x.ndim > 1 else 0
    scale = grad / total_weight if reduction == 1 else grad
    g = -w * scale
    keep = target != ignore_index
    t = jnp.where(keep, target, 0)
    onehot = jnp.expand_dims(t, cls) == lax.broadcasted_iota(t.dtype, x.shape, cls)
    return jnp.where(onehot, jnp.expand_dims(g, cls), jnp.zeros((), x.dtype)).astype(x.dtype)


@lower(aten.nll_loss_forward)
@reports
def nll_loss_forward(x, target, weight, reduction, ignore_index):
    return _nll_forward(x, target, weight, reduction, ignore_index)


@lower(aten.nll_loss2d_forward)
@reports
def nll_loss2d_forward(x, target, weight, reduction, ignore_index):
    return _nll_forward(x, target, weight, reduction, ignore_index)


@lower(aten.nll_loss_backward)
def nll_loss_backward(grad, x, target, weight, reduction, ignore_index, total_weight):
    return _nll_backward(grad, x, target, weight, reduction, ignore_index, total_weight)


@lower(aten.nll_loss2d_backward)
def nll_loss2d_backward(grad, x, target, weight, reduction, ignore_index, total_weight):
    return _nll_backward(grad, x, target, weight, reduction, ignore_index, total_weight)


@lower(aten.binary_cross_entropy)
def binary_cross_entropy(x, target, weight=None, reduction=1):
    """PyTorch clamps each log term at -100, so a saturated probability gives a finite loss."""
    loss = -(target * jnp.maximum(jnp.log(x), -100) + (1 - target) * jnp.maximum(jnp.log1p(-x), -100))
    if weight is not None:
        loss = loss * weight
    return _reduce(loss, reduction)


@lower(aten.binary_cross_entropy_backward)
def binary_cross_entropy_backward(grad, x, target, weight=None, reduction=1):
    g = _reduce_backward(grad, x.shape, reduction) * (x - target) / jnp.maximum((1 - x) * x, 1e-12)
    return g * weight if weight is not None else g


@lower(aten.mse_loss)
def mse_loss(x, target, reduction=1):
    return _reduce(jnp.square(x - target), reduction)


@lower(aten.mse_loss_backward)
def mse_loss_backward(grad, x, target, reduction):
    return 2 * (x - target) * _reduce_backward(grad, x.shape, reduction)


@lower(aten.smooth_l1_loss)
def smooth_l1_loss(x, target, reduction=1, beta=1.0):
    d = jnp.abs(x - target)
    loss = d if beta == 0 else jnp.where(d < beta, 0.5 * d * d / beta, d - 0.5 * beta)
    return _reduce(loss, reduction)


@lower(aten.smooth_l1_loss_backward)
def smooth_l1_loss_backward(grad, x, target, reduction, beta):
    d = x - target
    g = _reduce_backward(grad, x.shape, reduction)
    if beta == 0:
        return jnp.sign(d) * g
    return jnp.where(d <= -beta, -g, jnp.where(d >= beta, g, d / beta * g))


@lower(aten.huber_loss)
def huber_loss(x, target, reduction=1, delta=1.0):
    d = jnp.abs(x - target)
    return _reduce(jnp.where(d < delta, 0.5 * d * d, delta * (d - 0.5 * delta)), reduction)


@lower(aten.huber_loss_backward)
def huber_loss_backward(grad, x, target, reduction, delta):
    d = x - target
    g = _reduce_backward(grad, x.shape, reduction)
    return jnp.where(d < -delta, -delta * g, jnp.where(d > delta, delta * g, d * g))


# ---- upsampling --------------------------------------------------------------------------------------------------


def _scale(n_in, n_out, scale):
    """PyTorch's ``compute_scales_value`` (float32): the input step per output step."""
    return np.float32(1.0 / scale) if scale is not None and scale > 0 else np.float32(n_in) / np.float32(n_out)


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


def _source_index(n_in, n_out, align_corners, scale, cubic):
    """PyTorch's ``area_pixel_compute_source_index`` for every output position (float32)."""
    o = np.arange(n_out).astype(np.float32)
    if align_corners:
        s = np.float32((n_in - 1) / (n_out - 1)) if n_out > 1 else np.float32(0)
        return s * o
    src = _scale(n_in, n_out, scale) * (o + np.float32(0.5)) - np.float32(0.5)
    return src if cubic else np.maximum(src, np.float32(0))


def _linear_matrix(n_in, n_out, align_corners, scale):
    src = _source_index(n_in, n_out, align_corners, scale, False)
    i0 = np.minimum(np.floor(src).astype(np.int64), n_in - 1)
    lam = np.clip(src - i0, 0, 1).astype(np.float64)
    i1 = i0 + (i0 < n_in - 1)
    m = np.zeros((n_out, n_in))
    np.add.at(m, (np.arange(n_out), i0), 1 - lam)
    np.add.at(m, (np.arange(n_out), i1), lam)
    return m


def _cubic_matrix(n_in, n_out, align_corners, scale):
    a = -0.75
    src = _source_index(n_in, n_out, align_corners, scale, True)
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


def _upsample_interp(x, output_size, align_corners, scales, matrix):
    nd = len(output_size)
    xf = _acc(x)
    for axis, (n_out, scale) in enumerate(zip(output_size, scales)):
        ax = x.ndim - nd + axis
        m = jnp.asarray(matrix(x.shape[ax], n_out, align_corners, scale), xf.dtype)
        xf = jnp.moveaxis(jnp.tensordot(xf, m, axes=([ax], [1]), precision=HIGHEST), -1, ax)
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


@lower(aten._safe_softmax)
def safe_softmax(x, dim, dtype=None):
    """Softmax whose rows that are entirely ``-inf`` give zeros instead of NaN (attention over no keys)."""

    def fn(v, a):
        v = _acc(v) if dtype is None else v.astype(jnp.promote_types(v.dtype, jnp.float32))
        dead = jnp.all(v == -jnp.inf, axis=a, keepdims=True)
        return jnp.where(dead, jnp.zeros((), v.dtype), jax.nn.softmax(v, axis=a))

    return _along(fn, x, dim)


# ---- fused inference-only transformer kernels (the fast path of nn.MultiheadAttention/TransformerEncoderLayer) --


def _attention_mask(scores, mask, mask_type):
    """Apply a fast-path mask: bool ``True`` (or ``-inf``) hides a key; type 1 is a (B, S) key padding mask."""
    if mask is None:
        return scores
    if mask_type == 1:
        mask = mask.reshape(mask.shape[0], 1, 1, mask.shape[-1])
    if mask.dtype == jnp.bool_:
        return jnp.where(mask, -jnp.inf, scores)
    return scores + mask


def _mha(query, key, value, embed_dim, num_head, qkv_weight, qkv_bias, proj_weight, proj_bias, mask, mask_type):
    wq, wk, wv = jnp.split(qkv_weight, 3, axis=0)
    bq, bk, bv = jnp.split(qkv_bias, 3, axis=0)
    d = embed_dim // num_head

    def heads(x, w, b):
        y = jnp.matmul(x, w.T, precision=HIGHEST) + b
        return y.reshape(y.shape[0], y.shape[1], num_head, d).transpose(0, 2, 1, 3)

    q = heads(query, wq, bq) / math.sqrt(d)
    k, v = heads(key, wk, bk), heads(value, wv, bv)
    scores = _attention_mask(jnp.matmul(q, k.swapaxes(-1, -2), precision=HIGHEST), mask, mask_type)
    dead = jnp.all(scores == -jnp.inf, axis=-1, keepdims=True)
    attn = jnp.where(dead, 0.0, jax.nn.softmax(scores, axis=-1))
    out = jnp.matmul(attn, v, precision=HIGHEST).transpose(0, 2, 1, 3).reshape(query.shape[0], query.shape[1], -1)
    return jnp.matmul(out, proj_weight.T, precision=HIGHEST) + proj_bias, attn


@lower(aten._native_multi_head_attention)
def native_multi_head_attention(query, key, value, embed_dim, num_head, qkv_weight, qkv_bias, proj_weight,
                                proj_bias, mask=None, need_weights=True, average_attn_weights=True, mask_type=None):
    out, attn = _mha(query, key, value, embed_dim, num_head, qkv_weight, qkv_bias, proj_weight, proj_bias, mask,
                     mask_type)
    if not need_weights:
        return out, jnp.zeros((0,), out.dtype)
    return out, jnp.mean(attn, axis=1) if average_attn_weights else attn


def _layer_norm(x, w, b, eps):
    return native_layer_norm(x, [x.shape[-1]], w, b, eps)[0]


@lower(aten._transformer_encoder_layer_fwd)
def transformer_encoder_layer_fwd(src, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias, use_gelu,
                                  norm_first, eps, norm_weight_1, norm_bias_1, norm_weight_2, norm_bias_2,
                                  ffn_weight_1, ffn_bias_1, ffn_weight_2, ffn_bias_2, mask=None, mask_type=None):
    x = _layer_norm(src, norm_weight_1, norm_bias_1, eps) if norm_first else src
    x = _mha(x, x, x, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias, mask, mask_type)[0] + src
    if not norm_first:
        x = _layer_norm(x, norm_weight_1, norm_bias_1, eps)
    residual = x
    if norm_first:
        x = _layer_norm(x, norm_weight_2, norm_bias_2, eps)
    h = jnp.matmul(x, ffn_weight_1.T, precision=HIGHEST) + ffn_bias_1
    h = gelu(h) if use_gelu else jnp.maximum(h, 0)
    x = jnp.matmul(h, ffn_weight_2.T, precision=HIGHEST) + ffn_bias_2 + residual
    return x if norm_first else _layer_norm(x, norm_weight_2, norm_bias_2, eps)


# ---- embedding_bag -----------------------------------------------------------------------------------------------


def _bags(indices, offsets, include_last_offset, padding_idx):
    """Bag of each index (``offset2bag``), the number of bags and which indices count (not ``padding_idx``)."""
    n_bags = offsets.shape[0] - 1 if include_last_offset else offsets.shape[0]
    positions = jnp.arange(indices.shape[0], dtype=offsets.dtype)
    bag = jnp.searchsorted(offsets[:n_bags], positions, side="right") - 1
    if include_last_offset:  # indices past the last offset belong to no bag
        bag = jnp.where(positions < offsets[n_bags], bag, n_bags)
    keep = indices != padding_idx if padding_idx >= 0 else jnp.ones(indices.shape, bool)
    return bag, n_bags, keep


@lower(aten._embedding_bag, aten._embedding_bag_forward_only)
def embedding_bag(weight, indices, offsets, scale_grad_by_freq=False, mode=0, sparse=False, per_sample_weights=None,
                  include_last_offset=False, padding_idx=-1):
    """Returns (output, offset2bag, bag_size, max_indices); mean divides by the bag's non-padding count, and an
    empty bag (or one of padding only) gives zeros. ``max`` takes the first maximum, as PyTorch's CPU kernel."""
    bag, n_bags, keep = _bags(indices, offsets, include_last_offset, padding_idx)
    rows = jnp.take(_acc(weight), indices, axis=0)
    count = jax.ops.segment_sum(keep.astype(jnp.int64), bag, n_bags)
    if mode == 2:
        fill = jnp.asarray(-jnp.inf, rows.dtype)
        vals = jnp.where(keep[:, None], rows, fill)
        best = jax.ops.segment_max(vals, bag, n_bags)
        hit = keep[:, None] & (vals == best[jnp.minimum(bag, n_bags - 1)]) & (bag < n_bags)[:, None]
        first = jax.ops.segment_min(jnp.where(hit, jnp.arange(indices.shape[0])[:, None], indices.shape[0]),
                                    bag, n_bags)
        max_idx = jnp.where(count[:, None] > 0, jnp.take(indices, jnp.minimum(first, indices.shape[0] - 1)), -1)
        out = jnp.where(count[:, None] > 0, best, jnp.zeros((), rows.dtype))
        return out, bag, _bag_size(count, offsets), max_idx
    if per_sample_weights is not None:
        rows = rows * per_sample_weights[:, None].astype(rows.dtype)
    rows = jnp.where(keep[:, None], rows, jnp.zeros((), rows.dtype))
    out = jax.ops.segment_sum(rows, bag, n_bags)
    if mode == 1:
        out = out / jnp.maximum(count, 1)[:, None].astype(out.dtype)
    return out, bag, _bag_size(count, offsets), jnp.zeros((0,), jnp.int64)


def _bag_size(count, offsets):
    """``bag_size`` has one entry per offset, include_last_offset or not (the extra one is zero)."""
    return jnp.pad(count, (0, offsets.shape[0] - count.shape[0]))


def _embedding_bag_grad(grad, indices, offset2bag, bag_size, max_indices, num_weights, scale_grad_by_freq, mode,
                        per_sample_weights, padding_idx):
    grad = _acc(grad)
    n_bags, dim = grad.shape
    if mode == 2:
        valid = (max_indices >= 0) & (bag_size[:n_bags, None] > 0)
        target = jnp.where(valid, max_indices, num_weights)
        cols = jnp.broadcast_to(jnp.arange(dim), target.shape)
        return jnp.zeros((num_weights + 1, dim), grad.dtype).at[target, cols].add(grad)[:num_weights]
    in_bag = offset2bag < n_bags
    g = jnp.take(grad, jnp.minimum(offset2bag, n_bags - 1), axis=0)
    if mode == 1:
        g = g / jnp.maximum(jnp.take(bag_size, jnp.minimum(offset2bag, n_bags - 1)), 1)[:, None].astype(g.dtype)
    if per_sample_weights is not None:
        g = g * per_sample_weights[:, None].astype(g.dtype)
    if scale_grad_by_freq:
        counts = jnp.zeros((num_weights,), g.dtype).at[indices].add(1)
        g = g / counts[indices][:, None]
    keep = in_bag & (indices != padding_idx) if padding_idx >= 0 else in_bag
    g = jnp.where(keep[:, None], g, jnp.zeros((), g.dtype))
    return jnp.zeros((num_weights, dim), g.dtype).at[indices].add(g)


@lower(aten._embedding_bag_dense_backward)
def embedding_bag_dense_backward(grad, indices, offset2bag, bag_size, max_indices, num_weights, scale_grad_by_freq,
                                 mode, per_sample_weights, padding_idx=-1):
    return _embedding_bag_grad(grad, indices, offset2bag, bag_size, max_indices, num_weights, scale_grad_by_freq,
                               mode, per_sample_weights, padding_idx)


@lower(aten._embedding_bag_backward)
def embedding_bag_backward(grad, indices, offsets, offset2bag, bag_size, max_indices, num_weights, scale_grad_by_freq,
                           mode, sparse, per_sample_weights, padding_idx=-1):
    if sparse:
        raise NotImplementedError("torchtpu_lab: sparse embedding_bag gradients are not supported")
    return _embedding_bag_grad(grad, indices, offset2bag, bag_size, max_indices, num_weights, scale_grad_by_freq,
                               mode, per_sample_weights, padding_idx)


@lower(aten._embedding_bag_per_sample_weights_backward)
def embedding_bag_per_sample_weights_backward(grad, weight, indices, offsets, offset2bag, mode, padding_idx=-1):
    n_bags = grad.shape[0]
    g = jnp.take(_acc(grad), jnp.minimum(offset2bag, n_bags - 1), axis=0)
    out = jnp.sum(g * jnp.take(_acc(weight), indices, axis=0), axis=1)
    keep = offset2bag < n_bags
    if padding_idx >= 0:
        keep = keep & (indices != padding_idx)
    return jnp.where(keep, out, jnp.zeros((), out.dtype))


# ---- pairwise distances ------------------------------------------------------------------------------------------


def _pnorm(diff, p):
    """The ``p``-norm over the last axis, with PyTorch's p = 0 (count of nonzeros) and p = inf (max) cases."""
    a = jnp.abs(diff)
    if p == 0:
        return jnp.sum((a != 0).astype(diff.dtype), axis=-1)
    if p == 1:
        return jnp.sum(a, axis=-1)
    if p == 2:
        return jnp.sqrt(jnp.sum(a * a, axis=-1))
    if math.isinf(p):
        return jnp.max(a, axis=-1, initial=0)
    return jnp.sum(a ** p, axis=-1) ** (1 / p)


def _pnorm_grad(grad, diff, dist, p):
    """PyTorch's ``d dist / d diff`` times ``grad`` (zero where ``dist`` is zero), ``dist`` broadcast over the last
    axis of ``diff``."""
    g, d = grad[..., None], dist[..., None]
    zero = jnp.zeros((), diff.dtype)
    if p == 0:
        return jnp.zeros_like(diff)
    if p == 1:
        return g * jnp.sign(diff)
    if p == 2:
        return jnp.where(d == 0, zero, g * diff / jnp.where(d == 0, 1, d))
    if math.isinf(p):
        return jnp.where(d == 0, zero, g * jnp.sign(diff) * (jnp.abs(diff) == d))
    safe = jnp.where(d == 0, 1, d)
    if p < 1:
        out = g * jnp.sign(diff) * jnp.abs(diff) ** (p - 1) / safe ** (p - 1)
        return jnp.where((d == 0) | (diff == 0), zero, out)
    if p < 2:
        out = g * jnp.sign(diff) * jnp.abs(diff) ** (p - 1) / safe ** (p - 1)
        return jnp.where(d == 0, zero, out)
    return jnp.where(d == 0, zero, g * diff * jnp.abs(diff) ** (p - 2) / safe ** (p - 1))


@lower(aten._cdist_forward)
def cdist_forward(x1, x2, p, compute_mode):
    """For p = 2 PyTorch uses the matrix-product form (``|a|^2 - 2ab + |b|^2``) when ``compute_mode`` is 1, or is
    None/0 and either side has more than 25 rows; we follow, since its rounding differs from the direct form."""
    x1, x2 = _acc(x1), _acc(x2)
    batch = jnp.broadcast_shapes(x1.shape[:-2], x2.shape[:-2])
    x1 = jnp.broadcast_to(x1, batch + x1.shape[-2:])
    x2 = jnp.broadcast_to(x2, batch + x2.shape[-2:])
    mm = compute_mode == 1 or (compute_mode in (None, 0) and (x1.shape[-2] > 25 or x2.shape[-2] > 25))
    if p == 2 and mm:
        n1 = jnp.sum(x1 * x1, axis=-1, keepdims=True)
        n2 = jnp.sum(x2 * x2, axis=-1, keepdims=True)
        prod = jnp.matmul(x1, jnp.swapaxes(x2, -1, -2), precision=HIGHEST)
        return jnp.sqrt(jnp.maximum(n1 - 2 * prod + jnp.swapaxes(n2, -1, -2), 0))
    return _pnorm(x1[..., :, None, :] - x2[..., None, :, :], p)


@lower(aten._cdist_backward)
def cdist_backward(grad, x1, x2, p, dist):
    batch = dist.shape[:-2]
    a = jnp.broadcast_to(_acc(x1), batch + x1.shape[-2:])
    b = jnp.broadcast_to(_acc(x2), batch + x2.shape[-2:])
    g = _pnorm_grad(_acc(grad), a[..., :, None, :] - b[..., None, :, :], _acc(dist), p)
    return jnp.sum(g, axis=-2)


def _pairs(n):
    return np.triu_indices(n, 1)


@lower(aten._pdist_forward)
def pdist_forward(x, p=2.0):
    i, j = _pairs(x.shape[0])
    x = _acc(x)
    return _pnorm(x[i] - x[j], p)


@lower(aten._pdist_backward)
def pdist_backward(grad, x, p, dist):
    i, j = _pairs(x.shape[0])
    xf = _acc(x)
    g = _pnorm_grad(_acc(grad), xf[i] - xf[j], _acc(dist), p)
    return jnp.zeros_like(xf).at[i].add(g).at[j].add(-g)


# ---- CTC loss ----------------------------------------------------------------------------------------------------


def _ctc_labels(targets, target_lengths, blank):
    """Per sample the extended label sequence ``blank, l1, blank, l2, ..., blank`` (padded with blank to
    ``2 * max_len + 1``), its valid length, and where the skip transition ``s-2 -> s`` is allowed."""
    lengths = np.asarray(target_lengths, np.int64)
    n, s_max = len(lengths), int(lengths.max(initial=0))
    if targets.ndim == 2:
        pos = np.minimum(np.arange(s_max)[None, :], max(targets.shape[1] - 1, 0))
        lab = targets[:, :s_max] if targets.shape[1] >= s_max else jnp.take_along_axis(targets, jnp.asarray(pos), 1)
    else:
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        pos = np.minimum(starts[:, None] + np.arange(s_max)[None, :], max(targets.shape[0] - 1, 0))
        lab = jnp.take(targets, jnp.asarray(pos)) if targets.shape[0] else jnp.zeros((n, s_max), targets.dtype)
    lab = jnp.where(np.arange(s_max)[None, :] < lengths[:, None], lab, blank).astype(jnp.int32)
    ext = jnp.full((n, 2 * s_max + 1), blank, jnp.int32).at[:, 1::2].set(lab)
    prev2 = jnp.pad(ext, ((0, 0), (2, 0)), constant_values=blank)[:, :-2]
    skip = (ext != blank) & (ext != prev2) & (np.arange(2 * s_max + 1) >= 2)
    return ext, 2 * lengths + 1, skip


def _lse(*xs):
    m = xs[0]
    for x in xs[1:]:
        m = jnp.maximum(m, x)
    m0 = jnp.where(jnp.isinf(m) & (m < 0), 0, m)
    return jnp.log(sum(jnp.exp(x - m0) for x in xs)) + m0


def _ctc_alpha(lp, ext, ext_len, skip, input_lengths):
    """log alpha, (N, T, S') with -inf outside each sample's lattice; lp is (T, N, C)."""
    t_max = lp.shape[0]
    s = ext.shape[1]
    neg = jnp.asarray(-jnp.inf, lp.dtype)
    emit = jnp.take_along_axis(lp, jnp.broadcast_to(ext[None], (t_max,) + ext.shape), axis=2)  # (T, N, S')
    in_lattice = np.arange(s)[None, :] < ext_len[:, None]
    a0 = jnp.where((np.arange(s)[None, :] < 2) & in_lattice, emit[0], neg)

    def step(a, e):
        a1 = jnp.pad(a, ((0, 0), (1, 0)), constant_values=-jnp.inf)[:, :-1]
        a2 = jnp.pad(a, ((0, 0), (2, 0)), constant_values=-jnp.inf)[:, :-2]
        nxt = _lse(a, a1, jnp.where(skip, a2, neg)) + e
        nxt = jnp.where(in_lattice, nxt, neg)
        return nxt, nxt

    _, rest = lax.scan(step, a0, emit[1:])
    alpha = jnp.concatenate([a0[None], rest], axis=0)  # (T, N, S')
    alive = np.arange(t_max)[:, None] < np.asarray(input_lengths)[None, :]
    return jnp.swapaxes(jnp.where(alive[..., None], alpha, neg), 0, 1), emit


def _ctc_nll(alpha, ext_len, input_lengths):
    n = alpha.shape[0]
    last = alpha[np.arange(n), np.maximum(np.asarray(input_lengths) - 1, 0)]  # (N, S')
    end1 = last[np.arange(n), ext_len - 1]
    end2 = jnp.where(ext_len > 1, last[np.arange(n), np.maximum(ext_len - 2, 0)], -jnp.inf)
    return -_lse(end1, end2)


@lower(aten._ctc_loss)
def ctc_loss(log_probs, targets, input_lengths, target_lengths, blank=0, zero_infinity=False):
    """Returns (neg_log_likelihood, log_alpha) per sample, as PyTorch's CPU kernel (log_alpha is (N, T, 2S+1));
    ``zero_infinity`` only affects the backward pass, as in PyTorch."""
    lp = _acc(log_probs)
    ext, ext_len, skip = _ctc_labels(targets, target_lengths, blank)
    alpha, _ = _ctc_alpha(lp, ext, ext_len, skip, input_lengths)
    return _ctc_nll(alpha, ext_len, input_lengths), alpha


@lower(aten._ctc_loss_backward)
def ctc_loss_backward(grad, log_probs, targets, input_lengths, target_lengths, nll, log_alpha, blank,
                      zero_infinity=False):
    """PyTorch's gradient: ``exp(lp) - exp(log(sum alpha*beta over s with label c) + nll - lp)``, times ``grad``;
    it is the gradient w.r.t. the logits of a log_softmax, not of ``lp`` itself."""
    lp = _acc(log_probs)
    t_max, n, c = lp.shape
    ext, ext_len, skip = _ctc_labels(targets, target_lengths, blank)
    alpha, emit = _ctc_alpha(lp, ext, ext_len, skip, input_lengths)
    s = ext.shape[1]
    neg = jnp.asarray(-jnp.inf, lp.dtype)
    in_lattice = np.arange(s)[None, :] < ext_len[:, None]
    il = np.asarray(input_lengths)
    skip_next = jnp.pad(skip, ((0, 0), (0, 2)), constant_values=False)[:, 2:]  # s -> s+2 allowed

    def step(b, xs):
        t, e = xs
        b1 = jnp.pad(b, ((0, 0), (0, 1)), constant_values=-jnp.inf)[:, 1:]
        b2 = jnp.pad(b, ((0, 0), (0, 2)), constant_values=-jnp.inf)[:, 2:]
        nxt = _lse(b, b1, jnp.where(skip_next, b2, neg)) + e
        start = (np.arange(s)[None, :] >= (ext_len - 2)[:, None]) & in_lattice
        init = jnp.where(start, e, neg)
        nxt = jnp.where((t == il - 1)[:, None], init, jnp.where((t < il - 1)[:, None], nxt, neg))
        nxt = jnp.where(in_lattice, nxt, neg)
        return nxt, nxt

    b_last = jnp.full((n, s), -jnp.inf, lp.dtype)
    _, beta = lax.scan(step, b_last, (jnp.arange(t_max), emit), reverse=True)  # (T, N, S')
    ab = jnp.swapaxes(alpha, 0, 1) + beta
    onehot = ext[..., None] == jnp.arange(c)  # (N, S', C)
    lcab = jnp.where(onehot[None], ab[..., None], neg)
    m = jnp.max(lcab, axis=2, keepdims=True)
    m0 = jnp.where(jnp.isinf(m), 0, m)
    lcab = jnp.log(jnp.sum(jnp.exp(lcab - m0), axis=2)) + m0[:, :, 0]  # (T, N, C)
    nll = _acc(nll)
    res = (jnp.exp(lp) - jnp.exp(lcab + nll[None, :, None] - lp)) * _acc(grad)[None, :, None]
    alive = np.arange(t_max)[:, None] < il[None, :]
    res = jnp.where(alive[..., None], res, jnp.zeros((), res.dtype))
    if zero_infinity:
        res = jnp.where(jnp.isinf(nll)[None, :, None], jnp.zeros((), res.dtype), res)
    return res


# ---- fractional max pooling --------------------------------------------------------------------------------------


def _fractional_starts(sample, n_in, n_out, k):
    """PyTorch's ``generate_intervals`` in float32: window starts per output position, for each sample (..., )."""
    o = jnp.arange(n_out, dtype=jnp.float32)
    if n_out > 1:
        alpha = jnp.float32(n_in - k) / jnp.float32(n_out - 1)
        s = sample.astype(jnp.float32)[..., None]
        starts = ((o + s) * alpha).astype(jnp.int64) - (s * alpha).astype(jnp.int64)
    else:
        starts = jnp.zeros(sample.shape + (n_out,), jnp.int64)
    return starts.at[..., n_out - 1].set(n_in - k) if n_out > 0 else starts


def _fractional_max_pool(x, kernel_size, output_size, samples, nd):
    """Samples index the spatial dims in reverse (W, H) for 2-D and in order (T, H, W) for 3-D, as in PyTorch.
    Takes the first maximum (or a NaN) of each window; indices are flat over the input's spatial dims."""
    batched = x.ndim == nd + 2
    xb = x if batched else x[None]
    size, k, out = xb.shape[2:], _tup(kernel_size, nd), _tup(output_size, nd)
    order = [1, 0] if nd == 2 else [0, 1, 2]
    starts = [_fractional_starts(samples[..., order[a]], size[a], out[a], k[a]) for a in range(nd)]  # (N, C, o)
    flat = xb.reshape(xb.shape[:2] + (-1,))
    strides = [math.prod(size[a + 1:]) for a in range(nd)]
    best = idx = None
    for offs in itertools.product(*[range(kk) for kk in k]):
        index = 0
        for a in range(nd):
            pos = starts[a] + offs[a]
            shape = pos.shape[:2] + tuple(out[a] if b == a else 1 for b in range(nd))
            index = index + pos.reshape(shape) * strides[a]
        index = jnp.broadcast_to(index, xb.shape[:2] + out)
        val = jnp.take_along_axis(flat, index.reshape(xb.shape[:2] + (-1,)), axis=2).reshape(index.shape)
        if best is None:
            best, idx = val, index
            continue
        take = (val > best) | jnp.isnan(val)
        best, idx = jnp.where(take, val, best), jnp.where(take, index, idx)
    return (best, idx) if batched else (best[0], idx[0])


@lower(aten.fractional_max_pool2d)
def fractional_max_pool2d(x, kernel_size, output_size, random_samples):
    return _fractional_max_pool(x, kernel_size, output_size, random_samples, 2)


@lower(aten.fractional_max_pool3d)
def fractional_max_pool3d(x, kernel_size, output_size, random_samples):
    return _fractional_max_pool(x, kernel_size, output_size, random_samples, 3)


@lower(aten.fractional_max_pool2d_backward)
def fractional_max_pool2d_backward(grad, x, kernel_size, output_size, indices):
    return _scatter_to_input(grad, x, indices, 2)


@lower(aten.fractional_max_pool3d_backward)
def fractional_max_pool3d_backward(grad, x, kernel_size, output_size, indices):
    return _scatter_to_input(grad, x, indices, 3)


# ---- margin losses (the forwards decompose; the backwards are the vjp of the same per-sample formula) -----------


def _multi_margin(x, target, p, margin, weight):
    """Per-sample ``sum_{j != y} max(0, margin - x[y] + x[j])^p * w[y] / C`` of a 2-D input."""
    u = jnp.take_along_axis(x, target[:, None], axis=1)
    z = jnp.maximum(margin - u + x, 0)
    z = z if p == 1 else z * z
    if weight is not None:
        z = z * jnp.take(weight, target)[:, None].astype(z.dtype)
    z = jnp.where(jnp.arange(x.shape[1]) != target[:, None], z, jnp.zeros((), z.dtype))
    return jnp.sum(z, axis=1) / x.shape[1]


def _multilabel_margin(x, target):
    """Per-sample multilabel margin loss of a 2-D input (targets end at the first -1)."""
    dim = x.shape[1]
    idx = jnp.arange(dim)
    end = jnp.min(jnp.where(target == -1, idx, dim), axis=1, keepdims=True)
    valid = idx < end
    u = jnp.take_along_axis(x, jnp.where(valid, target, 0), axis=1)  # (N, K)
    is_target = jnp.any((idx[None, None, :] == target[:, :, None]) & valid[:, :, None], axis=1)
    z = jnp.maximum(1 - u[:, :, None] + x[:, None, :], 0) / dim  # (N, K, C)
    z = jnp.where(valid[:, :, None] & ~is_target[:, None, :], z, jnp.zeros((), z.dtype))
    return jnp.sum(z, axis=(1, 2))


def _margin_backward(per_sample, grad, x, reduction):
    x2 = jnp.atleast_2d(_acc(x))
    losses, vjp = jax.vjp(per_sample, x2)
    g = _reduce_backward(_acc(grad).reshape(-1) if reduction == 0 else _acc(grad), losses.shape, reduction)
    return vjp(g.astype(losses.dtype))[0].reshape(x.shape)


@lower(aten.multi_margin_loss_backward, static_scalars=True)
def multi_margin_loss_backward(grad, x, target, p, margin, weight=None, reduction=1):
    t = jnp.atleast_1d(target)
    return _margin_backward(lambda v: _multi_margin(v, t, p, margin, weight), grad, x, reduction)


@lower(aten.multilabel_margin_loss_backward)
def multilabel_margin_loss_backward(grad, x, target, reduction, is_target):
    t = jnp.atleast_2d(target)
    return _margin_backward(lambda v: _multilabel_margin(v, t), grad, x, reduction)


# ---- segment_reduce ----------------------------------------------------------------------------------------------


def _segments(data, lengths, offsets, axis):
    """``data`` as (B*L, rest) rows, each row's segment id (B*S for rows in no segment), B*S, and the output shape.
    Segments run along ``axis``; ``lengths`` (lead, S) or ``offsets`` (lead, S+1) may differ per leading index."""
    if offsets is None:
        offsets = jnp.concatenate([jnp.zeros(lengths.shape[:-1] + (1,), lengths.dtype),
                                   jnp.cumsum(lengths, axis=-1)], axis=-1)
    lead, n, rest = data.shape[:axis], data.shape[axis], data.shape[axis + 1:]
    b, s = math.prod(lead), offsets.shape[-1] - 1
    offs = offsets.reshape(b, s + 1)
    pos = jnp.arange(n, dtype=offs.dtype)
    seg = jax.vmap(lambda o: jnp.searchsorted(o, pos, side="right") - 1)(offs)  # (B, L)
    inside = (seg >= 0) & (seg < s) & (pos[None, :] < offs[:, s:])
    ids = jnp.where(inside, seg + s * jnp.arange(b)[:, None], b * s).reshape(-1)
    return data.reshape((b * n,) + rest), ids, b * s, lead + (s,) + rest, offs


def _segment_counts(offs):
    return jnp.diff(offs, axis=-1).reshape(-1)


@lower(aten.segment_reduce)
def segment_reduce(data, reduce, *, lengths=None, indices=None, offsets=None, axis=0, unsafe=False, initial=None):
    """Empty segments give ``initial`` (or the reduction's identity; NaN for mean); a given ``initial`` also
    enters every non-empty segment's reduction, as in PyTorch."""
    if indices is not None:
        raise NotImplementedError("torchtpu_lab: segment_reduce with indices is not supported")
    axis = axis % data.ndim
    rows, ids, nseg, shape, offs = _segments(_acc(data), lengths, offsets, axis)
    count = _segment_counts(offs).reshape((-1,) + (1,) * (rows.ndim - 1))
    if reduce in ("sum", "mean"):
        out = jax.ops.segment_sum(rows, ids, nseg + 1)[:nseg]
        if initial is not None:
            out = out + initial
        if reduce == "mean":
            empty = jnp.asarray(jnp.nan if initial is None else initial, out.dtype)
            out = jnp.where(count > 0, out / jnp.maximum(count, 1), empty)
    elif reduce == "prod":
        out = jax.ops.segment_prod(rows, ids, nseg + 1)[:nseg]
        if initial is not None:
            out = out * initial
    elif reduce in ("max", "min"):
        fn = jax.ops.segment_max if reduce == "max" else jax.ops.segment_min
        out = fn(rows, ids, nseg + 1)[:nseg]
        nan = jax.ops.segment_max(jnp.isnan(rows).astype(jnp.int32), ids, nseg + 1)[:nseg] > 0
        out = jnp.where(nan, jnp.nan, out)
        if initial is not None:
            out = jnp.maximum(out, initial) if reduce == "max" else jnp.minimum(out, initial)
        ident = -jnp.inf if reduce == "max" else jnp.inf
        out = jnp.where(count > 0, out, jnp.asarray(ident if initial is None else initial, out.dtype))
    else:
        raise NotImplementedError(f"torchtpu_lab: segment_reduce reduce={reduce!r}")
    return out.reshape(shape)


@lower(aten._segment_reduce_backward)
def segment_reduce_backward(grad, output, data, reduce, *, lengths=None, offsets=None, axis=0, initial=None):
    """max/min share a segment's gradient equally among the elements equal to its result; prod divides the
    result by each element, except at zeros and NaNs, which get the product of the others (as PyTorch)."""
    axis = axis % data.ndim
    rows, ids, nseg, _, offs = _segments(_acc(data), lengths, offsets, axis)
    count = _segment_counts(offs)
    g_seg = jnp.concatenate([_acc(grad).reshape((nseg,) + rows.shape[1:]),
                             jnp.zeros((1,) + rows.shape[1:], rows.dtype)])
    out_seg = jnp.concatenate([_acc(output).reshape((nseg,) + rows.shape[1:]),
                               jnp.zeros((1,) + rows.shape[1:], rows.dtype)])
    g, out = g_seg[ids], out_seg[ids]
    zero = jnp.zeros((), rows.dtype)
    if reduce == "sum":
        res = g
    elif reduce == "mean":
        n = jnp.concatenate([count, jnp.ones((1,), count.dtype)])[ids]
        res = g / jnp.maximum(n, 1).reshape((-1,) + (1,) * (rows.ndim - 1)).astype(rows.dtype)
    elif reduce in ("max", "min"):
        hit = (rows == out) | (jnp.isnan(rows) & jnp.isnan(out))
        ties = jax.ops.segment_sum(hit.astype(rows.dtype), ids, nseg + 1)[ids]
        res = jnp.where(hit, g / jnp.maximum(ties, 1), zero)
    elif reduce == "prod":
        special = (rows == 0) | jnp.isnan(rows)
        plain = jax.ops.segment_prod(jnp.where(special, 1, rows), ids, nseg + 1)[ids]
        if initial is not None:
            plain = plain * initial
        n_zero = jax.ops.segment_sum((rows == 0).astype(jnp.int32), ids, nseg + 1)[ids] - (rows == 0)
        n_nan = jax.ops.segment_sum(jnp.isnan(rows).astype(jnp.int32), ids, nseg + 1)[ids] - jnp.isnan(rows)
        others = jnp.where(n_nan > 0, jnp.nan, jnp.where(n_zero > 0, 0 * plain, plain))
        res = jnp.where(special, g * others, g * out / jnp.where(special, 1, rows))
    else:
        raise NotImplementedError(f"torchtpu_lab: _segment_reduce_backward reduce={reduce!r}")
    res = jnp.where((ids < nseg).reshape((-1,) + (1,) * (rows.ndim - 1)), res, zero)
    return res.reshape(data.shape)


# ---- grid sampling -----------------------------------------------------------------------------------------------


def _flip(x, neg):
    return jnp.where(neg, -x, x)  # gradient +1 at zero (PyTorch's ``in < 0`` test), unlike jnp.abs


def _reflect(x, twice_low, twice_high):
    if twice_low == twice_high:
        return jnp.zeros_like(x)
    low, span = twice_low / 2, (twice_high - twice_low) / 2
    d = x - low
    d = _flip(d, d < 0)
    extra = jnp.fmod(d, span)
    flips = jnp.floor(d / span)
    return jnp.where(jnp.fmod(flips, 2) == 0, extra + low, span - extra + low)


def _clip(x, size):
    return jnp.where(x < 0, jnp.zeros((), x.dtype), jnp.where(x > size - 1, jnp.asarray(size - 1, x.dtype), x))


def _pad_coord(x, size, padding_mode, align_corners):
    """PyTorch's ``compute_coordinates``: border clips, reflection reflects then clips."""
    if padding_mode == 1:
        return _clip(x, size)
    if padding_mode == 2:
        x = _reflect(x, 0, 2 * (size - 1)) if align_corners else _reflect(x, -1, 2 * size - 1)
        return _clip(x, size)
    return x


def _unnormalize(coord, size, align_corners):
    if align_corners:
        return (coord + 1) / 2 * (size - 1)
    return ((coord + 1) * size - 1) / 2


def _grid_sample(x, grid, mode, padding_mode, align_corners):
    """``grid_sampler_{2,3}d``: x (N, C, *S), grid (N, *O, nd) with coordinates ordered (W, H[, D]).
    Modes: 0 bilinear, 1 nearest, 2 bicubic (2-D); padding: 0 zeros, 1 border, 2 reflection."""
    nd = x.ndim - 2
    size = x.shape[2:]
    flat = x.reshape(x.shape[:2] + (-1,))
    strides = [math.prod(size[a + 1:]) for a in range(nd)]
    coords = [grid[..., nd - 1 - a] for a in range(nd)]  # per spatial axis of x: D, H, W

    def tap(pos):
        """x at integer positions ``pos`` (per axis, float or int, shaped (N, *O)); zero outside."""
        valid = jnp.ones(pos[0].shape, bool)
        index = 0
        for a in range(nd):
            p = pos[a].astype(jnp.int64)
            valid = valid & (pos[a] >= 0) & (pos[a] <= size[a] - 1)
            index = index + jnp.clip(p, 0, size[a] - 1) * strides[a]
        vals = jax.vmap(lambda f, i: f[:, i])(flat, index)  # (N, C, *O)
        return jnp.where(valid[:, None], vals, jnp.zeros((), vals.dtype))

    if mode == 2:
        a_ = -0.75

        def near(v):
            return ((a_ + 2) * v - (a_ + 3)) * v * v + 1

        def far(v):
            return ((a_ * v - 5 * a_) * v + 8 * a_) * v - 4 * a_

        src = [_unnormalize(c, n, align_corners) for c, n in zip(coords, size)]
        base = [jnp.floor(s) for s in src]
        t = [s - b for s, b in zip(src, base)]
        coeff = [[far(tt + 1), near(tt), near(1 - tt), far(2 - tt)] for tt in t]
        out = 0
        for offs in itertools.product(range(4), repeat=nd):
            pos = [_pad_coord(b - 1 + o, n, padding_mode, align_corners) for b, o, n in zip(base, offs, size)]
            w = math.prod(coeff[a][offs[a]] for a in range(nd))
            out = out + w[:, None] * tap([jnp.trunc(p) if padding_mode else p for p in pos])
        return out
    src = [_pad_coord(_unnormalize(c, n, align_corners), n, padding_mode, align_corners)
           for c, n in zip(coords, size)]
    if mode == 1:
        return tap([jnp.round(s) for s in src])
    base = [jnp.floor(s) for s in src]
    out = 0
    for offs in itertools.product(range(2), repeat=nd):
        w = math.prod((s - b) if o else (b + 1 - s) for s, b, o in zip(src, base, offs))
        out = out + w[:, None] * tap([b + o for b, o in zip(base, offs)])
    return out


def _grid_sample_backward(grad, x, grid, mode, padding_mode, align_corners, output_mask):
    xf, gf = _acc(x), _acc(grid)
    _, vjp = jax.vjp(lambda v, g: _grid_sample(v, g, mode, padding_mode, align_corners), xf, gf)
    gx, gg = vjp(_acc(grad).astype(xf.dtype))
    return (gx if output_mask[0] else None), (gg if output_mask[1] else None)


@lower(aten.grid_sampler_2d, aten.grid_sampler_3d)
def grid_sampler(x, grid, interpolation_mode, padding_mode, align_corners):
    return _grid_sample(_acc(x), _acc(grid), interpolation_mode, padding_mode, align_corners)


@lower(aten.grid_sampler_2d_backward, aten.grid_sampler_3d_backward)
def grid_sampler_backward(grad, x, grid, interpolation_mode, padding_mode, align_corners, output_mask):
    return _grid_sample_backward(grad, x, grid, interpolation_mode, padding_mode, align_corners, output_mask)


# ---- rrelu (mutates ``noise``) -----------------------------------------------------------------------------------


@kernel(aten.rrelu_with_noise.default)
def rrelu_with_noise(x, noise, lower=0.125, upper=1 / 3, training=False, generator=None):
    """Training: each ``x <= 0`` is scaled by a fresh U(lower, upper) sample, stored in ``noise`` (1 elsewhere).
    Otherwise a leaky ReLU with slope ``(lower + upper) / 2``; ``noise`` is left alone."""
    if not training:
        return torch.where(x > 0, x, x * ((lower + upper) / 2))
    r = torch.rand(x.shape, dtype=x.dtype, device=x.device) * (upper - lower) + lower
    r = torch.where(x <= 0, r, torch.ones((), dtype=x.dtype, device=x.device))
    noise.copy_(r)
    return x * r


# ---- antialiased upsampling (PIL-style separable filters) --------------------------------------------------------


def _aa_matrix(n_in, n_out, align_corners, scale, cubic):
    """PyTorch's antialias weights: a triangle (bilinear) or a=-0.5 cubic filter stretched by the downscale factor,
    each output's taps normalized to sum to one; computed in float32 as PyTorch's CPU kernel."""
    f32 = np.float32
    if align_corners:
        s = f32((n_in - 1) / (n_out - 1)) if n_out > 1 else f32(0)
    else:
        s = _scale(n_in, n_out, scale)
    half = f32(2.0 if cubic else 1.0)
    support = half * s if s >= 1 else half
    invscale = f32(1) / s if s >= 1 else f32(1)

    def filt(x):
        x = np.abs(x)
        if not cubic:
            return np.where(x < 1, 1 - x, 0)
        a = -0.5
        return np.where(x < 1, ((a + 2) * x - (a + 3)) * x * x + 1,
                        np.where(x < 2, (((x - 5) * x + 8) * x - 4) * a, 0))

    m = np.zeros((n_out, n_in), np.float32)
    for i in range(n_out):
        center = s * f32(i + 0.5)
        lo = max(int(center - support + f32(0.5)), 0)
        hi = min(int(center + support + f32(0.5)), n_in)
        j = np.arange(lo, hi)
        w = filt((j - center + f32(0.5)).astype(np.float32) * invscale).astype(np.float32)
        total = w.sum(dtype=np.float32)
        m[i, lo:hi] = w / total if total != 0 else w
    return m


def _aa_linear(n_in, n_out, align_corners, scale):
    return _aa_matrix(n_in, n_out, align_corners, scale, False)


def _aa_cubic(n_in, n_out, align_corners, scale):
    return _aa_matrix(n_in, n_out, align_corners, scale, True)


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


# ---- fused RNN cells (ATen's LSTM/GRU call these for non-CPU devices, with the gate matmuls already done) -------


def _gates(input_gates, hidden_gates, input_bias, hidden_bias):
    """The pre-activation gates in the accumulation dtype, biases added where given."""
    ig, hg = _acc(input_gates), _acc(hidden_gates)
    if input_bias is not None:
        ig = ig + _acc(input_bias)
    if hidden_bias is not None:
        hg = hg + _acc(hidden_bias)
    return ig, hg


@lower(aten._thnn_fused_lstm_cell)
def thnn_fused_lstm_cell(input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None):
    """PyTorch's LSTM step; the workspace holds the activated gates ``i, f, g, o`` (its gate order)."""
    ig, hg = _gates(input_gates, hidden_gates, input_bias, hidden_bias)
    i, f, g, o = jnp.split(ig + hg, 4, axis=-1)
    i, f, g, o = jax.nn.sigmoid(i), jax.nn.sigmoid(f), jnp.tanh(g), jax.nn.sigmoid(o)
    cy = f * _acc(cx) + i * g
    hy = o * jnp.tanh(cy)
    dt = input_gates.dtype
    return hy.astype(dt), cy.astype(dt), jnp.concatenate([i, f, g, o], axis=-1).astype(dt)


@lower(aten._thnn_fused_lstm_cell_backward_impl)
def thnn_fused_lstm_cell_backward_impl(grad_hy, grad_cy, cx, cy, workspace, has_bias):
    """Gradients w.r.t. the pre-activation gates (input and hidden gates alike), ``cx`` and the bias (``None``
    without bias, as CUDA); a missing ``grad_hy``/``grad_cy`` counts as zero."""
    i, f, g, o = jnp.split(_acc(workspace), 4, axis=-1)
    cx, cy = _acc(cx), _acc(cy)
    gh = jnp.zeros_like(cy) if grad_hy is None else _acc(grad_hy)
    gc = jnp.zeros_like(cy) if grad_cy is None else _acc(grad_cy)
    tanh_cy = jnp.tanh(cy)
    gc = gc + gh * o * (1 - tanh_cy * tanh_cy)
    grad_gates = jnp.concatenate([
        gc * g * i * (1 - i),
        gc * cx * f * (1 - f),
        gc * i * (1 - g * g),
        gh * tanh_cy * o * (1 - o),
    ], axis=-1)
    dt = workspace.dtype
    grad_bias = grad_gates.sum(0).astype(dt) if has_bias else None
    return grad_gates.astype(dt), (gc * f).astype(dt), grad_bias


@lower(aten._thnn_fused_gru_cell)
def thnn_fused_gru_cell(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):
    """PyTorch's GRU step, ``n = tanh(W_in x + b_in + r * (W_hn h + b_hn))``; the workspace holds ``r, z, n, hx``
    and ``W_hn h + b_hn`` (CUDA's layout)."""
    ig, hg = _gates(input_gates, hidden_gates, input_bias, hidden_bias)
    ir, iz, in_ = jnp.split(ig, 3, axis=-1)
    hr, hz, hn = jnp.split(hg, 3, axis=-1)
    h = _acc(hx)
    r = jax.nn.sigmoid(ir + hr)
    z = jax.nn.sigmoid(iz + hz)
    n = jnp.tanh(in_ + r * hn)
    hy = n + z * (h - n)
    dt = input_gates.dtype
    return hy.astype(dt), jnp.concatenate([r, z, n, h, hn], axis=-1).astype(dt)


@lower(aten._thnn_fused_gru_cell_backward)
def thnn_fused_gru_cell_backward(grad_hy, workspace, has_bias):
    """Gradients w.r.t. the input gates, hidden gates, ``hx`` and the two biases (``None`` without bias)."""
    r, z, n, h, hn = jnp.split(_acc(workspace), 5, axis=-1)
    gh = _acc(grad_hy)
    gz = gh * (h - n) * z * (1 - z)
    gn = gh * (1 - z) * (1 - n * n)
    gr = gn * hn * r * (1 - r)
    grad_input_gates = jnp.concatenate([gr, gz, gn], axis=-1)
    grad_hidden_gates = jnp.concatenate([gr, gz, gn * r], axis=-1)
    dt = workspace.dtype
    biases = (grad_input_gates.sum(0).astype(dt), grad_hidden_gates.sum(0).astype(dt)) if has_bias else (None, None)
    return (grad_input_gates.astype(dt), grad_hidden_gates.astype(dt), (gh * z).astype(dt)) + biases
