"""Attention that needs gradients: one fused op forward, one fused op backward, with PyTorch's own autograd.

Why. ``F.scaled_dot_product_attention`` with gradients used to take PyTorch's math decomposition: ~20 ops per
call (the causal mask built from ``ones``/``tril``, ``masked_fill``, ``matmul``, ``softmax``, ``matmul``) each
a dispatcher round trip, and as many again in its backward — about 1 ms of host time per layer in a small
transformer's fused step, more than PyTorch's whole CPU forward (bench/eager_overhead.py's step rows). On CPU
and CUDA PyTorch runs one fused kernel with a backward of its own.

How. PyTorch gives out-of-tree devices the same route: ``aten::_scaled_dot_product_fused_attention_overrideable``
and its ``_backward`` are native ops whose autograd formula is PyTorch's (``derivatives.yaml``), meant for a
backend to implement. The sdpa autograd kernel (:func:`.padded_attention.autograd_attention`) sends calls that
need gradients here; the forward is :func:`~torchtpu_lab.ops.nn.attention.attend` (output and log-sum-exp),
the backward is its JAX vjp for the inputs ``grad_input_mask`` asks for. Both are recorded into the fused graph
(or run, in strict/debug mode) like any op; XLA fuses the backward's recomputed scores with the rest of the step.

Double backward is not available on this route (PyTorch does not differentiate the backward op; nor does it on
CPU, where the flash kernel serves sdpa); dropout, 3-d inputs and forward-mode AD keep PyTorch's math
decomposition (:func:`.padded_attention.trainable` says which calls come here). Grouped-query heads (Llama 3,
Mistral, Qwen2: ``enable_gqa=True``) come here with their key and value heads repeated per query group first,
as the math decomposition repeats them, so autograd sums each group's gradients into its shared head.
"""

from __future__ import annotations

import jax
import torch

from .. import caches
from ..device import tensor
from ..ops.nn.attention import attend
from .executor import OpExecutable, _wrap, launch
from .padded_attention import _covered, _operand, _reader
from .signatures import OpSignature

aten = torch.ops.aten
_FORWARD = aten._scaled_dot_product_fused_attention_overrideable.default
_BACKWARD = aten._scaled_dot_product_fused_attention_overrideable_backward.default


def forward(query, key, value, attn_bias=None, dropout_p: float = 0.0, is_causal: bool = False,
            return_debug_mask: bool = False, *, scale=None):
    """The tpu kernel of ``_scaled_dot_product_fused_attention_overrideable``: ``(output, logsumexp, ...)``,
    the outputs this backend does not use (sequence offsets, the dropout seed) undefined, as the meta kernel
    says."""
    _check(_FORWARD, query, key, value, attn_bias, dropout_p, is_causal)
    if return_debug_mask:
        raise NotImplementedError(f"{_FORWARD}: return_debug_mask=True is not supported on tpu")
    query, key, value = tensor.adopt(query), tensor.adopt(key), tensor.adopt(value)
    dyn: list = []
    ins = tuple(_operand(t, dyn) for t in (query, key, value))
    bias_in = None if attn_bias is None else _operand(tensor.adopt(attn_bias), dyn)
    b, h, length, _ = query.shape
    sig = (*ins, bias_in, bool(is_causal), scale, query.dtype, (b, h, length, value.shape[-1]))
    program = _forward_program(*sig)
    device = query.tpu_storage.device_index
    out = launch(program, OpSignature("sdpa_fused_forward", sig, (), torch.get_float32_matmul_precision()),
                 dyn, device, True)
    output, lse = _wrap(out, program.meta, device)
    return output, lse, None, None, length, key.shape[2], None, None, None


def backward(grad_out, query, key, value, attn_bias, grad_input_mask, out, logsumexp, cum_seq_q, cum_seq_k,
             max_q, max_k, dropout_p: float, is_causal: bool, philox_seed, philox_offset, *, scale=None):
    """The tpu kernel of ``_scaled_dot_product_fused_attention_overrideable_backward``: the gradients of the
    query, key, value and (a float) bias that ``grad_input_mask`` asks for, ``None`` for the others."""
    _check(_BACKWARD, query, key, value, attn_bias, dropout_p, is_causal)
    want = tuple(bool(m) for m in grad_input_mask)
    if attn_bias is None or not attn_bias.dtype.is_floating_point:
        want = want[:3] + (False,)
    if not any(want):
        return None, None, None, None
    dyn: list = []
    ins = tuple(_operand(tensor.adopt(t), dyn) for t in (grad_out, query, key, value))
    bias_in = None if attn_bias is None else _operand(tensor.adopt(attn_bias), dyn)
    shapes = tuple(None if t is None else tuple(t.shape) for t in (query, key, value, attn_bias))
    sig = (*ins, bias_in, bool(is_causal), scale, want, shapes)
    program = _backward_program(*sig)
    device = tensor.adopt(query).tpu_storage.device_index
    grads = launch(program, OpSignature("sdpa_fused_backward", sig, (), torch.get_float32_matmul_precision()),
                   dyn, device, True)
    return tuple(_wrap(grads, program.meta, device))


def _check(op, query, key, value, attn_bias, dropout_p: float, is_causal: bool) -> None:
    """A direct call the fused kernel does not compute raises, naming the op (never a wrong number)."""
    if dropout_p > 0:
        raise NotImplementedError(f"{op}: dropout_p > 0 is not supported on tpu (sdpa with dropout takes "
                                  "PyTorch's math decomposition)")
    if not _covered(query, key, value, attn_bias, dropout_p, is_causal, False):
        raise NotImplementedError(f"{op}: only 4-d float query/key/value of one dtype with equal head counts are "
                                  "supported on tpu")


def _reads(specs):
    readers = [_reader(s) for s in specs]

    def read(inputs):
        values, rest = [], inputs
        for r in readers:
            v, rest = r(rest)
            values.append(v)
        return values, rest

    return read


@caches.memoize("attention_programs_forward", 256, code=True)
def _forward_program(q_in, k_in, v_in, bias_in, is_causal: bool, scale, dtype, out_shape):
    read = _reads([q_in, k_in, v_in] + ([bias_in] if bias_in is not None else []))

    def run(*inputs):
        (q, k, v, *bias), _ = read(inputs)
        return attend(q, k, v, bias[0] if bias else None, is_causal, scale)

    meta = (torch.empty(out_shape, dtype=dtype, device="meta"),
            torch.empty(out_shape[:3], dtype=torch.float32, device="meta"))
    return OpExecutable(run, True, meta, str(_FORWARD))


@caches.memoize("attention_programs_backward", 256, code=True)
def _backward_program(g_in, q_in, k_in, v_in, bias_in, is_causal: bool, scale, want: tuple, shapes: tuple):
    read = _reads([g_in, q_in, k_in, v_in] + ([bias_in] if bias_in is not None else []))
    float_bias = want[3]

    def run(*inputs):
        (g, q, k, v, *bias), _ = read(inputs)
        mask = bias[0] if bias else None
        if float_bias:
            _, vjp = jax.vjp(lambda q, k, v, b: attend(q, k, v, b, is_causal, scale)[0], q, k, v, mask)
        else:
            _, vjp = jax.vjp(lambda q, k, v: attend(q, k, v, mask, is_causal, scale)[0], q, k, v)
        grads = tuple(vjp(g)) + ((None,) if not float_bias else ())
        return tuple(gr if w else None for gr, w in zip(grads, want))

    specs = (q_in, k_in, v_in, bias_in)
    meta = tuple(torch.empty(shape, dtype=spec[3], device="meta") if w else None
                 for shape, spec, w in zip(shapes, specs, want))
    return OpExecutable(run, True, meta, str(_BACKWARD))


#: collected into ``backend.dispatch.KERNELS`` (the tpu kernels)
KERNELS = {_FORWARD: forward, _BACKWARD: backward}
