"""bfloat16 and float16 ops round where PyTorch's CPU kernels round, and carry what CPU carries in float32.

Matrix products with a bias: CPU's gemm adds the bias inside its float32 accumulation and rounds once;
``addbmm`` adds each batch with an ``addmm_`` of its own; ``addr`` computes ``beta * self + alpha * vec1 * vec2``
left to right in the dtype. A lowering that rounds the product before adding the bias is an ulp off (a
``Linear`` under bfloat16 autocast), and where the sum cancels that ulp is 15 % of the result.

Scans, norms and the softmax backward: CPU carries the running sum or product, the powers of a p-norm and the
softmax's dot product in float32 (``opmath``) and rounds each result once. In the half type itself a cumulative
sum drifts (23 % off where it cancels) and a float16 ``|x| ** 6`` overflows to ``inf`` where the norm is 8.5."""

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
    _assert_rounds_like(got, want, name)


def _assert_rounds_like(got: torch.Tensor, want: torch.Tensor, name: str) -> None:
    """Equal to CPU but for a float32 sum that straddles a rounding boundary: CPU's gemm sums in an order of
    its own, which differs between CPUs' vector widths (an AMD EPYC's AVX-512 float16 ``baddbmm`` is one ulp off
    the float32 sum rounded once in one element of 384), so at most 1 % of the elements may be the adjacent
    value. Rounding the product before adding the bias is a quarter of the elements off, which this fails."""
    off = got != want
    adjacent = torch.nextafter(want, got.where(off, want + 1)) == got
    assert bool((adjacent | ~off).all()), (name, (got.float() - want.float()).abs().max())
    assert int(off.sum()) <= max(1, want.numel() // 100), (name, int(off.sum()), want.numel())


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


def _same_as_cpu(fn, *args, exact: bool = True) -> None:
    want = fn(*args)
    got = fn(*[a.to("tpu") if isinstance(a, torch.Tensor) else a for a in args]).cpu()
    assert got.dtype == want.dtype and got.shape == want.shape
    if exact:
        assert torch.equal(got, want), (got.float() - want.float()).abs().max()
    else:
        torch.testing.assert_close(got, want, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_scans_carry_float32_and_round_each_result_once(dtype):
    x = _operands((6, 40), dtype=dtype)[0]
    _same_as_cpu(lambda t: torch.cumsum(t, 1), x, exact=False)
    _same_as_cpu(lambda t: torch.cumprod(t / 2 + 1, 1), x, exact=False)
    # a sum that cancels to near zero: the half type's own running sum is far off there
    y = torch.cat([x, -x.flip(1)], 1)
    got = torch.cumsum(y.to("tpu"), 1).cpu().float()
    exact = torch.cumsum(y.double(), 1)
    want = torch.cumsum(y, 1).float()
    assert (got - exact).abs().max() <= (want - exact).abs().max() + 1e-6


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("ord", [3, 4, 6])
def test_p_norms_do_not_overflow_where_cpus_do_not(dtype, ord):
    x = torch.linspace(-6, 6, 50).to(dtype)
    want = torch.linalg.vector_norm(x, ord)
    got = torch.linalg.vector_norm(x.to("tpu"), ord).cpu()
    assert torch.isfinite(want) and torch.isfinite(got)
    torch.testing.assert_close(got, want, rtol=2e-3, atol=0)
    _same_as_cpu(lambda a, b: torch.dist(a, b, ord), x, x.flip(0) / 3, exact=False)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_softmax_backward_in_float32(dtype):
    x = _operands((5, 10, 5), dtype=dtype)[0]
    out = torch.softmax(x, -1)
    grad = _operands((5, 10, 5), dtype=dtype)[0].flip(0)
    _same_as_cpu(lambda g, o: torch.ops.aten._softmax_backward_data(g, o, -1, dtype), grad, out, exact=False)
    logs = torch.log_softmax(x, -1)
    _same_as_cpu(lambda g, o: torch.ops.aten._log_softmax_backward_data(g, o, -1, dtype), grad, logs, exact=False)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_matrix_exp_of_half_types_is_float32s_rounded(dtype):
    a = _operands((5, 5), dtype=dtype)[0]
    got = torch.linalg.matrix_exp(a.to("tpu")).cpu()
    assert got.dtype == dtype
    torch.testing.assert_close(got, torch.linalg.matrix_exp(a.double()).to(dtype), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_variance_in_float32(dtype):
    x = (_operands((5, 5, 5), dtype=torch.float32)[0] * 3 + 1).to(dtype)
    for correction in (0, 1, 1.3, 2):
        for fn in (torch.var, torch.std):
            want = fn(x, dim=1, correction=correction)
            got = fn(x.to("tpu"), dim=1, correction=correction).cpu()
            assert got.dtype == dtype
            torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3)
        var, mean = torch.var_mean(x.to("tpu"), dim=(0, 2), correction=correction)
        want_var, want_mean = torch.var_mean(x, dim=(0, 2), correction=correction)
        torch.testing.assert_close(var.cpu(), want_var, rtol=1e-3, atol=1e-3)
        torch.testing.assert_close(mean.cpu(), want_mean, rtol=1e-3, atol=1e-3)
