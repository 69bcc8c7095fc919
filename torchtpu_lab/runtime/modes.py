"""The three eager modes (TorchTPU's names in brackets):

* ``debug``  [DEFER_NEVER_AND_LAUNCH_BLOCKING]: one op at a time, each waited for, so an error (or, with
  ``torchtpu_lab.debug.check_finite(True)``, a NaN/Inf) surfaces at the op and the user line that caused it;
* ``strict`` [DEFER_NEVER]: one op at a time, asynchronous; each op's executable cached by its signature;
* ``fused``  [DEFER_AND_FUSE] (default): ops are recorded into a lazy graph and run as one XLA computation at
  the next sync point (see :mod:`.lazy`).

Switching is always safe: leaving ``fused`` flushes the pending graph first.
"""

from __future__ import annotations

import contextlib
import os

MODES = ("debug", "strict", "fused")
_ENV = "TORCHTPU_LAB_EAGER_MODE"

_state = {"mode": os.environ.get(_ENV, "fused"), "check_finite": False}
if _state["mode"] not in MODES:
    raise ValueError(f"{_ENV}={_state['mode']!r}: expected one of {', '.join(MODES)}")


def current() -> str:
    return _state["mode"]


def set_eager_mode(name: str) -> None:
    """Switch eager mode (``"debug"``, ``"strict"`` or ``"fused"``); pending fused work is flushed first."""
    if name not in MODES:
        raise ValueError(f"unknown eager mode {name!r}; choose one of {', '.join(MODES)}")
    if name != _state["mode"]:
        from . import lazy

        from ..telemetry import SyncReason

        lazy.sync(SyncReason.MODE_SWITCH)
    _state["mode"] = name


@contextlib.contextmanager
def eager_mode(name: str):
    """Run a block in another eager mode: ``with torchtpu_lab.eager_mode("debug"): ...``."""
    previous = current()
    set_eager_mode(name)
    try:
        yield
    finally:
        set_eager_mode(previous)


def check_finite(enabled: bool = True) -> None:
    """In debug mode, raise at the first op whose output has a NaN or Inf."""
    _state["check_finite"] = bool(enabled)


def checking_finite() -> bool:
    return _state["check_finite"]
