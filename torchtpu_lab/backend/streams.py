"""``torch.tpu.Stream`` / ``Event`` / ``current_stream`` / ``stream``: the stream API that FSDP2 and other
CUDA-shaped code call, on a device that has one ordered queue.

XLA runs a device's programs in the order they were issued and tracks buffer readiness itself, so there is
one stream per device and every ordering request between streams (``wait_stream``, ``wait_event``) already
holds. What can be waited for is real: ``Stream.synchronize`` and ``Event.synchronize`` wait for the device
(:func:`torch.tpu.synchronize`). TorchTPU exposes the same placeholders.
"""

from __future__ import annotations

import contextlib

import torch


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
        from . import tpu_module

        tpu_module.synchronize(self.device)

    def __eq__(self, other) -> bool:
        return isinstance(other, Stream) and other.device == self.device

    def __hash__(self) -> int:
        return hash(("tpu-stream", self.device))


class Event:
    """A point in the device's queue; ``synchronize`` waits for the device."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> None:
        self._stream: Stream | None = None

    def record(self, stream: Stream | None = None) -> None:
        self._stream = stream or current_stream()

    def wait(self, stream: Stream | None = None) -> None:
        """Already ordered: one queue."""

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        (self._stream or current_stream()).synchronize()


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
