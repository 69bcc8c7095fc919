"""The three eager modes (TorchTPU's names in brackets):

* ``debug``  [DEFER_NEVER_AND_LAUNCH_BLOCKING]: one op at a time, each waited for, so an error (or, with
  ``torchtpu_lab.debug.check_finite(True)``, a NaN/Inf) surfaces at the op and the user line that caused it;
* ``strict`` [DEFER_NEVER]: one op at a time, asynchronous; each op's executable cached by its signature;
* ``fused``  [DEFER_AND_FUSE] (default): ops are recorded into a lazy graph and run as one XLA computation at
  the next sync point (see :mod:`.fused`).

Switching is always safe: leaving ``fused`` flushes the pending graph first.
"""

from __future__ import annotations

import contextlib

from .. import config

MODES = config.EAGER_MODES
#: the state behind the mode (``torchtpu_lab.config.eager_mode``; ``$TORCHTPU_LAB_EAGER_MODE`` sets its default)
MODE = config.eager_mode


def _flush_before_switch(old: str, new: str) -> None:
    if new != old:
        from . import fused

        from ..telemetry import SyncReason

        fused.sync(SyncReason.MODE_SWITCH)


MODE.before_change(_flush_before_switch)  # so `with config.patch(eager_mode=...)` flushes too


def current() -> str:
    return MODE.value


def set_eager_mode(name: str) -> None:
    """Switch eager mode (``"debug"``, ``"strict"`` or ``"fused"``); pending fused work is flushed first."""
    MODE.set(name)


@contextlib.contextmanager
def eager_mode(name: str):
    """Run a block in another eager mode: ``with torchtpu_lab.eager_mode("debug"): ...``."""
    with MODE(name):
        yield


def check_finite(enabled: bool = True) -> None:
    """In debug mode, raise at the first op whose output has a NaN or Inf."""
    config.check_finite.set(enabled)


def checking_finite() -> bool:
    return config.check_finite.value
