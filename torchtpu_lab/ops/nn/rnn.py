"""Fused RNN cells (``_thnn_fused_lstm_cell``, ``_thnn_fused_gru_cell`` and backwards): ATen's LSTM/GRU call these
for non-CPU devices, with the gate matmuls already done. Lowerings (pure JAX).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ..registry import aten, lower
from ._common import _acc


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
