"""Lower an ATen FX graph (what AOTAutograd hands a backend) to one JAX function, node by node, through the same
op table eager mode uses.

Each ``call_function`` node is one of:

* an op of the op table (:data:`torchtpu_lab.ops.LOWERINGS`) — its lowering is called on the traced JAX values
  and the result cast to the dtype PyTorch's meta kernel recorded on the node (``node.meta["val"]``), exactly as
  the eager executor casts (:func:`torchtpu_lab.runtime.encode.cast`); random ops get their keys from a
  ``(seed, first offset)`` pair that is an *input* of the function, drawn from the device generator per call:
  the k-th random op of the graph uses offset ``first + k``, the offset the same op would take eagerly, so a
  compiled region draws the same numbers as the same code run eagerly from the same seed;
* a view op (``view``, ``permute``, ``expand``, ``slice``...): inside the function every value is a
  contiguous array, so the view's geometry comes from running the op on a meta tensor of that shape — PyTorch
  decides it, as in eager mode (:mod:`torchtpu_lab.runtime.view_kernels`) — and the values are read with
  :func:`torchtpu_lab.device.views.read`; ``as_strided`` of a value whose fake strides are not row-major (a
  transposed graph input) addresses storage as on CPU;
* one of the few runtime kernels that are not lowerings (``_to_copy``, ``prims.convert_element_type``,
  ``copy``/``copy_``, ``empty``), each a line here; ``copy_`` into a graph input is an input mutation, returned
  and written back after the call;
* a functional collective (``_c10d_functional.all_reduce``...): the same per-rank body the eager collective
  runs, and the whole function becomes one ``shard_map`` program over the group's mesh (:mod:`.spmd`);
* anything else raises :class:`NotLowerable` naming the op, and the caller runs that graph eagerly instead.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
import numpy as np
import torch
import torch.fx

from .. import dtypes
from ..device import views
from ..ops import LOWERINGS, foreach
from ..ops.casts import convert
from ..ops.random_bits import DrawKey
from ..ops.registry import op_name
from ..runtime import encode, view_kernels
from . import spmd
from .errors import NotLowerable

aten = torch.ops.aten
_VIEW_OPS = frozenset(view_kernels.VIEW_OPS)

__all__ = ["GraphPlan", "NotLowerable", "trace"]


@dataclass
class GraphPlan:
    """What the traced function needs around it: where its inputs go and what its outputs are."""

    n_inputs: int
    n_ops: int = 0
    ops: list = field(default_factory=list)  # ATen op names in graph order (the profile's "ops inside")
    uses_rng: bool = False
    n_rng: int = 0  # random ops in the graph: the generator offsets one call takes
    #: output slots: ("tensor", torch.device, dtype) for an array the function returns, ("const", value) else
    outputs: list = field(default_factory=list)
    #: (placeholder index, position in the returned arrays) for every input the graph mutates (``copy_``)
    mutations: list = field(default_factory=list)
    #: the process group the graph's collectives run over (:class:`.spmd.Group`), ``None`` without collectives
    group: spmd.Group | None = None
    collectives: list = field(default_factory=list)  # names of the collective ops inside, in graph order
    scalar_outputs: tuple = ()  # with a group: which returned arrays are 0-d (see .spmd.as_local)


def _val(node):
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else node


def _fresh(meta):
    """A zero array shaped like ``meta`` (``empty`` in a graph: its values are always overwritten)."""
    return jnp.zeros(tuple(meta.shape), dtypes.to_jax(meta.dtype))


def _view(op, x, args, kwargs):
    shadow = torch.empty(tuple(x.shape), device="meta")
    out = op(shadow, *args, **kwargs)
    outs = out if isinstance(out, (list, tuple)) else (out,)
    base = tuple(x.shape)
    arrays = [views.read(x, base, views.canonical(base, tuple(o.size()), tuple(o.stride()), o.storage_offset()))
              for o in outs]
    return arrays if isinstance(out, (list, tuple)) else arrays[0]


def _footprint(t: torch.Tensor) -> np.ndarray:
    """The storage index of every element of ``t`` (by its size, stride and storage offset)."""
    idx = np.full(tuple(t.shape), t.storage_offset(), dtype=np.int64)
    for d, (n, s) in enumerate(zip(t.shape, t.stride())):
        idx = idx + (np.arange(n, dtype=np.int64) * s).reshape((n,) + (1,) * (t.dim() - d - 1))
    return idx


def _as_strided(x, meta_in: torch.Tensor, meta_out: torch.Tensor):
    """``as_strided`` of a graph value whose fake geometry is not row-major from offset 0: ``x`` holds the values
    in logical order, so place them at their storage indices and read the output's indices from there, as CPU
    reads its storage. An output reaching storage the input does not cover has no value here."""
    src, dst = _footprint(meta_in), _footprint(meta_out)
    if dst.size and not np.isin(dst, src).all():
        raise NotLowerable("aten::as_strided reaches storage outside its input inside a compiled graph")
    if not dst.size:
        return jnp.zeros(tuple(meta_out.shape), x.dtype)
    flat = jnp.zeros((int(max(src.max(), dst.max())) + 1,), x.dtype).at[src.reshape(-1)].set(x.reshape(-1))
    return flat[dst]


def _plain(t) -> bool:
    return (isinstance(t, torch.Tensor) and t.storage_offset() == 0
            and t.stride() == views.contiguous_strides(tuple(t.shape)))


def _check_stays_on_tpu(kwargs) -> None:
    """A ``_to_copy`` to another device (``.cpu()`` in a compiled function) leaves the program: the graph runs op
    by op instead (its caller's fallback)."""
    device = kwargs.get("device")
    if device is not None and torch.device(device).type != "tpu":
        raise NotLowerable(f"aten::_to_copy to {device} inside a compiled graph")


def _to_copy(x, meta, kwargs):
    _check_stays_on_tpu(kwargs)
    return convert(x, dtypes.to_jax(meta.dtype))


def _copy(dst_meta, src):
    return convert(jnp.broadcast_to(src, tuple(dst_meta.shape)), dtypes.to_jax(dst_meta.dtype))


class _Tracer:
    """Evaluates the graph on traced JAX values (one instance per trace)."""

    def __init__(self, gm: torch.fx.GraphModule, plan: GraphPlan):
        self.gm = gm
        self.plan = plan
        self.placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        self.index_of = {n: i for i, n in enumerate(self.placeholders)}
        self.foreach: dict = {}  # _foreach_* op -> the per-tensor op of the op table it maps to

    def run(self, arrays, seed_offset):
        env = {}
        n_random = 0
        mutated: dict[int, object] = {}
        for node in self.gm.graph.nodes:
            if node.op == "placeholder":
                env[node] = arrays[self.index_of[node]]
            elif node.op == "get_attr":
                value = getattr(self.gm, node.target)
                env[node] = jnp.asarray(dtypes.host_array(value.detach().cpu())) if isinstance(value, torch.Tensor) else value
            elif node.op == "call_function":
                args = torch.fx.node.map_arg(node.args, lambda n: env[n])
                kwargs = torch.fx.node.map_arg(node.kwargs, lambda n: env[n])
                key = None
                if seed_offset is not None and _is_random(node.target):
                    # eager's key for the same op: (seed, offset), one offset per random op
                    key = DrawKey(seed_offset[0], seed_offset[1] + n_random)
                    n_random += 1
                env[node] = self.call(node, args, kwargs, key)
                if node.target is aten.copy_.default and node.args[0] in self.index_of:
                    mutated[self.index_of[node.args[0]]] = env[node]
            elif node.op == "output":
                outs = node.args[0]
                flat = []
                for o in (outs if isinstance(outs, (list, tuple)) else (outs,)):
                    if isinstance(o, torch.fx.Node) and isinstance(_val(o), torch.Tensor):
                        flat.append(env[o])
                for value in mutated.values():
                    flat.append(value)
                return tuple(flat)
            else:
                raise NotLowerable(f"FX node kind {node.op!r} ({node.target})")
        raise NotLowerable("graph without an output node")

    def call(self, node, args, kwargs, key):
        op = node.target
        if op is operator.getitem:
            return args[0][args[1]]
        meta = _val(node)
        if op in spmd.OPS:
            return encode.cast(op, spmd.lower(op, args, self.plan.group), meta)
        low = LOWERINGS.get(op)
        if low is not None:
            if not low.jit_for(*torch.fx.node.map_arg((node.args, node.kwargs), _val)):
                raise NotLowerable(f"{op_name(op)} has a data-dependent output shape here")
            if low.rng:
                kwargs = dict(kwargs, key=key)
            return encode.cast(op, low.fn(*args, **kwargs), meta)
        if op is aten.as_strided.default and not _plain(_val(node.args[0])):
            return _as_strided(args[0], _val(node.args[0]), meta)
        if op in _VIEW_OPS:
            return _view(op, args[0], args[1:], kwargs)
        if op in self.foreach:
            per_tensor = self.foreach[op]
            low = LOWERINGS[per_tensor]
            outs = foreach.apply(per_tensor, args, kwargs, len(meta), lambda op, a, k: low.fn(*a, **k))
            return [encode.cast(per_tensor, o, m) for o, m in zip(outs, meta)]
        if op is aten._to_copy.default:
            return _to_copy(args[0], meta, kwargs)
        if op is _CONVERT:  # Dynamo's rewrite of a captured .item() into tensor ops casts with this prim
            return convert(args[0], dtypes.to_jax(meta.dtype))
        if op in (aten.copy.default, aten.copy_.default):
            return _copy(meta, args[1])
        if op in (aten.empty.memory_format, aten.empty_strided.default, aten.new_empty.default,
                  aten.new_empty_strided.default, aten.empty_like.default):
            return _fresh(meta)
        name = op_name(op) if isinstance(op, torch._ops.OpOverload) else getattr(op, "__name__", str(op))
        raise NotLowerable(f"{name} has no lowering for the tpu device")


def _is_random(op) -> bool:
    low = LOWERINGS.get(op)
    return low is not None and low.rng


def trace(gm: torch.fx.GraphModule) -> tuple[callable, GraphPlan]:
    """The graph's traceable JAX function ``fn(*arrays[, seed, first offset]) -> tuple of arrays`` and its plan.

    Checks every node up front (raising :class:`NotLowerable` before anything is jitted)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    plan = GraphPlan(n_inputs=len(placeholders))
    index_of = {n: i for i, n in enumerate(placeholders)}
    foreach: dict = {}
    n_returned = 0
    for node in gm.graph.nodes:
        if isinstance(_val(node), torch.SymInt) or (
                isinstance(_val(node), torch.Tensor) and any(isinstance(d, torch.SymInt) for d in _val(node).shape)):
            raise NotLowerable("symbolic sizes in the graph (.specialize binds them per call before lowering)")
        if node.op == "call_function":
            op = node.target
            if op is operator.getitem:
                continue
            if not isinstance(op, torch._ops.OpOverload):
                raise NotLowerable(f"{getattr(op, '__name__', op)} (not an ATen op) in a compiled graph")
            if op._schema.name.startswith("aten::_foreach_") and op not in LOWERINGS:
                foreach[op] = _foreach_target(node)
            elif op in spmd.OPS:
                if op is not spmd.WAIT:
                    plan.collectives.append(op_name(op))
            elif op not in LOWERINGS and op not in _VIEW_OPS and op not in _OTHER_OPS:
                raise NotLowerable(f"{op_name(op)} has no lowering for the tpu device")
            if op is torch.ops.aten._to_copy.default:
                _check_stays_on_tpu(node.kwargs)
            if _is_random(op):
                plan.uses_rng = True
                plan.n_rng += 1
            plan.n_ops += 1
            plan.ops.append(op_name(op))
        elif node.op == "output":
            outs = node.args[0]
            for o in (outs if isinstance(outs, (list, tuple)) else (outs,)):
                v = _val(o)
                if isinstance(o, torch.fx.Node) and isinstance(v, torch.Tensor):
                    plan.outputs.append(("tensor", v.device, v.dtype))
                    n_returned += 1
                elif isinstance(o, torch.fx.Node):
                    raise NotLowerable(f"a non-tensor value ({o.name}) returned from the graph")
                else:
                    plan.outputs.append(("const", o))
    mutated = [index_of[n.args[0]] for n in gm.graph.nodes
               if n.op == "call_function" and n.target is aten.copy_.default and n.args[0] in index_of]
    plan.mutations = [(i, n_returned + k) for k, i in enumerate(dict.fromkeys(mutated))]
    plan.group = spmd.group_of(gm.graph.nodes)
    tracer = _Tracer(gm, plan)
    tracer.foreach = foreach

    if plan.uses_rng:
        def fn(*arrays):
            return tracer.run(arrays[:-2], arrays[-2:])
    else:
        def fn(*arrays):
            return tracer.run(arrays, None)

    if plan.group is not None:
        fn = spmd.program(fn, plan.group, _scalar_inputs(placeholders, plan))
        plan.scalar_outputs = _scalar_outputs(gm, placeholders, plan)
    return fn, plan


def _scalar_inputs(placeholders, plan: GraphPlan) -> tuple:
    """Which inputs of the function are 0-d (a program over a mesh lays its inputs out along dim 0, so those are
    passed as shape ``(1,)``); the RNG seed and counter, when there are, come last."""
    flags = []
    for n in placeholders:
        v = _val(n)
        if not isinstance(v, torch.Tensor):
            raise NotLowerable(f"a non-tensor graph input ({n.name}) in a graph with collectives")
        flags.append(v.dim() == 0)
    return tuple(flags) + ((True, True) if plan.uses_rng else ())


def _scalar_outputs(gm: torch.fx.GraphModule, placeholders, plan: GraphPlan) -> tuple:
    """Which of the function's returned arrays are 0-d (outputs, then mutated inputs), for :func:`.spmd.as_local`."""
    out = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    outs = [_val(o) for o in (out if isinstance(out, (list, tuple)) else (out,))
            if isinstance(o, torch.fx.Node) and isinstance(_val(o), torch.Tensor)]
    outs += [_val(placeholders[i]) for i, _ in plan.mutations]
    return tuple(v.dim() == 0 for v in outs)


def _foreach_target(node):
    """The op-table op that computes one element of a ``_foreach_*`` node (``_foreach_add.List`` ->
    ``aten.add.Tensor``): the one PyTorch's own slow foreach path would call (:func:`.foreach.per_tensor`)."""
    op = node.target
    out = _val(node)
    if isinstance(out, (list, tuple)) and out:
        args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda a: foreach.as_meta(_val(a)))
        target = foreach.per_tensor(op, args, kwargs, len(out), tuple(out[0].shape))
        if target is not None:
            return target
    raise NotLowerable(f"{op_name(op)} has no lowering for the tpu device")


_CONVERT = torch.ops.prims.convert_element_type.default
_OTHER_OPS = frozenset({
    _CONVERT, aten._to_copy.default, aten.copy.default, aten.copy_.default, aten.empty.memory_format,
    aten.empty_strided.default, aten.new_empty.default, aten.new_empty_strided.default, aten.empty_like.default,
})
