"""Real training loops on tpu match the same loops on CPU, step by step, from the same initial weights."""

import copy
import io

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torchtpu_lab
from compare import assert_same, no_cpu_fallback
from sweeps import EAGER_MODES

STEPS = 20
RTOL = 1e-4


@pytest.fixture(params=EAGER_MODES, autouse=True)
def eager_mode(request):
    """Every training test runs in each eager mode."""
    with torchtpu_lab.eager_mode(request.param):
        yield request.param


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(16)
        self.drop = nn.Dropout(0.25)
        self.fc = nn.Linear(16 * 4 * 4, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        return self.fc(self.drop(x.flatten(1)))


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class TinyTransformer(nn.Module):
    def __init__(self, vocab=50, d=32, heads=4, layers=2, seq=16):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(seq, d)
        self.blocks = nn.Sequential(*[Block(d, heads) for _ in range(layers)])
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)

    def forward(self, idx):
        pos = torch.arange(idx.shape[1], device=idx.device)
        return self.head(self.ln(self.blocks(self.tok(idx) + self.pos(pos))))


def _run(model, make_opt, batches, loss_fn, device, clip=None):
    model = copy.deepcopy(model).to(device)
    opt = make_opt(model.parameters())
    losses = []
    for x, y in batches:
        x, y = x.to(device), y.to(device)
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        losses.append(loss.item())
    return losses, model


def _compare(model, make_opt, batches, loss_fn, clip=None):
    cpu_losses, cpu_model = _run(model, make_opt, batches, loss_fn, "cpu", clip)
    with no_cpu_fallback("training on tpu"):
        tpu_losses, tpu_model = _run(model, make_opt, batches, loss_fn, "tpu", clip)
    for step, (c, t) in enumerate(zip(cpu_losses, tpu_losses)):
        assert t == pytest.approx(c, rel=RTOL, abs=1e-6), f"step {step}: tpu {t} vs cpu {c}"
    assert sum(cpu_losses[-4:]) < sum(cpu_losses[:4])  # it really trained (batches cycle with period 4)
    return cpu_model, tpu_model


def test_mlp_sgd_matches_cpu():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1))
    xs = [torch.randn(32, 20) for _ in range(4)]
    batches = [(xs[i % 4], xs[i % 4][:, :5].sum(1, keepdim=True).sin()) for i in range(STEPS)]
    _compare(model, lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9), batches, F.mse_loss)


def test_cnn_adam_matches_cpu_and_eval_dropout():
    torch.manual_seed(0)
    model = CNN().eval()  # dropout in eval: deterministic, batch norm uses running stats
    data = [(torch.randn(8, 3, 16, 16), torch.randint(0, 10, (8,))) for _ in range(4)]
    batches = [data[i % 4] for i in range(STEPS)]
    _compare(model, lambda p: torch.optim.Adam(p, lr=1e-3), batches, F.cross_entropy)


def test_cnn_batchnorm_train_mode_running_stats_match():
    # SGD, not Adam: a conv bias feeding batch norm has a mathematically zero gradient, so its float noise differs
    # between backends, and Adam's normalized step turns that noise into +-lr updates the running mean then sees.
    torch.manual_seed(0)
    model = CNN()
    model.drop.p = 0.0
    batches = [(torch.randn(8, 3, 16, 16), torch.randint(0, 10, (8,))) for _ in range(5)]
    make_opt = lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9)  # noqa: E731
    cpu_losses, cpu_model = _run(model, make_opt, batches, F.cross_entropy, "cpu")
    with no_cpu_fallback("training on tpu"):
        tpu_losses, tpu_model = _run(model, make_opt, batches, F.cross_entropy, "tpu")
    assert tpu_losses == pytest.approx(cpu_losses, rel=RTOL)
    assert_same(tpu_model.bn1.running_mean, cpu_model.bn1.running_mean, rtol=1e-4, atol=1e-5, where="bn1 mean")
    assert_same(tpu_model.bn2.running_var, cpu_model.bn2.running_var, rtol=1e-4, atol=1e-5, where="bn2 var")
    assert tpu_model.bn1.num_batches_tracked.item() == 5


def test_transformer_adamw_clipping_matches_cpu():
    torch.manual_seed(0)
    model = TinyTransformer()
    data = []
    for _ in range(4):
        idx = torch.randint(0, 50, (4, 16))
        data.append((idx, torch.roll(idx, -1, dims=1)))
    batches = [data[i % 4] for i in range(STEPS)]

    def loss_fn(logits, y):
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))

    _compare(model, lambda p: torch.optim.AdamW(p, lr=3e-3, weight_decay=0.01), batches, loss_fn, clip=1.0)


def test_state_dict_save_load_to_cpu_and_tpu():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 2)).to("tpu")
    model(torch.randn(16, 4, device="tpu")).sum().backward()
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    buf.seek(0)
    on_cpu = torch.load(buf, map_location="cpu")
    assert all(v.device.type == "cpu" for v in on_cpu.values())
    buf.seek(0)
    on_tpu = torch.load(buf)
    assert all(v.device.type == "tpu" for v in on_tpu.values())
    for k, v in model.state_dict().items():
        torch.testing.assert_close(on_cpu[k], v.cpu())
        torch.testing.assert_close(on_tpu[k].cpu(), v.cpu())
    fresh = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 2))
    fresh.load_state_dict(on_cpu)
    fresh_tpu = copy.deepcopy(fresh).to("tpu")
    fresh_tpu.load_state_dict(on_tpu)
    x = torch.randn(3, 4)
    fresh.eval(), fresh_tpu.eval(), model.eval()
    torch.testing.assert_close(fresh_tpu(x.to("tpu")).cpu(), model(x.to("tpu")).detach().cpu())
    torch.testing.assert_close(fresh(x), model(x.to("tpu")).detach().cpu(), rtol=1e-5, atol=1e-6)
