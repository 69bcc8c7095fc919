"""``x ** y`` for a number ``y`` (ops/powers.py ``power_scalar``): PyTorch's shortcuts for the exponents its
CPU kernel special-cases, picked when the program runs, so the exponent stays a graph input."""

import jax
import jax.numpy as jnp
import pytest
import torch

import torchtpu_lab
from torchtpu_lab import telemetry
from torchtpu_lab.ops import powers

# bases where a shortcut and ``pow`` could part: signed zeros, negatives, infinities, NaN, subnormal-adjacent
_BASES = [0.0, -0.0, 1.0, -1.0, 2.5, -2.5, 1e-20, -1e-20, 3e12, float("inf"), float("-inf"), float("nan"), 0.3]


@pytest.mark.parametrize("size", ["small", "large"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_every_exponent_equals_cpu_and_a_new_one_compiles_nothing(dtype, size):
    """Both forms: every candidate selected (small tensors), and a switch that runs one (large ones)."""
    x = torch.tensor(_BASES, dtype=dtype)
    if size == "large":
        x = x.repeat(powers._SELECTED_POWERS_UP_TO // len(_BASES) + 1)
    xt = x.to("tpu")
    torchtpu_lab.sync()
    # numbers are keyed by type, not value: one program for the ints, one for the floats
    exponents = [2, 3, -1, -2, 0, 1, -3, 2.0, 3.0, 0.5, -0.5, 2.5, 4.0, 1.5, -1.0, 0.0]
    compiles = []
    with torchtpu_lab.eager_mode("fused"):
        for e in exponents:
            before = telemetry.counters.get("xla_compile_requests", 0)
            got = (xt ** e).cpu()
            compiles.append(telemetry.counters.get("xla_compile_requests", 0) - before)
            torch.testing.assert_close(got, x ** e, equal_nan=True, msg=f"exponent {e}")
    assert compiles == [1] + [0] * 6 + [1] + [0] * 8, compiles


def test_integer_tensors_keep_integer_powers():
    i = torch.tensor([-3, -1, 0, 2, 7])
    torch.testing.assert_close((i.to("tpu") ** 2).cpu(), i ** 2)
    torch.testing.assert_close((i.to("tpu") ** 0.5).cpu(), i ** 0.5, equal_nan=True)


@pytest.mark.parametrize("mode", ["fused", "strict"])
def test_bool_tensors_to_bool_powers_stay_bool_as_on_cpu(mode):
    """CPU keeps ``b ** True`` bool (it is ``b``; ``b ** False`` is all True) where PyTorch's meta kernel says
    int64, and so runs ``pow_(True)`` and a bool ``out=`` that the meta kernel's dtype would refuse; a number
    exponent still gives int64, in the same process after the bool ones."""
    b = torch.tensor([True, False, True])
    calls = {
        "b ** True": lambda x: x ** True,
        "b ** False": lambda x: x ** False,
        "pow_(True)": lambda x: x.clone().pow_(True),
        "pow_(False)": lambda x: x.clone().pow_(False),
        "out=": lambda x: torch.pow(x, True, out=torch.empty(3, dtype=torch.bool, device=x.device)),
        "b ** 1": lambda x: x ** 1,
        "b ** 2": lambda x: x ** 2,
    }
    with torchtpu_lab.eager_mode(mode):
        for name, fn in calls.items():
            want, got = fn(b), fn(b.to("tpu")).cpu()
            assert got.dtype == want.dtype, name
            assert torch.equal(got, want), name


def test_the_exponent_is_an_input_that_selects_a_branch():
    """The lowering of an input exponent is a switch (the shortcuts, then ``pow``), not ``pow`` alone: XLA's
    general power of an input exponent is what GPT-2's GELU spent 6x its time in on XLA:CPU."""
    x = jnp.ones((powers._SELECTED_POWERS_UP_TO + 1,), jnp.float32)
    text = jax.jit(powers.power_scalar).lower(x, jnp.float64(3.0)).as_text()
    assert "case" in text and "multiply" in text
    # a small tensor computes every candidate and selects one: no conditional between fused ops
    small = jax.jit(powers.power_scalar).lower(jnp.ones((4,), jnp.float32), jnp.float64(3.0)).as_text()
    assert "case" not in small and "select" in small and "power" in small
    # a number known when traced takes its shortcut directly: no pow, no switch
    constant = jax.jit(lambda a: powers.power_scalar(a, 3.0)).lower(x).as_text()
    assert "case" not in constant and "power" not in constant
