"""Non-blocking copies from the device into host memory: ``host.copy_(x, non_blocking=True)``.

As on CUDA, the call returns at once: the work ``x`` waits for is launched (the pending fused graph runs, the
host does not wait for it), and ``host``'s values are undefined until the copy *lands*. It lands when the host
waits for it: ``torch.Event.synchronize`` (or a ``query`` that finds it computed) of an event recorded after the
copy, ``torch.tpu.synchronize``, any read that waits for the device (``.item()``, ``.cpu()``) and the end of a
notebook cell. That is what lets a loop read a flag one step late — transformers' ``DeferredStopCheck`` copies
"every sequence finished" this way and reads it a token later — so the host records step n+1 while the device
runs step n instead of waiting for it.

Each copy takes a number as it is issued. The native core keeps the count (``csrc/guard.cpp``), so an event
recorded in C++ knows which copies come before it; without the core the count is kept here.

``x.to("cpu", non_blocking=True)`` stays a blocking copy: it makes the host tensor it returns, and code that
reads that tensor at once (which works on CUDA when the copy happens to be fast) would read garbage here.
"""

from __future__ import annotations

import collections
from typing import NamedTuple

import torch

from .. import dtypes, native, telemetry
from ..device import tensor
from ..telemetry import SyncReason
from . import fused, program_cost, values

#: number a copy covered by every event: what a device-wide wait lands
ALL = 2 ** 64 - 1


class _Copy(NamedTuple):
    number: int
    host: torch.Tensor  # the destination, written when the copy lands
    held: tensor.TpuTensor  # the source's values when the copy was issued, held by a storage of its own
    nbytes: int


#: copies issued and not landed, oldest first (numbers increase)
_QUEUE: collections.deque[_Copy] = collections.deque()
_ISSUED = [0]  # the count, without the native core


def _next_number() -> int:
    core = native.module()
    if core is not None:
        return core.issue_host_copy()
    _ISSUED[0] += 1
    return _ISSUED[0]


def issued() -> int:
    """How many copies were issued so far: the number an event recorded now covers up to."""
    core = native.module()
    return core.host_copies_issued() if core is not None else _ISSUED[0]


def issue(host: torch.Tensor, src: tensor.TpuTensor) -> None:
    """Copy ``src``'s values into the CPU tensor ``host`` once the device has them, without waiting (see above).

    Shapes are checked now (``src`` must broadcast to ``host``'s shape), as a blocking copy checks them. The
    values are those ``src`` has now: an in-place change after the call does not reach ``host``."""
    src = tensor.adopt(src)
    # PyTorch's own error for shapes that do not broadcast
    torch.empty(host.shape, dtype=host.dtype, device="meta").copy_(torch.empty(src.shape, dtype=src.dtype,
                                                                               device="meta"))
    # pending work is launched (a sync event), not waited for
    array = values.value(src, SyncReason.NON_BLOCKING_COPY, host_read=False)
    # its own storage: a later graph must not donate (and delete) the buffer this copy still reads
    held = tensor.from_array(array, src.dtype, src.tpu_storage.device_index)
    _QUEUE.append(_Copy(_next_number(), host, held, src.numel() * src.element_size()))


def pending(upto: int = ALL) -> bool:
    """Whether a copy numbered ``upto`` or lower has not landed."""
    return bool(_QUEUE) and _QUEUE[0].number <= upto


def land(upto: int = ALL, wait: bool = True) -> bool:
    """Land the copies numbered up to ``upto``, oldest first; ``wait=False`` lands only those already computed
    and stops at the first that is not. Returns whether every copy up to ``upto`` has landed. A sync event is
    recorded only where the host waits: copies the device has finished land without one. Every host read calls
    this: with nothing in flight it is one check."""
    return True if not pending(upto) else _land(upto, wait)


@fused.entry_point
def _land(upto: int, wait: bool) -> bool:
    """:func:`land` under the runtime's lock, as :func:`issue` runs (inside ``copy_``): two threads never land
    one copy twice."""
    while pending(upto) and _QUEUE[0].held.tpu_storage.array.is_ready():
        _write(_QUEUE.popleft())
    if not pending(upto) or not wait:
        return not pending(upto)
    with telemetry.sync_event(SyncReason.COPY_LANDS):
        while pending(upto):
            _write(_QUEUE.popleft())
    return True


def _write(copy: _Copy) -> None:
    array = copy.held.tpu_storage.array
    copy.host.copy_(dtypes.host_tensor(program_cost.host_values(array), copy.held.dtype))
    telemetry.count("transfer_to_host_bytes", copy.nbytes)

