"""CPU's refusals and exact shortcuts for ops with a number operand, checked against CPU itself:

- an integer tensor to a negative integer number raises CPU's error, also after the same op ran with a positive
  one (the number is a graph input, so the check runs with the op: a deferred error, not a compile-time one);
- bool tensors have no ``remainder``/``fmod``/rounded division/``pow`` of two tensors, integers no ``nextafter``:
  CPU's NotImplementedError, never a number;
- a complex tensor to 0, 1, 2, 3, -1, -2, 0.5, -0.5 takes CPU's shortcuts (``x * x``, not ``exp(2 log x)``), so
  ``(-9+0j) ** 2`` is exactly 81.
"""

import pytest
import torch

import torchtpu_lab


@pytest.mark.parametrize("mode", ["fused", "strict"])
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8, torch.bool])
def test_an_integer_tensor_to_a_negative_integer_raises_cpus_error(mode, dtype):
    x = torch.arange(3).to(dtype)
    with pytest.raises(RuntimeError, match="Integers to negative integer powers are not allowed"):
        x ** -3
    with torchtpu_lab.eager_mode(mode):
        t = x.to("tpu")
        for _ in range(3):  # the recording kernel learns the op with a positive number first
            assert torch.equal((t ** 2).cpu(), x ** 2)
        with pytest.raises(RuntimeError, match="Integers to negative integer powers are not allowed"):
            (t ** -3).cpu()
        assert torch.equal((t ** 3).cpu(), x ** 3)  # the session and the tensor stay usable


REFUSED = {
    "remainder_bool": (lambda v: v % True, torch.bool, "remainder_cpu"),
    "fmod_bool": (lambda v: v.fmod(True), torch.bool, "fmod_cpu"),
    "floor_divide_bool": (lambda v: v // True, torch.bool, "div_floor_cpu"),
    "div_trunc_bool": (lambda v: torch.div(v, v, rounding_mode="trunc"), torch.bool, "div_trunc_cpu"),
    "pow_bool_tensors": (lambda v: v ** v, torch.bool, "pow"),
    "rpow_bool": (lambda v: True ** v, torch.bool, "pow"),
    "nextafter_long": (lambda v: torch.nextafter(v, v + 1), torch.int64, "nextafter_cpu"),
}


@pytest.mark.parametrize("name", list(REFUSED))
def test_an_op_cpu_has_no_kernel_for_raises_its_error(name):
    fn, dtype, kernel = REFUSED[name]
    x = torch.tensor([1, 0, 1]).to(dtype)
    with pytest.raises(NotImplementedError, match=f'"{kernel}" not implemented'):
        fn(x)
    with pytest.raises(NotImplementedError, match=f'"{kernel}" not implemented'):
        fn(x.to("tpu")).cpu()


@pytest.mark.parametrize("exponent", [0, 1, 2, 3, -1, -2, 0.5, True])
def test_complex_special_powers_are_cpus_shortcuts(exponent):
    x = (torch.arange(-6, 7) * 1.5).to(torch.complex64) + 0.5j
    torch.testing.assert_close((x.to("tpu") ** exponent).cpu(), x ** exponent, rtol=2e-7, atol=0)
    assert ((torch.full((4,), -9 + 0j).to("tpu") ** 2).cpu() == 81).all()


CALL_ERRORS = {
    "bool_minus_number": (lambda d: torch.tensor([True, False], device=d) - 1, "with a bool tensor is not supported"),
    "number_minus_bool": (lambda d: 1 - torch.tensor([True, False], device=d), "with a bool tensor is not supported"),
    "int_minus_true": (lambda d: torch.tensor([1], dtype=torch.int8, device=d) - True, "with a bool tensor"),
    "bool_alpha": (lambda d: torch.add(torch.ones(2, dtype=torch.int8, device=d), 1, alpha=True),
                   "Boolean alpha only supported for Boolean results"),
    "complex_alpha": (lambda d: torch.add(torch.ones(2, device=d), 1, alpha=1j),
                      "For non-complex input tensors, argument alpha must not be a complex number"),
    "heaviside_dtypes": (lambda d: torch.heaviside(torch.ones(2, device=d), torch.ones(2, dtype=torch.int8, device=d)),
                         "heaviside is not yet implemented for tensors with different dtypes"),
    "heaviside_complex": (lambda d: torch.ones(2, device=d).heaviside(torch.ones(2, dtype=torch.complex64, device=d)),
                          "heaviside is not yet implemented for complex tensors"),
    "heaviside_complex_out": (lambda d: torch.heaviside(torch.ones(2, device=d), torch.ones(2, device=d),
                                                        out=torch.empty(2, dtype=torch.complex64, device=d)),
                              "heaviside is not yet implemented for complex tensors"),
    "complex_abs_in_place": (lambda d: torch.tensor([3 + 4j], device=d).abs_(),
                             "In-place abs is not supported for complex tensors"),
    "isposinf_float_out": (lambda d: torch.isposinf(torch.ones(2, device=d), out=torch.empty(2, device=d)),
                           "isposinf does not support non-boolean outputs"),
    "isneginf_int_out": (lambda d: torch.isneginf(torch.ones(2, device=d),
                                                  out=torch.empty(2, dtype=torch.int64, device=d)),
                         "isneginf does not support non-boolean outputs"),
}


@pytest.mark.parametrize("name", list(CALL_ERRORS))
def test_cpus_argument_errors_are_raised_at_the_call(name):
    """In fused mode too: the error comes from the line that made the call, not from a later sync."""
    fn, message = CALL_ERRORS[name]
    with pytest.raises(RuntimeError, match=message):
        fn("cpu")
    with torchtpu_lab.eager_mode("fused"):
        with pytest.raises(RuntimeError, match=message):
            fn("tpu")  # no .cpu(): raised before anything is synced
