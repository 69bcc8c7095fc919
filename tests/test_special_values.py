"""Ops at infinities, NaNs, signed zeros and their domains' edges, value for value against CPU's kernels: XLA's
complex ``exp``, ``exp2``, ``sqrt``, ``abs``, ``atan``, ``atanh`` and ``log`` give NaN (or the other side of a
branch cut) where C's functions (which CPU's kernels use) give an infinity, a zero or a signed part, and CPU's
reciprocals (``rsqrt``, ``sigmoid``) and quotients divide as ``c10::complex`` does; complex ``sin``/``cos``/``tan`` and
their hyperbolic twins are C's formulas (glibc's), at special points and in their last digits;
``igamma``/``igammac`` have CPU's boundary values (SciPy's), checked in CPU's order; ``digamma`` of a signed zero
is an infinity of the other sign; float32 ``exp2``/``cosh``/``sinh`` of large arguments stay within a few ulps.
(Found by PyTorch's own test_unary_ufuncs on tpu.)"""

import itertools
import math

import pytest
import torch

import torchtpu_lab  # noqa: F401 — registers the tpu device

_PARTS = (float("-inf"), -2.0, 0.0, 1.5, float("inf"), float("nan"))
_IMAG = (0.0, 1.0, -2.5, math.pi / 2, float("inf"), float("nan"))
_VALUES = [complex(a, b) for a in _PARTS for b in _IMAG]


def _same(a: complex, b: complex) -> bool:
    return all(u == v or (math.isnan(u) and math.isnan(v)) or abs(u - v) <= 1e-5 * max(1.0, abs(u))
               for u, v in ((a.real, b.real), (a.imag, b.imag)))


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_complex_logaddexp_at_infinities_and_nans_is_cpus(dtype):
    pairs = list(itertools.product(_VALUES, _VALUES))
    x = torch.tensor([p[0] for p in pairs], dtype=dtype)
    y = torch.tensor([p[1] for p in pairs], dtype=dtype)
    cpu = torch.logaddexp(x, y).tolist()
    tpu = torch.logaddexp(x.to("tpu"), y.to("tpu")).cpu().tolist()
    wrong = [(pairs[i], cpu[i], tpu[i]) for i in range(len(pairs)) if not _same(cpu[i], tpu[i])]
    assert not wrong, wrong[:5]
    # e.g. equal real parts of -inf: CPU returns its "lower" operand, which for a tie is the second
    x, y = complex(-math.inf, 1), complex(-math.inf, 2)
    assert torch.logaddexp(torch.tensor([x]), torch.tensor([y])).item() == y
    assert torch.logaddexp(torch.tensor([x], device="tpu"), torch.tensor([y], device="tpu")).item() == y


@pytest.mark.parametrize("fn", [torch.exp, torch.exp2, torch.sqrt, torch.abs, torch.rsqrt, torch.sigmoid, torch.atan,
                                torch.atanh, torch.acos, torch.acosh, torch.asin, torch.asinh, torch.tanh, torch.tan,
                                torch.sinh, torch.cosh, torch.sin, torch.cos, torch.reciprocal, torch.log])
@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_complex_functions_at_infinities_nans_and_signed_zeros_are_cs(fn, dtype):
    values = [complex(a, b) for a in (*_PARTS, -0.0, -3.0, 800.0) for b in (*_IMAG, -0.0, -math.inf, 1e30, -3.0)]
    if fn in (torch.acos, torch.acosh, torch.asin, torch.asinh):  # C's NaN combinations there are not all CPU's
        values = [v for v in values if math.isfinite(v.real) and math.isfinite(v.imag)]
    z = torch.tensor(values, dtype=dtype)
    cpu, tpu = fn(z).tolist(), fn(z.to("tpu")).cpu().tolist()
    wrong = [(values[i], cpu[i], tpu[i]) for i in range(len(values)) if not _same(complex(cpu[i]), complex(tpu[i]))]
    assert not wrong, wrong[:5]


def test_complex_examples_xla_got_wrong():
    def on_tpu(fn, z):
        return fn(torch.tensor([z], device="tpu")).item()

    assert on_tpu(torch.exp, complex(-math.inf, math.inf)) == 0
    assert on_tpu(torch.exp2, complex(-math.inf, 0.5)) == 0
    assert on_tpu(torch.sqrt, complex(-4.0, -0.0)) == complex(0, -2)  # the branch cut follows -0's sign
    assert on_tpu(torch.abs, complex(math.inf, math.nan)) == math.inf
    assert on_tpu(torch.atan, complex(-0.0, 1e30)).real < 0  # -pi/2: the cut follows the zero's sign too
    assert on_tpu(torch.rsqrt, complex(-math.inf, -3.0)) == 0
    assert on_tpu(torch.acos, complex(-3.0, -0.0)).imag > 0  # conj-symmetric: 3.14 + 1.76j, not - 1.76j
    z = torch.randn(20000, dtype=torch.complex64) * torch.logspace(-20, 20, 20000)
    assert torch.equal(z.to("tpu").abs().cpu(), z.abs())  # correctly rounded, as hypot is


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_complex_division_is_c10_complexs(dtype):
    """CPU divides complex numbers as ``c10::complex`` does (Smith's scaled division): ``1 / (-0 + 0j)`` is
    ``inf + nan j`` (XLA: ``-inf``), ``(inf + 0j) / (2 + 1j)`` keeps an infinite real part, and a quotient by a
    large divisor keeps its last bits."""
    values = [complex(a, b) for a in (*_PARTS, -0.0, 1e-30, 3e20) for b in (*_IMAG, -0.0, 1e-30, 3e20)]
    pairs = list(itertools.product(values, values))
    x = torch.tensor([p[0] for p in pairs], dtype=dtype)
    y = torch.tensor([p[1] for p in pairs], dtype=dtype)
    cpu, tpu = (x / y).tolist(), (x.to("tpu") / y.to("tpu")).cpu().tolist()
    wrong = [(pairs[i], cpu[i], tpu[i]) for i in range(len(pairs)) if not _same(cpu[i], tpu[i])]
    assert not wrong, wrong[:5]
    q = torch.tensor([1 + 0j], dtype=dtype, device="tpu") / torch.tensor([complex(-2.5, 1e-30)], dtype=dtype,
                                                                          device="tpu")
    assert q.item() == (torch.tensor([1 + 0j], dtype=dtype) / torch.tensor([complex(-2.5, 1e-30)], dtype=dtype)).item()


@pytest.mark.parametrize("fn", [torch.add, torch.sub, torch.pow, lambda x, y: torch.rsub(x, y, alpha=2)],
                         ids=["add", "sub", "pow", "rsub_alpha"])
def test_complex_sums_and_powers_at_infinities_are_cpus(fn):
    """CPU computes ``x + alpha * y`` with a complex multiply even for ``alpha = 1`` (``(inf + 1j) + (inf + 1j)`` is
    ``inf + nan j``), and ``pow`` as C's ``cpow``: ``cexp(y * clog(x))``, ``0 ** 0`` NaN, a C product's infinities."""
    values = [complex(a, b) for a in (*_PARTS, -0.0, 1e20) for b in (*_IMAG, -0.0)]
    pairs = list(itertools.product(values, values))
    x = torch.tensor([p[0] for p in pairs], dtype=torch.complex64)
    y = torch.tensor([p[1] for p in pairs], dtype=torch.complex64)
    cpu, tpu = fn(x, y).tolist(), fn(x.to("tpu"), y.to("tpu")).cpu().tolist()
    wrong = [(pairs[i], cpu[i], tpu[i]) for i in range(len(pairs)) if not _same(cpu[i], tpu[i])]
    assert not wrong, wrong[:5]


def test_complex_square_roots_by_pow_take_the_sqrt_kernels_cuts():
    """``z ** 0.5`` and ``z ** -0.5`` are CPU's ``sqrt``/``rsqrt`` shortcuts: the branch cut follows a zero's sign
    (``(-4 - 0j) ** 0.5`` is ``-2j``, XLA's sqrt gave ``+2j``)."""
    z = torch.tensor([complex(-4, -0.0), complex(-9, 0.0), complex(math.inf, 1), complex(-math.inf, 2)])
    for e in (0.5, -0.5):
        cpu, tpu = (z ** e).tolist(), (z.to("tpu") ** e).cpu().tolist()
        assert all(_same(c, t) for c, t in zip(cpu, tpu)), (e, cpu, tpu)


def test_complex_powers_of_large_values_are_cpus():
    """XLA's complex ``pow`` overflowed to NaN where C's result underflows to 0 or is an infinity."""
    base = torch.tensor([complex(-501, -501), complex(-501, -501), complex(3e3, 1)], dtype=torch.complex64)
    exponent = torch.tensor([complex(-501, 501), complex(-501, 13437.7), complex(20, 0.5)], dtype=torch.complex64)
    cpu = torch.pow(base, exponent)
    assert torch.equal(torch.pow(base.to("tpu"), exponent.to("tpu")).cpu(), cpu), cpu


def test_complex_hyperbolic_functions_keep_their_digits():
    """XLA's complex64 ``sinh``/``cosh`` were up to 2000 ulps from CPU's (C's ``csinhf``) for real parts up to 100,
    and its ``tanh`` lost digits next to its poles (``cosh 2x + cos 2y`` cancels there); C's formulas keep them
    within a few ulps."""
    g = torch.Generator().manual_seed(0)
    z = torch.complex(torch.empty(20000).uniform_(-100, 100, generator=g),
                      torch.empty(20000).uniform_(-3, 3, generator=g))
    for fn in (torch.sinh, torch.cosh):
        cpu, tpu = fn(z), fn(z.to("tpu")).cpu()
        torch.testing.assert_close(torch.view_as_real(tpu), torch.view_as_real(cpu), rtol=6e-7, atol=0)  # parts
    poles = torch.complex(torch.linspace(-1e-2, 1e-2, 2001), torch.full((2001,), math.pi / 2 + 1e-4))
    torch.testing.assert_close(torch.tanh(poles.to("tpu")).cpu(), torch.tanh(poles), rtol=1e-6, atol=0)


_GAMMA_ARGS = (0.0, -0.0, 1e-3, 1.0, 5.0, 1e3, math.inf, -1e-3, -math.inf, math.nan)


@pytest.mark.parametrize("fn", [torch.igamma, torch.igammac])
def test_incomplete_gamma_boundaries_are_cpus(fn):
    pairs = list(itertools.product(_GAMMA_ARGS, _GAMMA_ARGS))
    a, x = (torch.tensor([p[i] for p in pairs]) for i in (0, 1))
    cpu, tpu = fn(a, x).tolist(), fn(a.to("tpu"), x.to("tpu")).cpu().tolist()
    wrong = [(pairs[i], cpu[i], tpu[i]) for i in range(len(pairs))
             if not (cpu[i] == tpu[i] or (math.isnan(cpu[i]) and math.isnan(tpu[i])) or abs(cpu[i] - tpu[i]) < 1e-6)]
    assert not wrong, wrong[:5]


def test_float32_incomplete_gamma_is_as_accurate_as_cpus():
    """JAX's float32 series were off by 3e-4 at a == x == 1000; CPU's float32 result is within ~1e-6."""
    grid = torch.exp(torch.linspace(-4, 7, 300))
    a, x = torch.broadcast_tensors(grid[:, None], grid[None, :])
    exact = torch.igamma(a.double(), x.double())
    for fn, ref in ((torch.igamma, exact), (torch.igammac, 1 - exact)):
        error = (fn(a.to("tpu"), x.to("tpu")).cpu().double() - ref).abs().max().item()
        assert error <= max(2e-6, 1.5 * (fn(a, x).double() - ref).abs().max().item())


def test_digamma_of_a_signed_zero_is_cpus():
    x = torch.tensor([0.0, -0.0, -1.0])
    assert torch.digamma(x).tolist()[:2] == [-math.inf, math.inf]
    got = torch.digamma(x.to("tpu")).cpu().tolist()
    assert got[:2] == [-math.inf, math.inf] and math.isnan(got[2])


@pytest.mark.parametrize("fn", [torch.exp2, torch.cosh, torch.sinh])
def test_float32_exp2_cosh_sinh_of_large_arguments_are_within_a_few_ulps_of_cpus(fn):
    """XLA's lost up to 34 ulps (exp2) and 13 (cosh, sinh) once |x| >= 9: the argument's rounding, times |x|."""
    x = torch.cat([torch.linspace(-88, 88, 40001), torch.arange(-126.0, 128.0)])
    cpu, tpu = fn(x).double(), fn(x.to("tpu")).cpu().double()
    normal = cpu.isfinite() & (cpu.abs() >= torch.finfo(torch.float32).tiny)  # XLA flushes subnormals to zero
    ulps = (cpu - tpu).abs()[normal] / (cpu.abs()[normal] * torch.finfo(torch.float32).eps)
    assert ulps.max().item() <= 4
    if fn is torch.exp2:
        whole = torch.arange(-126.0, 128.0)
        assert torch.equal(torch.exp2(whole.to("tpu")).cpu(), torch.exp2(whole))  # powers of two, exactly


def test_digamma_follows_cpus_algorithm():
    """JAX's float32 digamma was 2.4e-4 off CPU's (60 % of values differed); CPU's Cephes recurrence and series."""
    for lo, hi in ((-50.0, 0.0), (0.0, 50.0)):
        x = torch.linspace(lo, hi, 20001)
        cpu, tpu = torch.digamma(x), torch.digamma(x.to("tpu")).cpu()
        finite = cpu.isfinite()
        assert torch.equal(cpu.isnan(), tpu.isnan())
        assert (cpu - tpu).abs()[finite].max().item() < 2e-5
        assert (cpu == tpu)[finite].float().mean().item() > 0.9
    for dtype in (torch.float64, torch.bfloat16):
        x = torch.linspace(-20, 20, 4001, dtype=dtype)
        assert torch.equal(torch.digamma(x.to("tpu")).cpu().nan_to_num(), torch.digamma(x).nan_to_num())
