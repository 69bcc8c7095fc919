"""``_foreach_*`` ops (an optimizer's foreach step, gradient clipping's scaling) as one node each.

Why. Without kernels of its own, a backend gets PyTorch's foreach fallback: one per-tensor op per element, each a
dispatch, a recorded node, a key the sync builds and a node it frees. A tiny transformer's foreach ``AdamW`` step
was ~330 such nodes, and a sync's host work grows with its nodes (docs/perf.md, twenty-sixth pass). Here a
functional foreach call is one node, whose program applies the per-tensor op's lowering to every element
(:func:`..ops.foreach.lowering`): the op PyTorch's fallback would call (:func:`..ops.foreach.per_tensor`), so the
values are the same. An in-place one (``_foreach_mul_``, ``_foreach_addcdiv_``) is that node with each result
written into its element (:func:`.mutation.write_result`); the recording kernel (``csrc/recorder.cpp``) records
both without entering Python once a call has taught it, as it does an in-place op.

The in-place form computes every element from the values before the call, which is the per-element order's result
only where the elements' updates are independent. Where an element of ``self`` shares its storage with another
element of ``self``, or with another list's element at another index, or with a shared tensor argument, the
elements run one after the other, each reading what the earlier ones wrote, as PyTorch's fallback does. So do
calls whose per-tensor op has no lowering for these arguments (through the dispatcher, as before), lists over
several devices, and lists of one tensor.
"""

from __future__ import annotations

import functools

import torch

from .. import caches
from ..device import tensor
from ..ops import foreach
from ..ops.registry import LOWERINGS, op_name
from . import executor, fused, mutation

aten = torch.ops.aten

#: (id of a foreach op, its arguments' kinds) -> (the per-tensor op, or None, and the lowering through it)
_TARGETS = caches.cache("foreach_targets", 1024)
#: overloads whose tensor argument is not an element list nor an operand of every element (``_foreach_addcmul.
#: Tensor``'s ``scalars``: one number per element, read on the host): PyTorch's fallback keeps them
_SKIPPED_ARGUMENTS = frozenset({"scalars"})


def _length(args: tuple) -> int:
    """The number of elements: the first list argument's length (``self``, or ``exponent`` for ``_foreach_pow.
    ScalarAndTensor``)."""
    return next((len(a) for a in args if isinstance(a, (list, tuple))), 0)


def _kind(v):
    """What the per-tensor op's choice depends on in one argument: a tensor's dtype and device type, a number's
    type, a list's first element's."""
    if isinstance(v, (list, tuple)):
        return ("list", _kind(v[0])) if v else ("list",)
    if isinstance(v, torch.Tensor):
        return v.dtype, v.device.type, v.dim() == 0
    return type(v)


def _target(op, args: tuple, kwargs: dict, n: int) -> tuple:
    """``(per-tensor op or None, its foreach lowering or None)`` for this call: PyTorch's own error where the
    arguments are bad (its meta kernel's: lists of unequal length, a wrong dtype)."""
    key = (id(op), tuple(_kind(a) for a in args), tuple((k, _kind(v)) for k, v in kwargs.items()))
    found = _TARGETS.get(key)
    if found is None:
        meta_args, meta_kwargs = foreach.as_meta(list(args)), foreach.as_meta(dict(kwargs))
        out = op(*meta_args, **meta_kwargs)  # raises PyTorch's error for bad arguments
        target = foreach.per_tensor(op, meta_args, meta_kwargs, n, tuple(out[0].shape), lowered=False,
                                    pointwise=True) if out else None
        low = LOWERINGS.get(target)
        # numbers are graph inputs of a foreach node (the recording kernel keys them by type): a per-tensor
        # lowering that needs them as constants takes the per-element path
        lowering = (foreach.lowering(op, target)
                    if low is not None and low.jit is True and not low.rng and not low.static_scalars else None)
        found = (target, lowering)
        _TARGETS.put(key, found)
    return found


def _per_element(op, target, args: tuple, kwargs: dict, n: int) -> list:
    """Each element's per-tensor call through the dispatcher (whatever kernel it has: a lowering, a decomposition,
    the CPU fallback), as PyTorch's foreach fallback makes them."""
    if target is None:
        raise NotImplementedError(f"torchtpu_lab: {op_name(op)} has no per-element op for these arguments on the "
                                  "tpu device")
    return foreach.apply(target, args, kwargs, n, lambda per_tensor, a, k: per_tensor(*a, **k))


def _functional_kernel(op):
    """The tpu kernel of a functional foreach op: one node (fused mode) or one program (strict mode) for all the
    elements, or the per-element calls where the per-tensor op has no lowering for them."""

    def kernel(*args, **kwargs):
        n = _length(args)
        if n == 0:
            return []
        target, lowering = _target(op, args, kwargs, n)
        if lowering is not None and n > 1 and _one_device(args, kwargs):
            try:
                return executor.execute(lowering, args, kwargs)
            except NotImplementedError:  # the per-tensor lowering does not cover these arguments
                pass
        return _per_element(op, target, args, kwargs, n)

    kernel.__name__ = f"foreach_{op_name(op)}"
    kernel.owns = fused.LOCK  # its parts are entry points themselves
    kernel.foreach = True  # the recording kernel may serve it (backend/dispatch.py)
    return kernel


def _inplace_kernel(op, functional_op, functional):
    """The tpu kernel of an in-place foreach op: its functional op's results written into ``self``'s elements
    (see the module's docstring for when they run one after the other instead)."""

    def kernel(self, *args, **kwargs):
        n = len(self)
        if n == 0:
            return None
        if n > 1 and _one_device((self, *args), kwargs) and _independent(self, args, kwargs):
            targets = [_whole(t, i, args, kwargs, n) for i, t in enumerate(self)]
            results = functional(targets, *args, **kwargs)
            _check_writes(targets, results)
            for dst in self:
                _bump(dst)
            for target, result in zip(targets, results):
                mutation.write_result(target, result, inplace=True)
            return None
        target, _ = _target(functional_op, (self, *args), kwargs, n)
        if target is None:
            raise NotImplementedError(f"torchtpu_lab: {op_name(op)} has no per-element op for these arguments on "
                                      "the tpu device")

        def write(per_tensor, a, k):
            result = per_tensor(*a, **k)
            _bump(a[0])
            mutation.write_result(a[0], result, inplace=True)

        foreach.apply(target, (self, *args), kwargs, n, write)
        return None

    kernel.__name__ = f"foreach_{op_name(op)}"
    return kernel


def _whole(t, i: int, args: tuple, kwargs: dict, n: int):
    """Element ``i`` of an update's ``self`` as the op runs on it: a view that is all of its storage without its
    leading size-1 dims (a bias gradient ``sum_to_size`` made, which gradient clipping scales), whose operands
    broadcast to its shape, as a base tensor of the storage (:func:`.mutation.whole_base`): the result replaces the
    storage's array whole, and the recording kernel keys such an element as its storage. Any other as it is (an
    operand that does not broadcast to it gets PyTorch's error from the write)."""
    base = mutation.whole_base(t, foreach.element([*args, *kwargs.values()], i, n))
    return t if base is None else base


def _bump(t: torch.Tensor) -> None:
    """Autograd's version counter of an element written in place, moved once as PyTorch's per-element fallback
    moves it (no autograd kernel of a foreach update does it): a tensor saved for backward and then updated is an
    error at backward, as on the CPU."""
    torch.autograd.graph.increment_version(t)


def _one_device(args: tuple, kwargs: dict) -> bool:
    """Whether the call's tpu tensors are all on one device: a node runs on one, where PyTorch's fallback takes
    each element where it is (lists over ``tpu:0`` and ``tpu:1`` run element by element; the recording kernel
    hands such a call to Python, its tensors not all on the pending graph's device)."""
    seen = None
    for a in (*args, *kwargs.values()):
        for t in (a if isinstance(a, (list, tuple)) else (a,)):
            if isinstance(t, torch.Tensor) and t.device.type == "tpu":
                if seen is None:
                    seen = t.device
                elif t.device != seen:
                    return False
    return True


def _storage_id(t) -> int | None:
    """The identity of a tpu tensor's storage (``None`` for a tensor elsewhere: it shares nothing with one)."""
    if not isinstance(t, torch.Tensor) or not tensor.on_tpu(t):
        return None
    return id(tensor.adopt(t).tpu_storage)


def _independent(self, args: tuple, kwargs: dict) -> bool:
    """Whether every element of ``self`` has a storage of its own, which no other list's element at another
    index and no shared tensor argument reads: then updating all of them from the values before the call is the
    per-element order's result."""
    owner: dict = {}
    for i, t in enumerate(self):
        s = _storage_id(t)
        if s in owner:
            return False
        owner[s] = i
    for a in (*args, *kwargs.values()):
        if isinstance(a, (list, tuple)):
            for j, x in enumerate(a):
                s = _storage_id(x)
                if s is not None and owner.get(s, j) != j:
                    return False
        elif _storage_id(a) in owner:
            return False
    return True


def _check_writes(self, results) -> None:
    """PyTorch's in-place errors, before any element is written (nothing is lost): a result of another shape than
    its element (an operand that does not broadcast to it), or of a dtype the element cannot hold."""
    for dst, result in zip(self, results):
        if tuple(result.shape) != tuple(dst.shape) or not torch.can_cast(result.dtype, dst.dtype):
            mutation.write_result(dst, result, inplace=True)  # raises PyTorch's message for it


def _registered(op) -> bool:
    """Whether ``op`` gets a kernel here: a foreach op of a pointwise per-tensor op, each of whose tensor
    arguments is an element list or one operand of every element."""
    if not op._schema.name.startswith("aten::_foreach_"):
        return False
    if any(a.name in _SKIPPED_ARGUMENTS and isinstance(a.type, torch.TensorType) for a in op._schema.arguments):
        return False
    base = op._schema.name[len("aten::_foreach_"):].rstrip("_")
    packet = getattr(aten, base, None)
    if packet is None:
        return False
    if op._overloadname in packet.overloads():  # the per-tensor op of its own name (`_foreach_max`: a reduction)
        return torch.Tag.pointwise in getattr(packet, op._overloadname).tags
    return any(torch.Tag.pointwise in getattr(packet, o).tags for o in packet.overloads())


@functools.cache
def kernels() -> tuple[dict, dict]:
    """``(op -> kernel, in-place op -> its functional op)`` for every foreach op :func:`_registered` takes: a
    functional op's and, where PyTorch has one of the same arguments, its in-place op's."""
    out: dict = {}
    inplace_of: dict = {}
    for name in sorted({s.name for s in torch._C._jit_get_all_schemas() if s.name.startswith("aten::_foreach_")}):
        packet = getattr(aten, name[len("aten::"):], None)
        if packet is None or name.endswith("_"):
            continue
        for overload in packet.overloads():
            op = getattr(packet, overload)
            if op._schema.is_mutable or not _registered(op):
                continue
            out[op] = _functional_kernel(op)
            inplace = getattr(getattr(aten, name[len("aten::"):] + "_", None), overload, None)
            if inplace is not None and mutation.signature(inplace._schema) == mutation.signature(op._schema):
                out[inplace] = _inplace_kernel(inplace, op, out[op])
                inplace_of[inplace] = op
    return out, inplace_of
