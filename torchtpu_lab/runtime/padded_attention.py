"""Attention over a KV cache that grows: one program for every length within a capacity bucket.

A dynamic KV cache (``transformers``' ``DynamicCache``, or any decode loop that does ``k = torch.cat([k, new],
-2)``) gives the keys and values a new length every token, and everything that reads them a new shape: one new
XLA program per token. :mod:`.growth` already keeps such a tensor in padded storage (capacity doubling, the
logical ``n`` positions at the front). Here the attention that reads it takes the *whole* padded storage and
``n`` as a graph input, and masks the padding exactly where the computation would read it — scores of padded
keys become ``-inf`` before the softmax's max and sum (their weights are exact zeros), padded values are zeroed
before the weighted sum (:func:`~torchtpu_lab.ops.nn.attention.attend`). Nothing after the attention has the
growing length in its shape (its output is ``[B, H, q, E]``), so a decode step is the same program for every
``n`` up to the capacity: O(log n) programs for n tokens.

How attention reaches us: ``F.scaled_dot_product_attention`` is CompositeImplicitAutograd, and PyTorch picks a
fused kernel for a PrivateUse1 device only through a C++ dispatch stub, so every call would decompose into
``bmm``/``softmax``/``bmm`` on the unpadded keys. So ``scaled_dot_product_attention`` has a tpu kernel of its own
(:func:`scaled_dot_product_attention`: one fused op, padded or not) and an autograd kernel
(:func:`autograd_attention`) that sends calls needing gradients to PyTorch's math decomposition, whose backward
is PyTorch's: training is unchanged, inference (``torch.no_grad``, as ``generate`` runs) gets the fused op.

**Bit-for-bit, and why not.** The padding itself is exact: a padded key's score is ``-inf`` before the max
and the sum (its weight is an exact ``0``) and a padded value is an exact ``0``, so every padded term adds
``+0.0``. What differs from an unpadded program is XLA:CPU's code for the *logical* work: its dot emitter
vectorizes along the output's last dim (8 float lanes with AVX2) and handles a remainder of ``n % 8`` columns
with other code, so even the score product ``q @ k.T`` — a contraction over the head dim, which the padding
never touches — gives results that differ in the last bit between a ``[.., n]`` and a ``[.., 64]`` output for
56 of the 64 lengths ``n`` (all but the multiples of 8; at most 9.5e-7, measured with plain ``jax.jit`` and no
torchtpu_lab code). The unpadded program's rounding depends on ``n`` in a way no program that serves every ``n``
can reproduce, so results equal the unpadded computation within float32 rounding (tests: ``atol=1e-6``),
and tokens equal CPU's.

A mask that comes with padded keys is read over the keys' padded extent when it is itself the front of a padded
result grown to the same length (built on padded extents by runtime/bounded.py, as ``transformers``' mask of a
left-padded batch is). Where keys and values are not both padded views of the same length, or the mask is not
such a front, the kernel reads them at their logical length: the results are the same, and the compile cause of
the next program names ``scaled_dot_product_attention`` and the length that changed.

With the native core, the first call of each kind teaches the recording kernel, which records the next ones
without Python: on padded keys, at any length (keyed without it); on whole buffers, as a static cache's keys
and values are, per geometry (keyed as any call).
"""

from __future__ import annotations

import functools

import torch

from .. import caches, dtypes
from ..device import sizes, tensor, views
from ..ops.nn.attention import attend
from . import bounded, fused, growth, recording
from .encode import dynamic_input, leaf_dtype
from .executor import OpExecutable, _wrap, launch
from .growth import padded_length
from .signatures import OpSignature

aten = torch.ops.aten
_NAME = "aten::scaled_dot_product_attention"


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p: float = 0.0,
                                 is_causal: bool = False, scale=None, enable_gqa: bool = False):
    """``aten::scaled_dot_product_attention`` below autograd: one fused op for the calls it covers (4-d inputs,
    no dropout), PyTorch's math decomposition for the rest (which also raises PyTorch's own errors)."""
    if not _covered(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa):
        return aten._scaled_dot_product_attention_math.default(
            query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)[0]
    return _fused(query, key, value, attn_mask, is_causal, scale)


def _fused(query, key, value, attn_mask, is_causal: bool, scale):
    """The fused op for a call :func:`_covered` accepts: padded keys and values read whole, with their length
    as an input, when both are the front of storages grown by appends (and a mask, if any, is such a front too)."""
    query, key, value = tensor.adopt(query), tensor.adopt(key), tensor.adopt(value)
    if attn_mask is None and growth.grown_storages():
        fronts = bounded.attention_fronts(query, key, value)
        if fronts is not None:  # a whole sequence's queries and keys, grown alike: the front of the whole result
            return growth.grown(_fused_whole(*fronts, is_causal, scale), 2, fronts[3])
    n = padded_length(key, 2)
    if n is not None and padded_length(value, 2) != n:
        n = None
    if n is not None and attn_mask is not None:  # a mask built from the grown length (runtime/bounded.py)
        mask = bounded.attention_mask(attn_mask, n, key.tpu_storage.shape[2])
        if mask is None:
            n = None
        else:
            attn_mask = mask
    dyn: list = []
    q_in = _operand(query, dyn)
    if n is not None:
        k_in, v_in = _whole(key, dyn), _whole(value, dyn)
        dyn.append(n)
    else:
        k_in, v_in = _operand(key, dyn), _operand(value, dyn)
    mask_read = None if attn_mask is None else tensor.adopt(attn_mask)
    mask_in = None if mask_read is None else _operand(mask_read, dyn)
    program, signature, out = _launch(query, value, dyn, (q_in, k_in, v_in, mask_in, n is not None), is_causal, scale)
    device = query.tpu_storage.device_index
    if type(out) is fused.LazyValue:  # the next such calls: recorded in C++
        if n is not None:  # at any n
            recording.learn_padded_attention(program, signature, dyn, query, mask_read)
        else:  # of this geometry (a static cache's: keys and values whole buffers)
            lesson = recording.lesson_pending
            if lesson is not None and lesson():
                recording.learn(_SDPA, program, dyn, (query, key, value, mask_read), {}, _NO_INPUTS, _NO_INPUTS, False,
                                signature=signature)
    return _wrap(out, program.meta, device)


def _fused_whole(query, key, value, n: int, is_causal: bool, scale):
    """Attention on whole padded extents of queries, keys and values (views, each grown along dim 2 to ``n``),
    keys past ``n`` masked as padding: every query position before ``n`` reads what it reads on the logical
    tensors, so its output row is the same; rows past ``n`` are padding. ``n`` is a graph input, so every length
    in the bucket runs one program. Not taught to the recording kernel: each call has a new length in its
    queries' key, so the recording kernel hands it here."""
    dyn: list = []
    q_in, k_in, v_in = _operand(query, dyn), _operand(key, dyn), _operand(value, dyn)
    dyn.append(n)
    program, _, out = _launch(query, value, dyn, (q_in, k_in, v_in, None, True), is_causal, scale)
    return _wrap(out, program.meta, query.tpu_storage.device_index)


def _launch(query, value, dyn: list, reads: tuple, is_causal: bool, scale):
    """``(program, signature, output)``: the attention program for ``reads`` (how each operand is read, and
    whether the keys' length is an input) launched on ``dyn``."""
    out_shape = tuple(query.shape[:3]) + (value.shape[-1],)
    sig = (*reads, bool(is_causal), scale, query.dtype, out_shape)
    program = _program(*sig)
    signature = OpSignature("scaled_dot_product_attention", sig, (), torch.get_float32_matmul_precision())
    return program, signature, launch(program, signature, dyn, query.tpu_storage.device_index, True)


def autograd_attention(query, key, value, attn_mask=None, dropout_p: float = 0.0, is_causal: bool = False,
                       scale=None, enable_gqa: bool = False):
    """``aten::scaled_dot_product_attention`` at the autograd key: a call that needs gradients takes PyTorch's
    math decomposition (its backward is PyTorch's own); the rest runs :func:`scaled_dot_product_attention`.

    Tensors that are not real tpu tensors (``FakeTensor``, ``FunctionalTensor``, functorch wrappers, meta
    tensors with the tpu keys) run PyTorch's CompositeImplicitAutograd decomposition, exactly as before this
    kernel existed: with a tpu kernel registered, functionalization no longer decomposes the op itself
    (``autograd_would_have_decomposed``), so without this ``torch.compile(backend="tpu")`` would trace
    ``aten.scaled_dot_product_attention`` into the graph, which has no lowering, and run the whole graph
    eagerly. Dynamo and AOTAutograd see what they saw before; the fused kernel is for eager tpu tensors."""
    if not all(_is_real(t) for t in (query, key, value, attn_mask)):
        return _SDPA.decompose(query, key, value, attn_mask, dropout_p, is_causal, scale=scale,
                               enable_gqa=enable_gqa)
    if attn_mask is not None and is_causal and cpu_refuses_mask_with_causal():  # PyTorch's error, from its math
        return aten._scaled_dot_product_attention_math.default(
            query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)[0]
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (query, key, value, attn_mask)):
        if trainable(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa):  # runtime/training_attention.py
            return _TRAINABLE(query, _query_heads(query, key), _query_heads(query, value), attn_mask, 0.0, is_causal,
                              False, scale=scale)[0]
        return aten._scaled_dot_product_attention_math.default(
            query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)[0]
    if _len_dispatch_stack() == 0 and _covered(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa):
        # the tpu kernel called directly, as the dispatcher would below autograd (no gradients, no dispatch mode
        # that must see the op): saves the second trip through the dispatcher, once per layer of a decode step
        return _FUSED(query, key, value, attn_mask, is_causal, scale)
    with torch._C._AutoDispatchBelowAutograd():
        return aten.scaled_dot_product_attention.default(query, key, value, attn_mask, dropout_p, is_causal,
                                                         scale=scale, enable_gqa=enable_gqa)


_SDPA = aten.scaled_dot_product_attention.default
#: one fused op forward and backward with PyTorch's autograd formula (kernels: runtime/training_attention.py)
_TRAINABLE = aten._scaled_dot_product_fused_attention_overrideable.default
#: :func:`_fused` under the runtime's lock with the interrupt checkpoint, as every tpu kernel runs
_FUSED = fused.entry_point(_fused)
_len_dispatch_stack = torch._C._len_torch_dispatch_stack
_NO_INPUTS = frozenset()  # no argument of the call is a graph input, by position or by name: numbers are keyed
_PLAIN = (torch.Tensor, torch.nn.Parameter)


def _is_real(t) -> bool:
    """``None``, or a tpu tensor with device data (not a fake, functional or functorch wrapper, nor meta)."""
    if t is None or type(t) is tensor.TpuTensor:
        return True
    return type(t) in _PLAIN and t.device.type == "tpu" and tensor.has_data(t)


def trainable(query, key, value, attn_mask, dropout_p: float, is_causal: bool, enable_gqa: bool) -> bool:
    """Whether an sdpa call that needs gradients takes the fused forward and backward (else the math
    decomposition): 4-d inputs the fused kernel covers, no dropout, and no forward-mode AD level active (the
    fused op has no forward derivative). Grouped-query heads (``enable_gqa``) are repeated first
    (:func:`_query_heads`)."""
    return (torch.autograd.forward_ad._current_level < 0
            and _covered(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa))


def _query_heads(query, t):
    """Keys or values ``t`` with as many heads as ``query``: each of a grouped-query call's key heads repeated
    for its group of query heads, as PyTorch's math decomposition does (``repeat_interleave`` along the heads),
    so the fused op, which takes one key head per query head, computes the same values and autograd sums the
    group's gradients back into the shared head."""
    h, kh = query.shape[1], t.shape[1]
    return t if kh == h else t.repeat_interleave(h // kh, dim=1)


def _covered(query, key, value, attn_mask, dropout_p: float, is_causal: bool, enable_gqa: bool) -> bool:
    """Whether the fused kernel computes this call (else the math decomposition does, and raises PyTorch's own
    errors for calls it refuses). A mask together with ``is_causal`` keeps what both keep where PyTorch's CPU
    kernel does (up to torch 2.13); where CPU refuses the pair (2.14, as its math decomposition always has and its
    documentation says), so do we."""
    if dropout_p > 0 or query.ndim != 4 or key.ndim != 4 or value.ndim != 4:
        return False
    if attn_mask is not None and is_causal and cpu_refuses_mask_with_causal():
        return False
    if 0 in query.shape or 0 in key.shape or 0 in value.shape:
        return False
    if not all(tensor.on_tpu(t) for t in (query, key, value, attn_mask) if t is not None):
        return False
    b, h, length, e = query.shape
    kb, kh, s, ke = key.shape
    if (kb, kh, s) != tuple(value.shape[:3]) or kb != b or ke != e or kh == 0 or h % kh:
        return False
    if kh != h and not enable_gqa:
        return False
    if attn_mask is not None:
        if attn_mask.dtype != torch.bool and attn_mask.dtype != query.dtype:
            return False
        if sizes.broadcast(tuple(attn_mask.shape), (b, h, length, s)) is None:
            return False
    return query.dtype == key.dtype == value.dtype and query.dtype.is_floating_point


@functools.cache
def cpu_refuses_mask_with_causal() -> bool:
    """Whether the installed torch's CPU attention refuses an explicit mask with ``is_causal=True``: up to 2.13 its
    flash kernel took the pair, from 2.14 the call raises. Asked once, on one element (on the CPU whatever the
    default device: under ``torch.device("tpu")`` the question would come back here)."""
    one = torch.zeros(1, 1, 1, 1, device="cpu")
    mask = torch.ones(1, 1, dtype=torch.bool, device="cpu")
    try:
        torch.nn.functional.scaled_dot_product_attention(one, one, one, attn_mask=mask, is_causal=True)
    except RuntimeError:
        return True
    return False


def _operand(t: tensor.TpuTensor, dyn: list) -> tuple:
    """``t`` read at its own shape: its storage (and a moving offset) go to ``dyn``; the key says how to read."""
    storage = t.tpu_storage
    dyn.append(storage.array)
    return ("view", tuple(storage.shape), dynamic_input(storage.shape, t.tpu_view, dyn), t.dtype,
            leaf_dtype(storage.held))


def _whole(t: tensor.TpuTensor, dyn: list) -> tuple:
    """``t``'s whole padded storage (``t`` is its first positions along dim 2: :func:`.growth.padded_length`)."""
    storage = t.tpu_storage
    dyn.append(storage.array)
    return ("padded", tuple(storage.shape), None, t.dtype, leaf_dtype(storage.held))


def _reader(spec: tuple):
    """A function of the remaining inputs that reads one operand and returns ``(value, rest)``."""
    _, base, key, dtype, _ = spec
    jdt = dtypes.to_jax(dtype)
    moves = key is not None and key.moves

    def read(rest):
        array, rest = rest[0], rest[1:]
        offset = ()
        if moves:
            offset, rest = rest[:1], rest[1:]
        return views.read(array, base, key, *offset).astype(jdt), rest

    return read


@caches.memoize("attention_programs", 512, code=True)
def _program(q_in, k_in, v_in, bias_in, padded: bool, is_causal: bool, scale, dtype, out_shape):
    """Attention on ``(q[, offset], k[, offset], v[, offset], [n,] [bias[, offset]])``: with ``padded``, k and v
    are whole padded storages and ``n`` their logical length, a value, so every ``n`` runs this program."""
    read_q, read_k, read_v = _reader(q_in), _reader(k_in), _reader(v_in)
    read_bias = None if bias_in is None else _reader(bias_in)

    def run(*inputs):
        q, rest = read_q(inputs)
        k, rest = read_k(rest)
        v, rest = read_v(rest)
        length = None
        if padded:
            length, rest = rest[0], rest[1:]
        bias = read_bias(rest)[0] if read_bias is not None else None
        return attend(q, k, v, bias, is_causal, scale, length)[0]

    return OpExecutable(run, True, torch.empty(out_shape, dtype=dtype, device="meta"), _NAME)


#: collected into ``backend.dispatch.KERNELS`` (the tpu kernels); with the native core, behind the recording
#: kernel, which records a call it has seen, on padded keys at any length (runtime/recording.py)
ATTENTION_KERNELS = {aten.scaled_dot_product_attention.default: scaled_dot_product_attention}


def install_autograd(lib: torch.library.Library, core=None) -> None:
    """Register :func:`autograd_attention` at ``AutogradPrivateUse1`` (with a tpu kernel of its own,
    ``scaled_dot_product_attention``, CompositeImplicitAutograd, would lose its gradients without it). With the
    native core (``core``) the kernel there is its C++ one (csrc/autograd_kernels.cpp), which sends a call on plain
    tpu tensors that needs no gradient below autograd without a Python frame — to the recording kernel, so a decode
    step's attention runs no Python — and every other call to :func:`autograd_attention`."""
    if core is not None:
        core.install_attention_autograd(autograd_attention)
    else:
        lib.impl(_SDPA, autograd_attention, "AutogradPrivateUse1")
