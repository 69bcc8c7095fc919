"""``segment_reduce`` and ``_segment_reduce_backward`` (sum, mean, prod, max, min over lengths/offsets).
Lowerings (pure JAX).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from ..registry import aten, lower
from ._common import _acc


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
