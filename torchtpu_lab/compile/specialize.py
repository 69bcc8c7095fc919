"""Dynamic-shape graphs specialized per concrete shape at call time, so each shape is still one XLA program.

With ``dynamic=None`` (PyTorch's default) Dynamo compiles a frame again after a shape changes, this time with
symbolic sizes: the ATen graph's sizes are ``SymInt`` s (``s77``), some inputs are those sizes, and a few nodes
compute sizes (``sym_size``, ``operator.mul`` on sizes). XLA programs have static shapes, so such a graph is
lowered per concrete shape: at each call the symbols are bound from the inputs (a ``SymInt`` input's value; a
tensor input's size where its meta size is a bare symbol), and a static copy of the graph is made for those
values — every size-valued node and ``SymInt`` input replaced by its value (read off its symbolic expression, so
the copy is the graph evaluated at that point, as Dynamo's guards admit it), every tensor's metadata given its
concrete shape. That copy is an ordinary static graph: it is lowered, cached and compiled like any other
(:mod:`.backend`), one executable per shape.

What cannot be bound (a size from data: ``.item()``, ``nonzero``; a symbol no input carries; a failed
``_assert_scalar``) raises :class:`NotLowerable` for that shape, which then runs eagerly and says why.
"""

from __future__ import annotations

import operator

import sympy
import torch
import torch.fx

from .errors import NotLowerable

_SYMBOLIC = (torch.SymInt, torch.SymFloat, torch.SymBool)
_SCALARS = (int, float, bool) + _SYMBOLIC


def _symbolic(v) -> bool:
    """Whether a node's value has a symbolic size or is itself symbolic."""
    if isinstance(v, _SYMBOLIC):
        return True
    if isinstance(v, torch.Tensor):
        return any(isinstance(d, torch.SymInt) for d in v.shape)
    if isinstance(v, (list, tuple)):
        return any(_symbolic(x) for x in v)
    return False


def is_dynamic(gm: torch.fx.GraphModule) -> bool:
    """Whether Dynamo handed us a graph with symbolic sizes."""
    return any(_symbolic(n.meta.get("val")) for n in gm.graph.nodes)


class Binder:
    """Reads the values of a dynamic graph's symbols off the inputs of each call."""

    def __init__(self, gm: torch.fx.GraphModule):
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        #: (input position, dim or None for a SymInt input, the symbol it carries)
        self.sources: list = []
        for i, n in enumerate(placeholders):
            v = n.meta.get("val")
            if isinstance(v, torch.SymInt) and v.node.expr.is_Symbol:
                self.sources.append((i, None, v.node.expr))
            elif isinstance(v, torch.Tensor):
                self.sources += [(i, d, s.node.expr) for d, s in enumerate(v.shape)
                                 if isinstance(s, torch.SymInt) and s.node.expr.is_Symbol]
        if not self.sources:
            raise NotLowerable("a dynamic-shape graph whose sizes no input carries")

    def key(self, args: list) -> tuple:
        """The concrete value of each symbol source in this call (the cache key of its specialization)."""
        return tuple(int(args[i]) if d is None else int(args[i].shape[d]) for i, d, _ in self.sources)

    def bindings(self, key: tuple) -> dict:
        bound: dict = {}
        for (_, _, symbol), value in zip(self.sources, key):
            if bound.setdefault(symbol, value) != value:
                raise NotLowerable(f"size {symbol} is {bound[symbol]} in one input and {value} in another")
        return bound


def _value(v, bound: dict):
    """A symbolic scalar's value at ``bound`` (a concrete Python value is itself)."""
    if not isinstance(v, _SYMBOLIC):
        return v
    expr = sympy.sympify(v.node.expr.xreplace(bound))  # a bare symbol is replaced by a Python int
    if expr.free_symbols:
        raise NotLowerable(f"a size that depends on data or on no input ({v.node.expr}) in a dynamic-shape graph")
    return bool(expr) if isinstance(v, torch.SymBool) else float(expr) if isinstance(v, torch.SymFloat) else int(expr)


def _concrete(v, bound: dict, mode):
    """Node metadata at the bound sizes: tensors as fake tensors of their concrete shape (same dtype and
    device; the lowering reads nothing else), containers item by item."""
    if isinstance(v, torch.Tensor):
        with mode:
            return torch.empty(tuple(_value(d, bound) for d in v.shape), dtype=v.dtype, device=v.device)
    if isinstance(v, (list, tuple)):
        return type(v)(_concrete(x, bound, mode) for x in v)
    return _value(v, bound)


def _is_size_node(node) -> bool:
    """A node that computes a scalar (a size, a size expression, a comparison of sizes)."""
    return node.op in ("placeholder", "call_function") and node.target is not operator.getitem and \
        isinstance(node.meta.get("val"), _SCALARS)


def specialize(gm: torch.fx.GraphModule, bound: dict) -> tuple[torch.fx.GraphModule, list]:
    """A static copy of ``gm`` at the sizes ``bound``, and the positions of the inputs it still takes (its scalar
    inputs are constants in it). :class:`NotLowerable` when a size cannot be evaluated."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    graph = torch.fx.Graph()
    copies: dict = {}
    outputs = graph.graph_copy(gm.graph, copies)  # every node but the output, whose value this is
    constants: dict = {}
    keep, position = [], 0
    for old, new in copies.items():
        v = old.meta.get("val")
        if new.op == "placeholder":
            position += 1
            if not _is_size_node(old):
                keep.append(position - 1)
        if _is_size_node(old):
            constants[new] = _value(v, bound)
            continue
        if new.op == "call_function" and new.target is torch.ops.aten._assert_scalar.default:
            if not _value(old.args[0].meta.get("val"), bound):
                raise NotLowerable(f"a runtime assertion of the graph fails at these sizes: {old.args[1]}")
            constants[new] = None
            continue
        new.args = torch.fx.node.map_arg(new.args, lambda a: constants.get(a, a))
        new.kwargs = torch.fx.node.map_arg(new.kwargs, lambda a: constants.get(a, a))
        if "val" in new.meta:
            new.meta = dict(new.meta, val=_concrete(v, bound, mode))
    graph.output(torch.fx.node.map_arg(outputs, lambda a: constants.get(a, a)))
    for node in reversed(list(constants)):
        graph.erase_node(node)
    return torch.fx.GraphModule(gm, graph), keep


def describe(bound: dict) -> str:
    """``s77=5, s12=3``: the sizes a specialization was made for (the compile event says them)."""
    return ", ".join(f"{s}={v}" for s, v in sorted(bound.items(), key=lambda kv: str(kv[0])))
