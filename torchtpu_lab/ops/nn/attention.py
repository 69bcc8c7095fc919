"""Fused inference-only transformer kernels: the fast path of ``nn.MultiheadAttention`` and
``nn.TransformerEncoderLayer`` (``_native_multi_head_attention``, ``_transformer_encoder_layer_fwd``). Lowerings
(pure JAX); the products run at :func:`~torchtpu_lab.ops.precision.matmul_precision`.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from ..precision import matmul_precision
from ..registry import aten, lower
from .activations import gelu
from .normalization import native_layer_norm


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
    prec = matmul_precision()

    def heads(x, w, b):
        y = jnp.matmul(x, w.T, precision=prec) + b
        return y.reshape(y.shape[0], y.shape[1], num_head, d).transpose(0, 2, 1, 3)

    q = heads(query, wq, bq) / math.sqrt(d)
    k, v = heads(key, wk, bk), heads(value, wv, bv)
    scores = _attention_mask(jnp.matmul(q, k.swapaxes(-1, -2), precision=prec), mask, mask_type)
    dead = jnp.all(scores == -jnp.inf, axis=-1, keepdims=True)
    attn = jnp.where(dead, 0.0, jax.nn.softmax(scores, axis=-1))
    out = jnp.matmul(attn, v, precision=prec).transpose(0, 2, 1, 3)
    out = out.reshape(query.shape[0], query.shape[1], num_head * d)  # not -1: an empty batch has no size to infer
    return jnp.matmul(out, proj_weight.T, precision=prec) + proj_bias, attn


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
    prec = matmul_precision()
    x = _layer_norm(src, norm_weight_1, norm_bias_1, eps) if norm_first else src
    x = _mha(x, x, x, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias, mask, mask_type)[0] + src
    if not norm_first:
        x = _layer_norm(x, norm_weight_1, norm_bias_1, eps)
    residual = x
    if norm_first:
        x = _layer_norm(x, norm_weight_2, norm_bias_2, eps)
    h = jnp.matmul(x, ffn_weight_1.T, precision=prec) + ffn_bias_1
    h = gelu(h) if use_gelu else jnp.maximum(h, 0)
    x = jnp.matmul(h, ffn_weight_2.T, precision=prec) + ffn_bias_2 + residual
    return x if norm_first else _layer_norm(x, norm_weight_2, norm_bias_2, eps)


def attend(q, k, v, bias, is_causal: bool, scale, length=None):
    """Scaled dot-product attention, ``softmax(q kᵀ · scale + bias) v`` over the last two dims, with PyTorch's
    semantics: ``scale`` defaults to ``1/sqrt(E)``; ``is_causal`` keeps key ``j`` for query ``i`` when ``j <= i``
    (top-left aligned, as ``torch.ones(L, S).tril()``); a bool ``bias`` keeps where True, a float one is added;
    a row with no key kept gives zeros (``_safe_softmax``); fewer key heads than query heads are shared by
    consecutive query heads (``enable_gqa``).

    ``length`` (a traced int, or ``None``): keys at positions ``>= length`` are padding — storage a growing tensor
    has not filled yet (runtime/padded_attention.py) — and are removed exactly: their scores become ``-inf``
    before the max and the sum, so their weights are exact zeros, and their values are zeroed before the
    weighted sum, so whatever the padding holds never reaches a result.

    Returns ``(output, logsumexp)``; the products run at :func:`~torchtpu_lab.ops.precision.matmul_precision`,
    half-precision inputs are computed in float32."""
    prec = matmul_precision()
    out_dtype = q.dtype
    work = jnp.promote_types(q.dtype, jnp.float32)
    q, k, v = q.astype(work), k.astype(work), v.astype(work)
    if k.ndim >= 3 and q.shape[-3] != k.shape[-3]:
        groups = q.shape[-3] // k.shape[-3]
        k, v = jnp.repeat(k, groups, axis=-3), jnp.repeat(v, groups, axis=-3)
    n_q, n_k = q.shape[-2], k.shape[-2]
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    root = math.sqrt(scale)
    scores = jnp.matmul(q * root, jnp.swapaxes(k * root, -1, -2), precision=prec)
    keep = None
    if length is not None:
        inside = jnp.arange(n_k) < length
        keep = jnp.broadcast_to(inside, (n_q, n_k))
        v = jnp.where(inside[:, None], v, 0)
    if is_causal:
        causal = jnp.arange(n_k)[None, :] <= jnp.arange(n_q)[:, None]
        keep = causal if keep is None else keep & causal
    if bias is not None:
        if bias.dtype == jnp.bool_:
            keep = bias if keep is None else keep & bias
        else:
            scores = scores + bias.astype(work)
    if keep is not None:
        scores = jnp.where(keep, scores, -jnp.inf)
    top = jnp.max(scores, axis=-1, keepdims=True)
    top = jnp.where(jnp.isfinite(top), top, 0)  # a row with nothing kept: exp(-inf) = 0 everywhere below
    e = jnp.exp(scores - top)
    total = jnp.sum(e, axis=-1, keepdims=True)
    weights = jnp.where(total == 0, 0, e / jnp.where(total == 0, 1, total))
    out = jnp.matmul(weights, v, precision=prec)
    return out.astype(out_dtype), (jnp.log(total) + top)[..., 0]
