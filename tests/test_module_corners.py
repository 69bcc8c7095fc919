"""Modules on tpu vs the same modules on CPU, in the corners PyTorch's device-generic test_modules.py walks: lazy
modules, module-level dtype and device moves, pooling with random samples."""

import pytest
import torch

import torchtpu_lab  # noqa: F401
from compare import assert_same, raises_like_cpu, same


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


_FRACTIONAL = {2: torch.ops.aten.fractional_max_pool2d, 3: torch.ops.aten.fractional_max_pool3d}


@pytest.mark.parametrize("nd", [2, 3])
@pytest.mark.parametrize("shape, rows", [((4, 7, 7, 7), 2), ((2, 4, 7, 7, 7), 3), ((4, 7, 7, 7), 1)])
def test_fractional_max_pool_reads_the_first_rows_of_its_samples(nd, shape, rows):
    """More ``random_samples`` rows than the input has batches (an unbatched input has one): CPU reads the first
    ones, as FractionalMaxPool3d's module test passes them; the lowering failed to broadcast them."""
    torch.manual_seed(0)
    x, samples = torch.randn(shape if nd == 3 else shape[:-1]), torch.rand(rows, 4, nd)  # 4 channels
    op, k = _FRACTIONAL[nd], [2] * nd
    same(lambda x, s: op(x, k, [3] * nd, s), x, samples)


@pytest.mark.parametrize("samples", [torch.rand(1, 4, 3), torch.rand(2, 5, 3), torch.rand(2, 4, 2), torch.rand(2, 4),
                                     torch.rand(2, 4, 3, dtype=torch.float64)])
def test_fractional_max_pool3d_checks_its_samples_as_cpu_does(samples):
    """CPU's checks and words for 3-D samples of too few rows, another channel count, other than 3 numbers a
    channel, another rank or dtype (PyTorch's meta kernel checks none of them: the lowering failed or read them)."""
    x = torch.randn(2, 4, 7, 7, 7)
    op = torch.ops.aten.fractional_max_pool3d
    with pytest.raises(RuntimeError) as on_cpu:
        op(x, [2, 2, 2], [3, 3, 3], samples)
    error = raises_like_cpu(lambda x, s: op(x, [2, 2, 2], [3, 3, 3], s), x, samples)
    assert str(error) == str(on_cpu.value)
