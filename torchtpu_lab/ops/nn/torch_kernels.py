"""Torch-level kernels of ``ops/nn``: not lowerings, but Python functions registered with ``@kernel``.

They receive tpu tensors and re-enter the dispatcher by calling torch ops, because the op mutates an argument
(batch norm's running statistics, ``rrelu_with_noise``'s ``noise``) or needs a ``torch.Generator``. Keep
``@lower`` registrations out of this module (``tests/test_ops_layout.py`` checks).
"""

from __future__ import annotations

import torch

from ..registry import aten, kernel


# ---- batch norm: training mode updates the running statistics in place -------------------------------------------


def _update_stats(x, weight, bias, running_mean, running_var, training, momentum, eps):
    if running_mean is None or running_var is None:
        if running_mean is not None or running_var is not None:
            raise RuntimeError("running_mean and running_var must both be given or both be None")
        return aten._native_batch_norm_legit.no_stats(x, weight, bias, training, momentum, eps)
    if not training:  # PyTorch's CPU kernels return empty saved statistics in evaluation mode
        out = aten._native_batch_norm_legit_no_training(x, weight, bias, running_mean, running_var, momentum, eps)[0]
        return out, x.new_empty((0,)), x.new_empty((0,))
    out, save_mean, save_rstd, new_mean, new_var = aten._native_batch_norm_legit_functional(
        x, weight, bias, running_mean, running_var, True, momentum, eps
    )
    running_mean.copy_(new_mean)
    running_var.copy_(new_var)
    return out, save_mean, save_rstd


@kernel(aten.native_batch_norm.default)
def native_batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps):
    return _update_stats(x, weight, bias, running_mean, running_var, training, momentum, eps)


@kernel(aten._native_batch_norm_legit.default)
def native_batch_norm_legit(x, weight, bias, running_mean, running_var, training, momentum, eps):
    return _update_stats(x, weight, bias, running_mean, running_var, training, momentum, eps)


@kernel(aten._batch_norm_with_update.default)
def batch_norm_with_update(x, weight, bias, running_mean, running_var, momentum, eps):
    out, save_mean, save_rstd = _update_stats(x, weight, bias, running_mean, running_var, True, momentum, eps)
    return out, save_mean, save_rstd, torch.empty(0, dtype=torch.uint8, device=x.device)


# ---- rrelu (mutates ``noise``) -----------------------------------------------------------------------------------


@kernel(aten.rrelu_with_noise.default)
def rrelu_with_noise(x, noise, lower=0.125, upper=1 / 3, training=False, generator=None):
    """Training: each ``x <= 0`` is scaled by a fresh U(lower, upper) sample, stored in ``noise`` (1 elsewhere).
    Otherwise a leaky ReLU with slope ``(lower + upper) / 2``; ``noise`` is left alone.

    Without ``generator``, or with a tpu ``torch.Generator`` (native core), the samples come from that tpu random
    stream (the device's default: ``torch.manual_seed``). A CPU generator draws the samples on the host (float64,
    as PyTorch's CPU kernel draws them), which are copied over; the k-th nonpositive element gets the k-th sample,
    as on CPU, without reading ``x`` back. Identically seeded generators thus give identical noise, and a fresh
    generator gives CPU's values; the generator advances by ``x.numel()`` draws (CPU's: one per ``x <= 0``).
    """
    if not training:
        return torch.where(x > 0, x, x * ((lower + upper) / 2))
    opmath = torch.promote_types(x.dtype, torch.float32)  # PyTorch's CPU kernel computes ``x * r`` in it
    neg = x <= 0
    if generator is None or generator.device.type == "tpu":
        r = torch.rand(x.shape, dtype=opmath, device=x.device, generator=generator) * (upper - lower) + lower
    else:
        lo, hi = torch.tensor([lower, upper], dtype=opmath).tolist()  # CPU rounds the bounds to opmath first
        # CPU's ``uniform_real_distribution<double>(lo, hi)``: ``u * (hi - lo) + lo`` from a U[0, 1) draw (not
        # ``uniform_(lo, hi)``, whose float64 kernel may round the last bit differently)
        u = torch.empty(x.numel(), dtype=torch.float64).uniform_(0, 1, generator=generator)
        drawn = u * (hi - lo) + lo
        rank = (torch.cumsum(neg.reshape(-1).to(torch.int64), 0) - 1).clamp_min(0)
        r = drawn.to(opmath).to(x.device).index_select(0, rank).reshape(x.shape)
    r = torch.where(neg, r, torch.ones((), dtype=opmath, device=x.device))
    noise.copy_(r)
    return (x.to(opmath) * r).to(x.dtype)
