"""Accounting of device buffers held by ``tpu`` tensors.

On TPU and GPU, ``jax.Device.memory_stats()`` is the truth and :func:`stats` reports it. On XLA:CPU it returns
``None``, so we count ourselves: every :class:`~torchtpu_lab.device.storage.Storage` registers the JAX array it
holds, arrays shared by several storages are counted once (keyed by identity), and a buffer leaves the count
when the last storage lets go of it. The figures agree with ``jax.live_arrays()`` to the byte when nothing else
in the process holds JAX arrays.

Allocation events go to telemetry through :data:`listeners`, a list the hot path only iterates when non-empty,
and to the :data:`sample_logs` of open profiles, which the ledger writes into directly (no Python call per
allocation).

What counts is what the *device* holds, not only what tensors hold: a buffer no storage holds any more but that
something still references (in fused mode, a pending graph reads the pre-step value of a parameter the
optimizer just updated) stays allocated until the array object is really gone (a weak reference tells us), or
until a graph that received it as a donation ran (:func:`settle`). While a fused graph runs, its outputs and
temporaries (XLA's ``memory_analysis()`` of the executable) are on the device too: :func:`executing` reports
them to listeners as an ``"exec"`` sample and counts them in the peak.
"""

from __future__ import annotations

import contextlib
import threading
import time
import weakref
from collections.abc import Callable

from .. import config, interrupts, platform, telemetry

# id(array) -> [array, references from storages, device index, bytes, (shape, dtype, source) of its storage]
_live: dict[int, list] = {}
_allocated: dict[int, int] = {}
_peak: dict[int, int] = {}
_since_sample: dict[int, int] = {}  # the most allocated since the sampler's last look (see take_sample_peak)
_counts = {"alloc": 0, "free": 0}
# id(array) -> [weakref to the array, device index, bytes]: released by every storage, still alive on device
_deferred: dict[int, list] = {}

#: Serializes the count's read-modify-write steps across threads (re-entrant: a ``Storage.__del__`` that the
#: garbage collector runs in the middle of an update of this very thread must not deadlock).
_lock = threading.RLock()

#: Callables ``fn(kind, nbytes, device_index)`` told of every ``"alloc"`` and ``"free"``.
listeners: list[Callable[[str, int, int], None]] = []

class SampleLog:
    """What a profile records of device memory on one device: after every allocation, free and graph launch,
    ``(time.perf_counter(), bytes allocated, kind, nbytes)`` appended flat to ``samples`` by the ledger itself
    (in C with the native core: a profiled step makes hundreds, and a Python call each cost more than the
    rest of the profile's per-allocation work), and ``on_peak(t, allocated, kind, nbytes)`` called when the
    allocated bytes rise above ``above`` (rare: the profile moves ``above`` up as it takes snapshots). An
    ``"exec"`` sample's allocated bytes include the graph's outputs and temporaries (its ``nbytes``)."""

    __slots__ = ("device_index", "samples", "above", "on_peak")

    def __init__(self, device_index: int, above: int, on_peak: Callable[[float, int, str, int], None]):
        self.device_index = device_index
        self.samples: list = []
        self.above = above
        self.on_peak = on_peak


#: The open profiles' :class:`SampleLog` s.
sample_logs: list[SampleLog] = []

#: When true, storages remember the user line that created them (``%tpu memory``, profiles); off by default
#: because it costs a stack walk per allocation (``torchtpu_lab.config.track_allocation_sources``).
TRACK_SOURCES = config.track_allocation_sources


@interrupts.guard  # an interrupt between two of these updates would leave the count wrong for good
def acquire(array, device_index: int, nbytes: int, origin: tuple | None = None) -> None:
    """Note that one more storage holds ``array`` (of ``nbytes`` bytes; ``origin``: shape, dtype, source)."""
    with _lock:
        entry = _live.get(id(array))
        if entry is not None:
            entry[1] += 1
            return
        if _deferred and _deferred.pop(id(array), None) is not None:  # held again before it was gone: no new bytes
            _live[id(array)] = [array, 1, device_index, nbytes, origin]
            return
        _live[id(array)] = [array, 1, device_index, nbytes, origin]
        total = _allocated.get(device_index, 0) + nbytes
        _allocated[device_index] = total
        if total > _peak.get(device_index, 0):
            _peak[device_index] = total
        if total > _since_sample.get(device_index, 0):
            _since_sample[device_index] = total
        _counts["alloc"] += 1
    if sample_logs:
        _sample("alloc", nbytes, device_index)
    if listeners:
        _notify("alloc", nbytes, device_index)


@interrupts.guard  # called from ``Storage.__del__``, i.e. from C++ frames
def release(array) -> None:
    """Note that one storage no longer holds ``array``."""
    with _lock:
        entry = _live.get(id(array))
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] > 0:
            return
        del _live[id(array)]
        key = id(array)
        if array.is_deleted():  # donated to a program that ran: its buffer is gone already
            ref = None
        else:
            try:
                ref = weakref.ref(array, lambda _r, key=key: _gone(key))
            except TypeError:  # not weak-referenceable: count it free now
                ref = None
        if ref is not None:
            _deferred[key] = [ref, entry[2], entry[3], entry[4]]
            return
    _free(entry[2], entry[3])


def ledger_state() -> dict:
    """What the native core's ledger (``csrc/ledger.cpp``) counts in: these dicts, under this lock, telling these
    listeners; its writes replace :func:`acquire`, :func:`release` and :func:`settle`, every reader here stays as
    it is."""
    return {"live": _live, "deferred": _deferred, "allocated": _allocated, "peak": _peak,
            "since_sample": _since_sample, "counts": _counts, "listeners": listeners, "notify": _notify,
            "lock": _lock, "sample_logs": sample_logs, "sample_log_type": SampleLog, "peak_reached": _peak_reached}


def use_native(native_acquire: Callable, native_release: Callable, native_settle: Callable) -> None:
    """Count with the native ledger's ``acquire``/``release``/``settle`` (same arguments, same state:
    :func:`ledger_state`) from now on; the Python ones stay in :data:`PYTHON_LEDGER` (pure-Python mode, and the
    test that holds the two to the same counts)."""
    global acquire, release, settle
    acquire, release, settle = native_acquire, native_release, native_settle


def use_lock(lock) -> None:
    """Serialize the counts with ``lock`` from now on (the native core's re-entrant ``Lock``, which its ledger
    takes with plain C calls where ``RLock``'s Python methods cost a call each way per buffer). Called once at
    registration, before any other thread can count."""
    global _lock
    _lock = lock


def _free(device_index: int, nbytes: int) -> None:
    with _lock:
        _allocated[device_index] -= nbytes
        _counts["free"] += 1
    if sample_logs:
        _sample("free", nbytes, device_index)
    if listeners:
        _notify("free", nbytes, device_index)


def _gone(key: int) -> None:
    """Weak-reference callback (may run from the garbage collector): it must never raise."""
    try:
        with _lock:
            entry = _deferred.pop(key, None)
        if entry is not None:
            _free(entry[1], entry[2])
    except BaseException:  # noqa: BLE001,S110 — a callback reachable from C++ must not raise
        pass


def settle() -> None:
    """Count as freed the released buffers that a graph consumed (donated buffers are deleted when it ran)."""
    for key, entry in list(_deferred.items()):
        array = entry[0]()
        if array is None or array.is_deleted():
            with _lock:
                gone = _deferred.pop(key, None) is not None
            if gone:
                _free(entry[1], entry[2])


#: executable -> its analysis (weakly: an evicted executable takes it along); asked once per executable, which the
#: persistent cache's prefetch thread does, so a prefetched executable's analysis is ready before its first sync
_ANALYSED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def analysis(executable) -> dict:
    """XLA's ``memory_analysis()`` of a compiled executable as plain bytes (zeros where XLA does not say)."""
    try:
        known = _ANALYSED.get(executable)
    except TypeError:  # not weak-referenceable: analysed each time
        known = None
    if known is not None:
        return dict(known)
    try:
        stats = executable.memory_analysis()
    except Exception:  # noqa: BLE001 — not every backend reports it
        stats = None
    keys = ("argument", "output", "temp", "alias")
    found = {k: int(getattr(stats, f"{k}_size_in_bytes", 0) or 0) for k in keys}
    try:
        _ANALYSED[executable] = found
    except TypeError:
        pass
    return dict(found)


#: the Python ledger's writers, whichever :func:`use_native` made current
PYTHON_LEDGER = (acquire, release, settle)


def executing(stats: dict, device_index: int, name: str = "") -> None:
    """A compiled graph is about to run: its outputs and temporaries (less outputs that reuse donated inputs)
    exist on the device on top of what is held. Counted in the peak; listeners get an ``"exec"`` sample."""
    extra = max(0, stats.get("output", 0) + stats.get("temp", 0) - stats.get("alias", 0))
    with _lock:
        total = _allocated.get(device_index, 0) + extra
        if total > _peak.get(device_index, 0):
            _peak[device_index] = total
        if total > _since_sample.get(device_index, 0):
            _since_sample[device_index] = total
    if sample_logs:
        _sample("exec", extra, device_index)
    if listeners:
        _notify("exec", extra, device_index)
    if extra and telemetry.recording():
        telemetry.emit("memory", name or "graph", nbytes=extra, with_source=False, **stats)


#: the listeners :func:`_notify` last marked as guarded (marking them on every call cost more than the call)
_guarded: list = [()]


@interrupts.guard
def _notify(kind: str, nbytes: int, device_index: int) -> None:
    """Tell the listeners; one that fails is reported once and dropped, never raised into a deallocation."""
    current = tuple(listeners)
    if current != _guarded[0]:  # element identity first: a cheap comparison while the list is unchanged
        for fn in current:
            interrupts.guard(fn)
        _guarded[0] = current
    for fn in current:
        try:
            fn(kind, nbytes, device_index)
        except Exception as e:  # noqa: BLE001 — a listener (a profile's) must not break the tensor it counts
            import warnings

            with contextlib.suppress(ValueError):
                listeners.remove(fn)
            warnings.warn(f"torchtpu_lab: memory listener {fn!r} failed and was detached: {e!r}", RuntimeWarning,
                          stacklevel=2)


@interrupts.guard
def _sample(kind: str, nbytes: int, device_index: int) -> None:
    """Append a sample to the sample logs of ``device_index`` (the native ledger does the same in C)."""
    now = _allocated.get(device_index, 0) + (nbytes if kind == "exec" else 0)
    t = time.perf_counter()
    for log in tuple(sample_logs):
        if log.device_index == device_index:
            log.samples += (t, now, kind, nbytes)
            if now > log.above:
                _peak_reached(log, t, now, kind, nbytes)


@interrupts.guard
def _peak_reached(log: SampleLog, t: float, allocated_now: int, kind: str, nbytes: int) -> None:
    """Tell ``log`` its device passed its mark; a failing ``on_peak`` is reported once and its log dropped."""
    try:
        log.on_peak(t, allocated_now, kind, nbytes)
    except Exception as e:  # noqa: BLE001 — a profile's snapshot must not break the allocation it samples
        import warnings

        with contextlib.suppress(ValueError):
            sample_logs.remove(log)
        warnings.warn(f"torchtpu_lab: memory sample log {log!r} failed and was detached: {e!r}", RuntimeWarning,
                      stacklevel=2)


def is_held(array) -> bool:
    """Whether some live storage holds ``array``."""
    return id(array) in _live


def holders(array) -> int:
    """How many live storages hold ``array`` (0 for one no storage holds)."""
    entry = _live.get(id(array))
    return 0 if entry is None else entry[1]


def allocated(device_index: int = 0) -> int:
    """Bytes of device buffers held by live tpu tensors on ``tpu:device_index``."""
    return _allocated.get(device_index, 0)


def peak(device_index: int = 0) -> int:
    """The most :func:`allocated` has been since the start or the last :func:`reset_peak`."""
    return _peak.get(device_index, 0)


def take_sample_peak(device_index: int = 0) -> int:
    """The most :func:`allocated` has been since the previous call (since the start, the first time); the next
    call counts from what is allocated now. For one sampler, the side panel's memory chart, which must see peaks
    that fall between its samples long after the session's :func:`peak` (which the user may reset) was set."""
    with _lock:
        now = _allocated.get(device_index, 0)
        value = max(_since_sample.get(device_index, 0), now)
        _since_sample[device_index] = now
    return value


def reset_peak(device_index: int = 0) -> None:
    _peak[device_index] = _allocated.get(device_index, 0)


def largest(device_index: int = 0, n: int = 10) -> list[dict]:
    """The ``n`` largest live buffers: bytes, shape, dtype and the user line that created them (if tracked)."""
    entries = sorted((e for e in _live.values() if e[2] == device_index), key=lambda e: -e[3])[:n]
    out = []
    for e in entries:
        shape, dtype, source = e[4] if e[4] else (tuple(e[0].shape), None, None)
        out.append({"nbytes": e[3], "shape": list(shape), "dtype": str(dtype).replace("torch.", "") if dtype else
                    str(e[0].dtype), "source": telemetry.describe(source) if source else None, "array_id": id(e[0])})
    return out


def owners(device_index: int = 0) -> list[tuple[int, tuple | None, bool]]:
    """What :func:`allocated` counts, buffer by buffer: ``(bytes, (shape, dtype, source) or None, held)``;
    ``held`` is false for a buffer no tensor holds any more that is still referenced (a pending graph reads it).
    The bytes add up to :func:`allocated` (a profile's memory at its peak)."""
    with _lock:
        out = [(e[3], e[4], True) for e in _live.values() if e[2] == device_index]
        out += [(e[2], e[3], False) for e in _deferred.values() if e[1] == device_index]
    return out


def live_buffers(device_index: int | None = None) -> list:
    """The JAX arrays currently held by tpu tensors (each once)."""
    return [e[0] for e in _live.values() if device_index is None or e[2] == device_index]


def stats(device_index: int = 0) -> dict:
    """A ``torch.cuda.memory_stats``-like dict: our own counts, plus XLA's where the platform reports them.
    CUDA's ``active_bytes``/``reserved_bytes`` keys (what ``torch.accelerator.memory_reserved`` & co. read) are
    the allocated figures: XLA keeps no cache of freed blocks that we could report apart."""
    now, top = allocated(device_index), peak(device_index)
    out = {
        "allocated_bytes.all.current": now,
        "allocated_bytes.all.peak": top,
        "active_bytes.all.current": now,
        "active_bytes.all.peak": top,
        "reserved_bytes.all.current": now,
        "reserved_bytes.all.peak": top,
        "allocation.all.allocated": _counts["alloc"],
        "allocation.all.freed": _counts["free"],
        "active.all.current": sum(1 for e in _live.values() if e[2] == device_index),
        "released_but_alive_bytes": sum(e[2] for e in _deferred.values() if e[1] == device_index),
        "source": "torchtpu_lab accounting",
    }
    xla = platform.jax_device(device_index).memory_stats()
    if xla:
        out["source"] = "xla memory_stats"
        for key, value in xla.items():
            out[f"xla.{key}"] = value
        if "bytes_limit" in xla:
            out["bytes_limit"] = xla["bytes_limit"]
    return out
