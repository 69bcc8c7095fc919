"""Argument templates: how one ATen call on tpu tensors becomes a hashable *template* plus a list of *dynamic
inputs*, and back.

Tensors become :class:`~.signatures.Slot` s naming their dtype, shape and view geometry (their storage array, and
a moving view's offset, go to the dynamic inputs); ``Scalar`` arguments become dynamic slots, so a changing
Python number is a graph input, never a constant; everything else is kept as a :class:`~.signatures.Static`
value. The template is the executable cache key (:mod:`.executor`); :func:`decode` rebuilds the arguments inside
the traced function, and :func:`cast` makes a lowering's outputs match PyTorch's own metadata.
"""

from __future__ import annotations

import jax.numpy as jnp
import torch

from .. import caches, dtypes
from ..device import context, tensor, views
from ..ops import cpu_rules
from ..ops.casts import convert
from ..ops.registry import ARG_CHECKS, META_FIXES
from .signatures import Slot, Static

#: what a meta kernel raises where it cannot describe a call it accepts (a Python decomposition standing in as the
#: meta kernel divides by a spatial size of 0: ``native_group_norm_backward``); the lowering's outputs stand then
_META_SKIP = (NotImplementedError, AttributeError, ZeroDivisionError)
try:
    from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException

    _META_SKIP = (*_META_SKIP, DataDependentOutputException, DynamicOutputShapeException)
except ImportError:  # pragma: no cover
    pass


@caches.memoize("op_schemas", 8192)
def _scalar_args(op: torch._ops.OpOverload) -> tuple[frozenset, frozenset]:
    """Positions and names of the op's arguments where a Python number is a *value*, not configuration: those
    typed ``Scalar`` (or ``Scalar?``, ``Scalar[]``), and those typed ``Tensor`` that received a number (a wrapped scalar, as
    decompositions pass to ``aten.div.Tensor``). Numbers there become graph inputs, never constants."""
    positions, names = set(), set()
    for i, arg in enumerate(op._schema.arguments):
        t = arg.type
        if isinstance(t, torch.OptionalType):
            t = t.getElementType()
        if isinstance(t, torch.ListType) and t.getElementType().kind() == "NumberType":
            t = t.getElementType()  # Scalar[]: a number per element of a foreach op (an optimizer's step sizes)
        if t.kind() in ("NumberType", "TensorType"):
            names.add(arg.name)
            if not arg.kwarg_only:
                positions.add(i)
    return frozenset(positions), frozenset(names)


class Encoder:
    """Builds a hashable template of an argument structure and collects its dynamic inputs."""

    __slots__ = ("dyn", "device_index", "static_scalars", "host_tensors")

    def __init__(self, static_scalars: bool, host_tensors: bool = False):
        self.dyn: list = []
        self.device_index: int | None = None
        self.static_scalars = static_scalars
        self.host_tensors = host_tensors  # CPU tensors of any shape are accepted (index tensors, as on CUDA)

    def encode(self, v, scalar: bool = False):
        if tensor.on_tpu(v):  # a subclass keeps its class (UninitializedParameter): adopt attaches its data
            v = tensor.adopt(v)
            storage = v.tpu_storage
            if self.device_index is None:
                self.device_index = storage.device_index
            elif storage.device_index != self.device_index:
                raise RuntimeError(
                    "Expected all tensors to be on the same device, but found at least two devices, "
                    f"tpu:{self.device_index} and tpu:{storage.device_index}!"
                )
            self.dyn.append(storage.array)
            index, view = len(self.dyn) - 1, v.tpu_view
            shape = tuple(storage.shape if view is None else view.size)  # not v.shape: a lazy module's raises
            if view is not None:  # the offset is an input right after the array (device/views.py)
                view, offset = views.dynamic(storage.shape, view)
                if offset is not None:
                    self.dyn.append(offset)
            return Slot("T", index, v.dtype, shape, storage.shape, view)
        if isinstance(v, torch.Tensor):
            if v.device.type == "cpu" and v.dim() != 0 and self.host_tensors:
                self.dyn.append(jnp.asarray(dtypes.host_array(v)))
                return Slot("H", len(self.dyn) - 1, v.dtype, tuple(v.shape), (), None)
            if v.dim() != 0 or v.device.type != "cpu":
                raise RuntimeError(
                    "Expected all tensors to be on the same device, but found at least two devices, "
                    f"tpu:{self.device_index or 0} and {v.device}!"
                )
            self.dyn.append(jnp.asarray(dtypes.host_array(v)))
            return Slot("H", len(self.dyn) - 1, v.dtype, (), (), None)
        if isinstance(v, (list, tuple)):
            return tuple(self.encode(x, scalar) for x in v)
        if scalar and not self.static_scalars and isinstance(v, (bool, int, float, complex)):
            self.dyn.append(v)
            return Slot("S", len(self.dyn) - 1, type(v), (), (), None)
        if isinstance(v, torch.Generator):
            return None
        if isinstance(v, (bool, int, float, complex)):
            return Static(type(v), v)
        return v


def decode(t, dyn: list | tuple, meta: bool = False):
    """The argument a template entry ``t`` stands for, given the dynamic inputs ``dyn`` (inside the traced
    function: tracers; views read through their geometry). ``meta=True``: meta tensors in place of tensor slots,
    for asking PyTorch's meta kernels about the call."""
    if isinstance(t, Slot):
        if t.kind == "S":
            return dyn[t.index]
        if meta:
            return _meta_tensor(t, dyn)
        if t.kind == "H":
            return dyn[t.index]
        return views.read(dyn[t.index], t.base_shape, t.view, _offset(t.view, dyn, t.index))
    if isinstance(t, Static):
        return t.value
    if isinstance(t, tuple):
        return [decode(x, dyn, meta) for x in t]
    if meta and isinstance(t, torch.device) and t.type == "tpu":
        return torch.device("meta")
    return t


def _meta_tensor(t: Slot, dyn) -> torch.Tensor:
    """A meta tensor for a tensor slot, with the view's sizes, strides and offset over its base: meta kernels that
    check geometry (``x.view(dtype)`` of a view at an odd offset) see what CPU's kernel would."""
    if t.view is None or t.kind != "T":
        return torch.empty(t.shape, dtype=t.dtype, device="meta")
    offset = _offset(t.view, dyn, t.index)
    return views.shadow(t.base_shape, t.view.size, t.view.stride, 0 if offset is None else int(offset), t.dtype,
                        t.view.cast)


def _offset(view, dyn, index: int):
    """The offset input of a view whose offset moves (right after its storage array), else ``None``."""
    return dyn[index + 1] if view is not None and view.moves else None


def meta_outputs(op: torch._ops.OpOverload, targs: tuple, tkwargs: tuple, dyn: list):
    """PyTorch's own output metadata for this call, or ``None`` where no meta kernel can say; CPU's checks of the
    arguments first, where the meta kernel's differ (:data:`~torchtpu_lab.ops.registry.ARG_CHECKS`) and where
    CPU refuses complex numbers (:func:`~torchtpu_lab.ops.cpu_rules.check_complex`)."""
    args, kwargs = [decode(a, dyn, True) for a in targs], {k: decode(v, dyn, True) for k, v in tkwargs}
    check = ARG_CHECKS.get(op)
    if check is not None:
        check(op, *args, **kwargs)
    cpu_rules.check_complex(op, args, kwargs)
    try:
        out = op(*args, **kwargs)
    except _META_SKIP:
        return None
    except RuntimeError as e:
        if str(e) == "duplicate value in the list of dims":  # PyTorch's Python meta kernels' wording
            raise _repeated_dim(op, args, kwargs) from None
        raise
    fix = META_FIXES.get(op)
    return out if fix is None else fix(op, args, kwargs, out)


def _repeated_dim(op, args: list, kwargs: dict) -> RuntimeError:
    """CPU's error for a reduction's ``dim`` list naming a dim twice (``x.sum((0, -4))`` of a 4-d ``x``)."""
    names = [a.name for a in op._schema.arguments]
    dims = kwargs.get("dim", args[names.index("dim")] if "dim" in names and names.index("dim") < len(args) else ())
    ndim = max(next((a.dim() for a in args if isinstance(a, torch.Tensor)), 1), 1)
    seen = set()
    for d in [dims] if isinstance(dims, int) else dims:
        d = d % ndim
        if d in seen:
            return RuntimeError(f"dim {d} appears multiple times in the list of dims")
        seen.add(d)
    return RuntimeError("duplicate value in the list of dims")


def cast(op, out, meta):
    """``out`` (a lowering's result) in PyTorch's output dtypes and container types from ``meta`` (its meta
    kernel's outputs), so lowerings may compute in any dtype JAX promotes to; a shape or arity that differs is our
    bug, and says so."""
    if meta is None:
        return out
    if isinstance(meta, torch.Tensor):
        if out is None:  # a gradient its output_mask left out, which PyTorch's meta kernel still describes
            return jnp.zeros(meta.shape, dtypes.to_jax(meta.dtype))
        if tuple(out.shape) != tuple(meta.shape):
            raise RuntimeError(
                f"torchtpu_lab bug: the lowering of {op} produced shape {tuple(out.shape)} "
                f"where PyTorch expects {tuple(meta.shape)}"
            )
        want = dtypes.to_jax(meta.dtype)
        return out if out.dtype == want else convert(out, want)
    if isinstance(meta, (list, tuple)):
        if not isinstance(out, (list, tuple)) or len(out) != len(meta):
            raise RuntimeError(f"torchtpu_lab bug: the lowering of {op} returned {type(out).__name__} "
                               f"where PyTorch expects {len(meta)} outputs")
        # PyTorch's container type, so output avals can be read off the metadata without tracing
        return type(meta)(cast(op, o, m) for o, m in zip(out, meta))
    return out


def dynamic_input(base_shape: tuple, view, dyn: list):
    """The offset-free key of ``view`` (``None`` for a base), appending its offset to ``dyn`` if it moves."""
    if view is None:
        return None
    key, offset = views.dynamic(base_shape, view)
    if offset is not None:
        dyn.append(offset)
    return key


def leaf_dtype(v) -> str:
    """A value's dtype as a key part (a placeholder's or an array's; weak types differ in compiled programs).
    Names are looked up, not formatted: ``str`` of a NumPy dtype costs ~20 us, once per append and attention
    of every decode step."""
    dtype = v.dtype
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype)
    return name


_DTYPE_NAMES: dict = {}


#: Ops that accept CPU index tensors next to tpu tensors (as CUDA does); those are copied to the device.
HOST_INDEX_OPS = frozenset({
    torch.ops.aten.index.Tensor, torch.ops.aten._unsafe_index.Tensor, torch.ops.aten.index_put.default,
    torch.ops.aten._unsafe_index_put.default, torch.ops.aten._index_put_impl.default,
})


def device_from_args(args: tuple, kwargs: dict) -> int:
    """The tpu device index a call without tensor inputs (a factory) targets: its ``device`` argument, else the
    current device."""
    dev = kwargs.get("device")
    if dev is None:
        dev = next((a for a in args if isinstance(a, torch.device)), None)
    if isinstance(dev, torch.device) and dev.type == "tpu" and dev.index is not None:
        return dev.index
    return context.current_index()


_PLANS = caches.cache("op_plans", 8192)


def op_plan(op: torch._ops.OpOverload) -> tuple:
    """``(scalar positions, scalar names, accepts host index tensors)`` of ``op``, looked up by the op's
    identity (an int hashes in no time; an OpOverload's hash is a Python call)."""
    plan = _PLANS.get(id(op))
    if plan is None:
        plan = (*_scalar_args(op), op in HOST_INDEX_OPS)
        _PLANS.put(id(op), plan)
    return plan
