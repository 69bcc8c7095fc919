"""A process forked after the tpu device started refuses tpu work instead of hanging.

JAX's runtime (its client, thread pools and device buffers) does not survive ``fork``: a forked child that reads
a tpu value waits forever for threads that exist only in the parent. CUDA has the same limit, and this gives
PyTorch's answer for it: in such a child, ``torch.tpu.init()``, ``torch.tpu._is_in_bad_fork()`` and every tpu op
say "Cannot re-initialize tpu in forked subprocess ... 'spawn' start method". A child forked before the device
started (the platform is decided on first use) may use it, and forked workers that only touch CPU tensors (a
``DataLoader``'s) are unaffected.

The refusal is the runtime lock's (``fused.LOCK``, which every op takes): its ``refuse`` makes each later acquire
raise, and with the native core the recording kernel's C acquire fail over to the Python kernel, which raises.
"""

from __future__ import annotations

import os

from .. import platform
from ..runtime import fused

MESSAGE = ("Cannot re-initialize tpu in forked subprocess. To use tpu with multiprocessing, you must use the "
           "'spawn' start method (JAX's runtime, started in the parent, does not survive fork: "
           "multiprocessing.get_context('spawn'), DataLoader(..., multiprocessing_context='spawn'))")

_state = {"installed": False, "bad_fork": False}


def _after_fork_in_child() -> None:
    if not platform.started():
        return
    _state["bad_fork"] = True
    fused.LOCK.refuse(MESSAGE)


def install() -> None:
    """Register the fork handler (once per process)."""
    if not _state["installed"]:
        os.register_at_fork(after_in_child=_after_fork_in_child)
        _state["installed"] = True


def in_bad_fork() -> bool:
    """Whether this process is a child forked after the device started (``torch.tpu._is_in_bad_fork``)."""
    return _state["bad_fork"]


def check() -> None:
    """Raise PyTorch's re-initialization error in a bad fork (``torch.tpu.init``/``_lazy_init``)."""
    if _state["bad_fork"]:
        raise RuntimeError(MESSAGE)


def installed() -> bool:
    return _state["installed"]
