"""``torch.autocast("tpu")`` follows CUDA's autocast policy; bfloat16 tensors work and match CPU."""

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torchtpu_lab
from torchtpu_lab.backend import autocast as tpu_autocast

LOW = [torch.bfloat16, torch.float16]
BF16_RTOL = 1.6e-2


def tpu(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype).to("tpu")


def test_policy_registered_on_the_key():
    key = "AutocastPrivateUse1"
    assert torch._C._dispatch_has_backend_fallback(torch._C.DispatchKey.AutocastPrivateUse1)
    for name in ("aten::mm", "aten::linear", "aten::conv2d", "aten::softmax.int", "aten::layer_norm",
                 "aten::nll_loss", "aten::addcmul", "aten::norm.Scalar", "aten::binary_cross_entropy"):
        assert torch._C._dispatch_has_kernel_for_dispatch_key(name, key), name
    listed = (tpu_autocast.LOWER_PRECISION_FP + tpu_autocast.FP32 + tpu_autocast.FP32_SET_OPT_DTYPE
              + tpu_autocast.PROMOTE + list(tpu_autocast.FP32_APPEND_DTYPE))
    assert [n for n in listed if tpu_autocast._overload(*n) is None] == []


@pytest.mark.parametrize("dtype", LOW)
def test_lower_precision_ops(seeded, dtype):
    lin, conv = nn.Linear(8, 5).to("tpu"), nn.Conv2d(3, 4, 3).to("tpu")
    x, img, q = tpu(4, 8), tpu(2, 3, 8, 8), tpu(2, 2, 4, 8)
    with torch.autocast("tpu", dtype=dtype):
        assert lin(x).dtype == dtype
        assert conv(img).dtype == dtype
        assert (x @ x.T).dtype == dtype
        assert torch.bmm(q[0], q[0].transpose(1, 2)).dtype == dtype
        assert torch.addmm(tpu(4, 4), x, x.T).dtype == dtype
        assert F.scaled_dot_product_attention(q, q, q, is_causal=True).dtype == dtype
        assert F.conv_transpose2d(img, tpu(3, 2, 3, 3)).dtype == dtype
        # Ops outside the lists fall through and keep their input dtype.
        y = lin(x)
        assert (y + 1).dtype == dtype and y.relu().dtype == dtype
        assert (tpu(3) * 2).dtype == torch.float32
        # float64 tensors are never cast.
        assert (x.double() @ x.double().T).dtype == torch.float64


@pytest.mark.parametrize("dtype", LOW)
def test_fp32_ops(seeded, dtype):
    y = tpu(4, 5).to(dtype)
    target = torch.tensor([0, 1, 2, 3], device="tpu")
    with torch.autocast("tpu", dtype=dtype):
        assert torch.softmax(y, -1).dtype == torch.float32
        assert F.log_softmax(y, 1).dtype == torch.float32
        assert F.cross_entropy(y, target).dtype == torch.float32
        assert F.nll_loss(F.log_softmax(y, 1), target).dtype == torch.float32
        assert F.mse_loss(y, y).dtype == torch.float32
        assert F.binary_cross_entropy_with_logits(y, torch.rand_like(y)).dtype == torch.float32
        # layer_norm and group_norm are in CUDA's float32 list; batch_norm is not.
        assert F.layer_norm(y, (5,)).dtype == torch.float32
        assert F.group_norm(y.view(4, 5, 1), 1).dtype == torch.float32
        assert y.exp().dtype == torch.float32 and y.log().dtype == torch.float32 and (y**2).dtype == torch.float32
        assert y.sum().dtype == torch.float32 and y.cumsum(0).dtype == torch.float32
        assert y.norm().dtype == torch.float32 and y.norm(dim=1).dtype == torch.float32
        # An explicit dtype is respected.
        assert y.sum(dtype=dtype).dtype == dtype
        assert torch.softmax(y, -1, dtype=torch.float64).dtype == torch.float64
        with pytest.raises(RuntimeError, match="unsafe to autocast"):
            F.binary_cross_entropy(torch.rand(3, device="tpu"), torch.rand(3, device="tpu"))


@pytest.mark.parametrize("dtype", LOW)
def test_promote_ops(seeded, dtype):
    lo, hi = tpu(3, 4).to(dtype), tpu(3, 4)
    with torch.autocast("tpu", dtype=dtype):
        assert torch.addcmul(hi, lo, lo).dtype == torch.float32
        assert torch.addcmul(lo, lo, lo).dtype == dtype
        assert torch.atan2(lo, hi).dtype == torch.float32
        assert torch.dot(lo[0], hi[0]).dtype == torch.float32


def test_cpu_tensors_and_disabled_autocast(seeded):
    lin = nn.Linear(8, 5).to("tpu")
    x = tpu(4, 8)
    with torch.autocast("tpu", dtype=torch.bfloat16):
        cpu = torch.randn(3, 3)
        assert (cpu @ cpu).dtype == torch.float32  # tpu autocast leaves CPU tensors alone
        with torch.autocast("tpu", enabled=False):
            assert lin(x).dtype == torch.float32
            assert torch.softmax(lin(x), -1).dtype == torch.float32
        assert lin(x).dtype == torch.bfloat16
    assert lin(x).dtype == torch.float32
    assert not torch.is_autocast_enabled("tpu")


def test_gradients_reach_float32_params(seeded):
    lin = nn.Linear(8, 5).to("tpu")
    with torch.autocast("tpu", dtype=torch.bfloat16):
        loss = F.cross_entropy(lin(tpu(4, 8)), torch.tensor([0, 1, 2, 3], device="tpu"))
    loss.backward()
    assert lin.weight.grad.dtype == torch.float32 and lin.bias.grad.dtype == torch.float32
    assert torch.isfinite(lin.weight.grad.cpu()).all()


def test_matmul_matches_cpu_autocast(seeded):
    a, b = torch.randn(16, 32), torch.randn(32, 24)
    bias = torch.randn(24)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = [a @ b, F.linear(a, b.T, bias), torch.addmm(bias, a, b)]
    ta, tb, tbias = a.to("tpu"), b.to("tpu"), bias.to("tpu")
    with torch.autocast("tpu", dtype=torch.bfloat16):
        got = [ta @ tb, F.linear(ta, tb.T, tbias), torch.addmm(tbias, ta, tb)]
    for g, w in zip(got, want):
        assert g.dtype == w.dtype == torch.bfloat16
        torch.testing.assert_close(g.cpu().float(), w.float(), rtol=BF16_RTOL, atol=5e-2)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.fc1 = nn.Linear(8 * 8 * 8, 32)
        self.ln = nn.LayerNorm(32)
        self.fc2 = nn.Linear(32, 10)

    def forward(self, x):
        x = F.relu(self.conv(x)).flatten(1)
        return self.fc2(F.gelu(self.ln(self.fc1(x))))


@pytest.mark.parametrize("mode", ["fused", "strict", "debug"])
def test_training_step_matches_cpu_autocast(seeded, mode):
    torch.manual_seed(0)
    model = Net()
    data = [(torch.randn(8, 3, 8, 8), torch.randint(0, 10, (8,))) for _ in range(5)]

    def run(device):
        m = copy.deepcopy(model).to(device)
        opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
        losses = []
        for x, y in data:
            with torch.autocast(device, dtype=torch.bfloat16):
                out = m(x.to(device))
                loss = F.cross_entropy(out, y.to(device))
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.float().item())
        return losses, m

    with torchtpu_lab.eager_mode(mode):
        got, m = run("tpu")
    want, _ = run("cpu")
    assert all(p.dtype == torch.float32 for p in m.parameters())
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=1e-2, atol=1e-3)


def test_bfloat16_tensors_match_cpu(seeded):
    bf = torch.bfloat16
    a, b = torch.randn(6, 8, dtype=bf), torch.randn(6, 8, dtype=bf)
    m = torch.randn(8, 5, dtype=bf)
    img, w = torch.randn(2, 3, 8, 8, dtype=bf), torch.randn(4, 3, 3, 3, dtype=bf)
    gamma, beta = torch.randn(8, dtype=bf), torch.randn(8, dtype=bf)
    cases = {
        "add": lambda a, b, m, img, w, g, be: a + b,
        "mul": lambda a, b, m, img, w, g, be: a * b,
        "mm": lambda a, b, m, img, w, g, be: a @ m,
        "sum": lambda a, b, m, img, w, g, be: a.sum(1),
        "softmax": lambda a, b, m, img, w, g, be: torch.softmax(a, -1),
        "conv2d": lambda a, b, m, img, w, g, be: F.conv2d(img, w, padding=1),
        "layer_norm": lambda a, b, m, img, w, g, be: F.layer_norm(a, (8,), g, be),
    }
    args = (a, b, m, img, w, gamma, beta)
    for name, fn in cases.items():
        want = fn(*args)
        got = fn(*(t.to("tpu") for t in args))
        assert got.dtype == bf, name
        torch.testing.assert_close(got.cpu().float(), want.float(), rtol=BF16_RTOL, atol=5e-2, msg=name)
