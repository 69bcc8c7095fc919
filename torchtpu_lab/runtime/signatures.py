"""The keys of every executable cache, as named structures (the compile-cause analysis reads them by name).

An :class:`OpSignature` identifies one compiled op: the op, an argument *template* (tensors replaced by
:class:`Slot` s naming dtype, shape and view geometry; configuration kept as :class:`Static` values; dynamic
scalars as slots) and the matmul precision in force. A :class:`GraphSignature` identifies one fused graph: its
nodes (op signatures plus their wiring), its leaf inputs' shapes and dtypes, the outputs it must produce, and
which inputs it donates. Values never appear in a signature, so a step that repeats compiles once.
"""

from __future__ import annotations

from typing import Any, NamedTuple


class Slot(NamedTuple):
    """A dynamic input in an argument template."""

    kind: str  # "T": tpu tensor, "H": host (CPU) tensor, "S": dynamic Python scalar
    index: int  # position among the call's dynamic inputs
    dtype: Any
    shape: tuple
    base_shape: tuple  # shape of the storage a tpu tensor views
    view: Any  # device.views.View, or None for a whole base tensor


class Static(NamedTuple):
    """A Python value baked into the executable (a dim, a flag, a size); its type is kept so 1 != True."""

    type: type
    value: Any


class OpSignature(NamedTuple):
    op: Any  # torch OpOverload, or a str naming an internal program ("assign", "read")
    args: tuple
    kwargs: tuple  # ((name, template), ...)
    precision: str = "highest"  # torch.get_float32_matmul_precision() when it was traced


class NodeSignature(NamedTuple):
    """One node of a fused graph: what it computes and where its inputs come from: ``(node, output)`` for an
    earlier node's output, ``(-1, leaf)`` for a graph input."""

    op: OpSignature
    inputs: tuple


class GraphSignature(NamedTuple):
    nodes: tuple  # NodeSignature per node, in recording order
    leaves: tuple  # ("a", shape, dtype) for array inputs, ("s", type) for scalar inputs
    targets: tuple  # (node, output) of each value the sync must produce
    donate: tuple = ()  # leaf positions whose buffers nothing else holds: XLA may reuse them for outputs


def op_label(op) -> str:
    """``aten::add.Tensor``-style name of an op in a signature."""
    if isinstance(op, str):
        return op
    from ..ops.registry import op_name

    try:
        return op_name(op)
    except AttributeError:
        return str(op)
