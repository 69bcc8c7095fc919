"""Moving values in and out of tpu tensors: :func:`assign` (the one way a tpu tensor's values change),
:func:`store` (a compiled graph's new value of a tensor), :func:`set_array` (a storage takes a new array or
placeholder), :func:`value` (the concrete array behind a tensor,
a sync point when it is pending) and :func:`materialize` (a view's values as a new base tensor).

Each is a small cached program run through :func:`.executor.launch`, so in fused mode it is recorded like any op.
The tensor-level functions are runtime entry points (:data:`.fused.entry_point`): they take the lock and pass the
interrupt safe point themselves, whoever calls them.
"""

from __future__ import annotations

import jax.numpy as jnp
import torch

from .. import caches, dtypes
from ..ops.casts import convert
from ..telemetry import SyncReason
from ..device import tensor, views
from ..device.storage import Storage, store_all
from . import fused, pending_errors
from .encode import dynamic_input, leaf_dtype
from .executor import OpExecutable, launch, run_now
from .signatures import OpSignature


@caches.memoize("programs", 2048, code=True)
def _assign_program(dst_base_shape, dst_view, dst_dtype, src_base_shape, src_view, overwrite_all: bool):
    """``dst_dtype``: the destination tensor's (a view with a cast writes the storage's bytes as that dtype)."""
    jdt = dtypes.to_jax(dst_dtype)
    dst_size = dst_base_shape if dst_view is None else dst_view.size

    # inputs: [dst base, dst offset if it moves,] src base[, src offset if it moves] (see _assign_inputs)
    def whole(src_base, *src_offset):
        v = convert(views.read(src_base, src_base_shape, src_view, *src_offset), jdt)
        return jnp.broadcast_to(v, dst_size)

    def partial(dst_base, *rest):
        dst_offset, rest = (rest[:1], rest[1:]) if dst_view is not None and dst_view.moves else ((), rest)
        v = convert(views.read(rest[0], src_base_shape, src_view, *rest[1:]), jdt)
        return views.write(dst_base, dst_base_shape, dst_view, v, *dst_offset)

    # its output's metadata, so fused mode records it without tracing (checked when the graph is traced)
    stored = dst_dtype if dst_view is None or dst_view.cast is None else dst_view.cast[0]
    meta = torch.empty(dst_size if overwrite_all else dst_base_shape, dtype=stored, device="meta")
    return OpExecutable(whole if overwrite_all else partial, True, meta, "aten::copy_")


@fused.entry_point
def assign(dst: tensor.TpuTensor, src) -> None:
    """Overwrite ``dst``'s values (through its view, if any) with ``src`` (a tpu tensor or JAX array).

    ``src`` broadcasts to ``dst``'s shape and is cast to ``dst``'s dtype, as ``Tensor.copy_`` does.
    """
    storage = dst.tpu_storage
    dst_view = dst.tpu_view
    if tensor.on_tpu(src):
        src = tensor.adopt(src)
        src_storage, src_view = src.tpu_storage, src.tpu_view
        src_array, src_base_shape = src_storage.array, src_storage.shape
        if (
            dst_view is None
            and src_view is None
            and src_storage.shape == storage.shape
            and src_storage.dtype == storage.dtype
        ):
            set_array(storage, src_array)  # arrays are immutable: sharing one is safe
            return
    else:
        src_array, src_base_shape, src_view = src, tuple(src.shape), None
    dyn = [] if dst_view is None else [storage.array]
    dst_key = dynamic_input(storage.shape, dst_view, dyn)
    dyn.append(src_array)
    src_key = dynamic_input(tuple(src_base_shape), src_view, dyn)
    sig = (storage.shape, dst_key, dst.dtype, tuple(src_base_shape), src_key, dst_view is None)
    program = _assign_program(*sig)
    out = launch(program, OpSignature("assign", sig + (leaf_dtype(src_array),), ()), dyn, storage.device_index, True)
    set_array(storage, out)
    _cut_if_over_limit(out)


def _cut_if_over_limit(out) -> None:
    """Flush the pending graph at its size limit once a recorded write or read is in its tensor, as every op the
    executor records does. ``launch`` cannot (its caller has not stored the placeholder yet, and a sync computes
    only what storages hold): without this a loop of slice assignments (``x[i] = y[i]``, 40,000 in PyTorch's
    ``test_index_copy_deterministic``) was one graph however long it grew."""
    if type(out) is fused.LazyValue and fused.over_limit():
        fused.sync(SyncReason.GRAPH_LIMIT)


@fused.entry_point
def store(dst: tensor.TpuTensor, array) -> None:
    """Replace ``dst``'s values with the JAX array ``array`` of its shape and dtype (a compiled graph's new
    value of an input it mutated): a base tensor takes the array itself, a view is written through."""
    dst = tensor.adopt(dst)
    if dst.tpu_view is None and tuple(dst.tpu_storage.shape) == tuple(array.shape):
        set_array(dst.tpu_storage, array)
    else:
        assign(dst, array)


def set_array(storage: Storage, array) -> None:
    """Give ``storage`` a new array (or placeholder, which the next sync must then materialize)."""
    if isinstance(array, fused.LazyValue):
        fused.track(storage)  # tracked first: an interrupt between the two lines leaves nothing untracked
    storage.array = array


def set_arrays(storages: list, arrays: list) -> None:
    """:func:`set_array` for each pair — one op's outputs replacing many tensors' arrays (an optimizer step) — in
    one native call when the core has it: placeholders as the recording kernel writes an in-place result,
    concrete arrays as a sync commits its results."""
    lazy = [type(a) is fused.LazyValue for a in arrays]
    native = _WRITE_PLACEHOLDERS[0]
    if native is not None and all(lazy):
        native(storages, arrays)
    elif not any(lazy):
        store_all(storages, arrays)
    else:
        for s, a in zip(storages, arrays, strict=True):
            set_array(s, a)


#: the native core's ``write_placeholders`` (``None``: pure-Python mode)
_WRITE_PLACEHOLDERS: list = [None]


def use_native_writes(write_placeholders) -> None:
    """Write placeholders into storages with the native core's ``write_placeholders`` (registration, once)."""
    _WRITE_PLACEHOLDERS[0] = write_placeholders


@fused.entry_point
def computed(storage, reason: SyncReason, record: bool = True, host_read: bool = True) -> None:
    """Before a read of ``storage``: the pending graph runs if it is pending (a sync point), and for a host read
    (``host_read``) errors its inputs reported surface (the read waits for the device anyway). A read on the device
    (a compiled graph's input, a collective, a copy not waited for) leaves them to the next host read or sync: it
    must not wait for the device."""
    if isinstance(storage.held, fused.LazyValue):
        fused.track(storage)  # normally tracked already; a no-op then
        fused.sync(reason, record=record)
    if host_read:
        pending_errors.raise_pending()


@fused.entry_point
def value(t: tensor.TpuTensor, reason: SyncReason = SyncReason.READ, record: bool = True, host_read: bool = True):
    """The concrete JAX array of ``t``'s values (a sync point if ``t`` is pending; a view is gathered);
    ``host_read``: as :func:`computed`'s (``False`` where the array is read on the device)."""
    t = tensor.adopt(t)
    storage = t.tpu_storage
    computed(storage, reason, record, host_read)
    if t.tpu_view is None:
        return storage.array
    dyn = [storage.array]
    key = dynamic_input(storage.shape, t.tpu_view, dyn)
    program = _read_program(storage.shape, key, t.dtype)
    return run_now(program, OpSignature("read", (storage.shape, key, t.dtype), ()), dyn, storage.device_index, True)


@caches.memoize("view_reads", 2048, code=True)
def _read_program(base_shape, view, dtype):
    """Gather a view (offset-free key ``view``; its offset, if it moves, is the second input) of ``dtype`` (the
    view's). Its output's metadata lets fused mode record it without tracing."""
    meta = torch.empty(base_shape if view is None else view.size, dtype=dtype, device="meta")
    return OpExecutable(lambda base, *offset: views.read(base, base_shape, view, *offset), True, meta,
                        "materialize view")


@fused.entry_point
def materialize(t: tensor.TpuTensor) -> tensor.TpuTensor:
    """A new base tensor holding ``t``'s values (recorded, not run, in fused mode)."""
    t = tensor.adopt(t)
    storage = t.tpu_storage
    dyn = [storage.array]
    key = dynamic_input(storage.shape, t.tpu_view, dyn)
    program = _read_program(storage.shape, key, t.dtype)
    out = launch(program, OpSignature("read", (storage.shape, key, t.dtype), ()), dyn,
                 storage.device_index, True)
    result = tensor.from_array(out, t.dtype, storage.device_index)
    if isinstance(out, fused.LazyValue):
        fused.track(result.tpu_storage)
        _cut_if_over_limit(out)
    return result
