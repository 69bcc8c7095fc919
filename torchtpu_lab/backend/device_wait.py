"""Waiting for a device: what ``torch.tpu.synchronize`` and ``Stream``/``Event.synchronize`` all do.

Its own module so that :mod:`.streams` and :mod:`.tpu_module` (which re-exports the stream API) both build on it
without importing each other.
"""

from __future__ import annotations

from .. import telemetry
from ..device import memory
from ..runtime import fused, pending_errors


def wait_for_device(index: int) -> None:
    """Run pending fused work and wait until every buffer held by tpu tensors on ``tpu:index`` is computed;
    then raise any error the finished work reported (everything has run, so every error is known)."""
    with telemetry.sync_event(telemetry.SyncReason.SYNCHRONIZE, fused.pending_ops()):
        fused.sync(telemetry.SyncReason.SYNCHRONIZE, record=False)
        for array in memory.live_buffers(index):
            array.block_until_ready()
    pending_errors.raise_pending()
