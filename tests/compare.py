"""The one comparison of tpu against CPU that the semantics tests share: "the same code gives the same answer".

What "the same" means, checked everywhere it is used:

* every tensor result is a **tpu** tensor with CPU's **dtype**, **shape** and **values** (bitwise, or within a
  tolerance; NaN where CPU has NaN); other results (Python scalars, None) are equal;
* the tpu run took **no CPU fallback** (a fallback runs PyTorch's own CPU kernel, so it would "match" whatever
  the device does; the fallback counter of telemetry must not move);
* where CPU raises, tpu raises the **same exception type**, and never one of our internal
  ``torchtpu_lab bug:`` errors (which happen to be ``RuntimeError``\\ s, the type many CPU errors have).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

from torchtpu_lab import telemetry

INTERNAL_ERROR = "torchtpu_lab bug"


def to_device(value: Any, device: str) -> Any:
    """``value`` with every tensor in it (nested in tuples and lists) moved to ``device``; a CPU tensor is cloned,
    so an in-place ``fn`` cannot change the caller's copy."""
    if isinstance(value, torch.Tensor):
        return value.clone() if device == "cpu" and value.device.type == "cpu" else value.to(device)
    if isinstance(value, (tuple, list)):
        return type(value)(to_device(v, device) for v in value)
    return value


def twins(build: Callable[[], torch.nn.Module]) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The same model built twice, seeded: one on CPU, one loaded with its state and moved to tpu."""
    torch.manual_seed(0)
    cpu, tpu = build(), build()
    tpu.load_state_dict(cpu.state_dict())
    return cpu, tpu.to("tpu")


@contextlib.contextmanager
def no_cpu_fallback(what: str = "the tpu run") -> Iterator[None]:
    """Fail if an op inside the block ran on the CPU through the fallback."""
    before = telemetry.counters["cpu_fallbacks"]
    yield
    after = telemetry.counters["cpu_fallbacks"]
    assert after >= before, "telemetry was reset inside the block: the fallback check cannot count"
    assert after == before, (f"{what} fell back to the CPU {int(after - before)} time(s) "
                             "(torchtpu_lab.metrics_report() names the ops)")


def assert_same(tpu: Any, cpu: Any, *, exact: bool = False, rtol: float | None = None, atol: float | None = None,
                where: str = "result") -> None:
    """``tpu`` (a tpu result, possibly nested in tuples/lists) against ``cpu``: device, dtype, shape, values.
    ``exact``: bitwise for floats too (integers and bools always are); otherwise ``rtol``/``atol`` (None:
    ``torch.testing.assert_close``'s defaults for the dtype). NaN matches NaN."""
    if isinstance(cpu, (tuple, list)):
        assert isinstance(tpu, (tuple, list)) and len(tpu) == len(cpu), (
            f"{where}: tpu gave {type(tpu).__name__} of {len(tpu) if isinstance(tpu, (tuple, list)) else '-'}, "
            f"cpu {type(cpu).__name__} of {len(cpu)}")
        for i, (t, c) in enumerate(zip(tpu, cpu)):
            assert_same(t, c, exact=exact, rtol=rtol, atol=atol, where=f"{where}[{i}]")
    elif isinstance(cpu, torch.Tensor):
        assert isinstance(tpu, torch.Tensor), f"{where}: tpu gave {type(tpu).__name__}, cpu a tensor"
        assert tpu.device.type == "tpu", f"{where}: on {tpu.device}, not tpu"
        t = tpu.detach().cpu()
        c = cpu.detach()
        assert t.dtype == c.dtype, f"{where}: dtype {t.dtype} vs cpu {c.dtype}"
        assert t.shape == c.shape, f"{where}: shape {tuple(t.shape)} vs cpu {tuple(c.shape)}"
        if exact or not (c.is_floating_point() or c.is_complex()):
            assert torch.equal(t, c) or (c.is_floating_point() and torch.allclose(t, c, 0, 0, equal_nan=True)), (
                f"{where}: tpu {t} vs cpu {c}")
        else:
            torch.testing.assert_close(t, c, rtol=rtol, atol=atol, equal_nan=True, msg=lambda m: f"{where}: {m}")
    else:
        assert tpu == cpu or (tpu != tpu and cpu != cpu), f"{where}: {tpu!r} vs cpu {cpu!r}"


def same(fn: Callable, *args: Any, exact: bool = True, rtol: float | None = None, atol: float | None = None) -> Any:
    """``fn`` on (copies of) CPU ``args`` and on their tpu copies, with :func:`assert_same` and no CPU fallback.
    Returns the tpu result."""
    expected = fn(*to_device(args, "cpu"))
    with no_cpu_fallback():
        got = fn(*to_device(args, "tpu"))
        assert_same(got, expected, exact=exact, rtol=rtol, atol=atol)
    return got


def same_on_both_devices(fn: Callable[[str], Any], *, exact: bool = False, rtol: float | None = None,
                         atol: float | None = None) -> Any:
    """``fn(device)`` for ``"cpu"`` and ``"tpu"`` (code that makes its own tensors), as :func:`same`."""
    expected = fn("cpu")
    with no_cpu_fallback():
        got = fn("tpu")
        assert_same(got, expected, exact=exact, rtol=rtol, atol=atol)
    return got


def _materialize(result: Any) -> None:
    """Read every tensor of ``result`` back: a deferred (fused) error surfaces at that sync point."""
    for v in result if isinstance(result, (tuple, list)) else (result,):
        if isinstance(v, torch.Tensor):
            v.cpu()


def raises_like_cpu(fn: Callable, *args: Any) -> BaseException:
    """``fn`` raises on CPU ``args``; on their tpu copies it raises the same exception type (read back, so a
    deferred error counts), with no CPU fallback and no internal error. Returns the tpu exception."""
    with pytest.raises(Exception) as on_cpu:
        fn(*to_device(args, "cpu"))
    with no_cpu_fallback(), pytest.raises(Exception) as on_tpu:
        _materialize(fn(*to_device(args, "tpu")))
    cpu_error, tpu_error = on_cpu.value, on_tpu.value
    assert INTERNAL_ERROR not in str(tpu_error), f"an internal error, not PyTorch's: {tpu_error}"
    assert type(tpu_error) is type(cpu_error), (
        f"tpu raised {type(tpu_error).__name__}: {tpu_error}\ncpu raised {type(cpu_error).__name__}: {cpu_error}")
    return tpu_error
