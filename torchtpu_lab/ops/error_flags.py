"""Data-dependent errors from compiled code: a lowering *reports* a bad condition, the runtime raises it.

A compiled XLA program cannot raise, and clamping an out-of-range index (XLA's gather) or dropping an
out-of-range write (its scatter) gives a silent wrong answer where PyTorch's CPU kernels raise. So a lowering
whose inputs can be out of range calls :func:`report` with a boolean array "this element is bad", the offending
values and the error PyTorch would raise. While the runtime traces an op it *collects* the reports
(:func:`collecting`); each becomes two extra scalar outputs of the op's compiled function — "any bad?" and the
first bad value — and the runtime raises the error, naming the op and the user's line, at the next host read
or sync (:mod:`torchtpu_lab.runtime.pending_errors`). Outside a collecting trace, concrete values raise at once.

Lowerings that report are marked with :func:`reports`, so the runtime knows before tracing that the op's
compiled function returns ``(outputs, flags)``.
"""

from __future__ import annotations

import builtins
import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .. import config


class Check(NamedTuple):
    """The static half of a report: the exception PyTorch raises and its message (``{value}``: the bad value)."""

    error: type
    message: str

    def encode(self) -> list | None:
        """A JSON-able form (for executables stored on disk, which are never traced again); ``None`` for an
        error class that is not a Python builtin (it could not be found again by name)."""
        if getattr(builtins, self.error.__name__, None) is not self.error:
            return None
        return [self.error.__name__, self.message]

    @staticmethod
    def decode(data) -> "Check":
        name, message = data
        error = getattr(builtins, str(name), None)
        if not (isinstance(error, type) and issubclass(error, Exception)) or not isinstance(message, str):
            raise ValueError(f"not a stored check: {data!r}")
        return Check(error, message)


_active = threading.local()


def reports(fn: Callable) -> Callable:
    """Mark a lowering that calls :func:`report` (its compiled function gets flag outputs)."""
    fn._tpu_reports = True
    return fn


def reporting(fn: Callable) -> bool:
    """Whether ``fn`` is compiled with its error flags (``config.data_checks``: ``TORCHTPU_LAB_CHECKS=0`` turns
    them off, giving silent wrong answers, as before; for measuring what the checks cost — see README)."""
    return config.data_checks.value and getattr(fn, "_tpu_reports", False)


@contextlib.contextmanager
def collecting() -> Iterator[list]:
    """Collect the reports made while tracing (a list of ``(flag, value, Check)``)."""
    previous = getattr(_active, "found", None)
    found: list = []
    _active.found = found
    try:
        yield found
    finally:
        _active.found = previous


def report(bad, value=None, *, error: type = IndexError, message: str) -> None:
    """Report that the elements where ``bad`` is true are invalid; ``value`` (broadcast to ``bad``) holds the
    values to show in ``message`` (``{value}`` is replaced by the first bad one). A tuple of scalars as ``value``
    (``bad`` a scalar) fills ``{0}``, ``{1}``, ... instead, as numbers print in PyTorch's messages."""
    bad = jnp.asarray(bad)
    found = getattr(_active, "found", None)
    if found is None:
        if isinstance(bad, jax.core.Tracer):
            return  # traced by someone else (a user's jax.jit around a lowering): nothing can raise here
        if bool(bad.any()):
            raise error(formatted(message, _first(bad, value)))
        return
    found.append((jnp.any(bad), _first(bad, value), Check(error, message)))


def formatted(message: str, value) -> str:
    """``message`` with a report's value (one number: ``{value}``; several: ``{0}``, ``{1}``, ... printed as
    c10 prints a double, ``1``, ``2.5``, ``inf``)."""
    value = np.asarray(value)
    if value.ndim == 0:
        return message.format(value=value.item())
    return message.format(*[f"{v:g}" for v in value.tolist()])


def _first(bad, value):
    if isinstance(value, tuple):
        return jnp.stack([jnp.asarray(v).reshape(()).astype(jnp.result_type(float)) for v in value])
    if value is None:
        return jnp.zeros((), jnp.int32)
    value = jnp.broadcast_to(jnp.asarray(value), bad.shape).reshape(-1)
    if value.size == 0:
        return jnp.zeros((), value.dtype)
    return value[jnp.argmax(bad.reshape(-1))]

