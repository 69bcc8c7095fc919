"""Kernels that are not lowerings: allocation, host<->device transfers, reading a scalar back, resizing.

Every transfer to the host is a sync point: it waits for the device. (Telemetry of syncs comes with the eager
modes; this module only moves data.)
"""

from __future__ import annotations

import math

import jax
import jax.numpy
import numpy as np
import torch
from torch._prims_common import suggest_memory_format

from .. import dtypes, platform, telemetry
from ..telemetry import SyncReason
from ..device import context, reinterpret, sizes, tensor, views
from ..device.storage import Storage
from ..ops.registry import Lowering
from . import executor, fused, host_copies, program_cost, transfer, values

aten = torch.ops.aten


def _tpu_index(device) -> int:
    device = torch.device(device) if device is not None else torch.device("tpu")
    index = context.current_index() if device.index is None else device.index
    platform.jax_device(index)  # raises, listing the devices, when tpu:index does not exist
    return index


def to_host(t: tensor.TpuTensor, reason: SyncReason = SyncReason.TO_HOST) -> torch.Tensor:
    """A CPU copy of a tpu tensor's values: a sync point (it waits for the device), recorded with its reason.
    Non-blocking copies issued before it land first, as they would on a CUDA stream."""
    host_copies.land()
    reason = telemetry.sync_reason.get() or reason
    with telemetry.sync_event(reason, fused.pending_ops()):
        host = dtypes.host_tensor(program_cost.host_values(values.value(t, reason, record=False)), t.dtype)
    telemetry.count("transfer_to_host_bytes", host.numel() * host.element_size())
    return host


def from_host(t: torch.Tensor, device_index: int) -> tensor.TpuTensor:
    """A new tpu tensor holding a copy of a CPU tensor's values."""
    host = np.array(dtypes.host_array(t), copy=True)  # never let the device alias user memory
    array = transfer.to_device(host, device_index)
    telemetry.count("transfer_to_device_bytes", host.nbytes)
    return tensor.from_array(array, t.dtype, device_index)


def empty_memory_format(size, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    if memory_format not in (None, torch.contiguous_format, torch.preserve_format):
        # channels_last and friends: the strides PyTorch gives that format, on a storage laid out that way
        stride = torch.empty(tuple(size), device="meta", memory_format=memory_format).stride()
        return empty_strided(size, stride, dtype, layout, device, pin_memory)
    dtype = dtype or torch.get_default_dtype()
    dtypes.to_jax(dtype)
    return tensor.empty(tuple(size), dtype, _tpu_index(device))


def empty_strided(size, stride, dtype=None, layout=None, device=None, pin_memory=None):
    """A tensor with exactly the strides asked for, as on CPU: a non-row-major layout is a view over a flat
    storage of the extent those strides span (reads and writes go through the view's gather/scatter)."""
    size, stride = tuple(size), tuple(stride)
    if stride == views.contiguous_strides(size):
        return empty_memory_format(size, dtype, layout, device, pin_memory)
    torch.empty_strided(size, stride, device="meta")  # PyTorch's error for a bad size or stride
    extent = 1 + sum((n - 1) * s for n, s in zip(size, stride)) if all(size) else 0
    base = empty_memory_format((extent,), dtype, layout, device, pin_memory)
    return tensor.make(base.tpu_storage, views.canonical((extent,), size, stride, 0))


_CAST = Lowering(aten._to_copy.default, lambda x, **_: x)


def to_copy(self, *, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False,
            memory_format=None):
    target = torch.device(device) if device is not None else self.device
    if tensor.on_tpu(self):
        self = tensor.adopt(self)
        if target.type == "tpu":
            index = _tpu_index(target) if target.index is not None else self.tpu_storage.device_index
            if index != self.tpu_storage.device_index:
                moved = jax.device_put(values.value(self), platform.jax_device(index))
                return to_copy(tensor.from_array(moved, self.dtype, index), dtype=dtype)
            kwargs = {"dtype": dtype or self.dtype}
            if memory_format is not None:  # the result's strides (runtime/layouts.py); preserve_format by default
                kwargs["memory_format"] = memory_format
            return executor.execute(_CAST, (self,), kwargs)
        host = to_host(self)
        return host.to(dtype=dtype or host.dtype, device=target)
    src = self if dtype is None else self.to(dtype)
    return from_host(src, _tpu_index(target))


#: A cast on the tensor's own device (``x.float()``, ``x.to(torch.bfloat16)``, ``logits.to(copy=True)``) is
#: ``_CAST``'s call in the executor, so the recording kernel (csrc/recorder.cpp) may serve it once that call taught
#: it; a call naming another device is a transfer, which the recording kernel never keys (this kernel's)
to_copy.lowering = _CAST


def copy_(self, src, non_blocking=False):
    if tensor.on_tpu(self):
        self = tensor.adopt(self)
        index = self.tpu_storage.device_index
        if not tensor.on_tpu(src):
            src = from_host(src.to(self.dtype), index)
        elif tensor.adopt(src).tpu_storage.device_index != index:
            src = to_copy(src, device=torch.device("tpu", index))
        shape = tuple(self.shape)
        wide = sizes.broadcast(shape, tuple(src.shape))
        if wide is None:
            raise RuntimeError(sizes.broadcast_error(shape, tuple(src.shape)))
        if wide != shape:
            raise RuntimeError(f"output with shape {list(shape)} doesn't match the broadcast shape {list(wide)}")
        values.assign(self, src)
        return self
    # a CPU (or other device) destination, a tpu source
    if non_blocking and self.device.type == "cpu":
        host_copies.issue(self, src)  # lands at an event's synchronize, or any wait for the device
    else:
        self.copy_(to_host(src))
    return self


def local_scalar_dense(self):
    host_copies.land()
    reason = telemetry.sync_reason.get() or SyncReason.ITEM
    with telemetry.sync_event(reason, fused.pending_ops()):
        element = _host_element(self, reason)
        if element is not None:
            return element
        return program_cost.host_values(values.value(self, reason, record=False)).item()


#: storages up to this size are read whole to read one element of a view of them (on a TPU or GPU; on XLA:CPU the
#: host's view of an array costs nothing): ``for v in t: v.item()``, ``all(mask)``, ``x[i].item()`` in a loop
HOST_ELEMENT_BYTES = 1 << 20


def _host_element(t, reason: SyncReason) -> object | None:
    """The one element of ``t`` (a view) read from its storage's host values (computed first if pending), which
    JAX keeps with the array, so a loop over a tensor's elements reads the device once, not a program per element;
    ``None`` where that does not apply (a reinterpreting or moving view, a large storage off XLA:CPU)."""
    t = tensor.adopt(t)
    storage, view = t.tpu_storage, t.tpu_view
    if view is None or type(view) is not views.View or view.cast is not None:
        return None
    if storage.nbytes > HOST_ELEMENT_BYTES and platform.info().platform != "cpu":
        return None
    values.computed(storage, reason, record=False)
    array = storage.held
    if not isinstance(array, jax.Array):  # a failed computation's placeholder: the general path raises its error
        return None
    return program_cost.host_values(array).reshape(-1)[view.offset].item()




def resize_(self, size, memory_format=None):
    """PyTorch semantics: the first ``min(old, new)`` elements (in row-major order) keep their values; new
    elements are uninitialized (here: zero). A resize that fits in the tensor's storage from its offset keeps
    that storage (the tensor becomes its contiguous elements there), so views of it, and its base, keep seeing
    its writes; one that needs more gets a storage of its own (PyTorch would grow the shared one). A
    ``memory_format`` (``channels_last`` ...) then gives the tensor that format's strides over the same elements
    of its storage, as CPU's ``empty_tensor_restride`` does, whether or not the sizes changed."""
    self = tensor.adopt(self)
    size = tuple(int(n) for n in size)
    if memory_format is torch.preserve_format:
        raise RuntimeError("Unsupported memory formatPreserve")  # CPU's words
    if tuple(self.shape) == size and memory_format is None:
        return self
    if any(n < 0 for n in size):
        raise RuntimeError(f"Trying to create tensor with negative dimension: {list(size)}")
    stride = (views.contiguous_strides(size) if memory_format is None
              else torch.empty(size, device="meta", memory_format=memory_format).stride())
    old, view = self.tpu_storage, self.tpu_view
    offset, cast = (0, None) if view is None else (view.offset, view.cast)
    room = math.prod(old.shape) if cast is None else reinterpret.length(old.shape, cast)
    if isinstance(offset, int) and offset + math.prod(size) <= room:
        tensor.set_geometry(self, old, views.canonical(old.shape, size, stride, offset, cast))
        return self
    new = Storage(size, self.dtype, old.device_index)
    keep = min(math.prod(size), self.numel())
    if keep:
        flat = values.value(self).reshape(-1)[:keep]
        if keep == math.prod(size):
            new.array = flat.reshape(size)
        else:
            new.array = jax.numpy.zeros(math.prod(size), flat.dtype).at[:keep].set(flat).reshape(size)
    tensor.set_geometry(self, new, views.canonical(size, size, stride, 0))
    return self


def resize_as_(self, the_template, memory_format=None):
    """``resize_`` to the template's sizes (an in-place op derived from a functional one would broadcast-check
    the result against ``self`` instead, and refuse every shape change); ``preserve_format`` takes the
    template's own format, as CPU's ``resize_as_`` does."""
    if memory_format is torch.preserve_format:
        memory_format = suggest_memory_format(the_template)
    return resize_(self, tuple(the_template.shape), memory_format)


def set_source_tensor(self, source):
    """``a.set_(b)``: ``a`` becomes a view of ``b``'s storage with ``b``'s offset, sizes and strides, so writes
    through either are seen by the other, as on CPU (the CPU fallback gave ``a`` a copy of ``b``'s values)."""
    self = tensor.adopt(self)
    tpu_source = tensor.adopt(source) if tensor.on_tpu(source) else None
    if tpu_source is None or tpu_source.tpu_storage.device_index != self.tpu_storage.device_index:
        raise RuntimeError(f'Attempted to set the storage of a tensor on device "{self.device}" to a storage on '
                           f'different device "{source.device}".  This is no longer allowed; the devices must match.')
    tensor.set_geometry(self, tpu_source.tpu_storage, tpu_source.tpu_view)
    return self


def is_set_to(self, other) -> bool:
    """CPU's rule: the same storage, storage offset, sizes and strides (the CPU fallback compared two host copies,
    which never share a storage)."""
    if not (tensor.on_tpu(self) and tensor.on_tpu(other)):
        return False
    return (tensor.adopt(self).tpu_storage is tensor.adopt(other).tpu_storage
            and self.storage_offset() == other.storage_offset()
            and self.shape == other.shape and self.stride() == other.stride())


def equal(a, b) -> bool:
    if a.shape != b.shape:
        return False
    return bool(torch.eq(a, b).all().item())


def is_pinned(self, device=None) -> bool:
    return False


#: the kernels above by the ops they implement (collected into ``backend.dispatch.KERNELS``)
NON_LOWERING_KERNELS = {
    aten.empty.memory_format: empty_memory_format,
    aten.empty_strided.default: empty_strided,
    aten._to_copy.default: to_copy,
    aten.copy_.default: copy_,
    aten._local_scalar_dense.default: local_scalar_dense,
    aten.resize_.default: resize_,
    aten.resize_as_.default: resize_as_,
    aten.set_.source_Tensor: set_source_tensor,
    aten.is_set_to.default: is_set_to,
    aten.equal.default: equal,
    aten.is_pinned.default: is_pinned,
}
