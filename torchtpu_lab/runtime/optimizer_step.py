"""``Adam(fused=True)`` and ``AdamW(fused=True)``'s step (``aten::_fused_adam_``, ``_fused_adamw_``) as one op.

Why. ``transformers``' ``Trainer`` defaults to ``adamw_torch_fused`` (torch >= 2.8), which hands the whole step —
every parameter, gradient and state tensor — to ``_fused_adamw_``. :mod:`torchtpu_lab.ops.optimizer_kernels`
writes that step with torch ops per parameter (about twenty dispatches each, from Python): a tiny transformer's
30 parameters took 6.9 ms of host time per step there, against 2.2 ms on the ``foreach`` path. Here the step is
one traced function of all of them, whose outputs replace their tensors' arrays (:func:`.values.set_array`, as
``copy_`` of a same-shaped base does): fused mode records one node, strict mode runs one executable.

The function applies the per-op kernel's sequence element for element — the same torch-level operations in the
same order (``lr / t`` is PyTorch's ``t.reciprocal() * lr``), so the same values. The hyperparameters are graph
inputs (numbers, or the tensor learning rate), so a learning-rate schedule compiles nothing new; the program is
keyed by the parameters' shapes and the step's options. A step this does not cover — a view or a non-float32
tensor among the lists, tensors on several devices, lists of unequal length (the per-op kernel raises PyTorch's
error) — takes the per-op kernel.
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
import torch

from .. import caches
from ..device import tensor
from ..ops import optimizer_kernels
from . import fused, values
from .executor import OpExecutable, launch
from .signatures import OpSignature

aten = torch.ops.aten


def _base_f32(t, device: int | None) -> int | None:
    """``t``'s device index when it is a float32 base tpu tensor (on ``device``, when given), else ``None``."""
    if not tensor.on_tpu(t):
        return None
    t = tensor.adopt(t)
    if t.tpu_view is not None or t.dtype != torch.float32:
        return None
    index = t.tpu_storage.device_index
    return index if device is None or index == device else None


def _device(groups: tuple, steps, extras: tuple) -> int | None:
    """The device of a step this module covers, else ``None``: lists of equal, non-zero length of float32 base
    tpu tensors on one device (a parameter's gradient and states of its shape), and tpu tensors among
    ``extras`` (a tensor learning rate, ``grad_scale``, ``found_inf``)."""
    params = groups[0]
    n = len(params)
    if n == 0 or any(len(g) != n for g in groups) or len(steps) != n:
        return None
    device = _base_f32(params[0], None)
    if device is None:
        return None
    for i, p in enumerate(params):
        shape = p.shape
        for g in groups:
            if _base_f32(g[i], device) is None or g[i].shape != shape:
                return None
        if _base_f32(steps[i], device) is None:
            return None
    for x in extras:
        if isinstance(x, torch.Tensor) and _base_f32(x, device) is None:
            return None
    return device


def _step(decoupled: bool, params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, *, lr, beta1,
          beta2, weight_decay, eps, amsgrad, maximize, grad_scale=None, found_inf=None) -> bool:
    """Run (or record) the step as one op, if :func:`_device` covers it; ``False`` (nothing done) otherwise."""
    groups = (params, grads, exp_avgs, exp_avg_sqs) + ((max_exp_avg_sqs,) if amsgrad else ())
    device = _device(groups, state_steps, (lr, grad_scale, found_inf))
    if device is None or (not amsgrad and max_exp_avg_sqs):
        return False
    _run(decoupled, groups, state_steps, device, lr, beta1, beta2, weight_decay, eps, amsgrad, maximize,
         grad_scale, found_inf)
    return True


@fused.entry_point
def _run(decoupled: bool, groups: tuple, steps, device: int, lr, beta1, beta2, weight_decay, eps, amsgrad: bool,
         maximize: bool, grad_scale, found_inf) -> None:
    tensors = [tensor.adopt(g[i]) for i in range(len(groups[0])) for g in groups]
    dyn = [t.tpu_storage.array for t in tensors]
    dyn += [tensor.adopt(s).tpu_storage.array for s in steps]
    lr_tensor = isinstance(lr, torch.Tensor)
    # the per-op kernel's Python-level numbers, computed as it computes them (in double, then cast by each op); with
    # a tensor learning rate, ``1 - lr * weight_decay`` is a tensor expression, computed in the program
    decay = (1 - lr * weight_decay) if decoupled and not lr_tensor else weight_decay
    dyn += [tensor.adopt(lr).tpu_storage.array if lr_tensor else lr, decay, beta1, 1 - beta1, beta2, 1 - beta2, eps]
    dyn += [tensor.adopt(x).tpu_storage.array for x in (grad_scale, found_inf) if x is not None]
    shapes = tuple(tuple(p.shape) for p in groups[0])
    sig = (shapes, decoupled, amsgrad, maximize, weight_decay != 0, lr_tensor, grad_scale is not None,
           found_inf is not None)
    program = _program(*sig)
    out = launch(program, OpSignature("fused_adam", sig, ()), dyn, device, True)
    for t, value in zip(_written(tensors, len(groups), grad_scale is not None), out):
        values.set_array(t.tpu_storage, value)


def _written(tensors: list, per_param: int, unscaled: bool) -> list:
    """The tensors the program's outputs replace, in its output order: per parameter its new value, first and
    second moments, running max (amsgrad), and its gradient once unscaled (with ``grad_scale``)."""
    out = []
    for i in range(0, len(tensors), per_param):
        p, g, m, v = tensors[i:i + 4]
        out += [p, m, v] + tensors[i + 4:i + per_param] + ([g] if unscaled else [])
    return out


@caches.memoize("fused_adam_programs", 64)
def _program(shapes: tuple, decoupled: bool, amsgrad: bool, maximize: bool, decays: bool, lr_tensor: bool,
             scaled: bool, checks_inf: bool) -> OpExecutable:
    """The step's traced function: inputs per parameter ``p, g, m, v[, max_v]``, then the steps, then ``lr,
    decay, beta1, 1 - beta1, beta2, 1 - beta2, eps[, grad_scale][, found_inf]``; outputs as :func:`_written`
    lists them."""
    n = len(shapes)
    per_param = 5 if amsgrad else 4

    def run(*inputs):
        states, steps = inputs[:n * per_param], inputs[n * per_param:n * (per_param + 1)]
        rest = inputs[n * (per_param + 1):]
        lr, decay, beta1, one_minus_beta1, beta2, one_minus_beta2, eps = rest[:7]
        scale = rest[7] if scaled else None
        found_inf = rest[-1] if checks_inf else None

        def unless_inf(new, old):
            return new if found_inf is None else jnp.where(found_inf == 1, old, new)

        outs = []
        for i in range(n):
            p, g, m, v = states[i * per_param:i * per_param + 4]
            if scaled:
                g = unless_inf(g / scale, g)
            unscaled = g
            if maximize:
                g = -g
            new_p = p
            if decays:
                if decoupled:
                    new_p = p * ((1 - lr * decay) if lr_tensor else decay)
                else:
                    g = g + p * decay
            new_m = m * beta1 + g * one_minus_beta1
            new_v = v * beta2 + g * g * one_minus_beta2
            bias_correction1 = 1 - jnp.power(beta1, steps[i])
            bias_correction2_sqrt = jnp.sqrt(1 - jnp.power(beta2, steps[i]))
            step_size = lr / bias_correction1 if lr_tensor else jnp.reciprocal(bias_correction1) * lr
            second = new_v
            written = []
            if amsgrad:
                old_max = states[i * per_param + 4]
                second = jnp.maximum(old_max, new_v)
                written.append(unless_inf(second, old_max))
            denom = jnp.sqrt(second) / bias_correction2_sqrt + eps
            new_p = new_p - step_size * new_m / denom
            outs += [unless_inf(new_p, p), unless_inf(new_m, m), unless_inf(new_v, v)] + written
            if scaled:
                outs.append(unscaled)
        return outs

    meta = []
    for shape in shapes:
        meta += [torch.empty(shape, dtype=torch.float32, device="meta")] * (3 + amsgrad + scaled)
    return OpExecutable(run, True, meta, "aten::_fused_adam_")


def _kernel(decoupled: bool):
    per_op = functools.partial(optimizer_kernels._adam, decoupled=decoupled)

    def fused_adam_(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, **hyper) -> None:
        if not _step(decoupled, params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, **hyper):
            per_op(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, **hyper)

    return fused_adam_


#: collected into ``backend.dispatch.KERNELS`` ahead of the per-op kernels
OPTIMIZER_KERNELS = {op: _kernel(decoupled)
                     for decoupled, packet in ((False, aten._fused_adam_), (True, aten._fused_adamw_))
                     for op in (packet.default, packet.tensor_lr)}
