"""``grid_sampler_2d``/``grid_sampler_3d`` (bilinear, nearest, bicubic; zeros/border/reflection padding) and
their backward (``jax.vjp`` of the forward). Lowerings (pure JAX).
"""

from __future__ import annotations

import itertools
import math

import jax
import jax.numpy as jnp

from ..registry import aten, checks_args, lower
from ._common import _acc


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
    # PyTorch leaves only the input's gradient out when it is not wanted: the grid's is always a tensor
    return (gx if output_mask[0] else None), gg


_BICUBIC = 2


@checks_args(aten.grid_sampler_2d, aten.grid_sampler_3d)
def _grid_args(op, x, grid, interpolation_mode, *_, **__) -> None:
    """CPU's shape checks (ATen's GridSamplerUtils.h), in its order and wording: PyTorch's decomposition of
    ``grid_sampler_2d`` makes none (a 5-d input raised ``ValueError: too many values to unpack``, an empty spatial
    dim JAX's TypeError) and its meta kernel of ``grid_sampler_3d`` prints the sizes as ``torch.Size([..])``."""
    if x.dim() == 0 or grid.dim() == 0:
        return  # PyTorch's own errors for these
    nd = 2 if op is aten.grid_sampler_2d.default else 3
    sizes = f"input with sizes {list(x.shape)} and grid with sizes {list(grid.shape)}"
    if x.shape[0] != grid.shape[0]:
        raise RuntimeError(f"grid_sampler(): expected grid and input to have same batch size, but got {sizes}")
    if grid.shape[-1] != x.dim() - 2:
        raise RuntimeError(f"grid_sampler(): expected grid to have size {x.dim() - 2} in last dimension, but got grid "
                           f"with sizes {list(grid.shape)}")
    for d in range(2, x.dim()):
        if x.shape[d] <= 0:
            raise RuntimeError(f"grid_sampler(): expected input to have non-empty spatial dimensions, but input has "
                               f"sizes {list(x.shape)} with dimension {d} being empty")
    if x.dim() != nd + 2 or grid.dim() != x.dim():
        raise RuntimeError(f"grid_sampler(): expected {nd + 2}D input and grid with same number of dimensions, but got "
                           f"{sizes}")
    if nd == 3 and interpolation_mode == _BICUBIC:
        raise RuntimeError("grid_sampler(): bicubic interpolation only supports 4D input")


@lower(aten.grid_sampler_2d, aten.grid_sampler_3d)
def grid_sampler(x, grid, interpolation_mode, padding_mode, align_corners):
    return _grid_sample(_acc(x), _acc(grid), interpolation_mode, padding_mode, align_corners)


@lower(aten.grid_sampler_2d_backward, aten.grid_sampler_3d_backward)
def grid_sampler_backward(grad, x, grid, interpolation_mode, padding_mode, align_corners, output_mask):
    return _grid_sample_backward(grad, x, grid, interpolation_mode, padding_mode, align_corners, output_mask)
