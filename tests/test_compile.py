"""torch.compile on the tpu device: fake tensors, PyTorch's debug backends, export, and our ``tpu`` backend."""

from __future__ import annotations

import pytest
import torch
from torch import nn


def _mlp_bn():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))


def _pair(make):
    cpu = make()
    tpu = make().to("tpu")
    tpu.load_state_dict({k: v.to("tpu") for k, v in cpu.state_dict().items()})
    return cpu, tpu


# ---- 0. fake tensors of device tpu never reach our kernels --------------------------------------------------


def test_fake_tensor_mode_on_tpu_views():
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode()
    x = mode.from_tensor(torch.randn(2, 4).to("tpu"))
    w = mode.from_tensor(torch.randn(3, 4).to("tpu"))
    with mode:
        y = torch.nn.functional.linear(x, w)  # t() is a view: its meta output carries tpu keys
        z = y.t().reshape(6)[1:].unsqueeze(0)
    assert y.device.type == "tpu" and tuple(y.shape) == (2, 3)
    assert tuple(z.shape) == (1, 5) and z.device.type == "tpu"


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_pytorch_debug_backends_on_a_tpu_module(backend):
    torch._dynamo.reset()
    cpu, tpu = _pair(_mlp_bn)
    x = torch.randn(6, 4)
    out = torch.compile(tpu, backend=backend)(x.to("tpu"))
    ref = cpu(x)
    torch.testing.assert_close(out.cpu(), ref.detach(), rtol=1e-5, atol=1e-5)
    out.sum().backward()
    ref.sum().backward()
    torch.testing.assert_close(tpu[0].weight.grad.cpu(), cpu[0].weight.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(tpu[1].running_mean.cpu(), cpu[1].running_mean, rtol=1e-5, atol=1e-6)


def test_dynamo_explain_and_export_on_tpu():
    torch._dynamo.reset()
    cpu, tpu = _pair(_mlp_bn)
    x = torch.randn(6, 4)
    cpu.eval(), tpu.eval()
    explanation = torch._dynamo.explain(tpu)(x.to("tpu"))
    assert explanation.graph_count == 1 and explanation.graph_break_count == 0
    exported = torch.export.export(tpu, (x.to("tpu"),))
    assert any(n.target is torch.ops.aten.linear.default for n in exported.graph.nodes)
    torch.testing.assert_close(exported.module()(x.to("tpu")).cpu(), cpu(x).detach(), rtol=1e-5, atol=1e-5)
