"""The native core (``torchtpu_lab/csrc``, C++): loading it, or saying why the device runs without it.

PyTorch accepts several parts of a device only from C++: a device guard that knows how many devices there are
(autograd's engine sizes its per-device queues from it), generators, a pinned-memory allocator. With the core,
``tpu:k`` trains on any chip, ``torch.Generator("tpu")`` exists and ``pin_memory()`` works. Without it
(no compiler, a failed build, or ``TORCHTPU_LAB_NATIVE=0``) the device is registered through PyTorch's Python
backend API as before: one device for autograd, no tpu generators, no pinned memory, every op's output
tensor made by PyTorch's Python backend factory (slower than the core's ``new_tensor``), no recording kernel
(every op through its Python kernel) and memory accounting's writes in Python. :func:`status` says which
mode runs and what is missing; the banner, ``%tpu`` and ``torchtpu_lab.global_changes()`` show it.

The bottom layer: it knows nothing of JAX or the device above it; :mod:`torchtpu_lab.backend.registration`
decides when to load and register.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import threading
from dataclasses import dataclass

_ENV = "TORCHTPU_LAB_NATIVE"
#: What pure-Python mode lacks, in the words the status lines use.
MISSING_WITHOUT_CORE = ("training on tpu:k for k > 0", "torch.Generator('tpu')", "pin_memory()",
                        "torch.Event('tpu') and PyTorch's profiler on tpu",
                        "data_ptr() (0 for every tpu tensor, so transformers' save_pretrained takes all weights "
                        "for shared: save from the CPU)",
                        "the C++ output-tensor factory, recording kernel and memory ledger (every op takes its "
                        "Python kernel: fused eager's host path is ~3x slower)")


@dataclass(frozen=True)
class Status:
    """Which mode the device runs in, and why."""

    native: bool
    reason: str  # where the module came from, or why there is none

    @property
    def mode(self) -> str:
        return "native core" if self.native else "pure Python"

    def describe(self) -> str:
        if self.native:
            return f"native core ({self.reason})"
        return f"pure Python ({self.reason}; missing: {', '.join(MISSING_WITHOUT_CORE)})"


_module = None
_status: Status | None = None


def _import(path) -> object:
    spec = importlib.util.spec_from_file_location("torchtpu_lab._C", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules["torchtpu_lab._C"] = module
    return module


def load():
    """The ``torchtpu_lab._C`` module, built if needed; ``None`` (and :func:`status` says why) without it."""
    global _module, _status
    if _status is not None:
        return _module
    if os.environ.get(_ENV, "1") == "0":
        _status = Status(False, f"{_ENV}=0")
        return None
    from . import build

    try:
        path = build.build(verbose=True)
        _module = _import(path)
        _status = Status(True, f"built for this torch in {path.parent}")
    except (RuntimeError, OSError, ImportError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        _status = Status(False, f"the core could not be built or loaded: {first}")
        print(f"torchtpu_lab: running in pure-Python mode: {e}", file=sys.stderr)
        _module = None
    return _module


def module():
    """The loaded core, or ``None`` (never builds: :func:`load` decides that once, at registration)."""
    return _module


def status() -> Status:
    return _status if _status is not None else Status(False, "not loaded yet")


def set_device_count(count: int) -> None:
    """Tell the core's guard how many devices the platform has (no-op without the core)."""
    if _module is not None:
        _module.set_device_count(count)


def reentrant_lock():
    """A new re-entrant lock for the runtime's entry points: the core's ``Lock`` when the core loads (its recording
    kernel takes it with plain C calls instead of ``RLock``'s Python methods, ~5% of a recorded op), else a
    :class:`RefusableLock`. Both have ``acquire(blocking, timeout)``, ``release()``, ``with``, ``_is_owned()`` and
    ``refuse(message)``."""
    core = load()
    return core.Lock() if core is not None else RefusableLock()


class RefusableLock:
    """``threading.RLock`` with the core Lock's ``refuse(message)``: once refused, every acquire raises
    ``RuntimeError(message)`` (a child forked after the device started: backend/fork_guard.py)."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._refusal: str | None = None
        self.release = self._lock.release
        self._is_owned = self._lock._is_owned

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if self._refusal is not None:
            raise RuntimeError(self._refusal)
        return self._lock.acquire(blocking, timeout)

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self._lock.release()

    def refuse(self, message: str) -> None:
        self._refusal = message
