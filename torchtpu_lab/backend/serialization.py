"""``torch.load(..., map_location="tpu")`` and storage-level calls on the tpu device.

A tpu tensor keeps its values in a JAX array, never in its ``torch`` storage: that storage is a placeholder
holding no bytes, and PyTorch has no allocator for the device (this backend registers none from Python), so a
storage-level copy onto it — what ``torch.load``'s default ``map_location`` handling does, through
``torch._utils._to`` — would make PyTorch's C++ write into memory that does not exist (a segmentation fault).

So loading goes through PyTorch's own hooks for a backend, never through a storage copy:

* a deserializer registered with ``torch.serialization.register_package`` (ahead of PyTorch's generic
  PrivateUse1 one) turns a loaded CPU storage bound for ``tpu``/``tpu:N`` — from every ``map_location`` form:
  a string, a ``torch.device``, a dict, or a callable returning ``storage.tpu()`` — into a *host-backed* tpu
  storage (:func:`to_device`), which carries the CPU bytes;
* ``Tensor.set_(storage, offset, size, stride)`` (how ``torch.load`` rebuilds every tensor on its storage) has
  a tpu kernel here that reads those bytes as the tensor's dtype and moves the values to the device.

Tensors loaded from one shared storage get one device copy each (the placeholder storage has no address for
``torch.load`` to share them by), as with ``torch.load`` onto the meta device.

``set_`` onto a live tpu tensor's storage makes the tensor a view of that tensor's data (of another dtype: a
reinterpreting view of the same bytes, as ``x.view(dtype)``). PyTorch does every storage-level call that way
(``storage.cpu()``, ``tolist()``, indexing, ``fill_``, ``copy_``, ``torch.save`` of a storage: ``set_`` of a byte
tensor onto it), so those read and write the tensor's bytes as on CPU.

Calls that cannot work on a tpu storage raise an error naming the call instead of crashing: creating one
(``torch.UntypedStorage(n, device="tpu")``, ``storage.clone()``, ``storage.to(device="tpu")``), and, without the
native core (whose tensors' storages report no bytes), a whole-storage ``set_``. Each of these is a process-wide
change, listed by :func:`torchtpu_lab.global_changes` (:func:`changes`).
"""

from __future__ import annotations

import math
import re
import sys

import torch
import torch.serialization

from ..device import reinterpret, tensor, views
from ..device.impl_factory import dummy_address

_LOCATION = re.compile(r"tpu(:\d+)?$")
#: before PyTorch's own PrivateUse1 deserializer (priority 23), which copies at the storage level
_PRIORITY = 19
_HOST = "_tpu_host"  # the attribute of a host-backed tpu storage holding its CPU bytes
_base_new = torch._C.StorageBase.__new__
_installed: list = []

aten = torch.ops.aten


def _device(device=None) -> torch.device:
    """``device`` (``None``, an index, ``"tpu:1"``...) as a checked ``torch.device("tpu", i)``."""
    from . import tpu_module

    if device is None:
        index = tpu_module.current_device()
    elif isinstance(device, int):
        index = device
    else:
        d = torch.device(device)
        if d.type != "tpu":
            raise ValueError(f"expected a tpu device, got {d}")
        index = tpu_module.current_device() if d.index is None else d.index
    count = tpu_module.device_count()
    if not 0 <= index < count:
        raise RuntimeError(f"tpu:{index} does not exist (torch.tpu.device_count() is {count}); with torch.load, "
                           "use map_location to map the storages to an existing device")
    return torch.device("tpu", index)


def to_device(storage: torch.UntypedStorage, device=None) -> torch.UntypedStorage:
    """The CPU ``storage`` as a tpu storage that carries its bytes; a tensor built on it with ``set_`` (as
    ``torch.load`` does) has its values moved to the device then, read as that tensor's dtype."""
    if isinstance(storage, torch.TypedStorage):
        return torch.TypedStorage(wrap_storage=to_device(storage._untyped_storage, device), dtype=storage.dtype,
                                  _internal=True)
    if storage.device.type == "tpu":
        if device is None or _device(device) == storage.device:
            return storage
        raise RuntimeError(f"storage.tpu({device!r}): moving a storage between tpu devices works on tensors only "
                           "(tensor.to(device))")
    if storage.device.type != "cpu":
        raise RuntimeError(f"storage.tpu(): a {storage.device.type} storage goes to the tpu device through the CPU "
                           "(storage.cpu().tpu()) or as a tensor (tensor.to('tpu'))")
    target = _device(device)
    placeholder = torch._C._construct_storage_from_data_pointer(dummy_address(), target, 0)
    setattr(placeholder, _HOST, storage)
    return placeholder


def _deserialize(obj, location: str):
    """``torch.serialization``'s deserializer for tpu locations (``None``: another location, not ours)."""
    if isinstance(location, str) and _LOCATION.match(location) and obj.device.type == "cpu":
        return to_device(obj, location)
    return None


def _tag(obj) -> None:
    return None  # tpu tensors are saved as CPU copies (TpuTensor.__reduce_ex__): their storages are never tagged


def _set_source_storage(self, source, storage_offset: int = 0, size=None, stride=()):
    host = source.__dict__.get(_HOST) if hasattr(source, "__dict__") else None
    if host is None:
        ref = tensor.storage_ref_of_storage(source)
        if ref is not None:  # a live tpu tensor's storage: self becomes a view of it
            if size is None and source.nbytes() == 0 and math.prod(ref[0].shape):
                raise RuntimeError(
                    f"{_calling()}: this tpu storage reports no bytes (pure-Python mode: PyTorch's Python factory "
                    "gives tpu tensors no data pointer, so a storage-level read or copy would see an empty "
                    "storage); work with the tensor instead (tensor.cpu(), tensor.copy_()), or build the native "
                    "core (python -m torchtpu_lab.native)")
            return _set_device_storage(self, ref[0], storage_offset, size, stride)
        # PyTorch reaches a storage's bytes through a tensor set_ on it (storage.cpu(), copy_...)
        raise RuntimeError(
            f"{_calling()}: a tpu storage holds no bytes to read or write (a tpu tensor keeps its values in a JAX "
            "array, not in its torch storage); work with the tensor instead (tensor.cpu(), tensor.copy_()). Only "
            "a storage made by torch.load(..., map_location='tpu') or storage.tpu() can be set on a tpu tensor.")
    cpu = torch.empty((0,), dtype=self.dtype)
    cpu = cpu.set_(host) if size is None else cpu.set_(host, storage_offset, size, stride)
    moved = tensor.adopt(cpu.to(source.device))
    tpu_self = tensor.adopt(self)
    tensor.set_geometry(tpu_self, moved.tpu_storage, moved.tpu_view)
    return self


def _set_device_storage(self, storage, storage_offset: int, size, stride):
    """``self.set_(y.untyped_storage(), offset, size, stride)`` for a tpu tensor ``y``: ``self`` becomes a view of
    ``y``'s data (a view of another dtype reads the same bytes, as ``x.view(dtype)`` does), so writes through
    either are seen by the other, as on CPU. A geometry past the storage's end raises as CPU does for a storage
    that cannot grow."""
    tpu_self = tensor.adopt(self)
    if storage.device_index != tpu_self.tpu_storage.device_index:
        raise RuntimeError(f'Attempted to set the storage of a tensor on device "{self.device}" to a storage on '
                           f'different device "tpu:{storage.device_index}".  This is no longer allowed; the '
                           "devices must match.")
    cast = None if storage.dtype == self.dtype else (storage.dtype, self.dtype)
    room = math.prod(storage.shape) if cast is None else reinterpret.length(storage.shape, cast)
    if size is None:
        size, stride, storage_offset = (room,), (1,), 0
    size, stride, storage_offset = tuple(int(n) for n in size), tuple(int(s) for s in stride), int(storage_offset)
    if not stride:
        stride = views.contiguous_strides(size)
    if math.prod(size) and storage_offset + sum((n - 1) * s for n, s in zip(size, stride)) >= room:
        # CPU grows a resizable storage to fit; a tpu storage cannot grow, so CPU's words for one that cannot
        raise RuntimeError("Trying to resize storage that is not resizable")
    tensor.set_geometry(tpu_self, storage, views.canonical(storage.shape, size, stride, storage_offset, cast))
    return self


def _calling() -> str:
    """The call that reached a storage-level kernel, named from the innermost Python frame outside this package."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame = frame.f_back
    if frame is None:
        return "Tensor.set_(storage)"
    code = frame.f_code
    where = f"{code.co_filename}:{frame.f_lineno}"
    if code.co_name in _CALLS:
        return f"{_CALLS[code.co_name]} (at {where})"
    if code.co_filename.endswith(_TORCH_STORAGE):
        return f"storage.{code.co_name}() (at {where})"
    return f"Tensor.set_(storage) or a storage call (at {where})"


_PACKAGE = __file__.rsplit("backend", 1)[0]
_TORCH_STORAGE = "torch/storage.py"
#: PyTorch's functions that reach a tpu storage's bytes, by the name of the Python frame that did
_CALLS = {"_to": "storage.cpu() / storage.to(...)", "_rebuild_tensor": "torch.load"}


def _set_whole_storage(self, source):
    return _set_source_storage(self, source)


#: tpu kernels installed with the others (``backend.dispatch``)
STORAGE_KERNELS = {
    aten.set_.source_Storage_storage_offset: _set_source_storage,
    aten.set_.source_Storage: _set_whole_storage,
}

_NAMED_CALLERS = {"clone": "storage.clone()", "_to": "storage.to(device='tpu')",
                  "wrap_storage_to": "storage.tpu()"}


def _storage_new(cls, *args, **kwargs):
    """``UntypedStorage.__new__``: refuse to allocate on the tpu device (PyTorch's C++ has no allocator there and
    would crash), naming the call that tried."""
    device = kwargs.get("device")
    if device is not None and _is_tpu(device):
        caller = sys._getframe(1).f_code.co_name
        call = _NAMED_CALLERS.get(caller, "torch.UntypedStorage(..., device='tpu')")
        raise RuntimeError(
            f"{call}: a tpu storage cannot be allocated or copied into (tpu tensors keep their values in JAX "
            "arrays, not in torch storages). Work with tensors instead (tensor.to('tpu'), tensor.clone()); a "
            "checkpoint loads onto the device with torch.load(..., map_location='tpu'), and a CPU storage "
            "becomes a tpu one with storage.tpu().")
    return _base_new(cls, *args, **kwargs)


def _is_tpu(device) -> bool:
    try:
        return torch.device(device).type == "tpu"
    except (RuntimeError, TypeError):
        return False


def _storage_tpu(self, device=None, non_blocking: bool = False):
    """``storage.tpu(device=None)``, as ``storage.cuda()``: see :func:`to_device`."""
    return to_device(self, device)


def _storage_is_tpu(self) -> bool:
    """``storage.is_tpu``, as ``storage.is_cuda``."""
    return self.device.type == "tpu"


def install() -> None:
    """Register the deserializer, the ``.tpu()`` method and ``is_tpu`` property of storages and the allocation
    guard (idempotent)."""
    if _installed:
        return
    torch.serialization.register_package(_PRIORITY, _tag, _deserialize)
    torch.UntypedStorage.__new__ = staticmethod(_storage_new)
    for cls in (torch.storage._StorageBase, torch.TypedStorage):
        if not hasattr(cls, "tpu"):
            cls.tpu = _storage_tpu
        if not hasattr(cls, "is_tpu"):
            cls.is_tpu = property(_storage_is_tpu)
    _installed.append(True)


def changes() -> dict:
    """The process-wide changes :func:`install` made (for :func:`torchtpu_lab.global_changes`)."""
    registered = any(fn is _deserialize for _, _, fn in torch.serialization._package_registry)
    return {
        "torch.serialization.register_package (tpu locations load onto the device)": registered,
        "torch.UntypedStorage.__new__ (refuses tpu allocations with an error, not a crash)":
            torch.UntypedStorage.__new__ is _storage_new,
        "torch.UntypedStorage.tpu / TypedStorage.tpu and is_tpu (added)":
            torch.storage._StorageBase.__dict__.get("tpu") is _storage_tpu,
    }
