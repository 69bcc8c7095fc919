"""Collect a :class:`~.session.Profile` while a block runs: telemetry events, memory samples, timings.

``profile(xprof_dir=...)`` also records a ``jax.profiler`` trace (XProf / TensorBoard ``*.xplane.pb`` plus a
Chrome ``*.trace.json.gz``) for the block, from which device time is then read.
"""

from __future__ import annotations

import contextlib
import time

from .. import telemetry
from ..device import memory
from .session import MemorySample, Profile


class _MemoryWatch:
    """Samples allocated bytes at every allocation and free while the block runs (a memory timeline)."""

    def __init__(self, t0: float, device_index: int = 0):
        self.t0 = t0
        self.device_index = device_index
        self.samples: list[MemorySample] = []
        self.peak = memory.allocated(device_index)

    def __call__(self, kind: str, nbytes: int, device_index: int) -> None:
        if device_index != self.device_index:
            return
        now = memory.allocated(device_index)
        self.peak = max(self.peak, now)
        self.samples.append(MemorySample(time.perf_counter() - self.t0, now, kind, nbytes))


@contextlib.contextmanager
def profile(xprof_dir: str | None = None, device_index: int = 0):
    """Record everything the tpu runtime does inside the ``with`` block into a :class:`Profile`.

    The block's pending fused work is flushed at the end (so its compiles and execution are in the profile),
    and the profile is complete even when the block raises.
    """
    from ..runtime import lazy

    lazy.sync(telemetry.SyncReason.PROFILE_START, record=False)
    prof = Profile(device_index=device_index)
    prof.start(memory.allocated(device_index), memory.live_buffers(device_index))
    watch = _MemoryWatch(prof.t0, device_index)
    memory.listeners.append(watch)
    trace = None
    if xprof_dir:
        import jax

        trace = jax.profiler.trace(xprof_dir, create_perfetto_trace=False)
        trace.__enter__()
    recorder = telemetry.Recorder()
    events = recorder.__enter__()
    tracked = memory.track_sources
    memory.track_sources = True
    try:
        yield prof
    except BaseException as e:
        prof.error = f"{type(e).__name__}: {e}"
        raise
    finally:
        try:
            lazy.sync(telemetry.SyncReason.PROFILE_END)
        except Exception as e:  # noqa: BLE001 — a failing fused graph is part of the block's outcome
            prof.error = prof.error or f"{type(e).__name__}: {e}"
        recorder.__exit__(None, None, None)
        memory.track_sources = tracked
        if trace is not None:
            trace.__exit__(None, None, None)
        memory.listeners.remove(watch)
        prof.finish(events, watch.samples, watch.peak, memory.allocated(device_index),
                    memory.live_buffers(device_index), xprof_dir)
