"""Waiting for a device: what ``torch.tpu.synchronize`` and ``Stream``/``Event.synchronize`` all do, and what
``Event.query`` answers.

Its own module so that :mod:`.streams` and :mod:`.tpu_module` (which re-exports the stream API) both build on it
without importing each other.
"""

from __future__ import annotations

from .. import telemetry
from ..device import memory
from ..runtime import fused, host_copies, pending_errors


def wait_for_device(index: int) -> None:
    """Run pending fused work and wait until every buffer held by tpu tensors on ``tpu:index`` is computed and
    every non-blocking copy to the host has landed; then raise any error the finished work reported (everything
    has run, so every error is known)."""
    with telemetry.sync_event(telemetry.SyncReason.SYNCHRONIZE, fused.pending_ops()):
        fused.sync(telemetry.SyncReason.SYNCHRONIZE, record=False)
        for array in memory.live_buffers(index):
            array.block_until_ready()
    host_copies.land()
    pending_errors.raise_pending()


def event_reached(index: int, upto: int, wait: bool) -> bool:
    """What ``Event.synchronize`` (``wait``) and ``Event.query`` do for an event on ``tpu:index`` recorded after
    the non-blocking copies to the host numbered up to ``upto``: land those copies (``query`` only those the
    device has computed), and say whether all have landed. They are what the host can observe of the work before
    the event; the device runs on meanwhile, which is the point of an event a loop waits on one step late. Where
    none of them is left to land, ``synchronize`` waits for the device as :func:`wait_for_device` does (timing
    code expects that) and ``query`` answers True."""
    if host_copies.pending(upto):
        return host_copies.land(upto, wait)
    if wait:
        wait_for_device(index)
    return True
