"""Raise the data-dependent errors that compiled ops report (see :mod:`torchtpu_lab.ops.error_flags`).

An op whose lowering reports gets a traced function returning ``(outputs, flags)``: :func:`instrument` builds it.
The flags of each call — computed by the op itself (strict mode) or by the fused graph that contains it —
are kept with the op's name and the user's line (:func:`note`) and inspected at the next host read or sync
(:func:`raise_pending`); a set flag raises the error PyTorch's CPU kernel raises, naming the op and the line.
Inspecting waits only for flags that are already computed unless asked to block, so a training loop keeps the
host ahead of the device; a host read (``.item()``, ``.cpu()``, printing) always blocks, and so raises.
"""

from __future__ import annotations

import functools
import threading
from collections import deque

import jax
import numpy as np

from .. import telemetry
from ..ops import error_flags as op_checks

#: Flags awaiting inspection: (flag, value, Check, op name, user source).
_pending: deque = deque()
_lock = threading.Lock()
#: Beyond this many uninspected flags, the oldest are inspected (blocking) so the list stays bounded.
MAX_PENDING = 256


def instrument(run):
    """``run`` (an op's traced function) returning ``(outputs, flags)``; ``statics`` fills in at trace time."""
    statics: list = []

    def checked(*args):
        with op_checks.collecting() as found:
            out = run(*args)
        statics[:] = [c for _, _, c in found]
        return out, tuple((flag, value) for flag, value, _ in found)

    return checked, statics


def note(flags, statics: list, name: str, source) -> None:
    """Keep one call's flags (concrete arrays, or pairs of them) for inspection."""
    if not statics:
        return
    flat = list(flags)
    with _lock:
        for i, check in enumerate(statics):
            _pending.append((flat[2 * i], flat[2 * i + 1], check, name, source))
        overflow = len(_pending) > MAX_PENDING
    if overflow:
        raise_pending(block=True, limit=len(_pending) - MAX_PENDING // 2)


def callback(statics: list, name: str, source):
    """A :func:`torchtpu_lab.runtime.fused.also_compute` callback noting a fused op's flags once computed: a
    ``functools.partial`` of :func:`note_later`, which the native recording kernel makes the same way (in C, so
    recording an op with checks runs no Python)."""
    return functools.partial(note_later, statics, name, source)


def note_later(statics: list, name: str, source, values) -> None:
    """:func:`note` with the call's facts first (the order ``functools.partial`` binds them in)."""
    note(values, statics, name, source)


def pending() -> int:
    return len(_pending)


def raise_pending(block: bool = True, limit: int | None = None) -> None:
    """Inspect noted flags (all, or the oldest ``limit``; only computed ones unless ``block``) and raise the
    first error found. Every inspected flag is dropped, raised or not, so one error is raised once."""
    if not _pending:
        return
    with _lock:
        taken = []
        keep = deque()
        for i, entry in enumerate(_pending):
            if (limit is None or i < limit) and (block or _ready(entry[0])):
                taken.append(entry)
            else:
                keep.append(entry)
        _pending.clear()
        _pending.extend(keep)
    if not taken:
        return
    # each flag read on its own: jax.device_get's tree walk and trace annotation cost four times the read of a
    # flag (a sync of a step with an embedding or a gather makes one every step); values only for set flags
    failed = [(np.asarray(e[1]), e) for e in taken if bool(np.asarray(e[0]))]
    if not failed:
        return
    (value, (_, _, check, name, source)), rest = failed[0], failed[1:]
    with _lock:  # the other errors found stay pending (as host values), each raised in its turn
        _pending.extendleft(reversed([(True, v, *e[2:]) for v, e in rest]))
    where = f" (at {telemetry.describe(source)})" if source else ""
    raise check.error(f"{name}: {op_checks.formatted(check.message, value)}{where}")


def _ready(flag) -> bool:
    return flag.is_ready() if isinstance(flag, jax.Array) else True
