"""Backward ops when only some of their inputs want a gradient, on tpu vs CPU.

PyTorch's backward ops take an ``output_mask`` and leave out the gradients nobody asked for, each in its own way
(``grid_sampler_2d_backward`` always returns the grid's gradient, only the input's may be left out). OpInfo's
gradient checks ask for every input's gradient at once, so a lowering that drops one it must return passes them
and fails a user's spatial transformer, whose image does not require grad. Here every subset of the float inputs
requires grad, and the gradients that exist must equal CPU's."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

import torchtpu_lab  # noqa: F401


def _inputs(shapes: list[tuple]) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.rand(*s, generator=g) * 2 - 1 for s in shapes]


CASES = {
    "grid_sample 2d": (lambda x, grid: F.grid_sample(x, grid, align_corners=False), [(1, 2, 5, 5), (1, 3, 4, 2)]),
    "grid_sample 3d": (lambda x, grid: F.grid_sample(x, grid, align_corners=True, padding_mode="border"),
                       [(1, 2, 4, 4, 4), (1, 2, 3, 2, 3)]),
    "grid_sample nearest": (lambda x, grid: F.grid_sample(x, grid, mode="nearest", align_corners=False), [(2, 1, 4, 6), (2, 3, 3, 2)]),
    "conv2d": (lambda x, w, b: F.conv2d(x, w, b, padding=1), [(2, 3, 6, 6), (4, 3, 3, 3), (4,)]),
    "conv_transpose2d": (lambda x, w, b: F.conv_transpose2d(x, w, b, stride=2), [(1, 3, 4, 4), (3, 2, 3, 3), (2,)]),
    "layer_norm": (lambda x, w, b: F.layer_norm(x, (6,), w, b), [(3, 4, 6), (6,), (6,)]),
    "group_norm": (lambda x, w, b: F.group_norm(x, 2, w, b), [(2, 4, 3, 3), (4,), (4,)]),
    "batch_norm": (lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True), [(4, 3, 2, 2), (3,), (3,)]),
    "linear": (lambda x, w, b: F.linear(x, w, b), [(5, 4), (3, 4), (3,)]),
    "bilinear": (lambda x, y, w: F.bilinear(x, y, w), [(3, 4), (3, 2), (5, 4, 2)]),
    "prelu": (lambda x, w: F.prelu(x, w), [(2, 3, 4), (3,)]),
    "instance_norm": (lambda x, w, b: F.instance_norm(x, weight=w, bias=b), [(2, 3, 5), (3,), (3,)]),
    "scaled_dot_product_attention": (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                                     [(1, 2, 4, 8), (1, 2, 4, 8), (1, 2, 4, 8)]),
    "conv1d grouped": (lambda x, w, b: F.conv1d(x, w, b, groups=2, stride=2), [(2, 4, 9), (6, 2, 3), (6,)]),
}


def _grads(fn, shapes: list[tuple], wants: tuple[bool, ...], device: str) -> list[torch.Tensor]:
    xs = [t.to(device).requires_grad_(w) for t, w in zip(_inputs(shapes), wants)]
    out = fn(*xs)
    (out * out).sum().backward()
    return [out.detach().cpu()] + [x.grad.cpu() for x in xs if x.requires_grad]


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_subset_of_inputs_wanting_a_gradient_gets_cpus_gradients(name):
    fn, shapes = CASES[name]
    for wants in itertools.product([False, True], repeat=len(shapes)):
        if not any(wants):
            continue
        want = _grads(fn, shapes, wants, "cpu")
        got = _grads(fn, shapes, wants, "tpu")
        assert len(got) == len(want), (name, wants)
        for w, g in zip(want, got):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5, msg=lambda m, wants=wants: f"{name} {wants}: {m}")
