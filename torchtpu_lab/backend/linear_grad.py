"""``aten::linear``'s autograd on the tpu device: weight gradients come out in the weight's own orientation.

Why. ``linear`` is CompositeImplicitAutograd: PyTorch runs it as ``addmm(b, x, w.t())`` and differentiates
``addmm``. Its ``mm_mat2_backward`` picks the gradient's layout from ``mat2``'s *strides*: for a column-major
``mat2`` (``w.t()`` of a row-major weight, as on CPU/CUDA) it computes ``grad.t().mm(x).t()``, which ``t``'s
backward turns back into a row-major ``[out, in]`` tensor. tpu tensors report contiguous torch strides (their
real geometry lives in :class:`~torchtpu_lab.device.views.View`), so PyTorch takes the other branch,
``x.t().mm(grad)`` (``[in, out]``), and ``weight.grad`` becomes a transposed *view* of that storage. In fused
mode the storage is a graph output, so the optimizer's update reads it transposed and XLA materializes one
transpose (and a copy) per weight per step — the main part of the fused MLP step's gap to ``jax.jit``
(``docs/perf.md``).

What. A kernel at ``AutogradPrivateUse1`` for ``aten::linear``: real tpu tensors that need a gradient go
through :class:`_Linear`, whose backward computes ``grad_w = g.t().mm(x)`` (``[out, in]``, a base tensor: the
``t()`` is an input of the ``mm``, which XLA folds into the dot), ``grad_x = g.mm(w)`` and ``grad_b = g.sum(0)``
on the leading dims flattened to 2-D, each only when ``needs_input_grad`` asks for it. The backward is made of
ordinary differentiable ops, so double backward (``create_graph=True``) works; forward-mode AD has a ``jvp``.
The forward of a floating-point input is the one-op ``linear`` that inference records (below), else PyTorch's
own decomposition. Everything else — no grad needed, complex dtypes, a 1-D
weight, and every tensor that is not a real tpu tensor (``FakeTensor``, ``FunctionalTensor``, functorch
wrappers, meta tensors carrying the tpu keys) — runs PyTorch's decomposition exactly as before, so
``torch.compile``, ``torch.export`` and ``FakeTensorMode`` keep seeing ``aten.linear`` / its decomposition.

Why at ``linear`` and not at ``mm``. Fixing ``mm``'s (and ``addmm``'s, ``bmm``'s, ``matmul``'s) autograd would
be more general in principle, but it would have to reproduce PyTorch's formulas for all of them (``alpha``,
``beta``, complex conjugation, the layout branches) and to guess from our view geometry which orientation a
caller wants — and ``mm``'s backward still could not stop ``t``'s backward from handing ``.grad`` a view.
``linear`` is where the orientation is known (a weight is ``[out, in]`` and its gradient must be too), it is
how nearly every parameter matrix is used (``nn.Linear``, attention projections, transformers' heads), and the
gradient of a matmul between activations is an intermediate whose transpose XLA folds into its consumer. The
root cause then (torch-level strides that were not the real ones) is gone: views now report PyTorch's strides;
this kernel stays because it keeps the fused step's program free of the transposes either way.
"""

from __future__ import annotations

import jax.numpy as jnp
import torch
import torch.autograd.forward_ad as _forward_ad

from ..device.tensor import TpuTensor, has_data
from ..ops.linalg import biased_product
from ..ops.precision import matmul_precision
from ..ops.registry import Lowering

aten = torch.ops.aten
_linear = aten.linear.default
_PLAIN = (torch.Tensor, torch.nn.Parameter)
_libs: list = []


def _is_real(t: torch.Tensor | None) -> bool:
    """A tpu tensor with device data (not a fake, functional or functorch wrapper, nor a meta tensor)."""
    if t is None or type(t) is TpuTensor:
        return True
    return type(t) in _PLAIN and t.device.type == "tpu" and has_data(t)


def _one_op(x: torch.Tensor) -> bool:
    """Whether ``linear`` on ``x`` runs as its own lowered op (``_product``) rather than the decomposition."""
    return x.dim() >= 1 and x.dtype.is_floating_point


def _as_2d(t: torch.Tensor) -> torch.Tensor:
    """``t`` with its leading dims flattened (a no-op for a 2-D tensor)."""
    return t if t.dim() == 2 else t.reshape(-1, t.shape[-1])


class _Linear(torch.autograd.Function):
    """``y = x @ w.t() + b`` with a backward that keeps every gradient in its input's orientation.

    Old-style (``forward(ctx, ...)``, no ``setup_context``) on purpose: ``Function.apply`` binds default
    arguments with ``inspect.signature`` for the new style, which cost about as much as the rest of the call; the
    new style is only needed under functorch transforms, where :func:`linear` does not use this class."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        ctx.save_for_backward(x, w)
        ctx.save_for_forward(x, w)
        ctx.bias_shape = None if b is None else b.shape
        if _one_op(x):  # one recorded op, as without a gradient (see linear)
            with _below_autograd():
                return _linear(x, w, b)
        return _linear.decompose(x, w, b)

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        x, w = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad
        g2 = _as_2d(g)
        grad_x = g2.mm(w).reshape(x.shape) if need_x else None
        grad_w = g2.t().mm(_as_2d(x)) if need_w else None
        grad_b = None
        if need_b:
            grad_b = g2.sum(0)
            if grad_b.shape != ctx.bias_shape:  # a bias that broadcast (e.g. [1, out]): g summed to its shape
                grad_b = g.sum_to_size(ctx.bias_shape)
        return grad_x, grad_w, grad_b

    @staticmethod
    def jvp(ctx, x_t: torch.Tensor | None, w_t: torch.Tensor | None, b_t: torch.Tensor | None):
        x, w = ctx.saved_tensors
        out = None
        for term in (None if x_t is None else _linear.decompose(x_t, w, None),
                     None if w_t is None else _linear.decompose(x, w_t, None), b_t):
            if term is not None:
                out = term if out is None else out + term
        return out


def _product(x, w, b=None):
    """``x @ w.T + b`` in one lowering: a ``dot_general`` contracting the last dims (the transpose is folded); the
    bias added before the one rounding in half types, as PyTorch's CPU gemm adds it."""
    if b is None:
        return jnp.matmul(x, w.T, precision=matmul_precision())
    return biased_product(b, x, w.T)


#: not in the op table (``linear`` is CompositeImplicitAutograd): only :func:`linear` (and inference mode, which
#: skips the autograd keys) dispatches it to the tpu key, where it is the recording kernel's like any lowered op
_PRODUCT = Lowering(_linear, _product)
#: collected into ``backend.dispatch.KERNELS`` as the tpu kernel of ``aten::linear``
LOWERED = {_linear: _PRODUCT}
_below_autograd = torch._C._AutoDispatchBelowAutograd


def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """The ``AutogradPrivateUse1`` kernel: :class:`_Linear` where it applies, one fused op where no gradient is
    needed, PyTorch's decomposition elsewhere.

    Without a gradient (inference, ``generate``) a ``linear`` of real tpu tensors is one recorded op instead of
    the decomposition's four (``t``, ``view``, ``mm``/``addmm``, ``_unsafe_view``, plus ``add`` for a batched
    bias): each op is a dispatcher round trip, and a decode step of a small model is mostly those (a tiny
    Llama's token: 15 linears of ~100 ops). It is dispatched below autograd to ``aten::linear``'s tpu kernel, so
    a repeated call is recorded by the native core's recording kernel without entering the executor's Python
    (25 -> 16.5 us a call, ``bench/generate.py --kernels``). The output has no autograd history, as the
    decomposition's would not either."""
    real = _is_real(x) and _is_real(w) and _is_real(b) and not torch._C._are_functorch_transforms_active()
    needs_grad = torch.is_grad_enabled() and (x.requires_grad or w.requires_grad
                                              or (b is not None and b.requires_grad))
    if real and w.dim() == 2 and not w.is_complex():
        if needs_grad:
            return _Linear.apply(x, w, b)
        if _one_op(x) and _forward_ad._current_level < 0:  # no dual tensors
            with _below_autograd():
                return _linear(x, w, b)
    return _linear.decompose(x, w, b)


def install(core=None) -> None:
    """Register :func:`linear` for ``aten::linear`` at ``AutogradPrivateUse1`` (idempotent). With the native
    core (``core``) the kernel is its C++ one (csrc/autograd_kernels.cpp), which serves the calls :func:`linear`
    serves without a Python frame: one that needs no gradient goes below autograd (~15 calls per decode token of
    a small Llama), one that needs a gradient through a C++ autograd Function with :class:`_Linear`'s forward and
    backward (its grad_fn's type is named ``_LinearBackward`` too). A Python Function costs ~50 us a call each
    way, a dozen times per step of a small transformer. Every other call (a functorch transform, a fake,
    functional or dual tensor, a complex or 1-D weight) reaches :func:`linear`."""
    if _libs:
        return
    if core is not None and hasattr(core, "install_linear_autograd"):
        core.install_linear_autograd(linear)
        _libs.append(core)
        return
    lib = torch.library.Library("aten", "IMPL")
    lib.impl(_linear, linear, "AutogradPrivateUse1")
    _libs.append(lib)
