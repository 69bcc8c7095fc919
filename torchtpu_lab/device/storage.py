"""The device buffer behind a base tensor and all of its views.

A :class:`Storage` owns one JAX array in the base tensor's shape. Mutation never touches that array (JAX arrays
are immutable): a write computes a new array and :attr:`Storage.array` is replaced, so every tensor that shares
the storage — the base and all its views — sees the new values. ``torch.empty`` allocates nothing: the array is
created on first read, zero-filled, and usually never, because the first write replaces it whole.

In fused mode the array may be a placeholder the runtime will compute at the next sync point; the storage
only counts memory for concrete arrays. The runtime marks a value whose computation failed with a
:class:`FailedValue` (the protocol declared here, so the data model never needs to know the runtime): reading
such a storage re-raises the failure.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import torch

from .. import dtypes, interrupts, telemetry
from . import memory, sizes


class FailedValue:
    """What a storage holds in place of an array whose computation failed: reading it re-raises ``error``.

    Declared here (the data model); the runtime subclasses it for its own failures."""

    __slots__ = ("error", "shape", "dtype")

    def __init__(self, error: BaseException, shape, dtype):
        self.error = error
        self.shape = shape
        self.dtype = dtype


_ARRAY_TYPES: dict = {}  # type -> whether its instances are JAX arrays


def is_array(value) -> bool:
    """``isinstance(value, jax.Array)``, remembered per type: ``jax.Array``'s check goes through its metaclass,
    and a storage asks on every write and every ``__del__`` (it was most of the cost of dropping a fused tensor).
    Tracers are asked every time (whether one counts as an array is not a property of its type alone)."""
    kind = type(value)
    known = _ARRAY_TYPES.get(kind)
    if known is None:
        known = isinstance(value, jax.Array)
        if not isinstance(value, jax.core.Tracer):
            _ARRAY_TYPES[kind] = known
    return known


class Storage:
    __slots__ = ("_array", "shape", "dtype", "device_index", "nbytes", "source", "__weakref__")

    def __init__(self, shape: tuple, dtype: torch.dtype, device_index: int, array=None):
        self._array = None  # first: __del__ runs even when the check below raises
        sizes.check(shape, dtype)
        self.shape = tuple(shape)
        self.dtype = dtype
        self.device_index = device_index
        self.nbytes = math.prod(self.shape) * dtype.itemsize
        self.source = telemetry.user_source(2) if memory.TRACK_SOURCES.value else None
        if array is not None:
            self.array = array

    @classmethod
    def output(cls, shape: tuple, dtype: torch.dtype, device_index: int, value, source=None) -> Storage:
        """A storage for an op's output — a JAX array, or a runtime placeholder — whose shape the runtime has
        already checked: the per-op path, so it skips the size check ``__init__`` makes. ``source``: the user
        line, when the caller has it already (else looked up here, if allocation sources are tracked)."""
        s = object.__new__(cls)
        s._array = None
        s.shape = shape
        s.dtype = dtype
        s.device_index = device_index
        s.nbytes = math.prod(shape) * dtype.itemsize
        if memory.TRACK_SOURCES.value:
            s.source = source if source is not None else telemetry.user_source(2)
        else:
            s.source = None
        if is_array(value):
            memory.acquire(value, device_index, s.nbytes, (shape, dtype, s.source))
        s._array = value
        return s

    @property
    def array(self):
        """The JAX array holding the values (allocated, zero-filled, on first read of an empty storage), or in
        fused mode a :class:`~torchtpu_lab.runtime.fused.LazyValue` standing for one not computed yet."""
        a = self._array
        if a is None:
            from .. import platform

            with jax.default_device(platform.jax_device(self.device_index)):
                self.array = jnp.zeros(self.shape, dtypes.to_jax(self.dtype))
            return self._array
        if isinstance(a, FailedValue):  # a fused computation of this value failed earlier
            raise a.error
        return a

    @array.setter
    def array(self, new) -> None:
        old = self._array
        if new is old:
            return
        if is_array(new):
            memory.acquire(new, self.device_index, self.nbytes, (self.shape, self.dtype, self.source))
        self._array = new
        if is_array(old):
            memory.release(old)

    @property
    def held(self):
        """What the storage holds now, as it is: a JAX array, a runtime placeholder, a :class:`FailedValue`, or
        ``None`` before the first write (unlike :attr:`array`, reading it never allocates and never raises)."""
        return self._array

    @property
    def allocated(self) -> bool:
        return self._array is not None

    @interrupts.guard  # runs wherever the last reference drops, often under a C++ frame
    def __del__(self) -> None:
        if is_array(self._array):
            memory.release(self._array)

    def finish_interrupted_del(self) -> None:
        """Finish a ``__del__`` that a Ctrl-C cut short on entry (called by the interrupts' unraisable hook)."""
        a, self._array = self._array, None
        if is_array(a):
            memory.release(a)


def holding(refs, kind: type) -> tuple[list, list]:
    """The live storages among the weak references ``refs`` whose value is exactly of type ``kind``, and those
    values, in order: a sync's snapshot of the placeholders it must compute, in one pass (no property call and
    no ``isinstance`` per storage: a training step's sync walks a few hundred)."""
    storages, values = [], []
    for ref in refs:
        s = ref()
        if s is not None:
            value = s._array
            if type(value) is kind:
                storages.append(s)
                values.append(value)
    return storages, values


def use_native_ledger(core) -> None:
    """Count device memory with the native core's ledger: :func:`.memory.acquire`/``release`` and
    ``Storage.__del__`` become C functions over memory's own dicts (``csrc/ledger.cpp``); a dropped storage then
    runs no Python frame (it was the largest part of a strict op's host cost). The counts' lock becomes the core's
    own ``Lock``, which the ledger takes without a Python call."""
    if not isinstance(memory._lock, core.Lock):  # once: the ledger keeps the lock it was configured with
        memory.use_lock(core.Lock())
    core.configure_ledger({**memory.ledger_state(), "Storage": Storage, "array_types": _ARRAY_TYPES,
                           "is_array": is_array})
    memory.use_native(core.ledger_acquire, core.ledger_release, core.ledger_settle)
    Storage.__del__ = core.storage_finalizer(Storage)
    _STORE_ALL[0] = core.store_all


def store_all(storages: list, values: list) -> None:
    """``storage.array = value`` for each pair: a sync's commit of its results, in one native call when the core
    has the ledger."""
    native = _STORE_ALL[0]
    if native is not None:
        native(storages, values)
        return
    for s, v in zip(storages, values):
        s.array = v


#: the native core's store_all (``None``: pure-Python mode, or before registration)
_STORE_ALL: list = [None]
