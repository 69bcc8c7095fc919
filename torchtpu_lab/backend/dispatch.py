"""Install every kernel for the PrivateUse1 (``tpu``) dispatch key, in one place.

Order of preference for an op: a hand-written core kernel (transfers, allocation), a view kernel, a lowering
from the op table, a decomposition from ``torch._decomp`` (which re-enters the dispatcher with simpler ops),
an in-place/``out=`` variant derived from one of those, and finally the boxed fallback, which runs the op on
the CPU (:mod:`.cpu_fallback`) or, with the fallback off, raises ``NotImplementedError`` naming the op and
overload — an op we cannot run never returns a wrong number.

:func:`tpu_kernel` is the one way a tpu kernel is made — for these ops, ``jax_op``, ``torch.compile``'s graphs
and whatever comes next — so every kernel holds :data:`torchtpu_lab.runtime.fused.LOCK` for its whole call and
starts at the interrupt checkpoint (the thread-safety rule of :mod:`torchtpu_lab.runtime.fused`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch
import torch._decomp

from ..device import sizes
from ..ops import DECOMP_SKIP, LOWERINGS, PY_KERNELS
from ..ops.registry import CALL_CHECKS, Lowering, NoKernel, op_name
from ..runtime import (
    bounded,
    core_kernels,
    foreach_kernels,
    cpu_fallback,
    executor,
    fused,
    growth,
    mutation,
    optimizer_step,
    overlap,
    padded_attention,
    recording,
    training_attention,
    view_kernels,
)
from . import linear_grad, serialization

aten = torch.ops.aten
_KEY = "PrivateUse1"

#: Every kernel we registered, by OpOverload, so variants can call functionals without re-dispatching.
KERNELS: dict = {}
#: In-place op -> the functional op its kernel runs and writes back (``x.add_(y)``: ``add``), for the recording
#: kernel, which records the functional op's node for a repeated in-place call.
INPLACE_OF: dict = {}
#: Ops that run as PyTorch's decomposition on tpu (op -> decomposition): ``torch.compile(backend="tpu")`` hands
#: the same table to AOTAutograd, so compiled and eager code take the same route.
DECOMPOSED: dict = {}
_libs: list = []

def tpu_kernel(impl: Lowering | Callable) -> Callable:
    """The tpu kernel of ``impl``: a :class:`~torchtpu_lab.ops.registry.Lowering` (run through the executor, or
    on the CPU where it does not cover the arguments) or a Python function of tpu tensors, held whole under the
    runtime's lock with the interrupt checkpoint at its start. Idempotent: a kernel it made is returned as is."""
    if isinstance(impl, Lowering):
        return _lowered(impl)
    if getattr(impl, "owns", None) is fused.LOCK:
        return impl
    return fused.entry_point(impl)


def _lowered(low: Lowering) -> Callable:
    # not wrapped again: execute and the CPU fallback are entry points themselves, so an op takes the lock once
    execute, fallback = executor.execute, cpu_fallback.run
    check = CALL_CHECKS.get(low.op)

    def kernel(*args, **kwargs):
        if check is not None:  # CPU's checks of every call (a warning each time), before anything is drawn
            check(low.op, *args, **kwargs)
        try:
            return execute(low, args, kwargs)
        except NoKernel as e:  # PyTorch has no kernel for these either: its error, as its own type
            raise NotImplementedError(str(e)) from None
        except NotImplementedError as e:  # the lowering does not cover these arguments
            return fallback(low.op, args, kwargs, e)

    kernel.__name__ = f"lowered_{low.op}"
    kernel.owns = fused.LOCK
    kernel.lowering = low  # the recording kernel may serve it (see install)
    return kernel


# In-place ops whose functional form has another name, so schema matching cannot pair them.
_RENAMED_INPLACE = {aten.normal_.default: aten.normal_functional.default}

_decomposing = threading.local()


class _Recursion(Exception):
    """A decomposition re-entered its own op; unwinds to that op's kernel, which falls back to the CPU."""

    def __init__(self, op):
        super().__init__(str(op))
        self.op = op


def _decomposition_kernel(op, fn):
    """Run PyTorch's decomposition of ``op``; if it re-enters ``op`` (a ``torch._refs`` decomposition whose prims
    lead back to the same ATen op), raise the usual no-lowering error instead of recursing forever."""

    size_at = _size_argument(op)

    def kernel(*args, **kwargs):
        if size_at is not None:  # a factory: PyTorch's refs would say only "Expected cond to be True"
            size = args[size_at] if len(args) > size_at else kwargs.get("size")
            if isinstance(size, (list, tuple)):
                sizes.check(size)
        active = getattr(_decomposing, "ops", None)
        if active is None:
            active = _decomposing.ops = set()
        if op in active:
            raise _Recursion(op)
        active.add(op)
        try:
            return fn(*args, **kwargs)
        except _Recursion as r:
            if r.op is not op:
                raise
            return cpu_fallback.run(op, args, kwargs, NotImplementedError(
                f"torchtpu_lab: {op_name(op)} has no lowering for the tpu device yet "
                "(its PyTorch decomposition leads back to itself)"))
        finally:
            active.discard(op)

    kernel.__name__ = f"decomposed_{op}"
    return kernel


def _size_argument(op) -> int | None:
    """Position of ``op``'s ``SymInt[] size`` argument (factories such as ``ones``/``full``), if any. A copy of a
    view (PyTorch's ``view_copy`` tag: ``view_copy``, ``expand_copy``) has none: its size is the view's, where a
    ``-1`` is inferred or kept."""
    if torch.Tag.view_copy in op.tags:
        return None
    for i, arg in enumerate(op._schema.arguments):
        if arg.name == "size" and isinstance(arg.type, torch.ListType):
            return i
    return None


def _is_composite_implicit(op) -> bool:
    """True for ops PyTorch decomposes above autograd (they never reach us), and for TorchScript-only ops."""
    try:
        return torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CompositeImplicitAutograd")
    except RuntimeError:
        return True


def _overloads(packet_name: str):
    packet = getattr(aten, packet_name, None)
    if packet is None:
        return []
    return [getattr(packet, o) for o in packet.overloads()]


def _collect() -> dict:
    kernels: dict = {}
    kernels.update(core_kernels.NON_LOWERING_KERNELS)
    kernels.update(growth.APPEND_KERNELS)
    kernels.update(padded_attention.ATTENTION_KERNELS)
    kernels.update(training_attention.KERNELS)
    kernels.update(serialization.STORAGE_KERNELS)
    kernels.update(optimizer_step.OPTIMIZER_KERNELS)
    foreach, foreach_inplace = foreach_kernels.kernels()
    kernels.update(foreach)
    INPLACE_OF.update(foreach_inplace)
    for op, low in linear_grad.LOWERED.items():  # CompositeImplicitAutograd: never in the op table's sweep
        kernels[op] = tpu_kernel(low)
    for op, fn in PY_KERNELS.items():
        kernels.setdefault(op, fn)
    for op in (*view_kernels.VIEW_OPS, *view_kernels.DTYPE_VIEW_OPS):
        kernels.setdefault(op, view_kernels.make_view_kernel(op))
    for op in view_kernels.INPLACE_VIEW_OPS:
        kernels.setdefault(op, view_kernels.make_inplace_view_kernel(op))
    kernels.setdefault(aten.detach_.default, view_kernels.detach_)
    for op, low in LOWERINGS.items():
        kernels.setdefault(op, tpu_kernel(low))
    for op, fn in torch._decomp.decomposition_table.items():
        if not isinstance(op, torch._ops.OpOverload) or op.namespace != "aten":
            continue
        if op in kernels or op._schema.is_mutable or op in DECOMP_SKIP or _is_composite_implicit(op):
            continue
        kernels[op] = _decomposition_kernel(op, fn)
        DECOMPOSED[op] = fn
    # in-place and out= variants of every functional op we can run
    for inplace, functional in _RENAMED_INPLACE.items():
        if functional in kernels and inplace not in kernels:
            kernels[inplace] = mutation.make_inplace_kernel(kernels[functional], inplace)
    functionals = {mutation.signature(op._schema): k for op, k in kernels.items() if not op._schema.is_mutable}
    functional_ops = {mutation.signature(op._schema): op for op in kernels if not op._schema.is_mutable}
    for base in {s[0] for s in functionals}:
        for op in _overloads(base) + _overloads(base + "_"):
            if op in kernels or not op._schema.is_mutable or _is_composite_implicit(op):
                continue
            functional = functionals.get(mutation.signature(op._schema))
            if functional is None:
                continue
            names = mutation.out_names(op._schema)
            if names:
                kernels[op] = mutation.make_out_kernel(functional, names, op)
            elif mutation.is_inplace(op._schema):
                kernels[op] = mutation.make_inplace_kernel(functional, op, _pointwise(op))
                INPLACE_OF[op] = functional_ops[mutation.signature(op._schema)]
    factories = {mutation.factory_signature(op._schema): k for op, k in kernels.items()
                 if not op._schema.is_mutable and mutation.is_factory(op._schema)}
    for base in {s[0] for s in factories}:
        for op in _overloads(base):
            names = mutation.out_names(op._schema)
            if op not in kernels and len(names) == 1 and not _is_composite_implicit(op):
                factory = factories.get(mutation.factory_signature(op._schema))
                if factory is not None:
                    kernels[op] = mutation.make_factory_out_kernel(factory, names[0], base)
    for op, kernel in kernels.items():
        if _writes_memory(op):
            kernels[op] = overlap.checked(op, kernel)
    return kernels


#: ops that write a tensor's metadata or storage pointer, not its elements
_METADATA_WRITES = {"resize_", "resize_as_", "set_", "detach_", "as_strided_", "_resize_output_"}


def _writes_memory(op: torch._ops.OpOverload) -> bool:
    """Whether ``op`` writes elements of a tensor argument (not a list: foreach updates and fused optimizers
    write parameters that never overlap), so CPU's overlap refusals apply (:mod:`..runtime.overlap`)."""
    if op in view_kernels.INPLACE_VIEW_OPS or op._schema.name.split("::")[-1] in _METADATA_WRITES:
        return False
    written = [a for a in op._schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    return bool(written) and not any(isinstance(a.type, torch.ListType) for a in written)


def _records(op, kernel) -> bool:
    """Whether the recording kernel can record ``op`` (run by ``kernel``): a lowered, non-random op with tensor
    outputs and no per-call check (``CALL_CHECKS``), or a foreach op (:mod:`..runtime.foreach_kernels`: a list of
    them)."""
    if getattr(kernel, "foreach", False):
        return recording.returns_list(op)
    low = getattr(kernel, "lowering", None)
    return low is not None and not low.rng and op not in CALL_CHECKS and recording.recordable(op)


def _dynamic_numbers(kernel) -> bool:
    """Whether numbers are graph inputs of the executables ``kernel`` records (a foreach op's: its per-tensor
    lowering decides per call, and a number list such as a step size per parameter changes every step)."""
    low = getattr(kernel, "lowering", None)
    return low is None or not low.static_scalars


def _fallback(keyset, op, *args, **kwargs):
    return cpu_fallback.run(op, args, kwargs)


def _pointwise(op: torch._ops.OpOverload) -> bool:
    """Whether ``op`` works element by element, the same on any shape of the same elements (not a random op:
    its draws follow the shape)."""
    return torch.Tag.pointwise in op.tags and torch.Tag.nondeterministic_seeded not in op.tags


def install(core=None) -> None:
    """Register all kernels (idempotent). With the native core's recording kernel (``core``), the ops the
    executor lowers get it as their kernel, in front of their Python kernel (:mod:`..runtime.recording`)."""
    if _libs:
        return
    KERNELS.update(_collect())
    lib = torch.library.Library("aten", "IMPL")
    # op -> (its Python kernel, recording.RECORD/VIEW/INPLACE, the op that teaches it, its lowering takes numbers
    # as graph inputs)
    native: dict = {}
    for op, fn in KERNELS.items():
        kernel = tpu_kernel(fn)
        if core is not None and _records(op, kernel):
            kind = (recording.RECORD_LIST if recording.returns_list(op) else
                    recording.RECORD_ON_FRONTS if bounded.on_fronts(op) else recording.RECORD)
            native[op] = (kernel, kind, op, _dynamic_numbers(kernel))
        elif core is not None and op in padded_attention.ATTENTION_KERNELS:  # padded keys, whole buffers (recording.py)
            native[op] = (kernel, recording.RECORD, op, False)
        elif core is not None and view_kernels.recordable_view(op, fn):
            native[op] = (kernel, recording.VIEW, op, False)
        elif (core is not None and op in INPLACE_OF and len(INPLACE_OF[op]._schema.returns) == 1
              and _records(INPLACE_OF[op], teacher := tpu_kernel(KERNELS[INPLACE_OF[op]]))):
            kind = (recording.INPLACE_LIST if recording.returns_list(INPLACE_OF[op]) else
                    recording.INPLACE_POINTWISE if _pointwise(op) else recording.INPLACE)
            native[op] = (kernel, kind, INPLACE_OF[op], _dynamic_numbers(teacher))
        else:
            lib.impl(op, kernel, _KEY)
    if native:
        recording.install(core, native)
    padded_attention.install_autograd(lib, core)
    fallback = torch.library.Library("_", "IMPL")
    fallback.fallback(tpu_kernel(_fallback), dispatch_key=_KEY, with_keyset=True)
    _libs.extend([lib, fallback])
