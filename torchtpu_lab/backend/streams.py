"""``torch.tpu.Stream`` / ``Event`` / ``current_stream`` / ``stream``: the stream API that FSDP2 and other
CUDA-shaped code call, on a device that has one ordered queue.

XLA runs a device's programs in the order they were issued and tracks buffer readiness itself, so there is
one stream per device and every ordering request between streams (``wait_stream``, ``wait_event``) already
holds. What can be waited for is real: ``Stream.synchronize`` waits for the device
(:func:`torch.tpu.synchronize`), ``Event.synchronize`` for the non-blocking copies to the host issued before the
event (or the device, where none is left: :func:`.device_wait.event_reached`). TorchTPU exposes the same
placeholders.
"""

from __future__ import annotations

import contextlib
import time

import torch

from ..runtime import host_copies
from .device_wait import event_reached, wait_for_device


def _index(device) -> int:
    """The tpu index of ``device`` (``None``: the current device; an int, a string or a ``torch.device``)."""
    from ..device import context

    if device is None:
        return context.current_index()
    if isinstance(device, int):
        return device
    index = torch.device(device).index
    return context.current_index() if index is None else index


class Stream:
    """The device's one queue. ``priority`` is accepted and ignored (there is nothing to prioritise)."""

    def __init__(self, device=None, priority: int = 0, **kwargs) -> None:
        self.device = torch.device("tpu", _index(device))
        self.priority = priority

    def wait_stream(self, stream: "Stream") -> None:
        """Already ordered: one queue."""

    def wait_event(self, event: "Event") -> None:
        """Already ordered: one queue."""

    def record_event(self, event: "Event | None" = None) -> "Event":
        event = event or Event()
        event.record(self)
        return event

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        wait_for_device(self.device.index)

    def __eq__(self, other) -> bool:
        return isinstance(other, Stream) and other.device == self.device

    def __hash__(self) -> int:
        return hash(("tpu-stream", self.device))

    def __repr__(self) -> str:
        return f"<torch.tpu.Stream device={self.device} (XLA orders work itself)>"


class Event:
    """A point in the device's queue; ``synchronize`` waits for what came before it (see the module's text).
    With ``enable_timing=True``, ``record`` waits for the work before it (so the mark is real) and
    ``elapsed_time`` gives host-measured milliseconds between two recorded events; without it, ``record`` costs
    nothing (FSDP2 records many)."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> None:
        self.enable_timing = enable_timing
        self._stream: Stream | None = None
        self._t: float | None = None
        self._copies = 0  # the non-blocking copies to the host issued before the record

    def record(self, stream: Stream | None = None) -> None:
        self._stream = stream or current_stream()
        self._copies = host_copies.issued()
        if self.enable_timing:
            self._stream.synchronize()
            self._t = time.perf_counter()

    def wait(self, stream: Stream | None = None) -> None:
        """Already ordered: one queue."""

    def query(self) -> bool:
        return self._stream is not None and event_reached(self._stream.device.index, self._copies, False)

    def synchronize(self) -> None:
        stream = self._stream or current_stream()
        event_reached(stream.device.index, self._copies, True)

    def elapsed_time(self, end_event: "Event") -> float:
        if not (self.enable_timing and end_event.enable_timing):
            raise RuntimeError("Both events must be created with enable_timing=True to measure elapsed time")
        if self._t is None or end_event._t is None:
            raise RuntimeError("Both events must be recorded before calling elapsed_time")
        return (end_event._t - self._t) * 1e3


_default: dict[int, Stream] = {}


def current_stream(device=None) -> Stream:
    index = _index(device)
    s = _default.get(index)
    if s is None:
        s = _default[index] = Stream(index)
    return s


default_stream = current_stream


@contextlib.contextmanager
def stream(s: Stream | None):
    """``with torch.tpu.stream(s):`` — a no-op context (one queue)."""
    yield s
