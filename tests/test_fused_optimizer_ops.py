"""``aten::_fused_adam_``, ``_fused_adamw_`` and ``_fused_sgd_`` (the ``fused=True`` optimizer steps) on tpu against
PyTorch's CPU kernels, option by option: every tensor they update in place must match, and none may fall back
to the CPU."""

from __future__ import annotations

import pytest
import torch

from torchtpu_lab import telemetry


def _tensors(n_lists: int, seed: int = 0) -> list[list[torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    shapes = [(3, 4), (5,)]
    return [[torch.randn(s, generator=g).abs() + 0.1 for s in shapes] for _ in range(n_lists)]


def _run_both(op, lists, steps, **kwargs):
    """The op on CPU copies and on tpu copies of ``lists``; the updated lists of both."""
    cpu = [[t.clone() for t in lst] for lst in lists]
    tpu = [[t.to("tpu") for t in lst] for lst in lists]
    extra_cpu = {k: v for k, v in kwargs.items()}
    extra_tpu = {k: v.to("tpu") if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    fallbacks = telemetry.counters["cpu_fallbacks"]
    op(*cpu, *([[s.clone() for s in steps]] if steps else []), **extra_cpu)
    op(*tpu, *([[s.to("tpu") for s in steps]] if steps else []), **extra_tpu)
    assert telemetry.counters["cpu_fallbacks"] == fallbacks, "the fused step fell back to the CPU"
    return cpu, tpu


def _check(cpu, tpu):
    for lc, lt in zip(cpu, tpu):
        for c, t in zip(lc, lt):
            torch.testing.assert_close(t.cpu(), c, rtol=1e-5, atol=1e-6)


ADAM_OPTIONS = [
    {},
    {"weight_decay": 0.1},
    {"amsgrad": True, "maximize": True, "weight_decay": 0.05},
    {"grad_scale": torch.tensor(4.0)},
    {"grad_scale": torch.tensor(4.0), "found_inf": torch.tensor(1.0)},
    {"lr": torch.tensor(0.02)},
]


@pytest.mark.parametrize("op", [torch._fused_adam_, torch._fused_adamw_], ids=["adam", "adamw"])
@pytest.mark.parametrize("options", ADAM_OPTIONS, ids=lambda o: ",".join(o) or "plain")
def test_fused_adam_matches_cpu(op, options):
    kwargs = {"lr": 0.01, "beta1": 0.9, "beta2": 0.99, "weight_decay": 0.0, "eps": 1e-8, "amsgrad": False,
              "maximize": False, **options}
    steps = [torch.tensor(3.0), torch.tensor(3.0)]
    lists = _tensors(5)
    if not kwargs["amsgrad"]:
        lists[4] = []  # max_exp_avg_sqs: PyTorch wants none without amsgrad
    cpu, tpu = _run_both(op, lists, steps, **kwargs)
    _check(cpu, tpu)
    if "found_inf" in options:  # a step that found an inf changes nothing
        _check(_tensors(5)[:4], tpu[:4])


SGD_OPTIONS = [
    {"momentum": 0.0},
    {"momentum": 0.9, "dampening": 0.1, "is_first_step": True},
    {"momentum": 0.9, "dampening": 0.1, "nesterov": False, "weight_decay": 0.01, "maximize": True},
    {"momentum": 0.9, "nesterov": True, "grad_scale": torch.tensor(2.0)},
    {"momentum": 0.9, "grad_scale": torch.tensor(2.0), "found_inf": torch.tensor(1.0)},
]


@pytest.mark.parametrize("options", SGD_OPTIONS, ids=lambda o: ",".join(o))
def test_fused_sgd_matches_cpu(options):
    kwargs = {"weight_decay": 0.0, "lr": 0.05, "dampening": 0.0, "nesterov": False, "maximize": False,
              "is_first_step": False, **options}
    lists = _tensors(3 if options["momentum"] else 2)
    if not options["momentum"]:
        lists.append([])
    cpu, tpu = _run_both(torch._fused_sgd_, lists, None, **kwargs)
    _check(cpu, tpu)
