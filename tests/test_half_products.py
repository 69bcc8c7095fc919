"""Matrix products with a bias in bfloat16 and float16 round where PyTorch's CPU kernels round, bit for bit.

CPU's gemm adds the bias inside its float32 accumulation and rounds once; ``addbmm`` adds each batch with an
``addmm_`` of its own; ``addr`` computes ``beta * self + alpha * vec1 * vec2`` left to right in the dtype. A
lowering that rounds the product before adding the bias is an ulp off (a ``Linear`` under bfloat16 autocast),
and where the sum cancels that ulp is 15 % of the result."""

from __future__ import annotations

import pytest
import torch

import torchtpu_lab  # noqa: F401

DTYPES = [torch.bfloat16, torch.float16]


def _operands(*shapes: tuple, dtype: torch.dtype) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(s, generator=g) * 3).to(dtype) for s in shapes]


CASES = {
    "addmm": (torch.addmm, [(16, 8), (16, 64), (64, 8)], {}),
    "addmm broadcast bias, beta and alpha": (torch.addmm, [(8,), (16, 64), (64, 8)], {"beta": 0.6, "alpha": 0.2}),
    "addmv": (torch.addmv, [(16,), (16, 32), (32,)], {"beta": 0.5, "alpha": 2.0}),
    "baddbmm": (torch.baddbmm, [(3, 16, 8), (3, 16, 32), (3, 32, 8)], {}),
    "addbmm": (torch.addbmm, [(16, 8), (5, 16, 32), (5, 32, 8)], {}),
    "addbmm scalar bias, beta and alpha": (torch.addbmm, [(), (5, 5, 5), (5, 5, 10)], {"beta": 0.6, "alpha": 0.2}),
    "addr": (torch.addr, [(5, 10), (5,), (10,)], {"beta": 0.6, "alpha": 0.2}),
    "linear": (lambda b, x, w: torch.nn.functional.linear(x, w, b), [(8,), (16, 64), (8, 64)], {}),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", sorted(CASES))
def test_products_with_a_bias_round_like_cpu(name, dtype):
    fn, shapes, kwargs = CASES[name]
    args = _operands(*shapes, dtype=dtype)
    want = fn(*args, **kwargs)
    got = fn(*[a.to("tpu") for a in args], **kwargs).cpu()
    assert got.dtype == want.dtype
    assert torch.equal(got, want), (name, (got.float() - want.float()).abs().max())


def test_a_linear_under_bfloat16_autocast_equals_cpu():
    torch.manual_seed(0)
    cpu = torch.nn.Linear(64, 32)
    tpu = torch.nn.Linear(64, 32)
    tpu.load_state_dict(cpu.state_dict())
    tpu = tpu.to("tpu")
    x = torch.randn(16, 64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = cpu(x)
    with torch.autocast("tpu", dtype=torch.bfloat16):
        got = tpu(x.to("tpu"))
    assert got.dtype == torch.bfloat16 and torch.equal(got.cpu(), want)
