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
    out = jnp.matmul(attn, v, precision=prec).transpose(0, 2, 1, 3).reshape(query.shape[0], query.shape[1], -1)
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
