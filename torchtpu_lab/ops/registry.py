"""The op table: one small JAX function per ATen op, registered with :func:`lower`.

A lowering receives the op's arguments in ATen schema order, with every tensor replaced by a JAX array (views
already materialized) and every other argument as the Python value PyTorch passed. Arguments the schema types
as ``Scalar`` arrive as traced JAX scalars, so a learning rate that changes each step does not recompile; a
lowering that needs a Python number there (say, for an output shape) declares ``static_scalars=True``.
A lowering that draws random numbers declares ``rng=True`` and receives a :class:`random_bits.DrawKey` as ``key=``
(the generator's seed and the op's offset, traced), from which :mod:`.random_bits` draws.
A lowering whose output shape depends on input *values* (``nonzero``, ``masked_select``, ``unique``) declares
``jit=False``: it then runs op by op on concrete arrays (a sync point), never inside a compiled graph. When only
some calls are data-dependent (indexing with a boolean mask), ``jit`` is a predicate ``(args, kwargs) -> bool``
deciding per call; the decision must follow from what the cache key holds (dtypes, shapes, static values).

The executor casts results to the dtype PyTorch's own meta kernel predicts, so lowerings may compute in
whatever dtype JAX promotes to; they must get shapes and values right.

The same table serves per-op eager execution and the fused lazy graph (both through the runtime's executor);
nothing in it knows which mode runs it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

aten = torch.ops.aten


def op_name(op) -> str:
    """``aten::add.Tensor``-style name of an OpOverload (``.default`` omitted), as PyTorch prints ops. Signatures
    also hold ops that are already names (strings) or other callables: those are named as they print."""
    if isinstance(op, str):
        return op
    if not hasattr(op, "_schema"):
        return str(op)
    overload = "" if op._overloadname == "default" else f".{op._overloadname}"
    return f"{op._schema.name}{overload}"


@dataclass(frozen=True)
class Lowering:
    op: torch._ops.OpOverload
    fn: Callable
    static_scalars: bool = False
    rng: bool = False
    jit: bool | Callable = True

    def jit_for(self, args: tuple, kwargs: dict) -> bool:
        return self.jit if isinstance(self.jit, bool) else bool(self.jit(args, kwargs))


LOWERINGS: dict[torch._ops.OpOverload, Lowering] = {}
#: Ops whose ``torch._decomp`` decomposition must not be used on tpu (wrong or recursive for us).
DECOMP_SKIP: set = set()


#: Plain Python kernels for ops that cannot be a pure function (they mutate an argument, like batch norm's
#: running statistics). They receive tpu tensors and call torch ops on them.
PY_KERNELS: dict = {}


#: Checks of an op's arguments that CPU makes and PyTorch's meta kernel makes otherwise or not at all (a different
#: exception type, or no check): called with the op and the meta kernel's arguments (meta tensors) just before it.
ARG_CHECKS: dict = {}


#: Corrections of an op's output metadata where PyTorch's meta kernel disagrees with its CPU kernel (a Python
#: reference's type promotion that the CPU kernel does not apply): called with the op, the meta kernel's arguments
#: and its outputs, returning the outputs CPU gives.
META_FIXES: dict = {}


#: Checks CPU makes at *every* call of an op, called with the op and the call's own arguments (tpu tensors and
#: Python values) before it runs, in every eager mode: for what a check run once per compiled signature
#: (:data:`ARG_CHECKS`) cannot do, such as a warning CPU gives each time (``random_``'s precision warning). An
#: op with one is never recorded by the native recording kernel, which would skip it on repeated calls.
CALL_CHECKS: dict = {}


def _registers_in(table: dict, ops: tuple) -> Callable:
    def register(fn: Callable) -> Callable:
        for op in ops:
            table[op.default if isinstance(op, torch._ops.OpOverloadPacket) else op] = fn
        return fn

    return register


def checks_args(*ops):
    """Register the decorated function as the argument check of ``ops`` (see :data:`ARG_CHECKS`)."""
    return _registers_in(ARG_CHECKS, ops)


def checks_calls(*ops):
    """Register the decorated function as the per-call check of ``ops`` (see :data:`CALL_CHECKS`)."""
    return _registers_in(CALL_CHECKS, ops)


def fixes_meta(*ops):
    """Register the decorated function as the output correction of ``ops`` (see :data:`META_FIXES`)."""
    return _registers_in(META_FIXES, ops)


def kernel(*ops):
    """Register the decorated function as the tpu kernel of ``ops`` (for ops a lowering cannot express)."""

    def register(fn: Callable) -> Callable:
        for op in ops:
            op = op.default if isinstance(op, torch._ops.OpOverloadPacket) else op
            if op in LOWERINGS or op in PY_KERNELS:
                raise RuntimeError(f"{op} has two tpu implementations")
            PY_KERNELS[op] = fn
        return fn

    return register


def skip_decomposition(*ops) -> None:
    """Never run PyTorch's decomposition of ``ops`` (an OpOverload, or a packet: all its overloads) on tpu: the
    op then runs through the CPU fallback (or raises, naming it) until it is lowered."""
    for op in ops:
        if isinstance(op, torch._ops.OpOverloadPacket):
            DECOMP_SKIP.update(getattr(op, name) for name in op.overloads())
        else:
            DECOMP_SKIP.add(op)


# Decompositions that assume real strides or storage, which tpu tensors do not expose.
skip_decomposition(aten.as_strided_scatter, aten._unsafe_view, aten.view, aten.empty_like)


def wrap_dim(dim: int, ndim: int) -> int:
    """``dim`` as an axis of an ``ndim``-dim array (a 0-dim one counts as 1-dim), or PyTorch's ``IndexError``: a
    lowering whose op's meta kernel does not check the dim must not wrap an out-of-range one into a wrong axis."""
    n = max(ndim, 1)
    if not -n <= dim < n:
        raise IndexError(f"Dimension out of range (expected to be in range of [{-n}, {n - 1}], but got {dim})")
    return dim % n


#: C++'s names for the types a Scalar converts to, as CPU's "value cannot be converted to type float" prints them
_CPP_TYPES = {"float32": "float", "float64": "double", "float16": "c10::Half", "bfloat16": "c10::BFloat16",
              "int64": "int64_t", "int32": "int", "int16": "int16_t", "int8": "int8_t", "uint8": "uint8_t",
              "bool": "bool"}


def real_fill_value(value, dtype, op: str | None = None) -> None:
    """CPU's error for a complex number written into a real tensor (``x.fill_(1j)``, ``index_fill_(d, i, 1+1j)``):
    a lowering's cast would drop the imaginary part, a silent wrong value. ``op`` names CPU's own wording for
    that op; otherwise it is Scalar's checked conversion's. ``value`` may be traced (a graph input): its dtype is
    known, its value not, so a complex number with no imaginary part is refused too (CPU lets it through)."""
    import jax.numpy as jnp

    if not jnp.issubdtype(jnp.result_type(value), jnp.complexfloating) or jnp.issubdtype(dtype, jnp.complexfloating):
        return
    if op is not None:
        raise RuntimeError(f"{op}(): Converting complex Scalar to non-complex type is not supported")
    name = jnp.dtype(dtype).name
    raise RuntimeError(f"value cannot be converted to type {_CPP_TYPES.get(name, name)} without overflow")


class NoKernel(NotImplementedError):
    """PyTorch has no kernel for these arguments either (an integer ``lerp``): raised to the caller as PyTorch's
    error, a plain ``NotImplementedError`` (backend/dispatch.py, or the failed op of a fused graph), where another
    ``NotImplementedError`` from a lowering means "not covered here, run it on the CPU"."""


def lower(*ops, static_scalars: bool = False, rng: bool = False, jit: bool | Callable = True):
    """Register the decorated function as the lowering of each of ``ops`` (OpOverloads or packets' defaults)."""

    def register(fn: Callable) -> Callable:
        for op in ops:
            if isinstance(op, torch._ops.OpOverloadPacket):
                op = op.default
            if op in LOWERINGS:
                raise RuntimeError(f"{op} is lowered twice ({LOWERINGS[op].fn.__name__} and {fn.__name__})")
            LOWERINGS[op] = Lowering(op, fn, static_scalars, rng, jit)
        return fn

    return register
