"""Torch-level kernels of the fused optimizer steps (``Adam(fused=True)``, ``AdamW(fused=True)``,
``SGD(fused=True)``): ``aten::_fused_adam_``, ``_fused_adamw_`` and ``_fused_sgd_``.

PyTorch lists PrivateUse1 among the devices ``fused=True`` accepts, and hands the whole step (every parameter,
gradient and state tensor) to one of these ops, which update their arguments in place. They are kernels, not
lowerings, because they mutate lists of tensors; each is written with torch ops on the tpu tensors, in the
order and precision of PyTorch's CPU kernels (``FusedAdamKernel.cpp``, ``FusedSGDKernel.cpp``), so in fused
eager mode a step is recorded into the pending graph like any other and needs no sync: the step count, a
tensor learning rate and ``found_inf`` stay on the device (a step that found an inf leaves every tensor as it
was, selected with ``where`` rather than read on the host).
"""

from __future__ import annotations

import functools

import torch

from .registry import aten, kernel


def _skip_if_inf(found_inf, new: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
    """``new``, or ``old`` where the grad scaler found an inf (``found_inf == 1``)."""
    return new if found_inf is None else torch.where(found_inf == 1, old, new)


def _unscale(grad: torch.Tensor, grad_scale, found_inf) -> torch.Tensor:
    """The gradient divided by the scale, written back as PyTorch's kernels write it."""
    if grad_scale is None:
        return grad
    grad.copy_(_skip_if_inf(found_inf, grad / grad_scale, grad))
    return grad


def _adam(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, *, decoupled: bool, lr, beta1, beta2,
          weight_decay, eps, amsgrad, maximize, grad_scale=None, found_inf=None):
    """``aten::_fused_adam_`` (``decoupled=False``) and ``_fused_adamw_`` (``True``): the same arguments, differing
    only in how weight decay applies."""
    if amsgrad and len(max_exp_avg_sqs) != len(params):
        raise RuntimeError("_fused_adam_: amsgrad needs one max_exp_avg_sq per parameter")
    if not amsgrad and max_exp_avg_sqs:
        raise RuntimeError("_fused_adam_: max_exp_avg_sqs must be empty without amsgrad (as PyTorch's kernel wants)")
    for i, (p, g, m, v, step) in enumerate(zip(params, grads, exp_avgs, exp_avg_sqs, state_steps, strict=True)):
        g = _unscale(g, grad_scale, found_inf)
        if maximize:
            g = -g
        new_p = p
        if weight_decay != 0:
            if decoupled:
                new_p = p * (1 - lr * weight_decay)
            else:
                g = g + p * weight_decay
        new_m = m * beta1 + g * (1 - beta1)
        new_v = v * beta2 + g * g * (1 - beta2)
        step = step.to(torch.float64 if p.dtype == torch.float64 else torch.float32)
        bias_correction1 = 1 - torch.pow(beta1, step)
        bias_correction2_sqrt = torch.sqrt(1 - torch.pow(beta2, step))
        step_size = lr / bias_correction1
        second = new_v
        if amsgrad:
            second = torch.maximum(max_exp_avg_sqs[i], new_v)
            max_exp_avg_sqs[i].copy_(_skip_if_inf(found_inf, second, max_exp_avg_sqs[i]))
        denom = torch.sqrt(second) / bias_correction2_sqrt + eps
        new_p = new_p - step_size * new_m / denom
        m.copy_(_skip_if_inf(found_inf, new_m, m))
        v.copy_(_skip_if_inf(found_inf, new_v, v))
        p.copy_(_skip_if_inf(found_inf, new_p, p))


fused_adam_ = kernel(aten._fused_adam_.default, aten._fused_adam_.tensor_lr)(functools.partial(_adam, decoupled=False))
fused_adamw_ = kernel(aten._fused_adamw_.default, aten._fused_adamw_.tensor_lr)(functools.partial(_adam, decoupled=True))


@kernel(aten._fused_sgd_.default, aten._fused_sgd_.tensor_lr)
def fused_sgd_(params, grads, momentum_buffer_list, *, weight_decay, momentum, lr, dampening, nesterov, maximize,
               is_first_step, grad_scale=None, found_inf=None):
    if momentum != 0 and len(momentum_buffer_list) != len(params):
        raise RuntimeError("_fused_sgd_: momentum needs one momentum buffer per parameter")
    for i, (p, g) in enumerate(zip(params, grads, strict=True)):
        g = _unscale(g, grad_scale, found_inf)
        if maximize:
            g = -g
        if weight_decay != 0:
            g = g + p * weight_decay
        if momentum != 0:
            buf = momentum_buffer_list[i]
            new_buf = g if is_first_step else buf * momentum + g * (1 - dampening)
            buf.copy_(_skip_if_inf(found_inf, new_buf, buf))
            g = g + new_buf * momentum if nesterov else new_buf
        p.copy_(_skip_if_inf(found_inf, p - lr * g, p))
