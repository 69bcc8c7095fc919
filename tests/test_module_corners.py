"""Modules on tpu vs the same modules on CPU, in the corners PyTorch's device-generic test_modules.py walks: lazy
modules, module-level dtype and device moves, pooling with random samples."""

import pytest
import torch

import torchtpu_lab  # noqa: F401
from compare import assert_same


@pytest.mark.parametrize("make", [lambda: torch.nn.LazyConv1d(4, 2), lambda: torch.nn.LazyLinear(3)])
def test_a_lazy_module_moved_then_cast_materializes_as_on_cpu(make):
    """``LazyConv1d(...).to("tpu").to(torch.float64)`` casts its UninitializedParameters (a Tensor subclass that
    keeps its class, and whose ``.shape`` raises): the executor refused them as 'on two devices, tpu:0 and tpu:0'."""
    x = torch.randn(2, 3, 5, dtype=torch.float64)
    out = {}
    for dev in ("cpu", "tpu"):
        torch.manual_seed(0)
        m = make().to(dev).to(torch.float64)
        assert isinstance(m.weight, torch.nn.UninitializedParameter)
        out[dev] = m(x.to(dev)), m
    (y_tpu, m_tpu), (y_cpu, m_cpu) = out["tpu"], out["cpu"]
    assert isinstance(m_tpu.weight, torch.nn.Parameter) and m_tpu.weight.dtype == torch.float64
    assert not isinstance(m_tpu.weight, torch.nn.UninitializedParameter)
    m_tpu.load_state_dict(m_cpu.state_dict())  # materialized with tpu's own draws: compare with CPU's weights
    assert_same(m_tpu(x.to("tpu")), y_cpu)
    assert y_tpu.shape == y_cpu.shape
