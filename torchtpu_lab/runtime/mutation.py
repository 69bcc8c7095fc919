"""In-place and ``out=`` variants, derived from functional kernels.

``x.add_(y)`` runs the functional ``add`` and assigns the result into ``x`` (through its view, if any);
``torch.add(a, b, out=o)`` assigns into ``o``. The variant of a functional op is found by matching schemas: same
base name (minus the trailing ``_``), same non-out arguments. PyTorch's checks are kept: an in-place result
must have ``self``'s shape, and its dtype must be castable to ``self``'s.
"""

from __future__ import annotations

import re

import torch

from .. import telemetry
from ..device import sizes, tensor, views
from ..dtypes import scalar_name as _name
from ..dtypes import scalar_names as _names
from ..ops import cpu_rules
from ..ops.registry import ARG_CHECKS
from . import values

def signature(schema) -> tuple:
    """What makes a functional op and its in-place/out variants the same op."""
    base = schema.name.split("::")[-1]
    if base.endswith("_"):
        base = base[:-1]
    args = tuple(
        (a.name, str(a.type))
        for a in schema.arguments
        if not (a.kwarg_only and a.alias_info is not None and a.alias_info.is_write)
    )
    return base, args


#: a factory's keyword arguments, which its ``out=`` variant takes from the out tensor instead
FACTORY_KWARGS = ("dtype", "layout", "device", "pin_memory")


def factory_signature(schema) -> tuple:
    """What makes a factory (``arange``, ``linspace``, ``eye``, ``rand``) and its ``out=`` variant the same op."""
    base, args = signature(schema)
    return base, tuple(a for a in args if a[0] not in FACTORY_KWARGS)


def is_factory(schema) -> bool:
    return all(any(a.name == k for a in schema.arguments) for k in FACTORY_KWARGS)


def out_names(schema) -> list[str]:
    return [a.name for a in schema.arguments if a.kwarg_only and a.alias_info is not None and a.alias_info.is_write]


def is_inplace(schema) -> bool:
    first = schema.arguments[0] if schema.arguments else None
    return (
        schema.name.endswith("_")
        and first is not None
        and first.alias_info is not None
        and first.alias_info.is_write
        and not out_names(schema)
    )


def write_result(dst, result, inplace: bool) -> None:
    if type(dst) is type(result) is tensor.TpuTensor and dst.tpu_view is None and result.tpu_view is None:
        storage, new = dst.tpu_storage, result.tpu_storage
        if new.shape == storage.shape and new.dtype is storage.dtype:  # the usual update (an optimizer's)
            values.set_array(storage, new.array)  # arrays are immutable: sharing one is safe
            return
    if inplace and tuple(result.shape) != tuple(dst.shape):
        raise RuntimeError(
            f"output with shape {list(dst.shape)} doesn't match the broadcast shape {list(result.shape)}"
        )
    if not torch.can_cast(result.dtype, dst.dtype):
        raise RuntimeError(f"result type {_name(result.dtype)} can't be cast to the desired output type {_name(dst.dtype)}")
    if not tensor.on_tpu(dst):
        raise RuntimeError(
            f"Expected all tensors to be on the same device, but found at least two devices, tpu:0 and {dst.device}!"
        )
    dst = tensor.adopt(dst)
    if tuple(result.shape) != tuple(dst.shape):
        dst.resize_(result.shape)
    values.assign(dst, result)


#: factories whose ``out=`` keeps its shape when it has as many elements as the range (CPU resizes it only when
#: the counts differ): ``torch.linspace(0, 3, 4, out=x.narrow(1, 1, 2))`` fills a 2x2 view in order
_RANGES = {"arange", "linspace", "logspace", "range"}


def make_factory_out_kernel(factory, name: str, base: str):
    """The ``out=`` variant of ``factory`` (``torch.arange(n, out=t)``, ``base`` its name): the factory's result in
    the out tensor's dtype and device, written into it (resized as CPU resizes it). It has no functional twin of
    its signature (no ``dtype``), and ran on the CPU: a host round trip, CPU's generator for a random one, and
    values that differed in the last bit from the factory's own on tpu."""
    keeps_shape = base in _RANGES

    def kernel(*args, **kwargs):
        out = kwargs.pop(name)
        result = factory(*args, **kwargs, dtype=out.dtype, device=out.device)
        if keeps_shape and out.numel() == result.numel() and out.shape != result.shape:
            result = result.reshape(out.shape)
        elif base == "arange" and out.numel() not in (0, result.numel()):
            telemetry.warn_at_user_line(
                f"The number of elements in the out tensor of shape {list(out.shape)} is {out.numel()} which does "
                f"not match the computed number of elements {result.numel()}. Note that this may occur as a result "
                f"of rounding error. The out tensor will be resized to a tensor of shape ({result.numel()},).")
        write_result(out, result, inplace=False)
        return out

    return kernel


def _defaults(schema) -> tuple:
    """``(position, name, default)`` of every argument of ``schema`` with a default (position ``None`` for a
    keyword-only one), read once per kernel: a schema's ``arguments`` are rebuilt as Python objects on every
    access, which cost more than the rest of an in-place op's host path."""
    return tuple((None if a.kwarg_only else i, a.name, a.default_value)
                 for i, a in enumerate(schema.arguments) if a.has_default_value())


def _with_defaults(defaults: tuple, args: tuple, kwargs: dict) -> tuple[list, dict]:
    """Spell out every omitted argument that has a default (``defaults``: from :func:`_defaults`; the variant's
    defaults may be absent from the functional op's schema, e.g. ``bernoulli_(p=0.5)`` vs ``bernoulli.p(p)``)."""
    args, kwargs = list(args), dict(kwargs)
    for i, name, value in defaults:
        if type(value) is list:  # a fresh list per call, as the schema gave
            value = list(value)
        if i is None:
            if name not in kwargs:
                kwargs[name] = value
        elif i >= len(args) and name not in kwargs:
            args.append(value)
    return args, kwargs


def make_inplace_kernel(functional, op=None, pointwise: bool = False):
    """The in-place variant ``op`` of ``functional``, with the argument check registered for ``op`` itself
    (``checks_args``: CPU's refusal of an in-place ``abs_`` of a complex tensor). ``pointwise`` (an elementwise
    op): a ``self`` that is its whole storage in another shape runs the op on the storage itself
    (:func:`_whole_storage`), as the recording kernel records it (csrc/recorder.cpp keys such a call as its
    storage's), so this path teaches that kernel the entry it looks up."""
    defaults = None if op is None else _defaults(op._schema)
    check = ARG_CHECKS.get(op)

    def kernel(self, *args, **kwargs):
        if defaults is not None:
            args, kwargs = _with_defaults(defaults, (self, *args), kwargs)
            args = args[1:]
        if check is not None:
            check(op, self, *args, **kwargs)
        if pointwise:
            whole = _whole_storage(self, args, kwargs)
            if whole is not None:
                whole, args, kwargs = whole
                write_result(whole, functional(whole, *args, **kwargs), inplace=True)
                return self
        write_result(self, functional(self, *args, **kwargs), inplace=True)
        return self

    return kernel


def _whole_storage(self, args: tuple, kwargs: dict):
    """``(self's storage as a base tensor, args, kwargs)`` for the op on that storage, when ``self`` is all of it
    in another shape (else ``None``: the op runs on ``self`` as it is):

    - without its leading size-1 dims (a bias gradient ``sum_to_size`` made, which gradient clipping scales in
      place), every other tensor operand broadcasting to ``self``'s shape (so to the storage's alike);
    - any other reshape of it (autograd accumulating a gradient that a ``view``'s backward reshaped, as
      ``[batch, seq, d]`` over a linear layer's ``[batch * seq, d]``), every other tensor operand of ``self``'s
      shape being the same reshape of a storage of the same shape: the operands are those storages too.
    """
    if type(self) is not tensor.TpuTensor or self.tpu_view is None:
        return None
    storage = self.tpu_storage
    view = self.tpu_view
    shape = tuple(self.shape)
    if views.drops_leading_ones(storage.shape, view):
        base = whole_base(self, (*args, *kwargs.values()))
        return None if base is None else (base, args, kwargs)
    if not views.reshapes_base(storage.shape, view):
        return None

    def alike(a):
        if not isinstance(a, torch.Tensor):
            return a
        if type(a) is not tensor.TpuTensor or a.tpu_view is None or tuple(a.shape) != shape:
            raise _NotAlike
        other = a.tpu_storage
        if other.shape != storage.shape or not views.reshapes_base(other.shape, a.tpu_view):
            raise _NotAlike
        return tensor.make(other, None)

    try:
        return (tensor.make(storage, None), tuple(alike(a) for a in args),
                {k: alike(v) for k, v in kwargs.items()})
    except _NotAlike:
        return None


def whole_base(self, operands) -> tensor.TpuTensor | None:
    """``self``'s storage as a base tensor, where ``self`` is all of it without its leading size-1 dims (``[1, n]``
    seen as ``[n]``: a bias gradient ``sum_to_size`` made) and every tensor among ``operands`` broadcasts to
    ``self``'s shape: a pointwise in-place op on ``self`` is then the same op on the storage, its operands
    broadcasting alike. ``None`` otherwise."""
    if type(self) is not tensor.TpuTensor or self.tpu_view is None:
        return None
    if not views.drops_leading_ones(self.tpu_storage.shape, self.tpu_view):
        return None
    shape = tuple(self.shape)
    for a in operands:
        if isinstance(a, torch.Tensor) and sizes.broadcast(tuple(a.shape), shape) != shape:
            return None
    return tensor.make(self.tpu_storage, None)


class _NotAlike(Exception):
    """An operand of an in-place op on a reshaped storage that is not the same reshape of a storage alike."""


#: a dtype named as PyTorch's C++ names it ("got: Float")
_DTYPE_NAME = re.compile(r"\b(" + "|".join(_names()) + r")\b")


def _about_types(e: BaseException) -> bool:
    """Whether CPU's error for an ``out=`` of another dtype is about dtypes ("Found dtype Double but expected
    Float", "result type Float can't be cast", "expected scalar type Long", "all only supports bool tensor for
    result, got: Float", "isposinf does not support non-boolean outputs.")."""
    message = str(e)
    return isinstance(e, RuntimeError) and ("type" in message.lower() or _DTYPE_NAME.search(message) is not None
                                            or "non-boolean outputs" in message)


def _warn_if_resized(out, result) -> None:
    """CPU's ``resize_output`` warning: an out tensor that had elements is resized to the result's shape."""
    if isinstance(out, torch.Tensor) and out.numel() != 0 and tuple(out.shape) != tuple(result.shape):
        telemetry.warn_at_user_line(
            f"An output with one or more elements was resized since it had shape {list(out.shape)}, which does not "
            f"match the required output shape {list(result.shape)}. This behavior is deprecated, and in a future "
            "PyTorch release outputs will not be resized unless they have zero elements. You can explicitly reuse "
            "an out tensor t by resizing it, inplace, to zero elements with t.resize_(0).")


def make_out_kernel(functional, names: list[str], op=None):
    """The ``out=`` variant ``op`` of ``functional``: PyTorch's dtype rule for the outs is ``op``'s on CPU (asked of
    its kernel, :func:`_about_types`), and so is the argument check a lowering registers for ``op`` itself
    (``checks_args``: heaviside's complex out)."""
    defaults = None if op is None else _defaults(op._schema)
    check = ARG_CHECKS.get(op)

    def kernel(*args, **kwargs):
        if defaults is not None:
            args, kwargs = _with_defaults(defaults, args, kwargs)
        if check is not None:
            check(op, *args, **kwargs)
        outs = [kwargs.pop(n) for n in names]
        result = functional(*args, **kwargs)
        results = result if isinstance(result, (tuple, list)) else (result,)
        if len(outs) == 1 and isinstance(outs[0], (list, tuple)):  # a Tensor[] out (split_with_sizes_copy)
            pairs = list(zip(outs[0], results))
        else:
            pairs = list(zip(outs, results))
        if op is not None and any(isinstance(o, torch.Tensor) and o.dtype != r.dtype for o, r in pairs):
            # the op's own rule for an out of another dtype (neg wants it exact, add casts): CPU's kernel says
            refused = cpu_rules.refusal(op, args, {**kwargs, **dict(zip(names, outs))}, _about_types, tuple(names))
            if refused is not None:
                raise refused
        for o, r in pairs:
            _warn_if_resized(o, r)
            write_result(o, r, inplace=False)
        if len(outs) == 1 and isinstance(outs[0], (list, tuple)):
            return None
        return outs[0] if len(outs) == 1 else tuple(outs)

    return kernel
