"""``Adam``, ``AdamW`` and ``SGD``'s ``fused=True`` step (``aten::_fused_adam_``, ``_fused_adamw_``,
``_fused_sgd_``) as one op.

Why. ``transformers``' ``Trainer`` defaults to ``adamw_torch_fused`` (torch >= 2.8), which hands the whole step —
every parameter, gradient and state tensor — to ``_fused_adamw_``. :mod:`torchtpu_lab.ops.optimizer_kernels`
writes that step with torch ops per parameter (about twenty dispatches each, from Python): a tiny transformer's
30 parameters took 3.5 ms of host time per ``opt.step()`` there, against 1.1 ms on the ``foreach`` path (fused
mode, one process, alternating). Here the step is one traced function of all of them (0.8 ms), whose outputs
replace their tensors' arrays (:func:`.values.set_arrays`, as ``copy_`` of a same-shaped base does): fused mode
records one node, strict mode runs one executable.

The function applies the per-op kernel's sequence element for element — the same torch-level operations in the
same order (``lr / t`` is PyTorch's ``t.reciprocal() * lr``), so the same values. The hyperparameters are graph
inputs (numbers, or the tensor learning rate), so a learning-rate schedule compiles nothing new; the program is
keyed by the parameters' shapes and the step's options. A tensor may be a view that reads its whole storage in
order (a reshape of it): a bias's gradient is one, since PyTorch's ``sum_to_size`` views the summed ``[1, n]``
as ``[n]`` (every ``Conv1D`` bias of GPT-2), and a ``Trainer`` puts the biases in a parameter group of their own;
the program reads and writes such a tensor's storage in the storage's shape. A step this does not cover — another
view or a non-float32 tensor among the lists, tensors on several devices, lists of unequal length (the per-op
kernel raises PyTorch's error) — takes the per-op kernel.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import torch

from .. import caches
from ..device import tensor, views
from ..ops import optimizer_kernels
from . import fused, values
from .executor import OpExecutable, launch
from .signatures import OpSignature

aten = torch.ops.aten
#: a storage value :func:`_arrays` takes as it is, with any ``jax.Array`` (else ``Storage.array`` decides: empty,
#: failed); no array made here: importing must leave JAX's backend uninitialised (``init_process_group`` needs that)
_LAZY = fused.LazyValue


def _arrays(lists, device: int | None, adopted: list | None = None, bases: list | None = None) -> list | None:
    """The arrays of ``lists``' tensors, in order, when every one is a float32 tpu tensor with device data (not a
    fake tensor Dynamo traces with) on one device (``device``, when given), a base tensor or, with ``bases``, a
    view of its whole storage in order (``views.reshapes_base``); else ``None``. The tensors, adopted, are appended to
    ``adopted``, and to ``bases`` the shape of each one's storage where it is such a view (else ``None``)."""
    arrays = []
    tpu_tensor, float32 = tensor.TpuTensor, torch.float32
    for lst in lists:
        for t in lst:
            # (a step reads ~150 tensors: an adopted one with a value, the usual case, takes no function call)
            if type(t) is not tpu_tensor:
                if not tensor.on_tpu(t) or not tensor.has_data(t):
                    return None
                t = tensor.adopt(t)
            storage = t.tpu_storage
            view = t.tpu_view
            if storage.dtype != float32 or (view is not None and (bases is None
                                                           or not views.reshapes_base(storage.shape, view))):
                return None
            if device is None:
                device = storage.device_index
            elif storage.device_index != device:
                return None
            a = storage._array
            arrays.append(a if type(a) is _LAZY or isinstance(a, jax.Array) else storage.array)
            if adopted is not None:
                adopted.append(t)
            if bases is not None:
                bases.append(None if view is None else tuple(storage.shape))
    return arrays


def _as_tensors(states, bases, shape: tuple) -> list:
    """A parameter's program inputs in its shape (a whole-storage view's array comes in its storage's shape)."""
    return [x if b is None else x.reshape(shape) for x, b in zip(states, bases)]


def _as_stored(outs: list, bases) -> list:
    """Program outputs in their storages' shapes (``bases``: the storage shape of each written tensor, or None)."""
    return [x if b is None else x.reshape(b) for x, b in zip(outs, bases)]


def _output_meta(shapes: tuple, bases: tuple, written) -> list:
    """The meta tensors of a step program's outputs: per parameter, :func:`_written`'s tensors in their storages'
    shapes (``written(bases of one parameter)``: those tensors' bases, in output order)."""
    per_param = len(bases) // len(shapes)
    return [torch.empty(shape if b is None else b, dtype=torch.float32, device="meta")
            for i, shape in enumerate(shapes) for b in written(bases[i * per_param:(i + 1) * per_param])]


def _covered(groups: tuple, steps, extras: tuple) -> tuple | None:
    """``(tensors, arrays, step and extra arrays, device, bases)`` of a step one op covers, else ``None``: lists of
    equal, non-zero length of float32 tpu tensors on one device (a parameter's gradient and states of its shape),
    each a base tensor or a view of its whole storage (``bases``: its storage's shape then, else ``None``), no
    two over one storage; ``steps`` and the tensors among ``extras`` — a tensor learning rate, ``grad_scale``,
    ``found_inf`` — base tensors. ``tensors``, ``arrays`` and ``bases`` go per parameter, its entries of
    ``groups`` in order."""
    params = groups[0]
    n = len(params)
    if n == 0 or any(len(g) != n for g in groups) or len(steps) not in (0, n):
        return None
    shapes = [p.shape for p in params]
    if any(g[i].shape != shape for g in groups[1:] for i, shape in enumerate(shapes)):
        return None
    tensors: list = []
    bases: list = []
    arrays = _arrays(zip(*groups), None, tensors, bases)
    if arrays is None or len({id(t.tpu_storage) for t in tensors}) != len(tensors):
        return None  # (two tensors over one storage: the per-op kernel's order of writes decides what it holds)
    device = tensors[0].tpu_storage.device_index
    more = _arrays((steps, [x for x in extras if isinstance(x, torch.Tensor)]), device)
    return None if more is None else (tensors, arrays, more, device, tuple(bases))


@fused.entry_point  # under the runtime's lock from the first array read to the last write
def _step(decoupled: bool, params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, *, lr, beta1,
          beta2, weight_decay, eps, amsgrad, maximize, grad_scale=None, found_inf=None) -> bool:
    """Run (or record) Adam's step as one op when :func:`_covered` covers it; ``False`` (nothing done) otherwise."""
    groups = (params, grads, exp_avgs, exp_avg_sqs) + ((max_exp_avg_sqs,) if amsgrad else ())
    covered = None if (not amsgrad and max_exp_avg_sqs) or not state_steps else _covered(
        groups, state_steps, (lr, grad_scale, found_inf))
    if covered is None:
        return False
    tensors, arrays, steps, device, bases = covered
    _run(decoupled, tensors, arrays, steps, device, bases, lr, beta1, beta2, weight_decay, eps, len(groups),
         grad_scale is not None, found_inf is not None, maximize)
    return True


def _run(decoupled: bool, tensors: list, arrays: list, steps: list, device: int, bases: tuple, lr, beta1, beta2,
         weight_decay, eps, per_param: int, scaled: bool, checks_inf: bool, maximize: bool) -> None:
    """Record (fused) or run (strict) the step's program on ``arrays`` (``tensors``' own, per parameter ``p, g, m,
    v[, max_v]``) and ``steps`` (the steps' arrays, then a tensor learning rate's, ``grad_scale``'s,
    ``found_inf``'s), and give its outputs to the tensors they replace."""
    lr_tensor = isinstance(lr, torch.Tensor)
    n = len(tensors) // per_param
    # the per-op kernel's Python-level numbers, computed as it computes them (in double, then cast by each op); with
    # a tensor learning rate, ``1 - lr * weight_decay`` is a tensor expression, computed in the program
    decay = (1 - lr * weight_decay) if decoupled and not lr_tensor else weight_decay
    dyn = arrays + steps[:n] + [steps[n] if lr_tensor else lr, decay, beta1, 1 - beta1, beta2, 1 - beta2, eps]
    dyn += steps[n + lr_tensor:]
    shapes = tuple(tuple(t.shape) for t in tensors[::per_param])
    sig = (shapes, decoupled, per_param == 5, maximize, weight_decay != 0, lr_tensor, scaled, checks_inf, bases)
    program = _program(*sig)
    out = launch(program, OpSignature("fused_adam", sig, ()), dyn, device, True)
    values.set_arrays([t.tpu_storage for t in _written(tensors, per_param, scaled)], list(out))


def _written(tensors, per_param: int, unscaled: bool) -> list:
    """The tensors the program's outputs replace, in its output order: per parameter its new value, first and
    second moments, running max (amsgrad), and its gradient once unscaled (with ``grad_scale``). (Of any sequence
    laid out per parameter as ``p, g, m, v[, max_v]``: the tensors' bases too.)"""
    out = []
    for i in range(0, len(tensors), per_param):
        p, g, m, v = tensors[i:i + 4]
        out += [p, m, v] + list(tensors[i + 4:i + per_param]) + ([g] if unscaled else [])
    return out


def _scaling(rest: tuple, scaled: bool, checks_inf: bool) -> tuple:
    """``(grad_scale, unless_inf)`` from a step program's last inputs (``[grad_scale][, found_inf]``): the scale
    (``None`` without one), and ``unless_inf(new, old)``, the per-op kernels' ``_skip_if_inf``: ``old`` where the
    grad scaler found an inf."""
    found_inf = rest[-1] if checks_inf else None

    def unless_inf(new, old):
        return new if found_inf is None else jnp.where(found_inf == 1, old, new)

    return (rest[0] if scaled else None), unless_inf


@caches.memoize("fused_adam_programs", 64, code=True)
def _program(shapes: tuple, decoupled: bool, amsgrad: bool, maximize: bool, decays: bool, lr_tensor: bool,
             scaled: bool, checks_inf: bool, bases: tuple) -> OpExecutable:
    """The step's traced function: inputs per parameter ``p, g, m, v[, max_v]``, then the steps, then ``lr,
    decay, beta1, 1 - beta1, beta2, 1 - beta2, eps[, grad_scale][, found_inf]``; outputs as :func:`_written`
    lists them (a whole-storage view's, ``bases``, in its storage's shape, as its input comes)."""
    n = len(shapes)
    per_param = 5 if amsgrad else 4

    def run(*inputs):
        states, steps = inputs[:n * per_param], inputs[n * per_param:n * (per_param + 1)]
        rest = inputs[n * (per_param + 1):]
        lr, decay, beta1, one_minus_beta1, beta2, one_minus_beta2, eps = rest[:7]
        scale, unless_inf = _scaling(rest[7:], scaled, checks_inf)
        outs = []
        for i in range(n):
            own = bases[i * per_param:(i + 1) * per_param]
            mine = _as_tensors(states[i * per_param:(i + 1) * per_param], own, shapes[i])
            p, g, m, v = mine[:4]
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
                old_max = mine[4]
                second = jnp.maximum(old_max, new_v)
                written.append(unless_inf(second, old_max))
            denom = jnp.sqrt(second) / bias_correction2_sqrt + eps
            new_p = new_p - step_size * new_m / denom
            mine = [unless_inf(new_p, p), unless_inf(new_m, m), unless_inf(new_v, v)] + written
            outs += _as_stored(mine + ([unscaled] if scaled else []), _written(own, per_param, scaled))
        return outs

    meta = _output_meta(shapes, bases, lambda own: _written(own, per_param, scaled))
    return OpExecutable(run, True, meta, "aten::_fused_adamw_" if decoupled else "aten::_fused_adam_")


@fused.entry_point
def _sgd_step(params, grads, momentum_buffer_list, *, weight_decay, momentum, lr, dampening, nesterov, maximize,
              is_first_step, grad_scale=None, found_inf=None) -> bool:
    """Run (or record) SGD's step as one op when :func:`_covered` covers it; ``False`` (nothing done) otherwise."""
    moves = momentum != 0
    groups = (params, grads) + ((momentum_buffer_list,) if moves else ())
    covered = _covered(groups, [], (lr, grad_scale, found_inf))
    if covered is None:
        return False
    tensors, arrays, extras, device, bases = covered
    lr_tensor, per_param, scaled = isinstance(lr, torch.Tensor), len(groups), grad_scale is not None
    dyn = arrays + [extras[0] if lr_tensor else lr, weight_decay, momentum, 1 - dampening] + extras[lr_tensor:]
    shapes = tuple(tuple(t.shape) for t in tensors[::per_param])
    sig = (shapes, moves, bool(is_first_step), bool(nesterov), bool(maximize), weight_decay != 0, lr_tensor, scaled,
           found_inf is not None, bases)
    out = launch(_sgd_program(*sig), OpSignature("fused_sgd", sig, ()), dyn, device, True)
    values.set_arrays([t.tpu_storage for t in _sgd_written(tensors, per_param, scaled)], list(out))
    return True


def _sgd_written(tensors, per_param: int, unscaled: bool) -> list:
    """:func:`_written` for SGD: per parameter (laid out ``p, g[, buf]``) its new value[, momentum buffer][, its
    gradient once unscaled]."""
    out = []
    for i in range(0, len(tensors), per_param):
        out += [tensors[i]] + list(tensors[i + 2:i + per_param]) + ([tensors[i + 1]] if unscaled else [])
    return out


@caches.memoize("fused_sgd_programs", 64, code=True)
def _sgd_program(shapes: tuple, moves: bool, first: bool, nesterov: bool, maximize: bool, decays: bool,
                 lr_tensor: bool, scaled: bool, checks_inf: bool, bases: tuple) -> OpExecutable:
    """SGD's step as ops/optimizer_kernels.py's ``fused_sgd_`` runs it: inputs per parameter ``p, g[, buf]``, then
    ``lr, weight_decay, momentum, 1 - dampening[, grad_scale][, found_inf]``."""
    n = len(shapes)
    per_param = 3 if moves else 2

    def run(*inputs):
        states, rest = inputs[:n * per_param], inputs[n * per_param:]
        lr, weight_decay, momentum, one_minus_dampening = rest[:4]
        scale, unless_inf = _scaling(rest[4:], scaled, checks_inf)
        outs = []
        for i in range(n):
            own = bases[i * per_param:(i + 1) * per_param]
            mine = _as_tensors(states[i * per_param:(i + 1) * per_param], own, shapes[i])
            p, g = mine[:2]
            if scaled:
                g = unless_inf(g / scale, g)
            unscaled = g
            if maximize:
                g = -g
            if decays:
                g = g + p * weight_decay
            written = []
            if moves:
                buf = mine[2]
                new_buf = g if first else buf * momentum + g * one_minus_dampening
                written.append(unless_inf(new_buf, buf))
                g = g + new_buf * momentum if nesterov else new_buf
            mine = [unless_inf(p - (lr * g if lr_tensor else g * lr), p)] + written + ([unscaled] if scaled else [])
            outs += _as_stored(mine, _sgd_written(own, per_param, scaled))
        return outs

    meta = _output_meta(shapes, bases, lambda own: _sgd_written(own, per_param, scaled))
    return OpExecutable(run, True, meta, "aten::_fused_sgd_")


def _sgd_kernel(params, grads, momentum_buffer_list, **hyper) -> None:
    if not _sgd_step(params, grads, momentum_buffer_list, **hyper):
        optimizer_kernels.fused_sgd_(params, grads, momentum_buffer_list, **hyper)


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
OPTIMIZER_KERNELS.update({aten._fused_sgd_.default: _sgd_kernel, aten._fused_sgd_.tensor_lr: _sgd_kernel})
