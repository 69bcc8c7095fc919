"""An op's result has the strides CPU gives it (``runtime/layouts.py``): elementwise ops on permuted inputs keep
their order, ``clone``/``*_like`` preserve it, ``contiguous(memory_format=torch.channels_last)`` gives channels-last
strides. Values, later views (``.view`` where CPU allows it), in-place writes through such results and gradients
are CPU's, in every eager mode and whether the recording kernel or the Python path records the call."""

from __future__ import annotations

import pytest
import torch

import torchtpu_lab
from compare import assert_same

MODES = ("debug", "strict", "fused")


def _x(device: str) -> torch.Tensor:
    return torch.arange(120.0).reshape(2, 3, 4, 5).div(7).to(device)


#: ops whose CPU result is laid out in another order than row-major
CALLS = {
    "permute_mul": lambda x: x.permute(0, 2, 3, 1) * 2,
    "transpose_add": lambda x: x.transpose(1, 2) + 1,
    "t_sub_2d": lambda x: x[0, 0].t() - x[0, 1].t(),
    "permuted_relu": lambda x: torch.relu(x.permute(3, 1, 0, 2) - 0.5),
    "clone_of_permute": lambda x: x.permute(0, 2, 3, 1).clone(),
    "channels_last": lambda x: x.contiguous(memory_format=torch.channels_last),
    "channels_last_then_affine": lambda x: x.contiguous(memory_format=torch.channels_last) * 3 - 1,
    "mixed_layouts": lambda x: x.permute(0, 2, 3, 1) + x.permute(0, 2, 3, 1).contiguous(),
    "where_of_t": lambda x: torch.where(x[0, 0].t() > 1, x[0, 0].t(), 0.0),
    "sum_of_permuted": lambda x: x.permute(0, 2, 3, 1).sum(1),
    "empty_like_filled": lambda x: torch.empty_like(x.permute(0, 2, 3, 1)).fill_(3.0),
    "zeros_like": lambda x: torch.zeros_like(x.transpose(0, 3)),
    "to_channels_last": lambda x: x.to(memory_format=torch.channels_last),
    "cast_of_t_preserves": lambda x: x[0, 0].t().to(torch.float64),
    "conv_channels_last": lambda x: torch.nn.functional.conv2d(
        x.contiguous(memory_format=torch.channels_last), torch.linspace(-1, 1, 54).reshape(6, 3, 3, 1).to(x.device)),
}


def _geometry(t: torch.Tensor) -> tuple:
    return tuple(t.shape), t.stride(), t.storage_offset(), t.is_contiguous(), \
        t.is_contiguous(memory_format=torch.channels_last) if t.dim() == 4 else None


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", sorted(CALLS))
def test_result_strides_and_values_are_cpus(name, mode):
    fn = CALLS[name]
    want = fn(_x("cpu"))
    with torchtpu_lab.eager_mode(mode):
        for _ in range(3):  # the first call teaches the recording kernel; the later ones may take its path
            got = fn(_x("tpu"))
            assert _geometry(got) == _geometry(want)
            if name.startswith("conv"):  # summed in another order than CPU's
                assert_same(got, want, rtol=1e-5, atol=1e-5)
            else:
                assert_same(got, want, exact=True)


@pytest.mark.parametrize("mode", MODES)
def test_views_cpu_allows_on_such_results_work_and_read_right(mode):
    """``(x.t() * 2).t()`` is row-major on CPU, so ``.view(-1)`` works there; it raised here before, the result
    of the product being row-major in the transposed order."""
    x = _x("cpu")
    with torchtpu_lab.eager_mode(mode):
        for _ in range(2):
            y = _x("tpu")
            assert_same((y[0, 0].t() * 2).t().view(-1), (x[0, 0].t() * 2).t().view(-1), exact=True)
            assert_same((y.permute(0, 2, 3, 1) + 1).permute(0, 3, 1, 2).view(2, 60),
                        (x.permute(0, 2, 3, 1) + 1).permute(0, 3, 1, 2).view(2, 60), exact=True)
            with pytest.raises(RuntimeError, match="view size is not compatible"):
                (y.transpose(1, 2) + 1).view(2, -1)  # as on CPU


@pytest.mark.parametrize("mode", MODES)
def test_writes_through_a_laid_out_result_land_where_cpu_puts_them(mode):
    x = _x("cpu")
    want = x.permute(0, 2, 3, 1) * 2
    want[:, 1].add_(100)
    want.view(-1)[::7].zero_() if want.is_contiguous() else want.as_strided((10,), (7,)).zero_()
    want.mul_(torch.arange(3.0))
    with torchtpu_lab.eager_mode(mode):
        got = _x("tpu").permute(0, 2, 3, 1) * 2
        got[:, 1].add_(100)
        got.as_strided((10,), (7,)).zero_()
        got.mul_(torch.arange(3.0).to("tpu"))
        assert _geometry(got) == _geometry(want)
        assert_same(got, want, exact=True)
        assert_same(got.contiguous(), want.contiguous(), exact=True)


@pytest.mark.parametrize("mode", ("strict", "fused"))
def test_gradients_through_laid_out_results_are_cpus(mode):
    def run(device):
        w = torch.linspace(-1, 1, 15).reshape(3, 5).to(device).requires_grad_()
        x = _x(device)
        h = torch.tanh(x.permute(0, 2, 1, 3) * 2 + 0.1)  # [2, 4, 3, 5], permuted on CPU
        out = (h @ w.t()).square().sum()
        out.backward()
        return out.detach(), w.grad

    want = run("cpu")
    with torchtpu_lab.eager_mode(mode):
        got = run("tpu")
        assert_same(got[0], want[0], rtol=1e-5, atol=1e-5)
        assert_same(got[1], want[1], rtol=1e-5, atol=1e-5)


def test_a_channels_last_convolution_net_trains_as_on_cpu():
    """A vision model in ``channels_last`` (timm's ``--channels-last``): its inputs and activations report
    channels-last strides, and its losses follow CPU's step by step."""
    def run(device):
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                                  torch.nn.Conv2d(8, 4, 3), torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6, 5))
        net = net.to(device).to(memory_format=torch.channels_last)
        opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
        x = torch.randn(4, 3, 8, 8).to(device).contiguous(memory_format=torch.channels_last)
        y = torch.tensor([0, 1, 2, 3]).to(device)
        losses = []
        for _ in range(3):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(net(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses, x.is_contiguous(memory_format=torch.channels_last)

    want = run("cpu")
    with torchtpu_lab.eager_mode("fused"):
        got = run("tpu")
    assert got[1] and want[1]
    assert got[0] == pytest.approx(want[0], rel=1e-4, abs=1e-5)
