"""Odd corners of PyTorch semantics, on tpu vs the same code on CPU: layouts, empty and 0-dim tensors, integer
overflow and rounding, NaN, masks, indexing with repeats, dtype promotion, bfloat16."""

import functools
import re

import pytest
import torch

import torchtpu_lab  # noqa: F401
from compare import assert_same, raises_like_cpu, same_on_both_devices
from compare import same as _same

#: bitwise unless a test says ``exact=False``, and then this close
same = functools.partial(_same, rtol=1e-6, atol=1e-6)


# -------------------------------------------------------------------------------- non-contiguous, as_strided


def _base():
    return torch.arange(24, dtype=torch.float32).reshape(4, 6) * 0.5 - 3


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: x.t() + 1,
        lambda x: x[:, ::2] * x[:, 1::2],
        lambda x: x.t() @ x[:, :4],
        lambda x: x[::2].sum(1),
        lambda x: x.t().softmax(-1),
        lambda x: x.t().contiguous().view(-1),
        lambda x: x.t().reshape(-1),
        lambda x: x.unsqueeze(0).expand(3, 4, 6).sum(0),
        lambda x: x.view(2, 2, 6).permute(2, 0, 1).cumsum(0),
        lambda x: x[1:, 2:].flip(0),
        lambda x: torch.cat([x.t(), x[:, :4].t()], dim=0),
        lambda x: x.t()[1:4].clone(),
        lambda x: x.unfold(1, 3, 2),
        lambda x: x.diagonal(offset=1) * 2,
    ],
    ids=["t", "step_slices", "matmul_t", "step_rows_sum", "softmax_t", "contig_view", "reshape_t", "expand",
         "permute_cumsum", "slice_flip", "cat_t", "clone_slice", "unfold", "diagonal"],
)
def test_non_contiguous_inputs(fn):
    same(fn, _base())


def test_in_place_through_non_contiguous_view_updates_base():
    def fn(x):
        x[:, ::2].mul_(-2)
        x.t()[1].add_(100)  # column 1
        v = x[1:3, 1:5]
        v.copy_(torch.ones(4, 2, device=x.device).t())
        return x

    same(fn, _base())


def test_copy_into_transposed_destination():
    def fn(x, y):
        x.t().copy_(y)
        return x

    same(fn, torch.zeros(3, 5), torch.arange(15.0).reshape(5, 3))


@pytest.mark.parametrize(
    "size,stride,offset",
    [((2, 2), (1, 2), 0), ((3, 3), (1, 1), 0), ((2, 3), (3, 1), 5), ((4,), (0,), 2), ((3, 2), (2, 4), 1)],
    ids=["transpose_like", "overlapping", "offset", "stride0", "gapped"],
)
def test_as_strided(size, stride, offset):
    same(lambda x: x.as_strided(size, stride, offset) * 1, torch.arange(12.0))


def test_as_strided_on_a_contiguous_view_and_in_place():
    # A tpu view reports storage_offset() 0 and contiguous strides (documented in device/views.py, as on
    # PyTorch/XLA), and as_strided reads its offset relative to the view; code that derives the offset from the
    # tensor's own storage_offset(), as PyTorch's own code does, means the same thing on both devices.
    def fn(x):
        v = x[1:]  # a contiguous view
        a = v.as_strided((2, 2), (4, 1), v.storage_offset() + 1).clone()
        x.as_strided((2,), (5,), 0).fill_(-1.0)  # writes the diagonal of the 4x... layout
        return a, x

    same(fn, torch.arange(16.0).reshape(4, 4))


def test_as_strided_backward_overlapping():
    x = torch.arange(6.0, requires_grad=True)
    xt = x.detach().to("tpu").requires_grad_()
    for v in (x, xt):
        (v.as_strided((3, 3), (1, 1)) * torch.arange(9.0, device=v.device).view(3, 3)).sum().backward()
    assert_same(xt.grad, x.grad, exact=True)


# ----------------------------------------------------------------------------------------- empty, 0-dim


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: x + 1,
        lambda x: x.sum(),
        lambda x: x.sum(0),
        lambda x: x.sum(1),
        lambda x: x.prod(),
        lambda x: x.mean(),
        lambda x: x.mean(0),
        lambda x: x.amax(1),
        lambda x: x.max(1),
        lambda x: x.argmax(1),
        lambda x: x.std(0),
        lambda x: x.cumsum(0),
        lambda x: x.softmax(1),
        lambda x: x @ torch.ones(3, 4, device=x.device),
        lambda x: x.t() @ x,
        lambda x: torch.cat([x, torch.ones(2, 3, device=x.device)]),
        lambda x: x[x > 0],
        lambda x: x.nonzero(),
        lambda x: x.reshape(3, 0, 1).sum((0, 2)),
        lambda x: x.any(),
        lambda x: x.all(0),
        lambda x: x.norm(),
        lambda x: x.sort(0),
        lambda x: x.flatten().topk(0),
    ],
    ids=["add", "sum", "sum0", "sum1", "prod", "mean_nan", "mean0", "amax1", "max1", "argmax1", "std0",
         "cumsum", "softmax", "matmul", "matmul_k0", "cat", "mask", "nonzero", "reshape_sum", "any", "all0",
         "norm", "sort", "topk0"],
)
def test_zero_size(fn):
    same(fn, torch.empty(0, 3))


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: x.max(),
        lambda x: x.amax(0),
        lambda x: x.argmax(),
        lambda x: x.amin(-2),
        lambda x: x.argmin(0),
        lambda x: x.argmin(),
        lambda x: x.min(0),
        lambda x: x.max(0),
    ],
    ids=["max", "amax0", "argmax", "amin-2", "argmin0", "argmin", "min0", "max0"],
)
def test_zero_size_reduction_without_identity_raises(fn):
    """With CPU's exception type: amax/argmax's came from PyTorch's meta kernel (a RuntimeError), which runs
    before our lowering, until ``ops.registry.ARG_CHECKS`` checked their arguments first."""
    raises_like_cpu(fn, torch.empty(0, 3))


def test_zero_size_in_place_and_backward():
    def fn(x):
        x.add_(1).mul_(2)
        return x

    same(fn, torch.empty(0, 3))
    x = torch.empty(0, 3, device="tpu", requires_grad=True)
    (x * 2).sum().backward()
    assert x.grad.shape == (0, 3) and x.grad.device.type == "tpu"


@pytest.mark.parametrize(
    "fn",
    [
        lambda s: s * 2 + 1,
        lambda s: s + torch.arange(3.0, device=s.device),
        lambda s: s.exp(),
        lambda s: s.sum(),
        lambda s: s.unsqueeze(0),
        lambda s: s.reshape(1, 1),
        lambda s: s[None, None],
        lambda s: s[()],
        lambda s: s.max(0),
        lambda s: torch.stack([s, s]),
        lambda s: s.expand(2, 3),
        lambda s: torch.where(s > 0, s, -s),
        lambda s: s.clone().add_(torch.ones((), device=s.device)),
    ],
    ids=["arith", "broadcast", "exp", "sum", "unsqueeze", "reshape", "none_index", "empty_index", "max_dim0",
         "stack", "expand", "where", "inplace"],
)
def test_zero_dim(fn):
    same(fn, torch.tensor(-1.5))


def test_zero_dim_item_and_python_conversions():
    s = torch.tensor(7, device="tpu")
    assert s.item() == 7 and int(s) == 7 and float(s * 0.5) == 3.5 and bool(s)
    assert s.dim() == 0 and s.shape == () and s.numel() == 1
    x = torch.arange(10, device="tpu")
    assert x[s].item() == 7  # a 0-dim tpu tensor as an index
    assert x[torch.tensor(3)].item() == 3  # a 0-dim CPU tensor as an index


def test_cpu_zero_dim_tensor_combines_with_tpu_tensor():
    # as on CUDA: a 0-dim CPU tensor is a scalar and may meet a tensor on another device
    same(lambda x: x * torch.tensor(2.5) + torch.tensor(1), torch.arange(4.0))


def test_cpu_non_scalar_tensor_does_not_combine_with_tpu_tensor():
    with pytest.raises(RuntimeError, match="device"):
        (torch.ones(3, device="tpu") + torch.ones(3)).cpu()


# ------------------------------------------------------------------------------------ in-place broadcasting


def test_in_place_broadcast_into_unsqueezed_view():
    def fn(x, y):
        x[:, None] += y  # (3, 1, 4) += (4,)
        x.unsqueeze(1).mul_(torch.tensor([[[2.0]]], device=x.device))
        return x

    same(fn, torch.arange(12.0).reshape(3, 4), torch.arange(4.0))


def test_in_place_broadcast_along_dim():
    def fn(x, col, row):
        x += col  # (3, 4) += (3, 1)
        x -= row  # (3, 4) -= (4,)
        x[1:] *= row[:1]
        return x

    same(fn, torch.ones(3, 4), torch.arange(3.0)[:, None], torch.arange(4.0))


def test_in_place_that_would_need_a_larger_output_raises():
    def fn(x, y):
        x += y
        return x

    raises_like_cpu(fn, torch.zeros(3, 1), torch.ones(3, 4))


# ---------------------------------------------------------------------------------------- integer semantics


def test_int8_wraparound():
    x = torch.tensor([127, -128, 100, -100, 0], dtype=torch.int8)
    same(lambda a: a + 1, x)
    same(lambda a: a - 1, x)
    same(lambda a: a * 3, x)
    same(lambda a: -a, x)
    same(lambda a: a.abs(), x)  # abs(-128) is -128
    same(lambda a: a * a, x)
    same(lambda a: a << 1, x)


def test_uint8_wraparound():
    same(lambda a: a - 1, torch.tensor([0, 1, 255], dtype=torch.uint8))
    same(lambda a: a + a, torch.tensor([0, 200, 255], dtype=torch.uint8))


@pytest.mark.parametrize("dtype,big", [(torch.int32, 2**31 - 1), (torch.int64, 2**63 - 1)])
def test_int32_int64_wraparound(dtype, big):
    x = torch.tensor([big, -big - 1, 3], dtype=dtype)
    same(lambda a: a + 1, x)
    same(lambda a: a - 2, x)
    same(lambda a: a * 2, x)
    same(lambda a: a.sum(), x)
    same(lambda a: a.cumsum(0), x)


def test_int32_pow_overflow_and_large_int64_pow():
    same(lambda a: a**20, torch.tensor([3, -3, 2], dtype=torch.int32))
    same(lambda a: a**40, torch.tensor([2, 3], dtype=torch.int64))


def test_int_reductions_accumulate_in_int64():
    x = torch.full((300,), 100, dtype=torch.int8)
    same(lambda a: a.sum(), x)  # int8 sum is int64: 30000, no wraparound
    same(lambda a: a.cumsum(0), x)
    same(lambda a: a.prod(), torch.tensor([100, 100, 100], dtype=torch.int16))
    same(lambda a: a.sum(dtype=torch.int8), x)  # explicitly int8: wraps


_NUM = torch.tensor([7, -7, 7, -7, 0, 5, -5, 6])
_DEN = torch.tensor([2, 2, -2, -2, 3, 5, 3, -4])


@pytest.mark.parametrize(
    "fn",
    [
        lambda a, b: a // b,
        lambda a, b: torch.div(a, b, rounding_mode="floor"),
        lambda a, b: torch.div(a, b, rounding_mode="trunc"),
        lambda a, b: a / b,
        lambda a, b: a % b,
        lambda a, b: torch.remainder(a, b),
        lambda a, b: torch.fmod(a, b),
        lambda a, b: a // 3,
        lambda a, b: a % -3,
        lambda a, b: torch.fmod(a, -3),
        lambda a, b: -7 // b,
        lambda a, b: 7 % b,
    ],
    ids=["floordiv", "div_floor", "div_trunc", "truediv", "mod", "remainder", "fmod", "floordiv_scalar",
         "mod_neg_scalar", "fmod_neg_scalar", "rfloordiv", "rmod"],
)
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int8, torch.float32], ids=str)
def test_division_rounding_and_remainder_signs(fn, dtype):
    same(fn, _NUM.to(dtype), _DEN.to(dtype))


def test_float_remainder_signs_and_floor_division():
    a = torch.tensor([5.5, -5.5, 5.5, -5.5, -0.0, 1e-8])
    b = torch.tensor([2.0, 2.0, -2.0, -2.0, 3.0, -1.0])
    same(lambda x, y: torch.remainder(x, y), a, b)
    same(lambda x, y: torch.fmod(x, y), a, b)
    same(lambda x, y: x // y, a, b)


def test_float_to_int_conversion_truncates():
    x = torch.tensor([-1.7, -0.5, 0.5, 1.5, 2.7, -2.5])
    for dtype in (torch.int8, torch.int32, torch.int64):
        same(lambda a: a.to(dtype), x)
    same(lambda a: a.round(), x)  # half to even


@pytest.mark.parametrize("mode", ["fused", "strict"])
@pytest.mark.parametrize("source", [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64])
def test_float8_e4m3fn_saturates_as_cpu_does(source, mode):
    """float8_e4m3fn has no infinity: CPU's conversion saturates at ±448 (infinities too), where XLA gave NaN for
    every value past 464; NaN stays NaN. float8_e5m2 overflows to infinity on both."""
    x = torch.cat([torch.linspace(-600, 600, 2401), torch.tensor([448.0, 449.0, 463.0, 464.0, 465.0, 57344.0, 1e6,
                                                                   float("inf"), float("-inf"), float("nan")])])
    x = x.nan_to_num(0.0, 1e6, -1e6).to(source) if not source.is_floating_point else x.to(source)
    with torchtpu_lab.eager_mode(mode):
        for target in (torch.float8_e4m3fn, torch.float8_e5m2):
            want, got = x.to(target).float(), x.to("tpu").to(target).cpu().float()
            assert torch.equal(want.nan_to_num(7.0), got.nan_to_num(7.0)), target



@pytest.mark.parametrize("mode", ["fused", "strict"])
@pytest.mark.parametrize("target", [torch.float8_e4m3fnuz, torch.float8_e5m2fnuz], ids=str)
def test_float8_fnuz_dtypes_hold_and_convert_as_cpu(target, mode):
    """The ``fnuz`` float8 formats (no infinity; NaN is the negative zero's bits) were refused as unsupported.
    Conversions into them from every float width give CPU's bits, overflow and infinities included, and their
    values read back and compute as CPU's."""
    x = torch.cat([torch.linspace(-70000, 70000, 4001),
                   torch.tensor([0.0, -0.0, 1e-9, 239.0, 240.0, 250.0, float("inf"), float("-inf"), float("nan")])])
    with torchtpu_lab.eager_mode(mode):
        for source in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
            want, got = x.to(source).to(target), x.to(source).to("tpu").to(target)
            assert got.dtype == target
            assert torch.equal(got.cpu().view(torch.uint8), want.view(torch.uint8)), source
        moved = want.to("tpu")
        assert torch.equal(moved.cpu().view(torch.uint8), want.view(torch.uint8))
        assert torch.equal((moved.float() * 2).cpu().nan_to_num(7.0), (want.float() * 2).nan_to_num(7.0))


# ------------------------------------------------------------------------------------------------ ranges


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8])
@pytest.mark.parametrize("start,end,steps", [(1, 127, 50), (1, 127, 25), (-5, 20, 96), (84, 0, 207), (0, 255, 7)])
def test_integer_linspace_rounds_as_cpu(dtype, start, end, steps):
    """CPU divides the span by ``steps - 1`` exactly; XLA's reciprocal of the constant put element 21 of
    ``linspace(1, 127, 50)`` at 54 where CPU (and NumPy) have 55."""
    if dtype == torch.int8 and max(start, end) > 127:
        end = 127
    same_on_both_devices(lambda d: torch.linspace(start, end, steps, dtype=dtype, device=d), exact=True)



@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16], ids=str)
def test_kaiser_window_is_cpus(dtype):
    """PyTorch's kernel of ``kaiser_window`` is a per-device stub: on tpu every length above 1 hit an internal
    assert. Every overload (default ``beta`` 12, ``periodic``) gives CPU's window; half types bit for bit."""
    calls = [lambda d, n: torch.kaiser_window(n, dtype=dtype, device=d),
             lambda d, n: torch.kaiser_window(n, False, dtype=dtype, device=d),
             lambda d, n: torch.kaiser_window(n, True, 0.5, dtype=dtype, device=d),
             lambda d, n: torch.kaiser_window(n, False, 30.0, dtype=dtype, device=d)]
    for call in calls:
        for n in (0, 1, 2, 7, 100):
            want, got = call("cpu", n), call("tpu", n)
            if dtype in (torch.float32, torch.float64):
                assert_same(got, want, rtol=2e-5, atol=1e-7)
            else:
                assert_same(got, want, exact=True)


@pytest.mark.parametrize("steps", [1, 2, 5, 257])
@pytest.mark.parametrize("fn", [torch.linspace, torch.logspace], ids=["linspace", "logspace"])
def test_complex_ends_give_complex_linspace_and_logspace(fn, steps):
    """With no dtype, complex ends make a complex result; its imaginary parts were dropped (computed in float32,
    then cast)."""
    start, end = complex(0.3, -0.28), complex(8.1, 0.5)
    same_on_both_devices(lambda d: fn(start, end, steps, device=d), rtol=2e-6, atol=1e-5)
    same_on_both_devices(lambda d: fn(start, end, steps, dtype=torch.complex128, device=d), rtol=1e-12, atol=0)


# ------------------------------------------------------------------------------------------ NaN propagation


_NAN = float("nan")


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: x.max(),
        lambda x: x.min(),
        lambda x: x.sum(),
        lambda x: x.mean(),
        lambda x: x.argmax(),
        lambda x: x.argmin(),
        lambda x: x.max(1),
        lambda x: x.min(1),
        lambda x: x.argmax(1),
        lambda x: x.amax(0),
        lambda x: x.amin(1),
        lambda x: x.aminmax(),
        lambda x: x.cummax(1),
        lambda x: x[:2].cummin(1),
        lambda x: x.cummin(1),
        lambda x: x.nansum(),
        lambda x: x.nanmean(1),
        lambda x: x.sort(dim=1, stable=True),
        lambda x: x[:2].topk(2, 1),  # not row 2: the order of tied NaNs in topk is unspecified
        lambda x: torch.maximum(x, x.flip(1)),
        lambda x: torch.fmax(x, x.flip(1)),
        lambda x: torch.fmin(x, x.flip(0)),
        lambda x: x.clamp(-1, 1),
        lambda x: x.relu(),
        lambda x: x.softmax(1),
        lambda x: x == x,
        lambda x: x.isnan().nonzero(),
        lambda x: x.nan_to_num(0.0, 9.0, -9.0),
    ],
    ids=["max", "min", "sum", "mean", "argmax", "argmin", "max1", "min1", "argmax1", "amax0", "amin1", "aminmax",
         "cummax", "cummin", "cummin_nans", "nansum", "nanmean", "sort", "topk", "maximum", "fmax", "fmin", "clamp",
         "relu", "softmax", "eq_self", "isnan", "nan_to_num"],
)
def test_nan_propagation(fn):
    x = torch.tensor([[1.0, _NAN, 3.0, -2.0], [0.5, 4.0, -1.0, 2.0], [_NAN, _NAN, float("inf"), -float("inf")]])
    same(fn, x)


# ------------------------------------------------------------------------------------- where, masks, indexing


@pytest.mark.parametrize(
    "fn",
    [
        lambda c, x, i: torch.where(c, x, 0.0),
        lambda c, x, i: torch.where(c, 1.0, x),
        lambda c, x, i: torch.where(c, 1, 0),
        lambda c, x, i: torch.where(c, 2.5, -1),
        lambda c, x, i: torch.where(c, i, 7),
        lambda c, x, i: torch.where(c, i, 0.5),
        lambda c, x, i: torch.where(c, x.half(), 1.0),
        lambda c, x, i: torch.where(c, True, False),
        lambda c, x, i: torch.where(c, x, i),
        lambda c, x, i: torch.where(c[:, None], x, x[:1]),
        lambda c, x, i: torch.where(c),
        lambda c, x, i: x.masked_fill(c, -1.5),
        lambda c, x, i: i.masked_fill(c, 2.9),
    ],
    ids=["x_0.0", "1.0_x", "1_0", "2.5_-1", "int_7", "int_0.5", "half_1.0", "bools", "float_int", "broadcast",
         "one_arg", "masked_fill", "int_masked_fill_float"],
)
def test_where_with_python_scalars(fn):
    c = torch.tensor([True, False, True, False])
    same(fn, c, torch.tensor([1.5, -2.0, 3.0, 4.0]), torch.tensor([1, 2, 3, 4], dtype=torch.int32))


def _mask_data():
    x = torch.arange(12.0).reshape(3, 4) - 5
    return x, x > 0


@pytest.mark.parametrize(
    "fn",
    [
        lambda x, m: x[m],
        lambda x, m: x[~m.any(1)],
        lambda x, m: x[m[:, 0]],
        lambda x, m: x[:, m[0] | True],
        lambda x, m: x[m & False],
        lambda x, m: x.masked_select(m),
        lambda x, m: x.unsqueeze(0).expand(2, 3, 4)[m.expand(2, 3, 4)],
        lambda x, m: x[m].sum() + x[m].numel(),
    ],
    ids=["read", "row_mask", "mask_dim0", "all_true_cols", "all_false", "masked_select", "expanded", "then_reduce"],
)
def test_boolean_mask_read(fn):
    same(fn, *_mask_data())


@pytest.mark.parametrize(
    "fn",
    [
        lambda x, m: x.__setitem__(m, 0),
        lambda x, m: x.__setitem__(m, torch.arange(float(m.sum()), device=x.device)),
        lambda x, m: x.__setitem__(m[:, 0], torch.tensor([9.0, 8.0, 7.0, 6.0], device=x.device)),
        lambda x, m: x.__setitem__(m & False, 1.0),
        lambda x, m: x.masked_fill_(m, 3.0),
        lambda x, m: x.masked_scatter_(m, torch.arange(12.0, device=x.device) * -1),
    ],
    ids=["zero", "values", "rows", "none", "masked_fill_", "masked_scatter_"],
)
def test_boolean_mask_write(fn):
    def run(x, m):
        fn(x, m)
        return x

    same(run, *_mask_data())


@pytest.mark.parametrize("mask_dtype", [torch.uint8, torch.int64])
@pytest.mark.parametrize(
    "fn",
    [
        lambda x, m: x.masked_select(m),
        lambda x, m: x.masked_fill(m, 3.0),
        lambda x, m: x.masked_fill(m, torch.tensor(3.0, device=x.device)),
        lambda x, m: x.masked_scatter(m, x * -1),
    ],
    ids=["masked_select", "masked_fill", "masked_fill_tensor", "masked_scatter"],
)
def test_non_bool_mask_raises_like_cpu(fn, mask_dtype):
    """CPU refuses a mask that is not bool; tpu took a uint8 mask as numbers (masked_select read 12 elements, as
    integer indices) or worded the error otherwise."""
    x, m = _mask_data()
    error = raises_like_cpu(fn, x, m.to(mask_dtype))
    with pytest.raises(RuntimeError) as on_cpu:
        fn(x, m.to(mask_dtype))
    assert str(error) == str(on_cpu.value)


@pytest.mark.parametrize("source", [torch.arange(2.0), torch.empty(0)], ids=["short", "empty"])
def test_masked_scatter_with_too_few_source_elements_raises(source):
    """CPU raises; tpu repeated the last source element into the remaining masked places (a silent wrong answer)."""
    x, m = _mask_data()
    error = raises_like_cpu(lambda x, m, s: x.masked_scatter_(m, s), x, m, source)
    assert "Number of elements of source < number of ones in mask" in str(error)


def test_boolean_mask_in_place_add_and_backward():
    def fn(x, m):
        x[m] += 1
        return x

    same(fn, *_mask_data())
    x, m = _mask_data()
    x.requires_grad_()
    xt = x.detach().to("tpu").requires_grad_()
    for v, mm in ((x, m), (xt, m.to("tpu"))):
        (v[mm] * torch.arange(float(m.sum()), device=v.device)).sum().backward()
    assert_same(xt.grad, x.grad, exact=True)


def test_index_put_accumulate_with_repeated_indices():
    idx = torch.tensor([0, 2, 0, 0, 4, 2])
    vals = torch.tensor([1.0, 10.0, 100.0, 1000.0, 0.5, -10.0])
    same(lambda x, i, v: x.index_put_((i,), v, accumulate=True), torch.zeros(5), idx, vals)
    same(lambda x, i, v: x.index_put((i,), v, accumulate=True), torch.ones(5), idx, vals)
    same(lambda x, i, v: x.index_put_((i,), v[:1], accumulate=True), torch.zeros(5), idx, vals)  # broadcast
    rows, cols = torch.tensor([0, 1, 0, 0]), torch.tensor([2, 0, 2, 2])
    same(lambda x, r, c: x.index_put_((r, c), torch.ones(4, device=x.device), accumulate=True),
         torch.zeros(2, 3), rows, cols)
    same(lambda x, r: x.index_put_((r,), torch.ones(4, 3, device=x.device), accumulate=True), torch.zeros(2, 3),
         rows)
    same(lambda x, i: x.index_put_((i,), torch.tensor([1, 2, 3, 4, 5, 6], device=x.device), accumulate=True),
         torch.zeros(5, dtype=torch.int64), idx)


def test_repeated_indices_without_accumulate():
    def fn(x, i):
        x[i] += 1  # read-modify-write: a repeated index is incremented once, not twice
        return x

    same(fn, torch.zeros(5), torch.tensor([1, 1, 3, 1]))
    same(lambda x, i: x.index_put_((i,), torch.tensor(7.0, device=x.device)), torch.zeros(5), torch.tensor([2, 2]))


def test_index_add_and_scatter_add_with_repeats():
    idx = torch.tensor([0, 2, 0, 0, 1])
    src = torch.arange(10.0).reshape(5, 2)
    same(lambda x, i, s: x.index_add(0, i, s, alpha=2), torch.ones(3, 2), idx, src)
    same(lambda x, i, s: x.scatter_add(0, i[:, None].expand(5, 2), s), torch.zeros(3, 2), idx, src)
    same(lambda x, i, s: x.scatter_reduce(0, i[:, None].expand(5, 2), s, "amax", include_self=False),
         torch.zeros(3, 2), idx, src)


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: x[[0, 2]],
        lambda x: x[[0, 2]][:, [1, 1, 0]],
        lambda x: x[torch.tensor([[0, 1], [2, 2]], device=x.device)],
        lambda x: x[torch.tensor([0, 2], device=x.device), torch.tensor([3, 1], device=x.device)],
        lambda x: x[torch.tensor([[0], [2]], device=x.device), torch.tensor([1, 3], device=x.device)],
        lambda x: x[:, torch.tensor([-1, 0], device=x.device)],
        lambda x: x[..., torch.tensor([3, 3], device=x.device)],
        lambda x: x[1:, torch.tensor([0, 2], device=x.device)],
        lambda x: x[torch.tensor([0, 2])],  # a CPU index tensor, accepted as on CUDA
        lambda x: x[None, [1], 2:],
    ],
    ids=["list", "list_list", "2d_index", "pairwise", "broadcast_pairs", "negative", "ellipsis", "slice_then_adv",
         "cpu_index", "none_list_slice"],
)
def test_advanced_indexing(fn):
    same(fn, torch.arange(12.0).reshape(3, 4))


# ------------------------------------------------------------------------------------------- dtype promotion


_PROMOTION_VALUES = {
    torch.bool: [True, False, True],
    torch.uint8: [0, 200, 7],
    torch.int8: [-3, 0, 100],
    torch.int16: [-300, 2, 5],
    torch.int32: [7, -9, 100000],
    torch.int64: [2**40, -5, 3],
    torch.float16: [0.5, -1.25, 3.0],
    torch.bfloat16: [0.5, -1.25, 3.0],
    torch.float32: [1.5, -2.5, 1e-3],
    torch.float64: [1.0 / 3, -2.0, 1e10],
}
_PAIRS = [
    (torch.int32, torch.float32), (torch.int64, torch.float16), (torch.bool, torch.int8), (torch.uint8, torch.int8),
    (torch.int8, torch.int16), (torch.bool, torch.bool), (torch.bool, torch.float32), (torch.float16, torch.bfloat16),
    (torch.float32, torch.float64), (torch.int64, torch.bfloat16), (torch.uint8, torch.bool),
]


def _pair_id(p):
    return f"{p[0]}-{p[1]}".replace("torch.", "")


def _pair_tensors(pair):
    return [torch.tensor(_PROMOTION_VALUES[d], dtype=d) for d in pair]


@pytest.mark.parametrize(
    "pair,op",
    [(p, op) for p in _PAIRS for op in ("add", "mul", "sub", "div", "lt", "maximum")
     if not (op == "sub" and torch.bool in p)],
    ids=lambda v: _pair_id(v) if isinstance(v, tuple) else v,
)
def test_binary_promotion(pair, op):
    same(getattr(torch, op), *_pair_tensors(pair))


def test_sub_of_bools_raises():
    raises_like_cpu(torch.sub, *_pair_tensors((torch.bool, torch.bool)))


@pytest.mark.parametrize("pair", [p for p in _PAIRS if torch.bool in p and p != (torch.bool, torch.bool)],
                         ids=_pair_id)
def test_sub_with_one_bool_operand_raises(pair):
    raises_like_cpu(torch.sub, *_pair_tensors(pair))


@pytest.mark.parametrize(
    "fn",
    [
        lambda i, f, b: i + 1.5,
        lambda i, f, b: i * True,
        lambda i, f, b: b + 1,
        lambda i, f, b: b * 2.5,
        lambda i, f, b: i / 2,
        lambda i, f, b: i + torch.tensor(2.5, dtype=torch.float64, device=i.device),
        lambda i, f, b: i + torch.tensor(5, dtype=torch.int64, device=i.device),
        lambda i, f, b: f.half() + torch.tensor(1.0, device=f.device),
        lambda i, f, b: f + torch.tensor(1.0, dtype=torch.float64, device=f.device),
        lambda i, f, b: i.to(torch.uint8) + torch.tensor(-1, device=i.device),
        lambda i, f, b: i.to(torch.int8) * 1000,
        lambda i, f, b: b.sum(),
        lambda i, f, b: b.cumsum(0),
        lambda i, f, b: i.to(torch.int16).mean(dtype=torch.float32),
        lambda i, f, b: torch.tensor(3, device=i.device) * f.half(),
        lambda i, f, b: f ** 2,
        lambda i, f, b: i ** 2.0,
        lambda i, f, b: 2 ** i,
        lambda i, f, b: i.float().pow(torch.tensor(2, device=i.device)),
        lambda i, f, b: torch.ones(3, dtype=torch.float16, device=i.device).add_(i),
    ],
    ids=["int+float", "int*True", "bool+1", "bool*2.5", "int/int", "int+f64_0dim", "int32+i64_0dim",
         "half+f32_0dim", "f32+f64_0dim", "u8+neg_0dim", "int8*1000", "bool_sum", "bool_cumsum", "int_mean_dtype",
         "i64_0dim*half", "f**2", "int**2.0", "2**int", "pow_0dim", "half_add_int_inplace"],
)
def test_scalar_and_zero_dim_promotion(fn):
    same(fn, torch.tensor([1, -2, 3], dtype=torch.int32), torch.tensor([0.5, -1.5, 2.0]),
         torch.tensor([True, False, True]))


def test_in_place_that_cannot_hold_the_promoted_type_raises():
    raises_like_cpu(lambda i: i.add_(1.5), torch.tensor([1, 2, 3]))
    raises_like_cpu(lambda b: b.mul_(2), torch.tensor([True, False]))


# ------------------------------------------------------------------------------------------------- bfloat16


_BF_A = torch.tensor([1.0, -2.5, 3.140625, 1e-3, 65504.0, -0.0, 1e30, 7.0]).bfloat16()
_BF_B = torch.tensor([0.3, 0.7, -1.1, 3.0, 2.0, 5.0, 1e10, 7.0]).bfloat16()


@pytest.mark.parametrize(
    "fn",
    [
        lambda a, b: a + b,
        lambda a, b: a - b,
        lambda a, b: a * b,
        lambda a, b: a / b,
        lambda a, b: -a,
        lambda a, b: a.abs(),
        lambda a, b: a + 1.1,
        lambda a, b: a * 3,
        lambda a, b: a + b.float(),
        lambda a, b: a.float(),
        lambda a, b: b.float().mul(1.0001).bfloat16(),  # float32 -> bf16 rounds to nearest even
        lambda a, b: a[:6].to(torch.int32),  # in range: out-of-range float->int conversion is undefined
        lambda a, b: a > b,
        lambda a, b: torch.maximum(a, b),
        lambda a, b: a.sqrt(),
    ],
    ids=["add", "sub", "mul", "div", "neg", "abs", "add_py_float", "mul_py_int", "add_f32", "to_f32", "from_f32",
         "to_int", "gt", "maximum", "sqrt_nan"],
)
def test_bfloat16_elementwise_bitwise(fn):
    same(fn, _BF_A, _BF_B)


@pytest.mark.parametrize(
    "fn",
    [lambda x: x.sum(), lambda x: x.mean(1), lambda x: x @ x.t(), lambda x: x.softmax(-1), lambda x: x.exp()],
    ids=["sum", "mean", "matmul", "softmax", "exp"],
)
def test_bfloat16_reductions_and_matmul(fn):
    # accumulation order and transcendental implementations may differ by one bf16 ulp (2**-8 relative)
    torch.manual_seed(0)
    same(fn, torch.randn(8, 16).bfloat16(), exact=False, rtol=2**-7, atol=1e-2)


def test_rrelu_with_noise_honours_its_generator():
    """An explicit generator (a CPU one: a tpu ``torch.Generator`` cannot be made) draws the noise: identically
    seeded generators give identical noise, and the values are CPU's (the k-th ``x <= 0`` gets the k-th draw)."""
    torch.manual_seed(0)
    x = torch.randn(6, 7)
    x[0, :3] = 0.0  # ``x <= 0`` draws too
    runs = []
    for dev in ("cpu", "tpu", "tpu"):
        noise = torch.empty_like(x, device=dev)
        out = torch.ops.aten.rrelu_with_noise(x.to(dev), noise, 0.1, 0.3, True, torch.Generator().manual_seed(3))
        runs.append((out, noise))
    assert_same(runs[1], runs[0], exact=True)
    assert_same(runs[2], runs[0], exact=True)
    other = torch.empty_like(x, device="tpu")
    torch.ops.aten.rrelu_with_noise(x.to("tpu"), other, 0.1, 0.3, True, torch.Generator().manual_seed(4))
    assert not torch.equal(other.cpu(), runs[0][1])
    # without a generator the device stream draws: noise in [lower, upper] where x <= 0, 1 elsewhere
    noise = torch.empty_like(x, device="tpu")
    torch.ops.aten.rrelu_with_noise(x.to("tpu"), noise, 0.1, 0.3, True)
    n = noise.cpu()
    assert torch.all(torch.where(x <= 0, (n >= 0.1) & (n <= 0.3), n == 1))


def _grad_through(forward):
    def fn(x):
        a = x.clone().requires_grad_()
        forward(a.clone()).backward(torch.ones_like(x))
        return a.grad

    return fn


_IN_PLACE_ACTIVATIONS = {
    "elu_": lambda a, s: torch.nn.functional.elu_(a, alpha=s), "celu_": lambda a, s: torch.nn.functional.celu_(a, s),
    "leaky_relu_": torch.nn.functional.leaky_relu_}


@pytest.mark.parametrize("name", list(_IN_PLACE_ACTIVATIONS))
def test_in_place_activation_backward_refuses_a_negative_slope(name):
    """The backward of an in-place activation sees only its result, which a negative slope makes ambiguous: CPU
    raises ('... please call out-of-place version instead.'); tpu had returned the gradient of ``x > 0`` (1)."""
    act = _IN_PLACE_ACTIVATIONS[name]
    x = torch.tensor([-1.0, 1.0, -0.5])
    error = raises_like_cpu(_grad_through(lambda a: act(a, -2.0)), x)
    assert "please call out-of-place version instead" in str(error)
    same(_grad_through(lambda a: act(a, 0.3)), x, exact=False)


def test_rrelu_backward_of_in_place_refuses_a_negative_slope():
    """``rrelu_``'s backward in evaluation mode is the leaky ReLU's, with the same check."""
    x, noise = torch.tensor([-1.0, 1.0]), torch.ones(2)
    error = raises_like_cpu(lambda g, v, n: torch.ops.aten.rrelu_with_noise_backward(g, v, n, -3.0, -1.0, False, True),
                            torch.ones(2), x, noise)
    assert "please call out-of-place version instead" in str(error)


@pytest.mark.parametrize("setting, expected", [("highest", "HIGHEST"), ("high", "HIGH"), ("medium", "DEFAULT")])
def test_matmul_precision_follows_torch_setting(setting, expected):
    """Lowerings read ``torch.get_float32_matmul_precision()`` when traced, not at import."""
    import jax
    import jax.numpy as jnp

    from torchtpu_lab.ops import LOWERINGS, precision

    a = jnp.ones((4, 4), jnp.float32)
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision(setting)
        assert precision.key() == setting
        assert precision.matmul_precision() == getattr(jax.lax.Precision, expected)
        mm = LOWERINGS[torch.ops.aten.mm.default].fn
        hlo = jax.jit(lambda x, y: mm(x, y)).lower(a, a).as_text()  # a fresh function: JAX's trace cache misses
    finally:
        torch.set_float32_matmul_precision(before)
    if expected == "DEFAULT":  # the default config is not printed
        assert "precision = [HIGH" not in hlo, hlo
    else:
        assert f"precision = [{expected}, {expected}]" in hlo, hlo


@pytest.mark.parametrize("fn", [torch.softmax, torch.log_softmax, lambda x, d: torch.sort(x, d).values],
                         ids=["softmax", "log_softmax", "sort"])
def test_a_dim_out_of_range_raises_instead_of_wrapping(fn):
    """PyTorch's meta kernels for these do not check the dim; the lowerings do (``registry.wrap_dim``: they used
    to wrap 2 to 0, a wrong answer)."""
    with pytest.raises(IndexError):
        fn(torch.ones(2, 9), 2)
    for dim in (2, -3):
        with pytest.raises((IndexError, RuntimeError), match="Dimension out of range"):
            fn(torch.ones(2, 9, device="tpu"), dim).cpu()
    torch.testing.assert_close(fn(torch.ones(2, 9, device="tpu"), -2).cpu(), fn(torch.ones(2, 9), -2))


def test_the_runtimes_broadcast_agrees_with_pytorchs_for_every_small_pair_of_shapes():
    """``sizes.broadcast`` stands in for ``torch.broadcast_shapes`` (30 us of Python per call) where attention and
    ``copy_`` ask it per call: the same shape for every pair that broadcasts, ``None`` for every pair that does
    not."""
    import itertools

    from torchtpu_lab.device import sizes

    shapes = [s for n in range(4) for s in itertools.product((1, 2, 3), repeat=n)]
    for a, b in itertools.product(shapes, shapes):
        try:
            want = tuple(torch.broadcast_shapes(a, b))
        except RuntimeError:
            want = None
        assert sizes.broadcast(a, b) == want, (a, b)


@pytest.mark.parametrize("dst, src", [((2, 3), (3,)), ((3,), (2, 3)), ((3,), (4,)), ((2, 3), (2, 1)),
                                      ((2, 3), (4, 1, 3)), ((4, 2, 3), (5, 3))])
def test_copy_into_a_tpu_tensor_broadcasts_or_raises_as_cpu_does(dst, src):
    values = torch.randn(src)
    cpu, tpu = torch.zeros(dst), torch.zeros(dst).to("tpu")
    try:
        cpu.copy_(values)
    except RuntimeError as e:
        with pytest.raises(RuntimeError, match=re.escape(str(e).split("\n")[0])):
            tpu.copy_(values.to("tpu"))
        return
    tpu.copy_(values.to("tpu"))
    torch.testing.assert_close(tpu.cpu(), cpu)


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_copy_variants_of_views_take_minus_one_in_their_size(mode):
    """``view_copy`` infers a ``-1`` and ``expand_copy`` keeps that dim, as their views do; a factory's ``-1``
    (``new_zeros``) still raises PyTorch's error."""
    x = torch.randn(5, 2, 5)
    with torchtpu_lab.eager_mode(mode):
        xt = x.to("tpu")
        assert torch.equal(torch.view_copy(xt, [5, -1, 5]).cpu(), torch.view_copy(x, [5, -1, 5]))
        col = torch.randn(1, 5, 1)
        assert torch.equal(torch.expand_copy(col.to("tpu"), [3, -1, 4]).cpu(), torch.expand_copy(col, [3, -1, 4]))
        with pytest.raises(RuntimeError, match="negative dimension -1"):
            xt.new_zeros([-1, 2])


@pytest.mark.parametrize("mode", ["fused", "strict"])
@pytest.mark.parametrize(
    "fn",
    [lambda x, y: torch.lerp(x, y, 0.5), lambda x, y: torch.lerp(x, y, y), lambda x, y: torch.frac(x),
     lambda x, y: torch.logcumsumexp(x, 0)],
    ids=["lerp_scalar", "lerp_tensor", "frac", "logcumsumexp"],
)
def test_an_op_with_no_integer_kernel_on_cpu_raises_its_error_on_integers(fn, mode):
    """PyTorch's CPU has no integer ``lerp``, ``frac`` or ``logcumsumexp``: NotImplementedError with its message,
    never a number (the promoted float computation gave ``lerp(1, 4, 0.5) == 2``), and the session stays usable."""
    x, y = torch.tensor([1, 2, 3]), torch.tensor([4, 5, 6])
    with torchtpu_lab.eager_mode(mode):
        error = raises_like_cpu(fn, x, y)
        cpu_message = re.escape(str(pytest.raises(NotImplementedError, fn, x, y).value))
        assert re.search(cpu_message, str(error)), error
        assert_same(fn(x.float().to("tpu"), y.float().to("tpu")), fn(x.float(), y.float()))


@pytest.mark.parametrize("shape, groups", [((0, 2), 1), ((0, 4, 3, 3), 2), ((2, 4, 0), 2)])
def test_group_norm_of_an_empty_batch_or_map(shape, groups):
    """Sizes are spelled out where a ``reshape`` of zero elements has no ``-1`` to infer (op_db's batch of 0
    raised ZeroDivisionError), and an empty map runs though the meta kernel divides by its size. (CPU's weight
    gradient over an empty map is NaN, ours the empty sum's 0: only the batch-of-0 cases compare it.)"""
    def run(device):
        x = torch.zeros(shape).to(device).requires_grad_()
        w = torch.ones(shape[1]).to(device).requires_grad_()
        y = torch.nn.functional.group_norm(x, groups, w, torch.zeros(shape[1]).to(device))
        y.sum().backward()
        return y.detach().cpu(), x.grad.cpu(), w.grad.cpu()

    try:
        want_all = run("cpu")
    except RuntimeError as e:  # from torch 2.14, CPU (and its meta kernel) refuse an empty map: so must we
        with pytest.raises(RuntimeError, match=re.escape(str(e))):
            run("tpu")
        return
    compared = 3 if shape[0] == 0 else 2
    for got, want in list(zip(run("tpu"), want_all))[:compared]:
        assert got.shape == want.shape and torch.equal(got, want)


@pytest.mark.filterwarnings("ignore:torchtpu_lab.*not lowered:RuntimeWarning")  # the fallback's, once a process
def test_a_nested_or_sparse_result_says_the_device_has_no_such_layout():
    """tpu tensors are dense: an op that only the CPU fallback runs and that returns a nested or sparse tensor
    raises NotImplementedError naming the op and the layout (it used to fail later, on a copy, naming neither),
    and nn.TransformerEncoder's nested fast path says how to avoid it; without it the encoder matches CPU."""
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(16, 4, 32, batch_first=True, dropout=0.0)
    x = torch.randn(2, 5, 16)
    pad = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
    nested = torch.nn.TransformerEncoder(layer, 2).eval().to("tpu")
    with torch.no_grad(), pytest.raises(NotImplementedError, match="_nested_tensor_from_mask returns a nested "
                                                                   "tensor.*enable_nested_tensor=False"):
        nested(x.to("tpu"), src_key_padding_mask=pad.to("tpu"))
    dense = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
    with torch.no_grad():
        want = dense(x, src_key_padding_mask=pad)
        got = dense.to("tpu")(x.to("tpu"), src_key_padding_mask=pad.to("tpu")).cpu()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    with pytest.raises(NotImplementedError, match="_to_sparse returns a torch.sparse_coo"):
        torch.ones(3, 3).to("tpu").to_sparse()


def test_a_tensor_imported_through_dlpack_says_it_has_no_device_values():
    """A DLPack capsule of a tpu tensor carries no values (they live in JAX arrays): the tensor PyTorch makes from
    it raises naming what happened and what to use, not an internal error (OpenReg's test_utils)."""
    x = torch.randn(2, 3, device="tpu")
    y = torch.from_dlpack(torch.utils.dlpack.to_dlpack(x))
    with pytest.raises(RuntimeError, match="torchtpu_lab did not make it.*from_dlpack.*cpu"):
        y.cpu()
    assert x.cpu().shape == (2, 3)  # the original is untouched


def test_flip_of_a_0d_tensor_and_accumulating_bools_into_a_bool_tensor():
    """PyTorch's device-generic tests: ``tensor(3.).flip(0)`` is itself (it failed at the next sync naming
    ``axis 0 is out of bounds``), and ``index_put_(accumulate=True)`` on bools is an or (JAX's add refused bool)."""

    def f(d):
        flipped = torch.tensor(3.0, device=d).flip(0)
        marks = torch.zeros(4, dtype=torch.bool, device=d)
        marks.index_put_((torch.tensor([0, 0, 2], device=d),), torch.tensor([True, False, False], device=d),
                         accumulate=True)
        return flipped, marks

    same_on_both_devices(f, exact=True)


# -------------------------------------------------------------------------------- the default dtype


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_a_changed_default_dtype_reaches_ops_already_compiled(mode):
    """``torch.set_default_dtype`` after an op ran: integer division, a float scalar on an integer tensor, a
    complex scalar and a factory without a dtype give the new default, as on CPU (they kept float32: the op
    signature lacked the default dtype), and the recompile says why."""
    def ops(dev):
        a = torch.tensor([1, 3], dtype=torch.int32, device=dev)
        return [a / a.flip(0), a.to(torch.uint8) + 5.5, 1j * torch.ones(2, device=dev),
                torch.arange(False, True, 0.5, device=dev), torch.ones(2, device=dev) / 3]

    before = torch.get_default_dtype()
    try:
        with torchtpu_lab.eager_mode(mode):
            for default in (torch.float32, torch.float64, torch.float32):
                torch.set_default_dtype(default)
                with torchtpu_lab.profile() as prof:
                    got = [t.cpu() for t in ops("tpu")]
                for g, want in zip(got, ops("cpu")):
                    assert g.dtype == want.dtype, (default, g.dtype, want.dtype)
                    assert torch.equal(g, want), (default, g, want)
                if default == torch.float64:
                    causes = [str(e.detail.get("cause")) for e in prof.compiles]
                    assert any("default dtype changed torch.float32 -> torch.float64" in c for c in causes), causes
    finally:
        torch.set_default_dtype(before)


@pytest.mark.parametrize("mode", ["strict", "fused"])
@pytest.mark.parametrize("key, values", [
    (lambda x: x[:, 0, 0] > -1, []),  # the report: a[mask] = torch.tensor([])
    (lambda x: x[:, 0, 0] > -1, [[1.0, 2.0, 3.0]]),
    (lambda x: (slice(None), torch.tensor([0, 1], device=x.device)), [[1.0, 2.0, 3.0]]),
    (lambda x: (torch.tensor([0, 2], device=x.device), slice(None), torch.tensor([1, 1], device=x.device)),
     [[1.0, 2.0]] * 4),  # non-adjacent indices: the indexed dims lead the result
])
def test_index_put_of_values_that_do_not_fit_raises_cpus_shape_mismatch(key, values, mode):
    """``a[mask] = wrong_shape`` raised JAX's ValueError ("Incompatible types for broadcasting"), which code and
    tests written against PyTorch do not catch; CPU's is a RuntimeError naming both shapes."""

    def f(x):
        x = x.clone()
        x[key(x)] = torch.tensor(values, device=x.device)
        return x

    with torchtpu_lab.eager_mode(mode):
        err = raises_like_cpu(f, torch.zeros(3, 4, 2))
    assert re.match(r"shape mismatch: value tensor of shape \[.*\] cannot be broadcast to indexing result", str(err))


# -------------------------------------------------------------------------------- dtypes a write must respect


def _error(fn, dev):
    try:
        fn(dev)
    except RuntimeError as e:  # raised at the call, not at a later read
        return str(e)
    return None


@pytest.mark.parametrize("mode", ["strict", "fused"])
@pytest.mark.parametrize("fn", [
    lambda d: torch.neg(torch.tensor(1.0, device=d), out=torch.empty(0, dtype=torch.float64, device=d)),
    lambda d: torch.floor(torch.tensor([1], dtype=torch.int32, device=d), out=torch.empty(0, device=d)),
    lambda d: torch.nonzero(torch.tensor([0, 1, 1], device=d), out=torch.empty([], device=d)),
    lambda d: torch.ones(5, 2, dtype=torch.double, device=d).__setitem__(
        (slice(None), [1]), torch.zeros(5, 1, dtype=torch.int, device=d)),
    lambda d: torch.ones(2, 2, device=d).index_fill_(1, torch.tensor([0], device=d), 1 + 1j),
    lambda d: torch.ones(2, 2, device=d).fill_(1 + 1j),
    lambda d: torch.full((2,), 2 - 1j, dtype=torch.float64, device=d),
], ids=["neg_out", "floor_out", "nonzero_out", "index_put", "index_fill", "fill", "full"])
def test_a_write_that_would_change_a_dtype_raises_cpus_error_at_the_call(fn, mode):
    """PyTorch refuses these where our kernels cast: an ``out=`` whose dtype the op's own rule refuses (``neg``
    wants it exact, ``nonzero`` wants Long; ``add`` would cast), values of another dtype put by index, and a
    complex number written into a real tensor (which kept its real part: a silent wrong value)."""
    with torchtpu_lab.eager_mode(mode):
        got = _error(fn, "tpu")
    assert got is not None and got == _error(fn, "cpu"), got


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_an_out_of_another_dtype_that_cpu_casts_into_still_casts(mode):
    """The other side of the rule: ``add`` and ``sin`` of an int write into a wider out, as on CPU."""
    def f(d):
        o1, o2 = torch.empty(0, dtype=torch.float64, device=d), torch.empty(0, dtype=torch.float64, device=d)
        torch.add(torch.tensor([1.5, 2.0], device=d), 1, out=o1)
        torch.sin(torch.tensor([1, 2], dtype=torch.int32, device=d), out=o2)
        return o1, o2

    with torchtpu_lab.eager_mode(mode):
        got = [t.cpu() for t in f("tpu")]
    for g, want in zip(got, f("cpu")):
        assert g.dtype == want.dtype == torch.float64
        torch.testing.assert_close(g, want)


@pytest.mark.parametrize("mode", ["strict", "fused"])
@pytest.mark.parametrize("fn", [
    lambda d: torch.empty(10, 0, device=d)[:, [0, 1]],
    lambda d: torch.zeros(5, 5, device=d)[[0, 1], [0, 1, 2]],
    lambda d: torch.tensor([1, 2, 3], device=d)[torch.tensor([], device=d)],
    lambda d: torch.ones(2, 3, 4, device=d)[False, [0, 1], ...],
    lambda d: torch.rand([], device=d).index_put([], torch.tensor([1.0], device=d), True),
], ids=["size0_dim", "no_broadcast", "float_index", "false_index", "0dim_values"])
def test_indexing_errors_are_cpus(fn, mode):
    """Type and text as on CPU (code catches IndexError, NumPy-style): they were JAX's TypeError from its gather,
    PyTorch's meta kernel's RuntimeError ("Attempting to broadcast"), or JAX's ValueError."""
    def error(dev):
        with pytest.raises(Exception) as e:
            fn(dev)
        return type(e.value), str(e.value)

    with torchtpu_lab.eager_mode(mode):
        assert error("tpu") == error("cpu")


@pytest.mark.parametrize("mode", ["strict", "fused"])
@pytest.mark.parametrize("fn", [
    lambda d: torch.floor(torch.tensor([1 + 1j], device=d)),
    lambda d: torch.round(torch.tensor([1.5 + 1j], device=d)),
    lambda d: torch.sign(torch.tensor([1 + 1j], device=d)),
    lambda d: torch.maximum(torch.tensor([1 + 1j], device=d), torch.tensor([2j], device=d)),
    lambda d: torch.atan2(torch.tensor([1 + 1j], device=d), torch.tensor([2j], device=d)),
    lambda d: torch.addcdiv(*[torch.tensor([1, 2], device=d)] * 3),
    lambda d: torch.add(torch.tensor([1, 2], device=d), torch.tensor([1, 2], device=d), alpha=1.5),
    lambda d: torch.tensor([1, 2], device=d).sub_(1, alpha=0.5),
    lambda d: torch.tensor([1.0, 2.0], device=d).clamp(),
    lambda d: torch.arange(8, device=d).reshape(2, 4).roll(shifts=(1,), dims=(1, 2)),
    lambda d: torch.arange(8, device=d).roll(shifts=(1, 2), dims=()),
    lambda d: torch.repeat_interleave(torch.arange(4, device=d).reshape(2, 2)),
    lambda d: torch.repeat_interleave(torch.tensor([1, 2, -1, 3], device=d)),
    lambda d: torch.complex(torch.tensor([1, 2], device=d), torch.tensor([3, 4], device=d)),
    lambda d: torch.complex(torch.tensor([1.0], device=d), torch.tensor([2.0], device=d, dtype=torch.float64)),
    lambda d: torch.polar(torch.tensor([1.0], device=d), torch.tensor([2.0], device=d, dtype=torch.float64)),
    lambda d: torch.arange(-5, float("nan"), device=d),
    lambda d: torch.arange(0.5, float("-inf"), -1, device=d),
    lambda d: torch.linspace(0, 1j, 5, dtype=torch.float32, device=d),
    lambda d: torch.logspace(0, 1j, 5, dtype=torch.float32, device=d),
    lambda d: torch.randint(6, (2,), dtype=torch.complex64, device=d),
    lambda d: torch.median(torch.zeros(2, 0, 4, device=d), dim=1),
    lambda d: torch.nanmedian(torch.zeros(2, 0, 4, device=d), 1),
    lambda d: torch.mode(torch.zeros(2, 0, 4, device=d), dim=1),
    lambda d: torch.kthvalue(torch.zeros(2, 0, 4, device=d), 1, dim=1),
    lambda d: torch.all(torch.ones(2, 2, device=d), 0, out=torch.empty(2, device=d)),
    lambda d: torch.sum(torch.ones(3, 3, 3, 3, device=d), dim=(0, -4)),
    lambda d: torch.std(torch.ones(3, 3, 3, 3, device=d), dim=(1, 2, 1)),
], ids=["floor", "round", "sign", "maximum", "atan2", "addcdiv_int", "add_alpha", "sub_alpha", "clamp_none",
        "roll_align", "roll_flat_align", "repeat_interleave_2d", "repeat_interleave_negative", "complex_int",
        "complex_mixed", "polar_mixed", "arange_nan", "arange_inf", "linspace_complex_into_real",
        "logspace_complex_into_real", "randint_complex", "median_empty_dim", "nanmedian_empty_dim", "mode_empty_dim",
        "kthvalue_empty_dim", "all_into_float", "sum_repeated_dim", "std_repeated_dim"])
def test_refusals_are_cpus_at_the_call(fn, mode):
    """Type and text as on CPU, raised by the call itself. Complex inputs to round, sign, maximum and atan2 gave
    values (JAX computes them); floor's refusal came at the next sync as JAX's TypeError; the others were PyTorch's
    Python reference's ValueErrors or a tuple printed as the message."""
    def error(dev):
        with pytest.raises(Exception) as e:
            fn(dev)  # not read back: the error must not wait for a sync
        return type(e.value), str(e.value)

    with torchtpu_lab.eager_mode(mode):
        assert error("tpu") == error("cpu")


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_float_repeats_are_refused_as_on_cpu(mode):
    """CPU's kernel has no float repeats (JAX would have refused them as an index, with a TypeError)."""
    with torchtpu_lab.eager_mode(mode), pytest.raises(NotImplementedError, match="not implemented for 'Float'"):
        torch.repeat_interleave(torch.arange(4.0, device="tpu"))


def test_an_unsupported_dtype_is_named_inside_an_operator():
    """``float16 + 1j`` is complex32, which the device lacks: the error says so (a TypeError there became
    Python's "unsupported operand type(s) for +")."""
    with pytest.raises(RuntimeError, match="complex32 is not supported on the tpu device"):
        torch.ones(2, dtype=torch.float16, device="tpu") + 1j
    with pytest.raises(RuntimeError, match="complex32 is not supported on the tpu device"):
        torch.tensor([2], dtype=torch.complex32, device="tpu")  # numpy's "Got unsupported ScalarType ComplexHalf"


@pytest.mark.parametrize("fn", [
    lambda d: torch.arange(1, 9, dtype=torch.int8, device=d)[1:7].view(torch.int16),
    lambda d: torch.arange(16, dtype=torch.int8, device=d).view(4, 4)[:, ::2].view(torch.int16),
    lambda d: torch.arange(6, dtype=torch.int8, device=d).view(2, 3).view(torch.int16),
    lambda d: torch.zeros(4, 4, 2, device=d).as_strided((4, 4, 2), (2, 1, 1)).view(torch.float64),
    lambda d: torch.view_as_complex(torch.zeros(3, 2, 2, device=d).transpose(1, 2)),
], ids=["offset", "stride-1", "size-1", "stride1", "view_as_complex"])
def test_dtype_views_check_the_views_geometry(fn):
    """PyTorch's meta kernels check a view's storage offset and strides; they ran on contiguous stand-ins, so a
    view at an odd offset, or with a last stride of 2, was read as values where CPU raises."""
    def error(dev):
        with pytest.raises(RuntimeError) as e:
            fn(dev)
        return str(e.value)

    assert error("tpu") == error("cpu")


def test_a_dtype_view_at_an_odd_offset_raises_after_one_at_an_even_offset():
    """The same geometry at another offset is the same recorded call (the offset is a graph input): the check of
    the offset runs on every call, not once per compiled signature."""
    for dev in ("cpu", "tpu"):
        b = torch.arange(1, 9, dtype=torch.int8, device=dev)
        assert b[2:8].view(torch.int16).cpu().tolist() == [1027, 1541, 2055]
        with pytest.raises(RuntimeError, match=r"storage_offset\(\) must be divisible by 2"):
            b[1:7].view(torch.int16)


def test_asking_cpu_about_dtypes_leaves_the_cpu_random_stream_alone():
    """A random op's first complex call or out= of another dtype asks CPU's kernel (ops/cpu_rules.py) on
    stand-ins: that draw must not move the user's CPU generator."""
    torch.manual_seed(0)
    want = torch.rand(2)
    torch.manual_seed(0)
    torch.randn_like(torch.ones(3, dtype=torch.complex64, device="tpu"))
    torch.bernoulli(torch.full((3,), 0.5, dtype=torch.float64, device="tpu"), out=torch.empty(0, device="tpu"))
    assert torch.equal(torch.rand(2), want)


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_a_uint8_mask_warns_as_on_cpu(mode):
    """PyTorch deprecates uint8 masks with a warning at every such index or index_put (its tests count them)."""
    import warnings

    v = torch.randn(5, 7, 3, device="tpu")
    mask = torch.tensor([1, 0, 1, 1, 0], dtype=torch.uint8, device="tpu")
    with torchtpu_lab.eager_mode(mode):
        for fn in (lambda: v[mask], lambda: v.__setitem__(mask, torch.ones(3, 7, 3, device="tpu"))):
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                fn()
            assert [str(x.message) for x in w] == [
                "indexing with dtype torch.uint8 is now deprecated, please use a dtype torch.bool instead."]


_OUT_OF_RANGE = [2.0 ** 40 + 7, 2.0 ** 33 + 5, -2.0 ** 33 - 3, 2.0 ** 31 + 9, -1.5, 1e30, 70000.5, -2.0 ** 63,
                 2.0 ** 63, float("nan"), float("inf"), -float("inf"), 255.9, 300.0, -128.7, -129.2, -0.0, 2.0 ** 31,
                 -2.0 ** 31 - 1, 32767.9, 65535.9]


@pytest.mark.parametrize("mode", ["strict", "fused"])
@pytest.mark.parametrize("src", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
def test_floats_out_of_an_integer_range_cast_as_on_cpu(src, mode):
    """CPU wraps where XLA saturates: ``300.0`` to uint8 is 44 and ``-1.5`` is 255 (XLA: 255 and 0), NaN to int32
    is ``-2**31`` (XLA: 0); by ``.to``, ``copy_`` into an integer tensor and a slice assignment (ops/casts.py)."""
    values = torch.tensor(_OUT_OF_RANGE, dtype=torch.float64).to(src)
    with torchtpu_lab.eager_mode(mode):
        for dtype in (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.bool):
            expected = values.to(dtype)
            on_tpu = values.to("tpu")
            copied = torch.zeros(len(values), dtype=dtype, device="tpu").copy_(on_tpu)
            rows = torch.zeros(2, len(values), dtype=dtype, device="tpu")
            rows[1] = on_tpu
            for got in (on_tpu.to(dtype), copied, rows[1]):
                assert torch.equal(got.cpu(), expected), (dtype, got.cpu().tolist(), expected.tolist())


@pytest.mark.parametrize("mode", ["strict", "fused"])
@pytest.mark.parametrize("call, dtype", [
    (lambda **k: torch.arange(0.5, 10, 1.5, **k), torch.int64),
    (lambda **k: torch.arange(7, **k), torch.float32),
    (lambda **k: torch.linspace(0.1, 0.9, 137, **k), torch.float64),
    (lambda **k: torch.linspace(-5, 20, 96, **k), torch.int32),
    (lambda **k: torch.logspace(0.1, 2.9, 37, **k), torch.float32),
    (lambda **k: torch.eye(3, 5, **k), torch.int32),
    (lambda **k: torch.full((2, 3), 1.5, **k), torch.float32),
    (lambda **k: torch.zeros(2, 3, **k), torch.bool),
], ids=["arange_int", "arange_end", "linspace", "linspace_int", "logspace", "eye", "full", "zeros"])
def test_a_factory_into_out_is_the_factory_on_tpu(call, dtype, mode):
    """``torch.linspace(..., out=t)`` has no functional twin of its signature (no ``dtype``): it ran on the CPU
    (a warning, a host round trip, values a bit off the factory's own on tpu). It is the factory in ``t``'s dtype,
    ``t`` resized as CPU resizes it."""
    from torchtpu_lab import telemetry

    with torchtpu_lab.eager_mode(mode):
        fallbacks = telemetry.counters["cpu_fallbacks"]
        out = torch.empty(2, dtype=dtype, device="tpu")
        assert call(out=out) is out
        assert telemetry.counters["cpu_fallbacks"] == fallbacks
        assert torch.equal(out.cpu(), call(dtype=dtype, device="tpu").cpu())
        assert torch.allclose(out.cpu().double(), call(out=torch.empty(0, dtype=dtype)).double())


def test_block_diag_names_the_devices_as_cpu_does():
    """CPU's own wording (PyTorch's test_block_diag), not the executor's generic one."""
    with pytest.raises(RuntimeError, match=re.escape("torch.block_diag: input tensors must all be on the same device. "
                                                     "Input 0 is on device cpu and input 1 is on device tpu:0")):
        torch.block_diag(torch.ones(2, 2), torch.ones(2, 2, device="tpu"))


@pytest.mark.parametrize("fn", [
    lambda d: torch.median(torch.tensor([], device=d)),
    lambda d: torch.nanmedian(torch.tensor([], device=d)),
    lambda d: torch.median(torch.tensor([], dtype=torch.int64, device=d)),
    lambda d: torch.logsumexp(torch.zeros(2, 0, 4, device=d), dim=1),
    lambda d: torch.logsumexp(torch.zeros(2, 0, dtype=torch.int64, device=d), 1),
], ids=["median", "nanmedian", "median_int", "logsumexp", "logsumexp_int"])
def test_reductions_of_nothing_are_cpus(fn):
    """median of nothing is NaN (an integer's minimum), logsumexp over nothing -inf (JAX raised a ValueError;
    nanmedian gave 0): PyTorch's test_median_corner_cases, test_tensor_reduce_ops_empty."""
    same_on_both_devices(fn, exact=True)


@pytest.mark.parametrize("make", [lambda o: torch.linspace(0, 3, 4, out=o), lambda o: torch.arange(4, out=o)],
                         ids=["linspace", "arange"])
def test_a_range_into_an_out_of_as_many_elements_keeps_its_shape(make):
    """CPU resizes a range's ``out=`` only when the counts differ: a 2x2 view is filled in order
    (PyTorch's test_linspace)."""
    def fill(d):
        x = torch.zeros(2, 3, device=d)
        make(x.narrow(1, 1, 2))
        return x

    same_on_both_devices(fill, exact=True)


def test_arange_into_an_out_of_another_count_warns_as_cpu_does():
    """CPU's warning, at the user's line (PyTorch's test_arange)."""
    out = torch.empty(2, 2, device="tpu")
    with pytest.warns(UserWarning, match=r"out tensor of shape \[2, 2\] is 4 which does not match the computed "
                                         r"number of elements 7") as caught:
        torch.arange(7, out=out)
    assert caught[0].filename == __file__
    assert torch.equal(out.cpu(), torch.arange(7.0))


@pytest.mark.parametrize("target,weight,message", [
    ([[0], [1]], None, "0D or 1D target tensor expected, multi-target not supported"),
    ([0, 1], [1.0, 1.0, 1.0, 1.0], "weight tensor should be defined either for all 3 classes or no classes but got "
                                   "weight tensor of shape: [4]"),
    ([0, 1], [[1.0, 1.0, 1.0]], "weight tensor should be defined either for all 3 classes or no classes but got "
                                "weight tensor of shape: [1, 3]")])
def test_nll_loss_bad_shapes_raise_cpus_runtime_error(target, weight, message):
    """PyTorch's decomposition, standing in as nll_loss's meta kernel, asserts (an AssertionError); CPU raises a
    RuntimeError with its own message."""
    x = torch.randn(2, 3)
    w = None if weight is None else torch.tensor(weight)
    error = raises_like_cpu(lambda v, t: torch.nn.functional.nll_loss(v, t, weight=w if w is None else w.to(v.device)),
                            x, torch.tensor(target))
    assert str(error) == message


def test_transformer_encoder_layer_fast_path_takes_an_empty_batch():
    """The fused inference kernel reshaped its heads back with -1, which an empty batch cannot infer (JAX's
    ZeroDivisionError); CPU returns an empty result of the input's shape."""

    def fn(device):
        torch.manual_seed(0)
        layer = torch.nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, batch_first=True).eval().to(device)
        with torch.no_grad():
            return layer(torch.randn(0, 3, 8).to(device)), layer(torch.randn(2, 3, 8).to(device))

    same_on_both_devices(fn, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op", ["grid_sampler", "grid_sampler_2d", "grid_sampler_3d"])
@pytest.mark.parametrize(
    "input_shape,grid_shape",
    [((5, 5, 5, 5, 5), (1, 1, 1, 4, 4)), ((5, 5, 5, 5), (1, 1, 4, 4)), ((5, 5, 5, 5), (5, 1, 4, 3)),
     ((5, 2, 3, 3), (5, 4, 4, 2, 2)), ((2, 3, 0, 4), (2, 1, 1, 2))],
    ids=["batch_5d", "batch_4d", "last_dim", "5d_grid", "empty_spatial"],
)
def test_grid_sampler_shape_errors_are_cpus(op, input_shape, grid_shape):
    """CPU's RuntimeErrors, word for word: grid_sampler_2d's decomposition raised ValueError ('too many values to
    unpack'), AssertionError or JAX's TypeError, and grid_sampler_3d printed its sizes as torch.Size."""
    fn = getattr(torch, op)
    x, grid = torch.zeros(input_shape, dtype=torch.float64), torch.zeros(grid_shape, dtype=torch.float64)
    error = raises_like_cpu(lambda x, g: fn(x, g, 0, 0, True), x, grid)
    with pytest.raises(RuntimeError) as on_cpu:
        fn(x, grid, 0, 0, True)
    assert str(error) == str(on_cpu.value)


def test_index_fill_takes_negative_indices_from_the_end():
    """CPU's index_fill (alone of the index_* ops) takes an index in [-n, n); tpu raised IndexError for -1."""
    x = torch.arange(12.0).reshape(3, 4)
    same(lambda x, i: x.index_fill(1, i, -5.0), x, torch.tensor([-1, 0, -4]))
    same(lambda x, i: x.index_fill(0, i, 7.0), x, torch.tensor(-3))
    same(lambda x, i: x.index_fill(0, i, 9.0), torch.tensor(2.0), torch.tensor([-1]))


@pytest.mark.parametrize(
    "fn,index",
    [
        (lambda x, i: x.index_fill(0, i, 1.0), [-6]),
        (lambda x, i: x.index_copy(0, i, torch.ones(1, device=x.device)), [-1]),
        (lambda x, i: x.index_add(0, i, torch.ones(1, device=x.device)), [5]),
        (lambda x, i: x.index_reduce(0, i, torch.ones(1, device=x.device), "prod"), [9]),
        (lambda x, i: x.put(i, torch.ones(1, device=x.device)), [5]),
        (lambda x, i: x.put(i, torch.ones(1, device=x.device), accumulate=True), [-6]),
    ],
    ids=["index_fill", "index_copy", "index_add", "index_reduce", "put", "put_accumulate"],
)
def test_index_out_of_range_raises_cpus_error(fn, index):
    """CPU's IndexError and wording; put dropped an out-of-range write silently (XLA's scatter)."""
    x, i = torch.zeros(5), torch.tensor(index)
    error = raises_like_cpu(fn, x, i)
    with pytest.raises(IndexError) as on_cpu:
        fn(x, i)
    assert str(on_cpu.value) in str(error)


@pytest.mark.parametrize(
    "fn",
    [
        lambda x, i: x.index_select(0, i.view(1, 2)),
        lambda x, i: x.index_select(0, i.float()),
        lambda x, i: x.index_copy(0, i, torch.ones(2, 3, dtype=torch.int64, device=x.device)),
        lambda x, i: x.index_fill(0, i.view(1, 2), 1.0),
        lambda x, i: x.index_fill(0, i.int(), 1.0),
        lambda x, i: x.index_fill(0, i, torch.ones(1, device=x.device)),
        lambda x, i: x.index_reduce(0, i, torch.ones(2, 3, device=x.device), "sum"),
        lambda x, i: x.masked_fill(x > 0, torch.ones(1, device=x.device)),
        lambda x, i: x.masked_scatter(x > 0, x.long()),
        lambda x, i: x.index_copy(0, i, torch.ones(2, 4, device=x.device)),
        lambda x, i: x.index_copy(0, i, torch.ones(3, 3, device=x.device)),
        lambda x, i: x.index_copy(0, i, torch.ones(2, 3, 1, device=x.device)),
    ],
    ids=["select_2d_index", "select_float_index", "copy_other_dtype", "fill_2d_index", "fill_int32_index",
         "fill_1d_value", "reduce_sum", "masked_fill_1d_value", "masked_scatter_other_dtype", "copy_slice_shape",
         "copy_index_count", "copy_rank"],
)
def test_index_and_mask_argument_errors_are_cpus(fn):
    """CPU's errors, word for word: tpu computed most of these (a 2-d index read as flat, a source of another
    dtype cast, reduce='sum' run as something else) or worded them as PyTorch's meta kernels do (index_copy's
    slice shapes as torch.Size, and RuntimeError for CPU's IndexErrors)."""
    x, i = torch.arange(-6.0, 6.0).reshape(4, 3), torch.tensor([0, 2])
    error = raises_like_cpu(fn, x, i)
    with pytest.raises(Exception) as on_cpu:
        fn(x, i)
    assert str(error) == str(on_cpu.value)


def test_index_add_of_bools_is_cpus_or():
    """CPU adds bools as a logical or (alpha too is a bool); tpu raised JAX's TypeError (no bool add)."""
    x, i = torch.tensor([False, True, False, False]), torch.tensor([0, 0, 1, 3])
    src = torch.tensor([True, False, False, False])
    same(lambda x, i, s: x.index_add(0, i, s), x, i, src)
    same(lambda x, i, s: x.index_add(0, i, s, alpha=False), x, i, src)
    same(lambda x, i, s: x.view(2, 2).index_add(1, i[:2], s.view(2, 2)), x, i, src)


def test_scatters_of_bools_add_as_or_and_multiply_as_and():
    """CPU's bool scatter_add / scatter_reduce('sum'/'prod') / scatter(reduce=...): tpu raised JAX's TypeError
    (no bool add or multiply). Found by test_torch test_scatter_add_bool."""
    x, i = torch.tensor([False, True, False, False]), torch.tensor([0, 1, 1, 3])
    src = torch.tensor([True, False, True, False])
    same(lambda x, i, s: x.scatter_add(0, i, s), x, i, src)
    same(lambda x, i, s: x.scatter_reduce(0, i, s, "sum", include_self=False), x, i, src)
    same(lambda x, i, s: (~x).scatter_reduce(0, i, s, "prod"), x, i, src)


def test_index_reduce_of_bools_raises_cpus_not_implemented_error():
    """CPU has no bool index_reduce: its NotImplementedError, where tpu raised JAX's TypeError."""
    error = raises_like_cpu(lambda x, i, s: x.index_reduce(0, i, s, "prod"), torch.tensor([True, True]),
                            torch.tensor([1]), torch.tensor([False]))
    assert "not implemented for 'Bool'" in str(error)


# ------------------------------------------------------------------------------------------------ histograms


@pytest.mark.parametrize("mode", ["fused", "strict"])
def test_histc_raises_cpus_range_errors_every_call(mode):
    """A range from data with an infinity or NaN gave garbage counts; ``min > max`` raised only at the first
    call of a signature (PyTorch's meta kernel checks it, and a cached call never asks it again): both are now
    reported with CPU's words, at the next read."""
    x = torch.tensor([1.0, 2.0, 3.0])
    with torchtpu_lab.eager_mode(mode):
        for data, kwargs in (([1.0, 2.0, float("inf")], {}), ([float("-inf"), 1.0], {}), ([1.0, 2.0], {"max": float("inf")})):
            with pytest.raises(RuntimeError) as cpu:
                torch.histc(torch.tensor(data), **kwargs)
            with pytest.raises(RuntimeError, match=re.escape(str(cpu.value))):
                torch.histc(torch.tensor(data, device="tpu"), **kwargs).cpu()
        with pytest.raises(RuntimeError, match="range of .nan, nan. is not finite"):
            torch.histc(torch.tensor([float("nan"), 1.0], device="tpu")).cpu()
        for _ in range(3):
            assert torch.equal(torch.histc(x.to("tpu"), bins=4, min=0, max=3).cpu(), torch.histc(x, 4, 0, 3))
            with pytest.raises(RuntimeError, match="max must be larger than min"):
                torch.histc(x.to("tpu"), bins=4, min=5, max=1).cpu()


def test_bincount_checks_its_input_as_cpu():
    """``jnp.bincount`` counted a negative value in bin 0 and ignored a negative ``minlength``; other bad input
    raised JAX's errors."""
    raises_like_cpu(torch.bincount, torch.tensor([1, -1]))
    raises_like_cpu(torch.bincount, torch.tensor([[1]]))
    raises_like_cpu(torch.bincount, torch.tensor([1.0]))
    raises_like_cpu(torch.bincount, torch.tensor([1, 2]), torch.tensor([1.0]))
    raises_like_cpu(lambda x: torch.bincount(x, minlength=-1), torch.tensor([1, 2]))
    for d in ("cpu", "tpu"):
        assert torch.bincount(torch.tensor([], dtype=torch.long, device=d), minlength=3).tolist() == [0, 0, 0]
    assert_same(torch.bincount(torch.tensor([1, 2, 2], device="tpu"), torch.tensor([1.0, 2.0, 3.0], device="tpu")),
                torch.bincount(torch.tensor([1, 2, 2]), torch.tensor([1.0, 2.0, 3.0])), exact=True)


@pytest.mark.parametrize("keepdim", [False, True])
def test_nansum_over_no_dims_reduces_every_dim_as_on_cpu(keepdim):
    x = torch.tensor([[1.0, float("nan"), 2.0], [3.0, 4.0, float("nan")]])
    assert_same(torch.nansum(x.to("tpu"), dim=[], keepdim=keepdim), torch.nansum(x, dim=[], keepdim=keepdim),
                exact=True)


@pytest.mark.parametrize("mode", ["fused", "strict"])
def test_reading_a_tensor_element_by_element_reads_cpus_values_without_a_program_each(mode, monkeypatch):
    """``for v in t: v.item()`` and ``all(mask)`` read each element of a computed storage from its host values
    (a program per element made such loops ~100 µs an element); values stay right across in-place updates,
    pending work and views of every kind."""
    from torchtpu_lab.runtime import values

    programs = []
    run_now = values.run_now
    monkeypatch.setattr(values, "run_now", lambda *a, **k: programs.append(1) or run_now(*a, **k))
    x_cpu = torch.linspace(-3, 3, 24).reshape(4, 6)
    with torchtpu_lab.eager_mode(mode):
        x = x_cpu.to("tpu")
        for make in (lambda t: t[2], lambda t: t.t()[3], lambda t: t[:, ::2].reshape(-1), lambda t: t.bfloat16()[1],
                     lambda t: (t > 0)[1], lambda t: t.long()[0]):
            assert [v.item() for v in make(x)] == [v.item() for v in make(x_cpu)]
        x.mul_(2)  # a new array in the same storage: no stale host copy
        x_cpu.mul_(2)
        assert [v.item() for v in x[1]] == [v.item() for v in x_cpu[1]]
        assert all(torch.arange(300, device="tpu") < 400)
        assert [v.item() for v in (x + 1)[0]] == [v.item() for v in (x_cpu + 1)[0]]  # pending, then read
    assert programs == []


def test_searchsorted_and_bucketize_check_their_arguments_as_cpu():
    """CPU's checks that PyTorch's meta kernels lack: they returned results (a bad ``side``, 2-d boundaries for
    ``bucketize``, a sorter index out of range) or raised JAX's errors."""
    b2, v = torch.tensor([[1, 2, 3], [4, 5, 6]]), torch.arange(1, 10)
    raises_like_cpu(lambda b, x: torch.bucketize(x.view(3, 3), b), b2, v)
    raises_like_cpu(lambda b: torch.searchsorted(b, 1), b2)
    raises_like_cpu(lambda x: torch.searchsorted(x, x, side="bad"), v)
    raises_like_cpu(lambda b, s: torch.searchsorted(b, 2.5, sorter=s), torch.tensor([1, 2, 3]), torch.tensor([0, 1, 3]))
    raises_like_cpu(lambda b, x, s: torch.searchsorted(b, x, sorter=s), torch.tensor([1, 2, 3]), torch.tensor([2.5]),
                    torch.tensor([0, -1, 2]))
    raises_like_cpu(lambda b, s: torch.searchsorted(b, 2.5, sorter=s), torch.tensor([1.0, 2, 3]),
                    torch.tensor([0.0, 1, 2]))
    raises_like_cpu(lambda b, x: torch.searchsorted(b, x), torch.tensor(1), torch.tensor([1]))
    b, x, s = torch.tensor([3, 1, 2]), torch.tensor([2.5, 0.0, 9.0]), torch.tensor([1, 2, 0])
    assert_same(torch.searchsorted(b.to("tpu"), x.to("tpu"), sorter=s.to("tpu")), torch.searchsorted(b, x, sorter=s),
                exact=True)
