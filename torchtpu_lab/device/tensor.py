"""The Python side of a ``tpu`` tensor: a real PrivateUse1 ``torch.Tensor`` that points at a storage and view.

Tensors are made by :func:`make` from a PrivateUse1 TensorImpl without data (see :mod:`.impl_factory`), given
the class :class:`TpuTensor` and two public attributes, the data model every layer above reads:
``t.tpu_storage`` (:class:`Storage`) and ``t.tpu_view`` (:class:`~torchtpu_lab.device.views.View` or ``None`` for
the base). The executor reads both for every tensor argument of every op, so they are never Python properties:
with the native core they are C descriptors reading the pair kept with the tensor's torch storage (no per-tensor
writes or dict: ~10% of a recorded op), without it plain attributes. Only this module sets them (:func:`make`,
:func:`adopt`, :func:`set_geometry`). PyTorch keeps the Python object alive for as long as C++ holds the tensor,
so the attributes travel through autograd and the dispatcher.

:class:`TpuTensor` only adds what the pure-Python backend cannot get from PyTorch itself: printing, pickling
and deep copies, which for tensors without host-visible data go through a CPU copy, as PyTorch/XLA does.
"""

from __future__ import annotations

import copy

import torch

from .. import native, telemetry
from . import memory, sizes, views
from .impl_factory import dummy_address, new_impl
from .storage import Storage


class TpuTensor(torch.Tensor):
    """A tensor on the ``tpu`` device. Users never construct it: ``torch.ones(3, device="tpu")`` does."""

    __torch_function__ = torch._C._disabled_torch_function_impl

    def __repr__(self, *, tensor_contents=None) -> str:
        if tensor_contents is None:
            token = telemetry.sync_reason.set(telemetry.SyncReason.PRINT)
            try:
                host = self.detach().to("cpu")
            finally:
                telemetry.sync_reason.reset(token)
            tensor_contents = torch._tensor_str._tensor_str(host, len("tensor("))
        # PyTorch prefixes a subclass's repr with its class name; a tpu tensor should read like a cuda one.
        cls = self.__class__
        self.__class__ = torch.Tensor
        try:
            text = torch._tensor_str._str(self, tensor_contents=tensor_contents)
        finally:
            self.__class__ = cls
        if self.__dict__.get("_is_param"):
            text = "Parameter containing:\n" + text
        return text

    def __reduce_ex__(self, proto):
        # The CPU copy is pickled with an ordinary storage, so torch.load's map_location applies to it.
        return (
            torch._utils._rebuild_device_tensor_from_cpu_tensor,
            (self.detach().to("cpu"), self.dtype, str(self.device), self.requires_grad),
        )

    def __coerce_same_metadata_as_tangent__(self, expected_metadata, expected_type=None):
        # AOTAutograd compares a runtime tangent's exact type with the traced one (torch.Tensor). TpuTensor is
        # no wrapper subclass — it has no dispatch behaviour of its own — so it *is* a plain tensor there.
        if expected_type in (None, torch.Tensor) and expected_metadata is None:
            return self
        return None

    @property
    def data(self) -> torch.Tensor:
        return _TENSOR_DATA.__get__(self)

    @data.setter
    def data(self, new: torch.Tensor) -> None:
        # ``param.data = moved`` (Module._apply's path for shallow-copy compatible tensors) swaps the TensorImpl's
        # storage and geometry under this object: the Python data attributes must follow, or kernels would read
        # the old device data
        _TENSOR_DATA.__set__(self, new)
        ref = storage_ref(self) if self.device.type == "tpu" else None
        if ref is not None:
            self.tpu_storage, self.tpu_view = ref
            return
        for key in _DATA_ATTRS:  # moved off the device: a plain tensor (or Parameter) again
            self.__dict__.pop(key, None)
        self.__class__ = torch.nn.Parameter if self.__dict__.get("_is_param") else torch.Tensor

    def __copy__(self):
        """``copy.copy``: a new tensor over the same values, as CPU's (rebuilt on the same storage). The inherited
        path would pickle it (``__reduce_ex__``, a CPU copy), so writes to the copy would not reach ``self``."""
        new = make(self.tpu_storage, self.tpu_view)
        new.requires_grad_(self.requires_grad)
        new.__dict__.update((k, v) for k, v in self.__dict__.items() if k not in _DATA_ATTRS)
        return new

    def __deepcopy__(self, memo):
        if id(self) in memo:
            return memo[id(self)]
        storage = self.tpu_storage
        copied = memo.get(id(storage))
        if copied is None:  # the whole base, once per deepcopy: tensors sharing values share the copy, as on CPU
            with torch.no_grad():
                copied = make(storage, None).clone().tpu_storage
            memo[id(storage)] = copied
            copy._keep_alive(storage, memo)  # its id must not be reused while memo lives
        new = make(copied, self.tpu_view)
        new.requires_grad_(self.requires_grad)
        memo[id(self)] = new
        for key, value in self.__dict__.items():
            if key not in _DATA_ATTRS:
                setattr(new, key, copy.deepcopy(value, memo))
        if self.grad is not None:
            new.grad = copy.deepcopy(self.grad, memo)
        return new


_DATA_ATTRS = ("tpu_storage", "tpu_view")  # a deep copy gets its own (the clone's), never the original's
_TENSOR_DATA = torch._C.TensorBase.data


def make(storage: Storage, view: views.View | None) -> TpuTensor:
    """A new tpu tensor over ``storage`` with geometry ``view`` (``None``: the whole base), of the storage's dtype
    or, for a view with a cast, the view's."""
    size = storage.shape if view is None else view.size
    sizes.check(size, storage.dtype if view is None else None)  # XLA would abort the process on an overflow
    reported = view is not None and (view.offset or view.stride != _strides(view.size))
    dtype = storage.dtype if view is None or view.cast is None else view.cast[1]
    factory = _FACTORY[0]
    if factory is not None:  # the native core makes the TensorImpl, its Python object and the links in one call
        t = factory(TpuTensor, size, _strides(size), dtype, storage.device_index, storage, view)
        if reported:
            _report_geometry(t, storage, view)
        return t
    t = new_impl(size, dtype, storage.device_index)
    if reported:
        _report_geometry(t, storage, view)
    t.__class__ = TpuTensor
    _attach(t, storage, view)
    return t


_CPU_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)


def _report_geometry(t: torch.Tensor, storage: Storage, view: views.View) -> None:
    """Give ``t``'s TensorImpl the strides and storage offset of ``view`` (PyTorch's own view semantics: what
    ``stride()``, ``storage_offset()``, ``is_contiguous()``, ``reshape``'s view-or-copy choice, autograd's
    ``CopySlices`` and Dynamo's fake copies read). Its torch storage records the base's byte size, as on CPU.
    The native core sets them in place (~1 us); without it, ``set_`` on a placeholder storage does (~20 us)."""
    # every view lies inside its base (PyTorch checked it on the meta shadow; empty_strided sizes its base)
    core = native.module()
    if core is not None:
        core.set_geometry(t, view.size, view.stride, view.offset, storage.nbytes)
        return
    fake = torch._C._construct_storage_from_data_pointer(dummy_address(), t.device, storage.nbytes)
    torch.ops.aten.set_.source_Storage_storage_offset.redispatch(
        _CPU_KEYS, t, fake, view.offset, list(view.size), list(view.stride)
    )


def make_base(storage: Storage) -> TpuTensor:
    """A new base tensor over ``storage``, whose shape the runtime has already checked (an op's output)."""
    factory = _FACTORY[0]
    if factory is None:
        return make(storage, None)
    shape = storage.shape
    return factory(TpuTensor, shape, _strides(shape), storage.dtype, storage.device_index, storage, None)


#: the native core's ``new_tensor`` (``None``: pure-Python mode, or before registration chose)
_FACTORY: list = [None]
#: the native core's ``wrap_arrays`` (``None``: pure-Python mode, or before the recording kernel is configured)
_WRAP: list = [None]
#: the native core's ``storage_ref`` and ``set_storage_ref`` (``None``: pure-Python mode)
_REFS: list = [None, None]


def use_native_factory(factory, refs: tuple | None = None) -> None:
    """Make tensors with the native core's ``new_tensor(cls, sizes, strides, dtype, device_index, storage,
    view)`` (the registration calls this once the core is loaded; ``None`` goes back to the Python factory).
    ``refs``: the core's ``(storage_ref, set_storage_ref)``, which read and re-point the ``(storage, view)``
    pair its tensors keep with their torch storage (see :func:`storage_ref`); once given they stay, whichever
    factory makes new tensors, for the tensors the core made."""
    _FACTORY[0] = factory
    if refs is not None:
        _REFS[:] = refs


def use_native_wrap(wrap) -> None:
    """Make :func:`from_arrays`'s tensors with the native core's ``wrap_arrays(arrays, dtypes, devices)`` (the
    recording kernel's configuration calls this: the core's storages are made as its recorded outputs are)."""
    _WRAP[0] = wrap


def storage_ref(t: torch.Tensor) -> tuple | None:
    """``(storage, view)`` of a tpu tensor, read from its torch storage (``None``: a tensor without device data).

    The pair is kept with its torch storage and, unless the native core's descriptors read it from there (see
    :func:`use_attributes_in_storage`), on the tensor too (``tpu_storage``/``tpu_view``, the fast path).
    Autograd saves an op's *output* as a shallow copy — a new TensorImpl, hence a new Python object
    without our attributes — that shares the torch storage, and :func:`adopt` recovers the data from there. The
    native core's tensors keep it in the storage's data pointer context; the Python factory's on the storage's
    Python object, which PyTorch keeps alive (and its attributes) for as long as the storage lives."""
    read = _REFS[0]
    if read is not None:
        ref = read(t)
        if ref is not None:
            return ref
    return t.untyped_storage().__dict__.get("_tpu_ref")


def storage_ref_of_storage(storage: torch.UntypedStorage) -> tuple | None:
    """``(storage, view)`` kept with a torch storage that a tpu tensor made (``None``: another storage), for a
    call that names the storage rather than a tensor (``x.set_(y.untyped_storage(), ...)``). Its storage is the
    base every tensor on that torch storage reads (their ``storage_offset`` counts from its start)."""
    read = _REFS[0]
    if read is not None:
        ref = read(storage)
        if ref is not None:
            return ref
    return storage.__dict__.get("_tpu_ref") if hasattr(storage, "__dict__") else None


_STRIDES: dict = {}


def _strides(size: tuple) -> tuple:
    """Contiguous strides of ``size`` (memoized: a model uses few shapes; bounded by resetting when large)."""
    if type(size) is not tuple:  # a view's size from a list (hashable key)
        size = tuple(size)
    s = _STRIDES.get(size)
    if s is None:
        if len(_STRIDES) > 4096:
            _STRIDES.clear()
        s = _STRIDES[size] = views.contiguous_strides(size)
    return s


def use_attributes_in_storage(installed: bool) -> None:
    """Whether the native core made :class:`TpuTensor`'s ``tpu_storage``/``tpu_view`` descriptors reading the
    pair kept with the torch storage (its ``install_tensor_class``): its tensors then carry no attributes of their
    own, and writing the pair there is writing them."""
    _IN_STORAGE[0] = installed


#: see use_attributes_in_storage
_IN_STORAGE: list = [False]


def _attach(t: torch.Tensor, storage: Storage, view) -> None:
    # the pair on the tensor and with its torch storage (see storage_ref)
    write = _REFS[1]
    written = write is not None and write(t, storage, view)
    if not (written and _IN_STORAGE[0]):  # the attributes are the object's own
        t.tpu_storage = storage
        t.tpu_view = view
    if not written:
        t.untyped_storage()._tpu_ref = (storage, view)


_NO_DATA = ("a tpu tensor without device data reached a kernel: torchtpu_lab did not make it. tpu values live in "
            "JAX arrays, so a tensor made around a raw pointer (torch.from_dlpack of a capsule from "
            "torch.utils.dlpack.to_dlpack, torch.from_blob) has none; use .cpu() for a host copy, and "
            "torchtpu_lab.jax_op to hand tpu tensors to JAX code")


def adopt(t: torch.Tensor) -> TpuTensor:
    """The tpu tensor ``t`` as a :class:`TpuTensor` (a plain ``torch.Tensor`` on tpu — e.g. a tensor autograd
    saved for backward — gets its class and data back)."""
    if isinstance(t, TpuTensor):
        return t
    ref = storage_ref(t)
    if ref is None:
        raise RuntimeError(_NO_DATA)
    if type(t) is torch.nn.Parameter:
        # a CPU Parameter that Module._apply moved with ``param.data = moved`` (ties kept, as on CUDA); a
        # Parameter of our class is marked the way Parameter(tpu_tensor) marks it
        t.__class__ = TpuTensor
        t._is_param = True
    elif type(t) is torch.Tensor:
        t.__class__ = TpuTensor
    t.tpu_storage, t.tpu_view = ref
    return t


def has_data(t: torch.Tensor) -> bool:
    """Whether :func:`adopt` can recover ``t``'s device data (false for fake, functional, functorch and meta
    tensors, whose storage never held any)."""
    return isinstance(t, TpuTensor) or storage_ref(t) is not None


def on_tpu(v) -> bool:
    """Whether ``v`` is a tensor on the tpu device (of our class or not yet adopted)."""
    return isinstance(v, TpuTensor) or (isinstance(v, torch.Tensor) and v.device.type == "tpu")


def set_geometry(t: TpuTensor, storage: Storage, view) -> None:
    """Point ``t`` at ``storage``/``view`` in place, changing its torch-level sizes, strides and storage offset
    if they differ (in-place view ops such as ``squeeze_`` and ``t_``, ``resize_``)."""
    geometry = views.View(tuple(storage.shape), views.contiguous_strides(storage.shape), 0) if view is None else view
    if (tuple(t.shape), t.stride(), t.storage_offset()) != tuple(geometry[:3]):
        _report_geometry(t, storage, geometry)
    _attach(t, storage, view)


def from_array(array, dtype: torch.dtype, device_index: int = 0) -> TpuTensor:
    """Wrap a JAX array (already on the right device and of the JAX dtype of ``dtype``) as a new base tensor."""
    return make(Storage(array.shape, dtype, device_index, array), None)


def from_arrays(arrays: list, dtypes: tuple, devices: tuple) -> list:
    """:func:`from_array` for each of ``arrays`` (a compiled graph's outputs), with ``dtypes[i]`` on
    ``tpu:devices[i]``: in one call of the native core when it is there (a few µs less per output, and a compiled
    forward keeps dozens for its backward), unless allocations record their source lines (Python looks them up)."""
    wrap = _WRAP[0]
    if wrap is not None and not memory.TRACK_SOURCES.value:
        return wrap(arrays, dtypes, devices)
    return [from_array(a, d, i) for a, d, i in zip(arrays, dtypes, devices)]


def empty(shape, dtype: torch.dtype, device_index: int = 0) -> TpuTensor:
    """A new base tensor whose buffer is created on first read."""
    return make(Storage(tuple(shape), dtype, device_index), None)


def is_tpu(t) -> bool:
    return isinstance(t, TpuTensor)
