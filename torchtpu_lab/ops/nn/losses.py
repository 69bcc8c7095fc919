"""Loss functions: NLL, binary cross-entropy, MSE, smooth L1, Huber, margin losses and CTC. Lowerings (pure JAX).

``reduction`` follows ATen's enum: 0 none, 1 mean, 2 sum.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ..error_flags import report, reports
from ..registry import aten, checks_args, lower
from ._common import _acc


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


@checks_args(aten.nll_loss_forward)
def _nll_shapes(op, x, target, weight, reduction, ignore_index) -> None:
    """CPU's checks of ``nll_loss_forward`` (its meta function), whose Python decomposition, standing in as the meta
    kernel, asserts instead: an ``AssertionError`` where CPU raises ``RuntimeError``."""
    if not 0 < x.dim() <= 2:
        raise RuntimeError("input tensor should be 1D or 2D")
    if target.dim() > 1:
        raise RuntimeError("0D or 1D target tensor expected, multi-target not supported")
    if not (x.dim() == 1 and target.dim() == 0) and x.shape[0] != target.shape[0]:
        raise RuntimeError(f"size mismatch (got input: {list(x.shape)}, target: {list(target.shape)})")
    n_classes = x.shape[-1]
    if weight is not None and (weight.dim() != 1 or weight.numel() != n_classes):
        raise RuntimeError(f"weight tensor should be defined either for all {n_classes} classes or no classes but got "
                           f"weight tensor of shape: {list(weight.shape)}")


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
