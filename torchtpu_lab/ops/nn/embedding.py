"""``embedding`` (incl. renorm) and ``embedding_bag`` with their backward ops. Lowerings (pure JAX)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ..error_flags import report, reports
from ..registry import aten, lower
from ._common import _acc


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
