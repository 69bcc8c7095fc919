"""Collect a :class:`~.session.Profile` while a block runs: telemetry events, memory samples, timings.

``profile(xprof_dir=...)`` also records a ``jax.profiler`` trace (XProf ``*.xplane.pb`` plus a Chrome
``*.trace.json.gz``) for the block, from which device time is then read.

Whatever happens in the block or in the trace, the profile cleans up after itself (``finally``): the memory
listener is detached, the event recorder closed and a started trace stopped, so a failed ``--xprof`` (an
unwritable directory, say) is reported in the profile's :attr:`~.session.Profile.xprof_error` and never
leaves JAX's profiler "already started" for the next profile. Ctrl-C during the clean-up (writing a large trace
takes seconds) is held until the clean-up is done and then raised, so an interrupt never leaves a listener
attached to every later allocation or the profiler started.
"""

from __future__ import annotations

import contextlib
import os
import time

from .. import interrupts, telemetry
from ..device import memory
from ..runtime import program_cost
from .gc_pauses import GcWatch
from .session import PeakSnapshot, Profile

#: a new owner snapshot is taken when the peak grows past the last snapshot's total by more than this fraction:
#: the snapshot then describes a moment within it of the peak, and a block that allocates step by step takes a
#: few hundred snapshots rather than one per allocation
SNAPSHOT_STEP = 0.002


class _MemoryWatch:
    """Samples what the device holds at every allocation, free and graph execution while the block runs (the
    ledger writes them into a :class:`~torchtpu_lab.device.memory.SampleLog`), and keeps who held it at the
    peak (:class:`PeakSnapshot`)."""

    def __init__(self, t0: float, device_index: int = 0):
        self.t0 = t0
        start = memory.allocated(device_index)
        self.at_peak = PeakSnapshot(0.0, start, memory.owners(device_index), 0)
        self.log = memory.SampleLog(device_index, self._mark(start), self._on_peak)

    @staticmethod
    def _mark(total: int) -> int:
        return int(total * (1 + SNAPSHOT_STEP))

    def _on_peak(self, t: float, now: int, kind: str, nbytes: int) -> None:
        # the allocated bytes passed the last snapshot's total by more than SNAPSHOT_STEP: a new snapshot
        self.at_peak = PeakSnapshot(t - self.t0, now, memory.owners(self.log.device_index),
                                    nbytes if kind == "exec" else 0)
        self.log.above = self._mark(now)

    @property
    def peak(self) -> int:
        """The most the device held while the block ran (samples' allocated bytes are every fourth field)."""
        return max(self.log.samples[1::4], default=self.at_peak.total)

    def samples(self) -> list:
        """The samples, flat (:meth:`MemorySample.from_flat` reads them)."""
        return self.log.samples


class _Trace:
    """A ``jax.profiler`` trace that never raises and never stays started: errors become text."""

    def __init__(self, directory: str):
        self.directory = directory
        self.started = False
        self.error: str | None = None

    def start(self) -> None:
        import jax

        try:
            os.makedirs(self.directory, exist_ok=True)
            if not os.access(self.directory, os.W_OK):
                raise PermissionError(f"{self.directory!r} is not writable")
            jax.profiler.start_trace(self.directory, create_perfetto_trace=False)
            self.started = True
        except Exception as e:  # noqa: BLE001 — the profile goes on without a trace; the report says why
            self.error = f"XProf trace not recorded: {type(e).__name__}: {e}"

    def stop(self) -> BaseException | None:
        """Stop the trace; a failure becomes :attr:`error`. An interrupt (``KeyboardInterrupt``, ``SystemExit``)
        raised while writing is returned rather than raised, for :func:`profile` to raise once it has cleaned up:
        raising it here would skip the rest of the clean-up."""
        if not self.started:
            return None
        import jax

        self.started = False
        try:
            jax.profiler.stop_trace()
            return None
        except BaseException as e:  # noqa: BLE001 — recorded here, re-raised by the caller if not an Exception
            self.error = f"XProf trace not written: {type(e).__name__}" + (f": {e}" if str(e) else "")
            state = getattr(getattr(jax._src, "profiler", None), "_profile_state", None)
            if state is not None and getattr(state, "profile_session", None) is not None:
                state.reset()  # JAX leaves the session "started" when writing fails; the next trace must work
            return None if isinstance(e, Exception) else e


@contextlib.contextmanager
def profile(xprof_dir: str | None = None, device_index: int = 0):
    """Record everything the tpu runtime does inside the ``with`` block into a :class:`Profile`.

    The block's pending fused work is flushed at the end (so its compiles and execution are in the profile),
    and the profile is complete even when the block raises (the exception then propagates unchanged).
    """
    from ..runtime import fused, modes

    fused.sync(telemetry.SyncReason.PROFILE_START, record=False)
    prof = Profile(device_index=device_index)
    prof.start(memory.allocated(device_index), memory.live_buffers(device_index))
    prof.modes = (modes.current(),)
    watch = _MemoryWatch(prof.t0, device_index)
    trace = _Trace(xprof_dir) if xprof_dir else None
    recorder = telemetry.Recorder()
    collections = GcWatch()
    tracked = memory.TRACK_SOURCES.value
    memory.sample_logs.append(watch.log)
    program_cost.begin()
    spans = interrupts.entry_spans[0]  # an enclosing profile's list: share it, keep our part of it
    if spans is None:
        spans = interrupts.entry_spans[0] = []
    prof._spans_from = (spans, len(spans))
    block_raised = False
    try:
        recorder.__enter__()
        collections.start()
        memory.TRACK_SOURCES.set(True)
        if trace is not None:
            trace.start()
        try:
            yield prof
        except BaseException as e:
            block_raised = True
            prof.error = f"{type(e).__name__}: {e}"
            raise
        finally:
            try:
                fused.sync(telemetry.SyncReason.PROFILE_END)
            except Exception as e:  # noqa: BLE001 — a failing fused graph is part of the block's outcome
                prof.error = prof.error or f"{type(e).__name__}: {e}"
                prof.flush_exception = e
    finally:
        with interrupts.deferred():  # a Ctrl-C here is raised after the last line of the clean-up
            prof.gc_spans = collections.stop()
            interrupted = _clean_up(prof, watch, trace, recorder, tracked, xprof_dir, device_index)
        if interrupted is not None and not block_raised:  # the block's own exception, if any, wins
            raise interrupted


def _clean_up(prof: Profile, watch: _MemoryWatch, trace: _Trace | None, recorder: telemetry.Recorder,
              tracked: bool, xprof_dir: str | None, device_index: int) -> BaseException | None:
    """Detach and close everything :func:`profile` attached, then complete ``prof``; each step runs even if an
    earlier one fails. Returns an interrupt raised while the trace was written (for the caller to raise)."""
    interrupted = None
    with contextlib.suppress(Exception):  # the runs still going: waited for and timed (never raises; never fatal)
        program_cost.finish()
    spans, first = prof._spans_from
    prof.entry_spans = spans if first == 0 else spans[first:]
    if first == 0:
        interrupts.entry_spans[0] = None
    try:
        recorder.close(expand_records=False)  # the profile expands its op records on first read
    finally:
        memory.TRACK_SOURCES.set(tracked)
        with contextlib.suppress(ValueError):
            memory.sample_logs.remove(watch.log)
        if trace is not None:
            interrupted = trace.stop()
    from ..runtime import modes

    if modes.current() != prof.modes[-1]:
        prof.modes += (modes.current(),)
    prof.finish(recorder.events, watch.samples(), watch.peak, memory.allocated(device_index),
                memory.live_buffers(device_index), xprof_dir if trace is not None and trace.error is None else None)
    prof.peak_snapshot = watch.at_peak
    if trace is not None:
        prof.xprof_error = trace.error
    return interrupted
