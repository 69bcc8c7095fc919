"""Configuration: every setting torchtpu_lab reads, as an explicit, named state with an override.

A :class:`State` has the shape of JAX's ``jax.config`` states: a name, a default, an optional environment
variable (read once, at import), a validator, ``.value`` to read it, ``.set(v)`` to change it, and
``with state(v):`` to change it for a block (the previous value comes back on exit, even on error).
:func:`patch` does the same for several states at once (``with config.patch(eager_mode="strict",
cpu_fallback=False):``), and :func:`snapshot` / :func:`restore` save and bring back all of them. Values are
process-wide, as these settings always were (not per thread: every thread records into one fused graph).

**Why here, at the bottom.** The lowest layers read some of these on their hot paths (the device layer's
allocation source tracking in every ``Storage``, the ops layer's data-dependent checks), and a lower layer never
imports a higher one; so every state lives in this module, and any layer reads one with two attribute reads
(``config.max_graph_ops.value``: ``value`` is a slot, not a property, and modules on the per-op path keep the
state object in a module global). The runtime's :class:`~torchtpu_lab.runtime.state.Session` is the one object
that reaches all mutable state: these states, plus the pending graph, its lock, the caches, the compile history,
recorders and listeners that the layers own.

**Behaviour on change.** A state whose change needs a higher layer to act (leaving ``fused`` mode flushes the
pending graph) gets a hook from that layer (:meth:`State.before_change`), the same inversion as the device
layer's memory listeners: this module knows nobody above it.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Callable, Iterator

import torch

#: the eager modes, in TorchTPU's order (see :mod:`torchtpu_lab.runtime.modes`)
EAGER_MODES = ("debug", "strict", "fused")


class State:
    """One named setting. Read ``.value``; change it with ``.set(v)`` or, for a block, ``with state(v):``."""

    __slots__ = ("name", "default", "env", "help", "_validate", "_hooks", "value")

    def __init__(self, name: str, default: Any, help: str, validate: Callable[[Any], Any] | None = None,
                 env: str | None = None, parse: Callable[[str], Any] | None = None):
        set_ = object.__setattr__
        set_(self, "name", name)
        set_(self, "help", help)
        set_(self, "env", env)
        set_(self, "_validate", validate or (lambda v: v))
        set_(self, "_hooks", [])
        raw = os.environ.get(env) if env else None
        if raw is not None:
            try:
                default = (parse or str)(raw)
                default = self._validate(default)
            except ValueError as e:
                raise ValueError(f"{env}={raw!r}: {e}") from None
        set_(self, "default", self._validate(default))
        self._store(self.default)

    def __setattr__(self, name: str, value) -> None:
        raise AttributeError(f"{self.name}: use .set(value) or `with {self.name}(value):` (the value is validated)")

    def _store(self, value) -> None:
        object.__setattr__(self, "value", value)

    def set(self, value) -> None:
        """Validate ``value``, run the hooks (which may act before the change, e.g. flush), then store it."""
        value = self._validate(value)
        old = self.value
        for hook in self._hooks:
            hook(old, value)
        self._store(value)

    def before_change(self, hook: Callable[[Any, Any], None]) -> Callable[[], None]:
        """Call ``hook(old, new)`` before every change (a higher layer's reaction; see the module docstring);
        returns the function that removes it again."""
        self._hooks.append(hook)
        return lambda: self._hooks.remove(hook)

    @contextlib.contextmanager
    def __call__(self, value) -> Iterator[None]:
        previous = self.value
        self.set(value)
        try:
            yield
        finally:
            self.set(previous)

    def __repr__(self) -> str:
        return f"<config.{self.name} = {self.value!r} (default {self.default!r})>"


class _TorchMatmulPrecision(State):
    """``torch.float32_matmul_precision``: PyTorch owns the value (users set it with
    ``torch.set_float32_matmul_precision``, and lowerings read it there); this state only saves and restores it
    with the others."""

    __slots__ = ()

    @property
    def value(self) -> str:  # type: ignore[override]
        return torch.get_float32_matmul_precision()

    def _store(self, value) -> None:
        torch.set_float32_matmul_precision(value)


def _one_of(choices: tuple) -> Callable[[Any], Any]:
    def validate(v):
        if v not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}, got {v!r}")
        return v

    return validate


def _positive_int(v) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"expected a positive integer, got {v!r}")
    return v


def _eager_mode(v):
    if v not in EAGER_MODES:
        raise ValueError(f"unknown eager mode {v!r}; choose one of {', '.join(EAGER_MODES)}")
    return v


def _env_flag(raw: str) -> bool:
    return raw != "0"


def _on_off_auto(v):
    if v not in (True, False, "auto"):
        raise ValueError(f"expected True, False or 'auto', got {v!r}")
    return v


def _parse_on_off_auto(raw: str):
    return "auto" if raw == "auto" else raw != "0"


eager_mode = State("eager_mode", "fused", "debug, strict or fused (see torchtpu_lab.runtime.modes)",
                   _eager_mode, env="TORCHTPU_LAB_EAGER_MODE")
check_finite = State("check_finite", False, "debug mode raises at the first op whose output has a NaN or Inf",
                     bool)
cpu_fallback = State("cpu_fallback", True, "ops without a lowering run on the CPU (off: NotImplementedError)", bool)
track_sources = State("track_sources", True,
                      "record the user's source line with every fused op (compile causes, failures); a frame walk",
                      bool)
track_allocation_sources = State("track_allocation_sources", False,
                                 "record the user's source line of every device allocation (profiles, %load_ext)",
                                 bool)
max_graph_ops = State("max_graph_ops", 2000, "a fused graph is flushed once it has this many recorded ops",
                      _positive_int)
data_checks = State("data_checks", True, "compile ops with their data-dependent error flags (off: silent wrong "
                    "answers, for measuring what the checks cost)", bool, env="TORCHTPU_LAB_CHECKS", parse=_env_flag)
native_recording = State("native_recording", True, "repeated fused ops are recorded by the native core's C++ "
                         "kernel (off: every op takes the Python path; for comparisons)", bool,
                         env="TORCHTPU_LAB_NATIVE_RECORDING", parse=_env_flag)
prefetch_executables = State("prefetch_executables", True, "a fresh process loads the persistent cache entries its "
                             "previous run used on a background thread (runtime/prefetch.py)", bool,
                             env="TORCHTPU_LAB_PREFETCH", parse=_env_flag)
deferred_stop_check = State("deferred_stop_check", "auto", "transformers' generate() on tpu reads its stop flag a "
                            "token late, so the host records the next token while the device runs this one "
                            "(backend/hf_generation.py); 'auto': where the device is not XLA:CPU", _on_off_auto,
                            env="TORCHTPU_LAB_DEFERRED_STOP_CHECK", parse=_parse_on_off_auto)
matmul_precision = _TorchMatmulPrecision("matmul_precision", torch.get_float32_matmul_precision(),
                                         "torch.get_float32_matmul_precision(), read by the matmul lowerings",
                                         _one_of(("highest", "high", "medium")))

STATES: dict[str, State] = {s.name: s for s in (eager_mode, check_finite, cpu_fallback, track_sources,
                                                track_allocation_sources, max_graph_ops, data_checks,
                                                native_recording, prefetch_executables, deferred_stop_check,
                                                matmul_precision)}


def snapshot() -> dict[str, Any]:
    """Every state's value, by name (for :func:`restore`)."""
    return {name: s.value for name, s in STATES.items()}


def restore(values: dict[str, Any]) -> None:
    """Set each named state back to ``values[name]`` (a :func:`snapshot`); unchanged ones are left alone. A hook
    that fails (leaving fused mode runs pending work, which may fail) does not stop the restore: every value is
    put back, then the first failure is raised."""
    failure = None
    for name, value in values.items():
        state = STATES[name]
        if state.value == value:
            continue
        try:
            state.set(value)
        except Exception as e:  # noqa: BLE001 — raised below, once everything is back
            state._store(state._validate(value))
            failure = failure or e
    if failure is not None:
        raise failure


@contextlib.contextmanager
def patch(**values) -> Iterator[None]:
    """Set several states for a block: ``with config.patch(eager_mode="strict", cpu_fallback=False):``. Every
    name is checked before anything changes; on exit (even on error) the previous values come back."""
    unknown = set(values) - set(STATES)
    if unknown:
        raise TypeError(f"no such setting: {', '.join(sorted(unknown))}; settings: {', '.join(STATES)}")
    saved = {name: STATES[name].value for name in values}
    try:
        for name, value in values.items():
            STATES[name].set(value)
        yield
    finally:
        restore(saved)
