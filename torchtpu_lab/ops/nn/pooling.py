"""Max, average, adaptive and fractional max pooling (2-D and 3-D) and their backward ops. Lowerings (pure JAX).

Backward ops linear in ``grad_output`` are ``jax.vjp`` of the forward lowering; max-pooling backwards scatter
``grad`` to the saved indices. The adaptive-average matrices run at ``precision.EXACT``: PyTorch computes this
op exactly whatever its matmul-precision setting.
"""

from __future__ import annotations

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ..precision import EXACT
from ..registry import aten, checks_args, lower
from ._common import _acc, _linear_backward, _tup


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
        xf = jnp.moveaxis(jnp.tensordot(xf, jnp.asarray(m, xf.dtype), axes=([ax], [1]), precision=EXACT), -1, ax)
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


@checks_args(aten.fractional_max_pool3d.default)
def _samples_fit_3d(op, x, kernel_size, output_size, samples) -> None:
    """CPU's checks of the 3-D op's ``random_samples`` (PyTorch's meta kernel makes none; the 2-D one's does)."""
    batch, channels = (x.shape[0] if x.dim() == 5 else 1), x.shape[-4] if x.dim() >= 4 else None
    if x.dtype != samples.dtype:
        raise RuntimeError("Expect _random_samples to have the same dtype as input")
    if samples.dim() != 3:
        raise RuntimeError(f"Expect _random_samples to have 3 dimensions, got {samples.dim()}")
    if samples.shape[0] < batch:
        raise RuntimeError("Expect _random_samples.size(0) no less then input batch size.")
    if samples.shape[1] != channels:
        raise RuntimeError("Expect _random_samples.size(1) equals to input channel size.")
    if samples.shape[2] != 3:
        raise RuntimeError(f"Expect _random_samples.size(2) equals to 3; got {samples.shape[2]}.")


def _fractional_max_pool(x, kernel_size, output_size, samples, nd):
    """Samples index the spatial dims in reverse (W, H) for 2-D and in order (T, H, W) for 3-D, as in PyTorch.
    Takes the first maximum (or a NaN) of each window; indices are flat over the input's spatial dims. Samples
    may have more rows than the input has batches (an unbatched input has one): CPU reads the first ones."""
    batched = x.ndim == nd + 2
    xb = x if batched else x[None]
    samples = samples[: xb.shape[0]]
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
