"""Models as people write them, forward and backward on tpu vs the same model on CPU from the same initial weights."""

import contextlib
import copy
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
from torch.optim.optimizer import _default_to_fused_or_foreach

import torchtpu_lab
from compare import assert_same, no_cpu_fallback
from sweeps import EAGER_MODES, swept

RTOL, ATOL = 1e-4, 1e-5


def _close(tpu, cpu, what="", rtol=RTOL, atol=ATOL):
    """:func:`compare.assert_same` at this file's tolerances."""
    assert_same(tpu, cpu, rtol=rtol, atol=atol, where=what)


def _to(obj, device):
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, (tuple, list)):
        return type(obj)(_to(o, device) for o in obj)
    return obj


def _fwd_bwd(model, inputs, loss_fn, rtol=RTOL, atol=ATOL, grad_rtol=None, grad_atol=None):
    """One forward + backward on CPU and on tpu; outputs, loss and every parameter gradient must agree.
    ``inputs``: a tuple moved to each device, or a function of the device giving the tuple."""
    results = {}
    for device in ("cpu", "tpu"):
        with no_cpu_fallback(f"the {device} run") if device == "tpu" else contextlib.nullcontext():
            m = copy.deepcopy(model).to(device)
            out = m(*(inputs(device) if callable(inputs) else _to(inputs, device)))
            loss = loss_fn(out)
            loss.backward()
        results[device] = (m, out, loss)
    cm, cout, closs = results["cpu"]
    tm, tout, tloss = results["tpu"]
    _close(tout.detach(), cout.detach(), "output", rtol, atol)
    _close(tloss.detach(), closs.detach(), "loss", rtol, atol)
    cparams, tparams = dict(cm.named_parameters()), dict(tm.named_parameters())
    assert cparams.keys() == tparams.keys()
    for name, p in cparams.items():
        assert p.grad is not None, name
        _close(tparams[name].grad, p.grad, f"grad of {name}", grad_rtol or rtol, grad_atol or atol)
    return cm, tm


# ---------------------------------------------------------------------------------------------- (a) ResNet


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


class ResNet(nn.Module):
    def __init__(self, layers=(1, 1, 1), widths=(8, 16, 32), num_classes=10):
        super().__init__()
        self.inplanes = widths[0]
        self.conv1 = nn.Conv2d(3, self.inplanes, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(self.inplanes)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        self.layers = nn.Sequential(
            *[self._make_layer(w, n, stride=1 if i == 0 else 2) for i, (w, n) in enumerate(zip(widths, layers))]
        )
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(widths[-1] * BasicBlock.expansion, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def _make_layer(self, planes, blocks, stride):
        downsample = None
        if stride != 1 or self.inplanes != planes:
            downsample = nn.Sequential(
                nn.Conv2d(self.inplanes, planes, 1, stride=stride, bias=False), nn.BatchNorm2d(planes)
            )
        layers = [BasicBlock(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes
        layers += [BasicBlock(planes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layers(x)
        return self.fc(torch.flatten(self.avgpool(x), 1))


@pytest.mark.parametrize("mode", EAGER_MODES)
def test_resnet_forward_backward(mode):
    torch.manual_seed(0)
    model = ResNet(layers=(2, 1, 1))
    x, y = torch.randn(4, 3, 16, 16), torch.randint(0, 10, (4,))
    with torchtpu_lab.eager_mode(mode):
        cm, tm = _fwd_bwd(model, (x,), lambda out: F.cross_entropy(out, y.to(out.device)))
        # train-mode batch norm updated its running statistics the same way
        for (name, cb), tb in zip(cm.named_buffers(), tm.buffers()):
            _close(tb, cb, name)


def _eval_resnet():
    torch.manual_seed(0)
    model = ResNet()
    model(torch.randn(8, 3, 16, 16))  # non-trivial running stats
    return model.eval(), torch.randn(2, 3, 16, 16)


def test_resnet_eval_no_grad_is_deterministic():
    model, x = _eval_resnet()
    tm = copy.deepcopy(model).to("tpu")
    with torch.no_grad():
        expected = model(x)
        out = tm(x.to("tpu"))
    assert not out.requires_grad and out.grad_fn is None
    _close(out, expected, "no_grad")
    out2 = tm(x.to("tpu"))  # grad mode: eval() is deterministic, and the graph exists
    assert out2.requires_grad
    assert torch.equal(out2.detach().cpu(), out.cpu())




def test_resnet_eval_inference_mode():
    model, x = _eval_resnet()
    tm = copy.deepcopy(model).to("tpu")
    with torch.no_grad():
        expected = model(x)
    with torch.inference_mode():
        out = tm(x.to("tpu"))
    assert out.is_inference() and not out.requires_grad
    _close(out, expected, "inference_mode")


# ------------------------------------------------------------------------------------------------- (b) GPT


class CausalSelfAttention(nn.Module):
    """nanoGPT-style attention through F.scaled_dot_product_attention."""

    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)

    def forward(self, x):
        b, t, c = x.size()
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))


class MHAAttention(nn.Module):
    """The same through nn.MultiheadAttention(batch_first=True) and an explicit boolean causal mask."""

    def __init__(self, d, heads):
        super().__init__()
        self.attn = nn.MultiheadAttention(d, heads, dropout=0.0, batch_first=True)

    def forward(self, x):
        t = x.shape[1]
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool, device=x.device), diagonal=1)
        return self.attn(x, x, x, attn_mask=mask, need_weights=False)[0]


class GPTBlock(nn.Module):
    def __init__(self, d, heads, attn_cls):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d)
        self.attn = attn_cls(d, heads)
        self.ln_2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(approximate="tanh"), nn.Linear(4 * d, d))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, vocab=64, block_size=16, d=32, heads=4, tie_weights=True):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(block_size, d)
        self.h = nn.ModuleList([GPTBlock(d, heads, MHAAttention), GPTBlock(d, heads, CausalSelfAttention)])
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.apply(self._init_weights)
        if tie_weights:
            self.lm_head.weight = self.wte.weight

    @staticmethod
    def _init_weights(module):
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx):
        pos = torch.arange(0, idx.size(1), dtype=torch.long, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def _gpt_case(tie_weights):
    torch.manual_seed(0)
    model = GPT(tie_weights=tie_weights)
    idx = torch.randint(0, 64, (2, 16))
    targets = torch.roll(idx, -1, dims=1)

    def loss_fn(logits):
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.to(logits.device).view(-1))

    return model, idx, loss_fn


@pytest.mark.parametrize("mode", EAGER_MODES)
def test_gpt_untied_forward_backward(mode):
    model, idx, loss_fn = _gpt_case(tie_weights=False)
    with torchtpu_lab.eager_mode(mode):
        _fwd_bwd(model, (idx,), loss_fn)




def test_weight_tying_survives_to_tpu():
    model = GPT()
    assert model.lm_head.weight is model.wte.weight
    model.to("tpu")
    assert model.lm_head.weight is model.wte.weight
    assert len(list(model.parameters())) == len(list(GPT().parameters()))


def test_gpt_tied_forward_backward():
    model, idx, loss_fn = _gpt_case(tie_weights=True)
    _fwd_bwd(model, (idx,), loss_fn)  # the tied weight's gradient sums the embedding and lm-head parts


def test_gpt_is_causal():
    torch.manual_seed(0)
    model = GPT().to("tpu").eval()
    idx = torch.randint(0, 64, (1, 16))
    changed = idx.clone()
    changed[0, 10:] = (changed[0, 10:] + 1) % 64
    with torch.no_grad():
        a, b = model(idx.to("tpu")).cpu(), model(changed.to("tpu")).cpu()
    torch.testing.assert_close(a[:, :10], b[:, :10])  # earlier positions can't see later tokens
    assert not torch.allclose(a[:, 10:], b[:, 10:])


# ---------------------------------------------------------------------------------------------- (c) RNNs


class Seq2Label(nn.Module):
    def __init__(self, vocab=30, emb=8, hidden=16, classes=5):
        super().__init__()
        self.emb = nn.Embedding(vocab, emb, padding_idx=0)
        self.lstm = nn.LSTM(emb, hidden, num_layers=2, batch_first=True)
        self.gru = nn.GRU(hidden, hidden, batch_first=True, bidirectional=True)
        self.head = nn.Linear(2 * hidden, classes)

    def forward(self, tokens, lengths=None):
        x = self.emb(tokens)
        if lengths is None:
            x, _ = self.lstm(x)
            x, h = self.gru(x)
            return self.head(torch.cat([h[0], h[1]], dim=1)) + x.mean(1).sum(1, keepdim=True)
        packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        packed, _ = self.lstm(packed)
        packed, h = self.gru(packed)
        x, out_lengths = pad_packed_sequence(packed, batch_first=True)
        assert torch.equal(out_lengths, lengths)
        mean = x.sum(1) / lengths.to(x.device, x.dtype)[:, None]
        return self.head(torch.cat([h[0], h[1]], dim=1)) + mean.sum(1, keepdim=True)


@pytest.mark.parametrize("packed", [False, True], ids=["unpacked", "packed"])
def test_lstm_gru_forward_backward(packed):
    torch.manual_seed(0)
    model = Seq2Label()
    lengths = torch.tensor([7, 3, 5, 1])
    tokens = torch.randint(1, 30, (4, 7)) * (torch.arange(7)[None] < lengths[:, None])
    y = torch.randint(0, 5, (4,))
    # lengths stay on CPU, as pack_padded_sequence requires
    _fwd_bwd(
        model,
        lambda device: (tokens.to(device), lengths if packed else None),
        lambda out: F.cross_entropy(out, y.to(out.device)),
    )


def test_lstm_with_initial_state_and_stateful_steps():
    torch.manual_seed(0)
    lstm = nn.LSTM(4, 6, num_layers=2)
    x = torch.randn(5, 3, 4)  # (seq, batch, feature): batch_first=False
    h0, c0 = torch.randn(2, 3, 6), torch.randn(2, 3, 6)
    out, (h, c) = lstm(x, (h0, c0))
    tl = copy.deepcopy(lstm).to("tpu")
    state = (h0.to("tpu"), c0.to("tpu"))
    steps = []
    for t in range(5):  # step by step, carrying the state: same as the whole sequence at once
        o, state = tl(x[t : t + 1].to("tpu"), state)
        steps.append(o)
    _close(torch.cat(steps).detach(), out.detach(), "stepped output")
    _close(state[0].detach(), h.detach(), "h_n")
    _close(state[1].detach(), c.detach(), "c_n")


# ---------------------------------------------------------------------------------------------- (d) U-Net


class DoubleConv(nn.Sequential):
    def __init__(self, cin, cout):
        super().__init__(
            nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
            nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
        )


class UNet(nn.Module):
    def __init__(self, cin=3, classes=2, w=(4, 8, 16)):
        super().__init__()
        self.inc = DoubleConv(cin, w[0])
        self.down1 = nn.Sequential(nn.MaxPool2d(2), DoubleConv(w[0], w[1]))
        self.down2 = nn.Sequential(nn.MaxPool2d(2), DoubleConv(w[1], w[2]))
        self.up1 = nn.ConvTranspose2d(w[2], w[1], 2, stride=2)
        self.conv1 = DoubleConv(2 * w[1], w[1])
        self.up2 = nn.ConvTranspose2d(w[1], w[0], 2, stride=2)
        self.conv2 = DoubleConv(2 * w[0], w[0])
        self.outc = nn.Conv2d(w[0], classes, 1)

    @staticmethod
    def _up(up, conv, x, skip):
        x = up(x)
        dy, dx = skip.size(2) - x.size(2), skip.size(3) - x.size(3)  # odd sizes: pad as the reference U-Net does
        x = F.pad(x, [dx // 2, dx - dx // 2, dy // 2, dy - dy // 2])
        return conv(torch.cat([skip, x], dim=1))

    def forward(self, img):
        x1 = self.inc(img)
        x2 = self.down1(x1)
        x3 = self.down2(x2)
        x = self._up(self.up1, self.conv1, x3, x2)
        x = self._up(self.up2, self.conv2, x, x1)
        logits = self.outc(x)
        return F.interpolate(logits, scale_factor=1.5, mode="bilinear", align_corners=False)


def test_unet_forward_backward():
    torch.manual_seed(0)
    model = UNet()
    img = torch.randn(2, 3, 18, 18)  # 18 -> 9 -> 4: the decoder has to pad 4*2=8 back to 9
    target = torch.randint(0, 2, (2, 27, 27))
    cm, _ = _fwd_bwd(model, (img,), lambda out: F.cross_entropy(out, target.to(out.device)))
    assert cm(img).shape == (2, 2, 27, 27)


@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("size", [(5, 7), (16, 3)])
def test_interpolate_bilinear_forward_backward(size, align_corners):
    torch.manual_seed(0)
    x = torch.randn(2, 3, 6, 5, requires_grad=True)
    w = torch.randn(2, 3, *size)
    out = F.interpolate(x, size=size, mode="bilinear", align_corners=align_corners)
    (out * w).sum().backward()
    xt = x.detach().to("tpu").requires_grad_()
    tout = F.interpolate(xt, size=size, mode="bilinear", align_corners=align_corners)
    (tout * w.to("tpu")).sum().backward()
    _close(tout.detach(), out.detach(), "interpolate")
    _close(xt.grad, x.grad, "interpolate grad")


# ------------------------------------------------------------------------------ (e) EmbeddingBag, index_add_


class BagOfWords(nn.Module):
    """EmbeddingBag over variable-length bags, then bags pooled into documents with index_add_, then a
    per-document permutation written with scatter_."""

    def __init__(self, vocab=50, d=8, classes=3):
        super().__init__()
        self.bag = nn.EmbeddingBag(vocab, d, mode="mean")
        self.proj = nn.Linear(d, d)
        self.head = nn.Linear(d, classes)

    def forward(self, flat, offsets, doc_of_bag, num_docs, perm):
        h = torch.tanh(self.proj(self.bag(flat, offsets)))
        docs = torch.zeros(num_docs, h.shape[1], device=h.device, dtype=h.dtype)
        docs.index_add_(0, doc_of_bag, h)
        shuffled = torch.zeros_like(docs).scatter_(1, perm, docs)
        return self.head(docs + 0.5 * shuffled)


def test_embedding_bag_index_add_scatter_forward_backward():
    torch.manual_seed(0)
    model = BagOfWords()
    flat = torch.randint(0, 50, (20,))
    offsets = torch.tensor([0, 3, 4, 9, 15, 15 + 2])  # includes a bag of 1 and bags of different lengths
    doc_of_bag = torch.tensor([0, 2, 0, 1, 2, 2])  # repeated indices: index_add_ must accumulate
    perm = torch.stack([torch.randperm(8) for _ in range(3)])
    y = torch.tensor([1, 0, 2])
    _fwd_bwd(
        model, (flat, offsets, doc_of_bag, 3, perm), lambda out: F.cross_entropy(out, y.to(out.device))
    )


@pytest.mark.parametrize("mode", ["sum", "max"])
def test_embedding_bag_other_modes(mode):
    torch.manual_seed(0)
    bag = nn.EmbeddingBag(20, 4, mode=mode)
    flat, offsets = torch.randint(0, 20, (10,)), torch.tensor([0, 2, 7])
    weights = torch.rand(10) if mode == "sum" else None
    _fwd_bwd(bag, (flat, offsets, weights), lambda out: (out * torch.arange(4.0, device=out.device)).sum())


# -------------------------------------------------------------------------------- determinism, no_grad


def test_eval_is_deterministic_and_train_dropout_is_not():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Dropout(0.5), nn.Linear(64, 4))
    x = torch.randn(8, 16)
    tm = copy.deepcopy(model).to("tpu")
    xt = x.to("tpu")
    tm.eval()
    a, b = tm(xt).detach().cpu(), tm(xt).detach().cpu()
    assert torch.equal(a, b)
    torch.testing.assert_close(a, model.eval()(x).detach(), rtol=RTOL, atol=ATOL)
    tm.train()
    c, d = tm(xt).detach().cpu(), tm(xt).detach().cpu()
    assert not torch.equal(c, d)  # fresh dropout masks each call


def test_no_grad_does_not_record():
    lin = nn.Linear(4, 3).to("tpu")
    x = torch.randn(2, 4, device="tpu")
    with torch.no_grad():
        y = lin(x) * 2
        lin.weight.add_(1.0)  # in-place on a leaf that requires grad: allowed under no_grad
    assert y.grad_fn is None and not y.requires_grad
    assert lin.weight.requires_grad and lin.weight.grad_fn is None
    lin(x).sum().backward()
    torch.testing.assert_close(lin.weight.grad.cpu(), x.sum(0).expand(3, 4).cpu())


def test_inference_mode_elementwise_and_matmul():
    x = torch.randn(3, 3, device="tpu")
    with torch.inference_mode():
        y = x @ x + 1
        z = torch.randn(3, 3, device="tpu").relu_()
    assert y.is_inference() and z.is_inference()
    torch.testing.assert_close(y.cpu(), x.cpu() @ x.cpu() + 1, rtol=RTOL, atol=ATOL)
    with pytest.raises(RuntimeError, match="[Ii]nplace update to inference tensor"):
        y.add_(1)  # outside inference mode, an inference tensor can't be changed in place


def test_inference_mode_view_of_normal_tensor():
    x = torch.randn(3, 4, device="tpu")
    with torch.inference_mode():
        y = x.t()
    assert not y.is_inference()  # as on CPU: a view of a normal tensor stays a normal tensor
    torch.testing.assert_close(y.cpu(), x.cpu().t())


# ---------------------------------------------------------------------------------- clipping, optimizers


class MLP(nn.Sequential):
    def __init__(self):
        super().__init__(nn.Linear(10, 32), nn.Tanh(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1))


def _regression_batches(n=6):
    g = torch.Generator().manual_seed(1)
    xs = [torch.randn(16, 10, generator=g) for _ in range(3)]
    return [(xs[i % 3], xs[i % 3][:, :3].sum(1, keepdim=True).cos()) for i in range(n)]


@pytest.mark.parametrize("norm_type", [2.0, 1.0, math.inf])
def test_clip_grad_norm(norm_type):
    torch.manual_seed(0)
    model = MLP()
    x, y = _regression_batches(1)[0]
    norms, models = {}, {}
    for device in ("cpu", "tpu"):
        m = copy.deepcopy(model).to(device)
        (100 * F.mse_loss(m(x.to(device)), y.to(device))).backward()  # large grads so clipping bites
        norms[device] = torch.nn.utils.clip_grad_norm_(m.parameters(), max_norm=0.5, norm_type=norm_type)
        models[device] = m
    assert norms["cpu"] > 0.5
    _close(norms["tpu"], norms["cpu"], "total norm")
    for (name, cp), tp in zip(models["cpu"].named_parameters(), models["tpu"].parameters()):
        _close(tp.grad, cp.grad, f"clipped grad of {name}")
    total = torch.nn.utils.get_total_norm([p.grad for p in models["tpu"].parameters()], norm_type)
    assert total.cpu().item() == pytest.approx(0.5, rel=1e-4)


def test_clip_grad_norm_error_if_nonfinite():
    p = nn.Parameter(torch.ones(3, device="tpu"))
    p.grad = torch.tensor([1.0, float("nan"), 2.0], device="tpu")
    with pytest.raises(RuntimeError, match="non-finite"):
        torch.nn.utils.clip_grad_norm_([p], 1.0, error_if_nonfinite=True)


SCHEDULES = {
    "sgd_steplr": (
        lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-4),
        lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=2, gamma=0.5),
    ),
    "adam_cosine": (
        lambda p: torch.optim.Adam(p, lr=1e-2, amsgrad=True),
        lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=6, eta_min=1e-4),
    ),
    "adamw_onecycle": (
        lambda p: torch.optim.AdamW(p, lr=1e-3, weight_decay=0.05),
        lambda o: torch.optim.lr_scheduler.OneCycleLR(o, max_lr=2e-2, total_steps=6),
    ),
}


def _train(model, make_opt, make_sched, batches, device):
    m = copy.deepcopy(model).to(device)
    opt = make_opt(m.parameters())
    sched = make_sched(opt) if make_sched else None
    losses, lrs = [], []
    for x, y in batches:
        opt.zero_grad()
        loss = F.mse_loss(m(x.to(device)), y.to(device))
        loss.backward()
        opt.step()
        if sched:
            sched.step()
        losses.append(loss.item())
        lrs.append(opt.param_groups[0]["lr"])
    return m, opt, losses, lrs


@pytest.mark.parametrize("name", SCHEDULES)
def test_lr_scheduler_drives_optimizer(name):
    torch.manual_seed(0)
    model = MLP()
    make_opt, make_sched = SCHEDULES[name]
    batches = _regression_batches()
    cm, _, closses, clrs = _train(model, make_opt, make_sched, batches, "cpu")
    tm, _, tlosses, tlrs = _train(model, make_opt, make_sched, batches, "tpu")
    assert tlrs == clrs and len(set(clrs)) > 2  # the schedule really moved the learning rate
    assert tlosses == pytest.approx(closses, rel=RTOL, abs=1e-6)
    for (n, cp), tp in zip(cm.named_parameters(), tm.parameters()):
        _close(tp.detach(), cp.detach(), n)


OPTIMIZERS = {
    "SGD": (torch.optim.SGD, dict(lr=0.05, momentum=0.9, dampening=0.1)),
    "Adam": (torch.optim.Adam, dict(lr=1e-2)),
    "AdamW": (torch.optim.AdamW, dict(lr=1e-2)),
    "RMSprop": (torch.optim.RMSprop, dict(lr=1e-3, momentum=0.5, centered=True)),
    "Adagrad": (torch.optim.Adagrad, dict(lr=1e-2)),
    "Adamax": (torch.optim.Adamax, dict(lr=1e-2)),
    "NAdam": (torch.optim.NAdam, dict(lr=1e-2)),
    "RAdam": (torch.optim.RAdam, dict(lr=1e-2)),
    "Adadelta": (torch.optim.Adadelta, dict(lr=1.0)),
}


def _compare_optimizer(cpu_make, tpu_make, steps=4, *, cpu_fallback_ok=False):
    """``cpu_fallback_ok``: only the values are compared (the tpu steps may run on the CPU)."""
    torch.manual_seed(0)
    model = MLP()
    batches = _regression_batches(steps)
    cm, copt, closses, _ = _train(model, cpu_make, None, batches, "cpu")
    with contextlib.nullcontext() if cpu_fallback_ok else no_cpu_fallback("training on tpu"):
        tm, topt, tlosses, _ = _train(model, tpu_make, None, batches, "tpu")
    assert tlosses == pytest.approx(closses, rel=RTOL, abs=1e-6)
    for (n, cp), tp in zip(cm.named_parameters(), tm.parameters()):
        _close(tp.detach(), cp.detach(), n)
    for cp, tp in zip(cm.parameters(), tm.parameters()):
        for key, cv in copt.state[cp].items():
            tv = topt.state[tp][key]
            if isinstance(cv, torch.Tensor) and cv.dim() > 0:
                _close(tv, cv, f"optimizer state {key}")
            elif isinstance(cv, torch.Tensor):
                assert tv.item() == pytest.approx(cv.item()), key


@pytest.mark.parametrize("name", swept(OPTIMIZERS, keep={"SGD", "Adam"}))
def test_optimizer_default_implementation_matches_cpu(name):
    """foreach/fused left at None: PyTorch picks per device (never fused by default); the steps must match."""
    cls, kw = OPTIMIZERS[name]
    params = list(MLP().to("tpu").parameters())
    assert _default_to_fused_or_foreach(params, differentiable=False)[0] is False
    _compare_optimizer(lambda p: cls(p, **kw), lambda p: cls(p, **kw))


@pytest.mark.parametrize("name", swept(OPTIMIZERS, keep={"SGD", "Adam"}))
def test_optimizer_foreach_matches_cpu_loop(name):
    cls, kw = OPTIMIZERS[name]
    _compare_optimizer(lambda p: cls(p, **kw), lambda p: cls(p, foreach=True, **kw))




FUSED_OPTIMIZERS = ["Adam", "AdamW", "SGD"]


@pytest.mark.parametrize("name", FUSED_OPTIMIZERS)
def test_optimizer_fused_matches_cpu(name):
    """fused=True is accepted for tpu (PyTorch lists PrivateUse1 among fused devices); it must be right."""
    cls, kw = OPTIMIZERS[name]
    _compare_optimizer(lambda p: cls(p, fused=True, **kw), lambda p: cls(p, fused=True, **kw), cpu_fallback_ok=True)


@pytest.mark.parametrize("name", FUSED_OPTIMIZERS)
def test_optimizer_fused_runs_on_the_device(name):
    cls, kw = OPTIMIZERS[name]
    _compare_optimizer(lambda p: cls(p, fused=True, **kw), lambda p: cls(p, fused=True, **kw))
