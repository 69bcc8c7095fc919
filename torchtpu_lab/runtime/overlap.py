"""CPU's refusals of writes whose memory overlaps, for writes into tpu tensors.

PyTorch refuses some writes into memory that overlaps ("unsupported operation: more than one element of the
written-to tensor refers to a single memory location", or "some elements of the input tensor and the written-to
tensor refer to a single memory location"): ``x.expand(6, 3).add_(1)``, ``x.add_(x.t())``, ``x[:2].copy_(x[1:])``,
``torch.cat([y, y], out=expanded)``. Which ops refuse which overlaps is op by op inside CPU's kernels (TensorIterator
checks its outputs, ``fill_`` and ``index_put_`` opt out, ``sum(out=)`` allows it). On tpu a write is functional
(the result is computed from the old values, then assigned), so such a call would give a value where CPU gives an
error. So, where a write overlaps (rare: checked from sizes and strides alone), the op's CPU kernel is asked on
stand-ins of the same geometry, one CPU buffer per tpu storage, once per geometry, and its refusal is raised.

Stand-ins for storages above :data:`MAX_STAND_IN_ELEMENTS` elements are not made: such a call runs unchecked.
"""

from __future__ import annotations

import functools
import math

import torch

from ..device import tensor
from ..ops import cpu_rules

#: the largest total of storage elements asked about (a stand-in buffer is as large as its storage)
MAX_STAND_IN_ELEMENTS = 1 << 22


def _written(op: torch._ops.OpOverload) -> tuple:
    """(position, name) of each argument ``op`` writes (``Tensor(a!)``)."""
    return tuple((None if a.kwarg_only else i, a.name) for i, a in enumerate(op._schema.arguments)
                 if a.alias_info is not None and a.alias_info.is_write)


def _tensors(v):
    if isinstance(v, torch.Tensor):
        yield v
    elif isinstance(v, (list, tuple)):
        for x in v:
            if isinstance(x, torch.Tensor):
                yield x


def _geometry(t: torch.Tensor) -> tuple:
    return tuple(t.shape), t.stride(), t.storage_offset()


def _overlaps(dst, operands: list) -> bool:
    """Whether ``dst`` may overlap itself (a stride-0 dim of size > 1) or shares its storage with another operand:
    the cases CPU may refuse. An identical operand is asked about too: ``x.add_(x)`` is allowed, but
    ``i.index_add_(0, i, v)`` is refused (its index overlaps what it writes)."""
    storage = getattr(dst, "tpu_storage", None)
    if storage is None:
        return False
    if dst.tpu_view is not None and torch._debug_has_internal_overlap(dst) == 1:
        return True
    skipped = False  # dst's own place among the operands
    for a in operands:
        if a is dst and not skipped:
            skipped = True
        elif getattr(a, "tpu_storage", None) is storage:
            return True
    return False


def _stand_ins(args: tuple, kwargs: dict, make: bool) -> tuple:
    """(key, elements, args, kwargs): a key naming the call's geometry (each tpu tensor's storage, by order of
    appearance, dtype, sizes, strides and offset; other values as they are), its storages' elements in all and,
    if ``make``, the call's arguments with each tpu tensor a CPU tensor of its geometry over one zeroed buffer per
    tpu storage (CPU tensors cloned; else ``None``). One tensor passed twice (``torch.cat([x, y], out=x)``) is one
    stand-in: CPU tells a tensor from another over the same memory (an empty one overlaps only itself)."""
    buffers: dict = {}
    made: dict = {}  # id(tpu tensor) -> (its order of appearance, its stand-in)
    key: list = []

    def stand_in(v):
        if isinstance(v, (list, tuple)):
            return type(v)(stand_in(x) for x in v)
        if not isinstance(v, torch.Tensor):
            key.append(v if isinstance(v, (bool, int, float, str, type(None), torch.dtype)) else type(v))
            return v
        storage = getattr(v, "tpu_storage", None)
        if storage is None:
            key.append(("cpu", v.dtype, _geometry(v)))
            return v.detach().clone() if make else None
        if id(v) in made:
            seen, cpu = made[id(v)]
            key.append(("again", seen))
            return cpu
        if id(storage) not in buffers:
            n = math.prod(storage.shape)
            buffers[id(storage)] = (len(buffers), n, torch.zeros(n, dtype=v.dtype) if make else None)
        index, n, buffer = buffers[id(storage)]
        key.append((index, v.dtype, n, _geometry(v)))
        cpu = torch.as_strided(buffer, v.shape, v.stride(), v.storage_offset()) if make else None
        made[id(v)] = (len(made), cpu)
        return cpu

    cpu_args = stand_in(tuple(args))
    cpu_kwargs = {k: stand_in(v) for k, v in kwargs.items()}
    return (tuple(key), tuple(kwargs)), sum(n for _, n, _ in buffers.values()), cpu_args, cpu_kwargs


def _about_overlap(e: BaseException) -> bool:
    return isinstance(e, RuntimeError) and "unsupported operation" in str(e)


def check(op: torch._ops.OpOverload, written: tuple, args: tuple, kwargs: dict) -> None:
    """Raise CPU's refusal of this call of ``op`` (which writes the arguments ``written`` names), if its writes
    overlap as CPU refuses."""
    dsts = []
    for i, name in written:
        v = kwargs.get(name) if i is None or i >= len(args) else args[i]
        dsts.extend(_tensors(v))
    if not dsts:
        return
    operands = [t for v in (*args, *kwargs.values()) for t in _tensors(v)]
    if not any(_overlaps(d, operands) for d in dsts):
        return
    geometry, elements, _, _ = _stand_ins(args, kwargs, make=False)
    if elements > MAX_STAND_IN_ELEMENTS:
        return

    def ask():
        _, _, cpu_args, cpu_kwargs = _stand_ins(args, kwargs, make=True)
        op(*cpu_args, **cpu_kwargs)

    refused = cpu_rules.verdict(("overlap", op, geometry), ask, _about_overlap)
    if refused is not None:
        raise refused


def checked(op: torch._ops.OpOverload, kernel):
    """``kernel`` of ``op`` (an op that writes an argument), raising CPU's overlap refusals first."""
    written = _written(op)
    if not written:
        return kernel

    @functools.wraps(kernel)
    def overlap_checked(*args, **kwargs):
        check(op, written, args, kwargs)
        return kernel(*args, **kwargs)

    return overlap_checked
