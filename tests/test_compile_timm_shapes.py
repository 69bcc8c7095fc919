"""timm-shaped models compiled and trained (issue 25). timm itself is not installable here (it requires
torchvision, which has no wheel for this torch), so its two reference architectures are written out at tiny
widths: an EfficientNet-B0-shaped CNN (MBConv blocks: 1x1 expansion, depthwise convolution, squeeze-excite,
SiLU, BatchNorm, drop-path) and a ViT-tiny-shaped transformer (patch embedding, class token, pre-norm blocks
with ``F.scaled_dot_product_attention``, GELU MLP, drop-path). Each compiles (forward and the whole training
step) matching eager, and trains in fused eager mode with no explicit sync without compiling in steady state."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchtpu_lab
from torchtpu_lab import config, telemetry

#: a sweep: each test compiles a CNN or a transformer forward and backward (minutes on the shared 2-core machine)
pytestmark = pytest.mark.sweep


def drop_path(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Stochastic depth as timm does it: a whole sample's residual branch dropped, the rest scaled up."""
    if p == 0.0 or not training:
        return x
    keep = 1.0 - p
    mask = x.new_empty((x.shape[0],) + (1,) * (x.dim() - 1)).bernoulli_(keep)
    return x * mask / keep


class SqueezeExcite(nn.Module):
    def __init__(self, channels: int, reduced: int):
        super().__init__()
        self.reduce = nn.Conv2d(channels, reduced, 1)
        self.expand = nn.Conv2d(reduced, channels, 1)

    def forward(self, x):
        s = F.silu(self.reduce(x.mean((2, 3), keepdim=True)))
        return x * torch.sigmoid(self.expand(s))


class MBConv(nn.Module):
    """Inverted residual: expand (1x1), depthwise (k x k), squeeze-excite, project (1x1); residual when shapes
    allow, with drop-path."""

    def __init__(self, cin: int, cout: int, expand: int, kernel: int, stride: int, drop: float):
        super().__init__()
        mid = cin * expand
        self.expand = nn.Sequential(nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid), nn.SiLU()) \
            if expand != 1 else nn.Identity()
        self.depthwise = nn.Sequential(nn.Conv2d(mid, mid, kernel, stride, kernel // 2, groups=mid, bias=False),
                                       nn.BatchNorm2d(mid), nn.SiLU())
        self.se = SqueezeExcite(mid, max(1, cin // 4))
        self.project = nn.Sequential(nn.Conv2d(mid, cout, 1, bias=False), nn.BatchNorm2d(cout))
        self.residual = stride == 1 and cin == cout
        self.drop = drop

    def forward(self, x):
        y = self.project(self.se(self.depthwise(self.expand(x))))
        return x + drop_path(y, self.drop, self.training) if self.residual else y


class EfficientNetB0Shaped(nn.Module):
    """EfficientNet-B0's layout (stem, MBConv1 then MBConv6 stages with 3x3 and 5x5 depthwise kernels, head)
    at tiny widths and depths."""

    def __init__(self, classes: int = 5, drop_path_rate: float = 0.2):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1, bias=False), nn.BatchNorm2d(8), nn.SiLU())
        stages = [(8, 8, 1, 3, 1), (8, 12, 6, 3, 2), (12, 12, 6, 3, 1), (12, 16, 6, 5, 2)]
        self.blocks = nn.Sequential(*[MBConv(*s, drop=drop_path_rate * i / len(stages)) for i, s in enumerate(stages)])
        self.head = nn.Sequential(nn.Conv2d(16, 32, 1, bias=False), nn.BatchNorm2d(32), nn.SiLU())
        self.classifier = nn.Linear(32, classes)

    def forward(self, x):
        x = self.head(self.blocks(self.stem(x))).mean((2, 3))
        return self.classifier(F.dropout(x, 0.2, self.training))


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        return self.proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, c))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, drop: float):
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(dim), Attention(dim, heads)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, dim * 4), nn.GELU(), nn.Linear(dim * 4, dim))
        self.drop = drop

    def forward(self, x):
        x = x + drop_path(self.attn(self.norm1(x)), self.drop, self.training)
        return x + drop_path(self.mlp(self.norm2(x)), self.drop, self.training)


class ViTTinyShaped(nn.Module):
    """ViT-Tiny's layout (patch embedding, class token, learned positions, pre-norm blocks, head on the class
    token) at a tiny width and depth."""

    def __init__(self, image: int = 16, patch: int = 4, dim: int = 32, depth: int = 2, heads: int = 2,
                 classes: int = 5, drop_path_rate: float = 0.1):
        super().__init__()
        self.patch = nn.Conv2d(3, dim, patch, patch)
        self.cls = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
        self.pos = nn.Parameter(torch.randn(1, (image // patch) ** 2 + 1, dim) * 0.02)
        self.blocks = nn.Sequential(*[Block(dim, heads, drop_path_rate * i / depth) for i in range(depth)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], 1) + self.pos
        return self.head(self.norm(self.blocks(x))[:, 0])


MODELS = {"efficientnet_b0": EfficientNetB0Shaped, "vit_tiny": ViTTinyShaped}


def _batch():
    g = torch.Generator().manual_seed(1)
    return torch.randn(2, 3, 16, 16, generator=g).to("tpu"), torch.randint(0, 5, (2,), generator=g).to("tpu")


def _twins(name: str):
    torch.manual_seed(0)
    model = MODELS[name]().train()
    return model.to("tpu"), copy.deepcopy(model).to("tpu")


@pytest.mark.parametrize("name", sorted(MODELS))
def test_forward_and_gradients_compile_matching_eager(name):
    """Training mode (BatchNorm batch statistics and running-stat updates, dropout, drop-path): the compiled
    model's outputs, gradients and running statistics equal eager's from the same seed."""
    torch._dynamo.reset()
    model, twin = _twins(name)
    x, y = _batch()
    outs = []
    for m in (model, torch.compile(twin, backend="tpu")):
        torch.manual_seed(3)
        out = m(x)
        F.cross_entropy(out, y).backward()
        outs.append(out.detach().cpu())
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-4, atol=1e-5)
    for (n, a), b in zip(model.named_parameters(), twin.parameters()):
        torch.testing.assert_close(b.grad.cpu(), a.grad.cpu(), rtol=1e-4, atol=1e-5, msg=n)
    for (n, a), b in zip(model.named_buffers(), twin.buffers()):
        torch.testing.assert_close(b.cpu(), a.cpu(), rtol=1e-5, atol=1e-6, msg=n)


def _trainer(model, fullgraph: bool):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)

    def step(x, y):
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss.detach()

    return opt, step


def _losses(model, step, opt, steps: int) -> tuple[list[float], list[int]]:
    x, y = _batch()
    losses, compiles = [], []
    for i in range(steps):
        opt.zero_grad()
        torch.manual_seed(10 + i)  # drop-path and dropout draw the same masks in both runs
        before = telemetry.counters["compiles"]
        losses.append(step(x, y).item())
        compiles.append(int(telemetry.counters["compiles"] - before))
    return losses, compiles


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("fullgraph", [False, True], ids=["compiled_autograd", "fullgraph"])
def test_whole_step_compiles_matching_eager(name, fullgraph):
    """forward + backward + AdamW compiled as one function, with compiled autograd or as one graph
    (``fullgraph=True``, backward traced by Dynamo): losses follow eager step for step, and steady-state steps
    compile nothing."""
    model, twin = _twins(name)
    opt, step = _trainer(model, fullgraph)
    eager, _ = _losses(model, step, opt, 4)
    torch._dynamo.reset()
    opt, step = _trainer(twin, fullgraph)
    settings = {"trace_autograd_ops": True} if fullgraph else {"compiled_autograd": True}
    with torch._dynamo.config.patch(settings):
        compiled, compiles = _losses(twin, torch.compile(step, backend="tpu", fullgraph=fullgraph), opt, 4)
    assert compiled == pytest.approx(eager, rel=1e-4), (eager, compiled)
    assert compiles[-2:] == [0, 0], compiles


@pytest.mark.parametrize("name", sorted(MODELS))
def test_fused_eager_training_without_sync_settles(name):
    """Fused eager mode, no ``.item()`` or ``sync()`` in the loop, a graph-size limit small enough that each step
    is cut several times: the cuts land at the same ops every step (runtime/graph_cuts.py), so the last steps
    compile nothing."""
    torch.manual_seed(0)
    model = MODELS[name]().to("tpu").train()
    opt, step = _trainer(model, False)
    x, y = _batch()
    compiles = []
    with torchtpu_lab.eager_mode("fused"), config.max_graph_ops(150):
        for _ in range(8):
            before = telemetry.counters["compiles"]
            opt.zero_grad()
            step(x, y)
            compiles.append(int(telemetry.counters["compiles"] - before))
        torchtpu_lab.sync()
    assert sum(compiles) > 0 and compiles[-3:] == [0, 0, 0], compiles
