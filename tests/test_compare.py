"""The shared CPU-versus-tpu comparison (tests/compare.py) fails where "the same as CPU" does not hold: a CPU
fallback, a result left on the CPU, another dtype, another exception type, an internal error."""

from __future__ import annotations

import warnings

import pytest
import torch

import torchtpu_lab  # noqa: F401
from compare import assert_same, raises_like_cpu, same, same_on_both_devices
from torchtpu_lab.runtime import cpu_fallback

aten = torch.ops.aten


def _add_through_the_fallback(a, b):
    """``a + b``; on tpu, through the CPU fallback (the values are right: only the check can tell)."""
    if a.device.type == "cpu":
        return a + b
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return cpu_fallback.run(aten.add.Tensor, (a, b), {})


def test_same_passes_an_op_that_runs_on_the_device():
    got = same(torch.add, torch.arange(4.0), torch.ones(4))
    assert got.is_tpu


def test_same_fails_a_cpu_fallback_even_with_the_right_values():
    with pytest.raises(AssertionError, match="fell back to the CPU 1 time"):
        same(_add_through_the_fallback, torch.arange(4.0), torch.ones(4))


def test_same_on_both_devices_fails_a_cpu_fallback():
    def f(device):
        return _add_through_the_fallback(torch.arange(3.0, device=device), torch.ones(3, device=device))

    with pytest.raises(AssertionError, match="fell back"):
        same_on_both_devices(f)


def test_assert_same_checks_device_dtype_and_values():
    cpu = torch.arange(3.0)
    assert_same(cpu.to("tpu"), cpu, exact=True)
    with pytest.raises(AssertionError, match="not tpu"):
        assert_same(cpu.clone(), cpu)
    with pytest.raises(AssertionError, match="dtype"):
        assert_same(cpu.double().to("tpu"), cpu)
    with pytest.raises(AssertionError):
        assert_same((cpu + 1e-3).to("tpu"), cpu, exact=True)
    assert_same(torch.tensor([float("nan")], device="tpu"), torch.tensor([float("nan")]), exact=True)


def test_raises_like_cpu_wants_the_same_exception_type():
    def index_error_on_cpu_only(x):
        if x.device.type == "cpu":
            raise IndexError("cpu")
        raise RuntimeError("tpu")

    with pytest.raises(AssertionError, match="tpu raised RuntimeError"):
        raises_like_cpu(index_error_on_cpu_only, torch.ones(1))


def test_raises_like_cpu_refuses_an_internal_error_of_the_same_type():
    def internal_error_on_tpu(x):
        if x.device.type == "cpu":
            raise RuntimeError("PyTorch's message")
        raise RuntimeError("torchtpu_lab bug: the lowering of aten::foo produced shape (1,)")

    with pytest.raises(AssertionError, match="an internal error"):
        raises_like_cpu(internal_error_on_tpu, torch.ones(1))


def test_raises_like_cpu_fails_when_tpu_does_not_raise():
    def only_cpu_raises(x):
        if x.device.type == "cpu":
            raise ValueError("cpu")
        return x + 1

    with pytest.raises(pytest.fail.Exception):
        raises_like_cpu(only_cpu_raises, torch.ones(1))
