"""Convolutions whose window spans the input run as patches times the kernel on XLA:CPU (ops/nn/conv_patches.py):
the same values and gradients as PyTorch's CPU kernels, and no XLA convolution in their programs."""

import copy
import itertools
import random

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from torchtpu_lab.ops.nn import conv_patches, convolution


def test_the_rule_picks_the_windows_xla_cpu_loops_over():
    large = conv_patches.window_is_large
    # a 3x3 kernel over a 2x2 map (a ResNet's last stage on 64x64 images)
    assert large((2, 2), (3, 3), (1, 1), [(1, 1), (1, 1)], (1, 1), (1, 1))
    # a stride-2 3x3 into a 2x2 output: its input gradient's window covers the dilated gradient
    assert large((4, 4), (3, 3), (2, 2), [(1, 1), (1, 1)], (1, 1), (1, 1))
    # the input gradient itself (lhs dilation 2 of a 2x2 gradient: 3 positions, a 3-wide window)
    assert large((2, 2), (3, 3), (1, 1), [(1, 2), (1, 2)], (2, 2), (1, 1))
    # one spatial dim is enough (a 1-D kernel along a short axis)
    assert large((16, 2), (1, 3), (1, 1), [(0, 0), (1, 1)], (1, 1), (1, 1))
    # large maps and 1x1 kernels keep XLA's convolution
    assert not large((16, 16), (3, 3), (1, 1), [(1, 1), (1, 1)], (1, 1), (1, 1))
    assert not large((2, 2), (1, 1), (1, 1), [(0, 0), (0, 0)], (1, 1), (1, 1))
    assert not large((64, 64), (7, 7), (2, 2), [(3, 3), (3, 3)], (1, 1), (1, 1))


def _hlo(fn, *args) -> str:
    return jax.jit(fn).lower(*args).as_text()


def test_small_maps_lower_without_an_xla_convolution_forward_and_backward():
    x, w = jnp.ones((2, 8, 2, 2), jnp.float32), jnp.ones((8, 8, 3, 3), jnp.float32)

    def step(a, b):
        out, vjp = jax.vjp(lambda a, b: convolution._conv(a, b, 1, 1, 1, False, 0, 1), a, b)
        return out, vjp(jnp.ones_like(out))

    assert "convolution" not in _hlo(step, x, w)
    big = jnp.ones((2, 8, 16, 16), jnp.float32)
    assert "convolution" in _hlo(step, big, w)  # XLA's own where its Eigen path serves


def test_depthwise_convolutions_lower_without_xla_convolution_at_every_size():
    """XLA:CPU's grouped convolution is slow at every map size for one channel per group (ConvNeXt's 7x7): taps
    where the map is larger than the window, patches where the window spans it."""
    w = jnp.ones((16, 1, 7, 7), jnp.float32)

    def step(a, b):
        out, vjp = jax.vjp(lambda a, b: convolution._conv(a, b, 1, 3, 1, False, 0, 16), a, b)
        return out, vjp(jnp.ones_like(out))

    for size in (2, 32):
        text = _hlo(step, jnp.ones((2, 16, size, size), jnp.float32), w)
        assert "convolution" not in text
        assert ("dot_general" in text) == (size == 2)  # patches times the kernel only where the window spans
    # a grouped convolution with several channels per group keeps XLA's
    grouped = jnp.ones((16, 4, 3, 3), jnp.float32)
    assert "convolution" in _hlo(lambda a, b: convolution._conv(a, b, 1, 1, 1, False, 0, 4),
                                 jnp.ones((2, 16, 16, 16), jnp.float32), grouped)


def _reference(x, w, stride, padding, dilation, transposed, output_padding, groups, grad):
    tx, tw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    out = torch.convolution(tx, tw, None, stride, padding, dilation, transposed, output_padding, groups)
    out.backward(torch.tensor(grad))
    return out.detach().numpy(), tx.grad.numpy(), tw.grad.numpy()


@pytest.mark.parametrize("form", ["patches", "taps"])
def test_patches_and_taps_equal_pytorch_for_every_geometry(monkeypatch, form):
    """The patch form forced on (not only where the rule picks it), and the depthwise taps form: 1-3 spatial dims,
    strides, padding, dilation, groups (depthwise with and without a channel multiplier), transposed with output
    padding; values and both gradients against PyTorch's CPU kernels."""
    monkeypatch.setattr(conv_patches, "window_is_large", lambda *a: True)
    if form == "patches":
        monkeypatch.setattr(conv_patches, "is_depthwise", lambda *a: False)
        channels = ((4, 6, 1), (4, 6, 2), (6, 6, 6))
    else:
        channels = ((6, 6, 6), (4, 8, 4), (3, 9, 3))
    rng = np.random.default_rng(0)
    cases = list(itertools.product((1, 2, 3), channels, (1, 3), (1, 2), (0, 1), (1, 2), (False, True), (2, 5)))
    random.Random(0).shuffle(cases)
    checked = 0
    for nd, (cin, cout, groups), k, s, p, d, transposed, size in cases:
        if checked == 48:
            break
        op = 1 if transposed and s == 2 and d == 1 else 0
        x = rng.standard_normal((2, cin) + (size,) * nd).astype(np.float32)
        wshape = ((cin, cout // groups) if transposed else (cout, cin // groups)) + (k,) * nd
        w = rng.standard_normal(wshape).astype(np.float32)
        try:
            args = ([s] * nd, [p] * nd, [d] * nd, transposed, [op] * nd, groups)
            probe = torch.convolution(torch.tensor(x), torch.tensor(w), None, *args)
        except RuntimeError:  # a geometry PyTorch refuses (output smaller than one position)
            continue
        grad = rng.standard_normal(tuple(probe.shape)).astype(np.float32)
        want = _reference(x, w, *args, grad)
        out, vjp = jax.vjp(lambda a, b: convolution._conv(a, b, s, p, d, transposed, op, groups), x, w)
        got = (out, *vjp(jnp.asarray(grad)))
        for g, r in zip(got, want):
            np.testing.assert_allclose(np.asarray(g), r, rtol=1e-4, atol=1e-4,
                                       err_msg=f"nd={nd} groups={groups} k={k} s={s} p={p} d={d} t={transposed}")
        checked += 1
    assert checked >= 40


@pytest.mark.parametrize("case", ["resnet_last_stage", "strided_into_2x2", "transposed_up", "conv1d_short",
                                  "conv3d_small", "depthwise", "convnext_depthwise"])
def test_small_map_layers_train_like_cpu_on_the_device(case):
    torch.manual_seed(0)
    layer, shape = {
        "resnet_last_stage": (torch.nn.Conv2d(16, 16, 3, padding=1, bias=False), (2, 16, 2, 2)),
        "strided_into_2x2": (torch.nn.Conv2d(8, 16, 3, stride=2, padding=1), (2, 8, 4, 4)),
        "transposed_up": (torch.nn.ConvTranspose2d(8, 4, 3, stride=2, padding=1, output_padding=1), (2, 8, 2, 2)),
        "conv1d_short": (torch.nn.Conv1d(4, 8, 5, padding=2), (3, 4, 3)),
        "conv3d_small": (torch.nn.Conv3d(4, 4, 3, padding=1), (1, 4, 2, 2, 2)),
        "depthwise": (torch.nn.Conv2d(8, 8, 3, padding=1, groups=8), (2, 8, 1, 1)),
        "convnext_depthwise": (torch.nn.Conv2d(8, 8, 7, padding=3, groups=8), (2, 8, 12, 12)),
    }[case]
    x = torch.randn(shape)
    cpu = copy.deepcopy(layer)
    dev = torch.nn.Sequential(layer).to("tpu")
    xt, xc = x.to("tpu").requires_grad_(), x.clone().requires_grad_()
    out_t, out_c = dev(xt), cpu(xc)
    F.mse_loss(out_t, torch.zeros_like(out_t)).backward()
    F.mse_loss(out_c, torch.zeros_like(out_c)).backward()
    torch.testing.assert_close(out_t.cpu(), out_c, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(xt.grad.cpu(), xc.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dev[0].weight.grad.cpu(), cpu.weight.grad, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("form", ["patches", "taps"])
def test_half_precision_sums_accumulate_in_float32(form):
    """bfloat16 inputs: products summed in float32 and rounded once, as PyTorch's CPU kernel and XLA's own
    convolution do (a bfloat16 running sum over 64 channels x 9 taps, or 49 taps, strays by several of its ulps)."""
    torch.manual_seed(0)
    if form == "patches":
        x, w, groups = torch.randn(2, 64, 2, 2), torch.randn(32, 64, 3, 3), 1
    else:
        x, w, groups = torch.randn(2, 16, 12, 12), torch.randn(16, 1, 7, 7), 16
    xb, wb = x.bfloat16(), w.bfloat16()
    exact = F.conv2d(xb.float(), wb.float(), padding=w.shape[-1] // 2, groups=groups)
    got = F.conv2d(xb.to("tpu"), wb.to("tpu"), padding=w.shape[-1] // 2, groups=groups).cpu().float()
    scale = exact.abs().max()
    assert (got - exact).abs().max() <= 2 ** -7 * scale  # one bfloat16 rounding of the float32 sum
