"""Random ops against PyTorch's CPU semantics (found by PyTorch's own test_tensor_creation_ops.py on tpu): the
ranges ``random_`` draws, CPU's checks of the bounds (errors at the call, in every eager mode, never inside a
fused graph's trace; the precision warning at each call), complex draws of both parts, and CPU's errors for
``uniform_``, ``bernoulli`` and ``normal``. Values need not equal CPU's stream, only ranges and distributions."""

import warnings

import pytest
import torch

import torchtpu_lab
from sweeps import EAGER_MODES

N = 4000


@pytest.fixture(params=EAGER_MODES)
def mode(request):
    with torchtpu_lab.eager_mode(request.param):
        yield request.param


def _raises_like_cpu(fn, dtype=torch.float32):
    """``fn(tensor)`` raises on tpu the exception CPU raises, with CPU's message, at the call."""
    with pytest.raises(Exception) as cpu:
        fn(torch.empty(5, dtype=dtype))
    with pytest.raises(type(cpu.value)) as tpu:
        fn(torch.empty(5, dtype=dtype, device="tpu"))
    assert str(cpu.value) in str(tpu.value)


@pytest.mark.parametrize("dtype, from_, to", [
    (torch.float32, 0, -129), (torch.float32, 5, 5), (torch.int64, 3, 2), (torch.bfloat16, -42, -42),
    (torch.int8, 0, 300), (torch.int8, -129, 0), (torch.uint8, -1, 10), (torch.int16, 0, 2**40),
    (torch.bool, 0, 3), (torch.bool, -1, 1), (torch.float16, 0, 70000), (torch.float32, 2**25, None),
    (torch.int8, -2**63, None),
])
def test_random_bounds_errors_are_cpus_at_the_call_and_leave_no_pending_graph(mode, dtype, from_, to):
    _raises_like_cpu(lambda t: t.random_(from_, to), dtype)
    if to is not None:
        _raises_like_cpu(lambda t: torch.randint(from_, to, (3,), dtype=t.dtype, device=t.device), dtype)
        _raises_like_cpu(lambda t: torch.randint_like(t, from_, to), dtype)
    x = torch.ones(3, device="tpu")
    assert (x + 1).cpu().tolist() == [2.0, 2.0, 2.0]  # the failed call left nothing pending that fails later


def test_random_to_checks_like_cpu(mode):
    _raises_like_cpu(lambda t: t.random_(-42))
    _raises_like_cpu(lambda t: t.random_(0))
    _raises_like_cpu(lambda t: t.random_(2**40), torch.int32)


@pytest.mark.parametrize("dtype, digits", [(torch.float16, 11), (torch.bfloat16, 8), (torch.float32, 24),
                                           (torch.float64, 53)])
def test_random_on_floats_covers_zero_to_two_to_the_digits_inclusive(mode, dtype, digits):
    top = 2**digits
    t = torch.empty(N, dtype=dtype, device="tpu").random_().double().cpu()
    assert 0 <= t.min() < 0.1 * top and 0.9 * top < t.max() <= top
    t = torch.empty(N, dtype=dtype, device="tpu").random_(-top, None).double().cpu()
    assert -top <= t.min() < -0.8 * top and 0.8 * top < t.max() <= top


def test_random_from_to_on_floats_rounds_its_bounds_inward_like_cpu(mode):
    # 65503 rounds to 65504 in half: CPU moves `to` down to 65472, so no draw reaches 65504
    with pytest.warns(UserWarning, match="out of bounds"):  # past 2**11, as on CPU
        t = torch.empty(N, dtype=torch.float16, device="tpu").random_(65000, 65504).double().cpu()
    assert 65000 <= t.min() and t.max() <= 65472
    t = torch.empty(N, dtype=torch.bfloat16, device="tpu").random_(-42, 42).double().cpu()
    assert -42 <= t.min() and t.max() < 42


def test_random_precision_warning_is_given_at_every_call_and_names_the_callers_line():
    t = torch.empty(10, device="tpu")
    for _ in range(2):  # the second call runs a cached executable: it warns all the same
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            t.random_(0, 2**30)
        assert [str(w.message).split(".")[0] for w in caught] == ["to - 1 is out of bounds [-(2^24), 2^24]"]
        assert caught[0].filename == __file__
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        t.random_(-2**24, 2**24 + 1)  # the edge of the exact range: no warning


def test_random_draws_are_reproducible_across_eager_modes():
    draws = {}
    for m in ("debug", "strict", "fused"):
        with torchtpu_lab.eager_mode(m):
            torch.manual_seed(5)
            draws[m] = [torch.empty(50, dtype=torch.float16, device="tpu").random_(-2000, 2000).cpu(),
                        torch.empty(50, dtype=torch.bfloat16, device="tpu").random_().cpu(),
                        torch.randn(20, dtype=torch.complex64, device="tpu").cpu()]
    for m in ("strict", "fused"):
        for a, b in zip(draws["debug"], draws[m]):
            assert torch.equal(a, b), m


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_complex_draws_fill_both_parts_like_cpu(mode, dtype):
    z = torch.zeros(N, dtype=dtype, device="tpu")
    cases = {  # name -> (draws, mean and variance of each part on CPU)
        "randn": (torch.randn(N, dtype=dtype, device="tpu"), 0.0, 0.5),
        "randn_like": (torch.randn_like(z), 0.0, 0.5),
        "normal_": (z.clone().normal_(5.0, 2.0), 5.0, 2.0),
        "rand": (torch.rand(N, dtype=dtype, device="tpu"), 0.5, 1 / 12),
        "rand_like": (torch.rand_like(z), 0.5, 1 / 12),
        "uniform_": (z.clone().uniform_(5.0, 7.0), 6.0, 4 / 12),
    }
    for name, (draws, mean, var) in cases.items():
        assert draws.dtype == dtype, name
        for part in (draws.real.cpu().double(), draws.imag.cpu().double()):
            assert abs(part.mean() - mean) < 0.1 and abs(part.var() / var - 1) < 0.1, name


@pytest.mark.parametrize("dtype", [torch.float32, torch.complex64, torch.complex128])
def test_randn_into_out_equals_randn_of_the_same_seed(dtype):
    torch.manual_seed(123456)
    res1 = torch.randn(10, 10, dtype=dtype, device="tpu")
    res2 = torch.tensor([], dtype=dtype, device="tpu")
    torch.manual_seed(123456)
    torch.randn(10, 10, out=res2)
    assert torch.equal(res1.cpu(), res2.cpu())


@pytest.mark.parametrize("dtype, low, high", [
    (torch.float32, 5.0, 3.0), (torch.float32, -3e38, 3e38), (torch.float16, -1e5, 0.0), (torch.float64, 3.5, 2.25),
    (torch.complex64, 5.0, 3.0), (torch.int64, 0.0, 1.0),
])
def test_uniform_bounds_errors_are_cpus(mode, dtype, low, high):
    _raises_like_cpu(lambda t: t.uniform_(low, high), dtype)


def test_bernoulli_p_outside_zero_one_raises_like_cpu(mode):
    _raises_like_cpu(lambda t: t.bernoulli_(1.5))
    _raises_like_cpu(lambda t: torch.bernoulli(t, -0.5))


def test_normal_with_a_negative_std_element_raises_cpus_error():
    std = torch.tensor([1.0, -1.0], device="tpu")
    for mean in (0.0, torch.zeros(2, device="tpu")):
        with pytest.raises(RuntimeError, match="normal expects all elements of std >= 0.0"):
            torch.normal(mean, std).cpu()  # a data-dependent check: raised at the read, naming the call's line
    assert torch.normal(0.0, std.abs()).cpu().shape == (2,)


def test_randperm_into_out_draws_from_the_tpu_generator():
    for dtype in (torch.int64, torch.float32):
        with torch.random.fork_rng(devices=["tpu"], device_type="tpu"):  # CUDA by default in torch 2.11
            res1 = torch.randperm(50, dtype=dtype, device="tpu")
        res2 = torch.empty(0, dtype=dtype, device="tpu")
        assert torch.randperm(50, out=res2, dtype=dtype, device="tpu") is res2
        assert torch.equal(res1.cpu(), res2.cpu())


@pytest.mark.parametrize("dtype, fits, too_many", [(torch.uint8, 2**8, 2**8 + 1), (torch.int8, 128, 129),
                                                  (torch.float16, 2**11 + 1, 2**11 + 2),
                                                  (torch.float32, 2**24 + 1, 2**24 + 2)])
def test_randperm_refuses_n_its_dtype_cannot_hold_like_cpu(dtype, fits, too_many):
    out = torch.empty(0, dtype=dtype, device="tpu")
    if fits < 2**12:
        torch.randperm(fits, out=out)
        assert out.shape == (fits,)
    for make in (lambda: torch.randperm(too_many, out=out), lambda: torch.randperm(too_many, dtype=dtype,
                                                                                    device="tpu")):
        with pytest.raises(RuntimeError) as tpu:
            make()
        with pytest.raises(RuntimeError) as cpu:
            torch.randperm(too_many, dtype=dtype)
        assert str(cpu.value) in str(tpu.value)


@pytest.mark.parametrize("fn", [
    lambda d: torch.rand(2, 0, dtype=torch.int32, device=d),
    lambda d: torch.rand(3, dtype=torch.bool, device=d),
    lambda d: torch.rand_like(torch.zeros(3, dtype=torch.int64, device=d)),
], ids=["rand_int_empty", "rand_bool", "rand_like_long"])
def test_uniform_draws_of_an_integer_dtype_are_refused_as_on_cpu(mode, fn):
    """PyTorch's meta kernel makes them; CPU's kernel has none (test_tensor_factories_empty)."""
    with pytest.raises(NotImplementedError) as cpu:
        fn("cpu")
    with pytest.raises(NotImplementedError) as tpu:
        fn("tpu")
    assert str(tpu.value) == str(cpu.value)


@pytest.mark.parametrize("probs, n, replacement", [
    ([1.0, 1.0], 3, False), ([1.0, 1.0], 0, True), ([1.0, 1.0], -1, False), ([[[1.0]]], 1, True), ([1, 1], 1, False),
], ids=["more_than_categories", "zero_samples", "negative_samples", "3d", "integer"])
def test_multinomial_argument_errors_are_cpus(mode, probs, n, replacement):
    """CPU's RuntimeErrors at the call: tpu drew from an integer input and for n <= 0, raised JAX's ValueError
    (top_k) for more samples than categories, and worded the rank check otherwise."""
    with pytest.raises(RuntimeError) as cpu:
        torch.tensor(probs).multinomial(n, replacement)
    with pytest.raises(RuntimeError) as tpu:
        torch.tensor(probs, device="tpu").multinomial(n, replacement)
    assert str(tpu.value) == str(cpu.value)


@pytest.mark.parametrize("replacement", [False, True])
def test_multinomial_of_a_row_of_zeros_raises_cpus_error(mode, replacement):
    """CPU refuses a distribution that sums to zero; tpu drew arbitrary indices from it."""
    probs = torch.tensor([[1.0, 2.0], [0.0, 0.0]], device="tpu")
    with pytest.raises(RuntimeError, match=r"invalid multinomial distribution \(sum of probabilities <= 0\)"):
        probs.multinomial(2, replacement).cpu()  # a data-dependent check: raised at the read
    assert probs[:1].multinomial(2, replacement).cpu().shape == (1, 2)


@pytest.mark.parametrize("fn, dtype", [
    (lambda t: t.log_normal_(1, -1), torch.float32), (lambda t: t.log_normal_(), torch.int64),
    (lambda t: t.exponential_(0), torch.float32), (lambda t: t.exponential_(), torch.int64),
    (lambda t: t.cauchy_(1, -1), torch.float32), (lambda t: t.cauchy_(), torch.int64),
    (lambda t: t.geometric_(2), torch.float32), (lambda t: t.normal_(0, -1), torch.float32),
    (lambda t: t.normal_(), torch.int64), (lambda t: t.log_normal_(), torch.bool),
], ids=["log_normal_std", "log_normal_int", "exponential_lambda", "exponential_int", "cauchy_sigma", "cauchy_int",
        "geometric_p", "normal_std", "normal_int", "log_normal_bool"])
def test_distribution_parameter_and_dtype_errors_are_cpus(mode, fn, dtype):
    """CPU's exception types and wording: tpu printed 'std=-1.0' for CPU's 'std=-1', named dtypes 'torch.int64'
    for 'Long', and raised RuntimeError where CPU has no integer kernel (NotImplementedError)."""
    with pytest.raises(Exception) as cpu:
        fn(torch.empty(5, dtype=dtype))
    with pytest.raises(type(cpu.value)) as tpu:
        fn(torch.empty(5, dtype=dtype, device="tpu"))
    assert str(tpu.value) == str(cpu.value)
