"""Complex ops at infinities and NaNs, value for value against CPU's kernels: XLA's complex ``exp`` and ``log`` give
NaN where C's ``cexp``/``clog`` (which CPU's kernels use) give an infinity or a zero, so a lowering that composes
them must handle those points as CPU's kernel does."""

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
