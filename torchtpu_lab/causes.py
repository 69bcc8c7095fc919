"""Why something compiled, as a record: a :class:`Cause` holds the facts (what kind of change, which op and
input, the old and new value, the user line), and renders itself as the sentence a user reads.

The runtime, ``torch.compile`` and the Dynamo hooks build causes; telemetry carries them on compile events;
the profile groups them and suggests fixes by reading their fields, never by parsing the sentence back. The
sentence is only for people (``str(cause)``) and for the JSON export, next to the fields (:meth:`Cause.to_dict`).

Examples of the text: "first time this graph was seen", "op 3: input 0 of aten.mm changed shape [8, 128] ->
[7, 128] (recorded at cell [4], line 2)", "op sequence differs at op 57: aten.mul vs aten.add", "a Python
scalar that changes every step was baked in as a constant (aten.leaky_relu input 1: 0.1 -> 0.2)".
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from typing import Any

from .telemetry import Source, describe


class CauseKind(enum.Enum):
    """What changed. ``first``: nothing was compiled for this before (a first sighting, not a recompile)."""

    FIRST_OP = ("first_op", True)  # strict/debug: a new op signature
    FIRST_GRAPH = ("first_graph", True)  # fused: the first graph at all
    FIRST_FUNCTION = ("first_function", True)  # Dynamo: a frame compiled for the first time
    FIRST_COMPILED = ("first_compiled", True)  # torch.compile: a lowered graph's first executable
    FIRST_EAGER = ("first_eager", True)  # torch.compile: a graph that cannot be lowered runs op by op
    SEQUENCE = ("sequence", False)  # the op at ``index`` is another op
    DATA_FLOW = ("data_flow", False)  # same ops, wired differently into op ``index``
    GROW = ("grow", False)  # the graph has more (or fewer) ops than the nearest one compiled
    TARGETS = ("targets", False)  # different tensors alive at the sync
    DONATION = ("donation", False)  # a different set of inputs referenced elsewhere
    GRAPH_INPUTS = ("graph_inputs", False)
    SIGNATURE = ("signature", False)  # op ``index``'s signature changed in a way not named below
    SHAPE = ("shape", False)
    DTYPE = ("dtype", False)
    BASE_SHAPE = ("base_shape", False)  # a view's storage changed shape
    VIEW = ("view", False)  # a different view (sizes/strides) of its storage
    INPUT_KIND = ("input_kind", False)
    SCALAR = ("scalar", False)  # a float baked into the program as a constant
    STATIC_SIZE = ("static_size", False)  # an int argument (a size or dim) changed
    STATIC = ("static", False)  # another static argument changed
    STRUCTURE = ("structure", False)  # the nesting of an op's arguments changed
    ARG_COUNT = ("arg_count", False)
    PRECISION = ("precision", False)  # torch.set_float32_matmul_precision changed
    DEFAULT_DTYPE = ("default_dtype", False)  # torch.set_default_dtype changed
    DEVICE = ("device", False)  # a torch.compile graph ran on another device
    DYNAMO_RECOMPILE = ("dynamo_recompile", False)  # Dynamo's guard failure, in ``detail``
    UNKNOWN = ("unknown", False)  # differs from every cached signature, in no way we name

    def __init__(self, key: str, first: bool) -> None:
        self.key = key
        self.first = first


#: what to do about a tensor that grows every step (appended to a shape cause when one dim grew by one, and to a
#: size argument that grew by one)
GROWTH_HINT = (
    "; a tensor that grows by one every step (a KV cache or a token list extended with torch.cat in a decode loop) "
    "is read here at its full length, so every step is a new graph: read a growing KV cache with "
    "F.scaled_dot_product_attention (transformers: attn_implementation=\"sdpa\"), which runs on its padded "
    "storage with the length as an input (one program per capacity), or preallocate it — transformers: "
    "generate(..., cache_implementation=\"static\") or a StaticCache — and write each step at a moving offset "
    "(buf[:, pos] = token), which compiles once for any number of steps"
)


def fmt_shape(shape) -> str:
    return "[" + ", ".join(str(int(n)) for n in shape) + "]"


def grew_by_one(old: tuple | int, new: tuple | int) -> bool:
    """Exactly one dimension of a shape grew by one, or a size argument did: the signature of a decode loop."""
    if isinstance(old, int) or isinstance(new, int):
        return isinstance(old, int) and isinstance(new, int) and new == old + 1
    if len(old) != len(new):
        return False
    changed = [(a, b) for a, b in zip(old, new) if a != b]
    return len(changed) == 1 and changed[0][1] == changed[0][0] + 1


@dataclass(frozen=True, slots=True)
class Cause:
    """Why a compile happened. Which fields are set depends on ``kind``:

    * ``op``: the op's label (``aten.mm``); for :attr:`CauseKind.SEQUENCE` ``old``/``new`` are op labels;
    * ``input``: which argument (``input 0``, ``input 1[2]``, ``input alpha``);
    * ``old``/``new``: the value before and now (shapes as int tuples, dtypes as text, numbers, op counts);
    * ``index``: the op's position in a fused graph (``None`` for a single op);
    * ``site``: the user line that recorded that op;
    * ``detail``: text that only comes from outside (Dynamo's guard failure, a torch.compile graph's name).
    """

    kind: CauseKind
    op: str | None = None
    input: str | None = None
    old: Any = None
    new: Any = None
    index: int | None = None
    site: Source | None = None
    detail: str = ""

    @property
    def first(self) -> bool:
        """Nothing was compiled for this before (every other cause is a recompile)."""
        return self.kind.first

    def at(self, index: int, site: Source | None) -> Cause:
        """This op-level cause, as op ``index`` of a fused graph recorded at ``site``."""
        return dataclasses.replace(self, index=index, site=site)

    def __str__(self) -> str:
        text = _TEXT[self.kind](self)
        if self.index is not None and self.kind not in _NAMES_INDEX:
            text = f"op {self.index}: {text}"
        if self.site is not None:
            text += f" (recorded at {describe(self.site)})"
        return text

    def to_dict(self) -> dict:
        """Plain JSON-able data: the fields, the user line and the sentence."""
        site = None if self.site is None else {"file": self.site.filename, "line": self.site.lineno,
                                               "function": self.site.function, "where": describe(self.site)}
        return {"kind": self.kind.key, "op": self.op, "input": self.input, "old": _plain(self.old),
                "new": _plain(self.new), "index": self.index, "site": site, "detail": self.detail,
                "first": self.first, "text": str(self)}


def _plain(value):
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value if isinstance(value, (str, int, float, bool, type(None))) else repr(value)


def _shape_change(c: Cause, what: str) -> str:
    hint = GROWTH_HINT if grew_by_one(c.old, c.new) else ""
    return f"{c.input} of {c.op} {what} {fmt_shape(c.old)} -> {fmt_shape(c.new)}{hint}"


def _static_size(c: Cause) -> str:
    """A size argument that grew by one (``torch.arange(n)`` of a decode loop's length, as transformers builds
    its mask each step) is the same growing tensor read at its length, with the same fix."""
    hint = GROWTH_HINT if grew_by_one(c.old, c.new) else ""
    return f"static size/dim argument {c.input} of {c.op} changed {c.old} -> {c.new}{hint}"


def _in(c: Cause) -> str:
    """``"; <detail>"`` (a torch.compile graph's name) for a cause that carries one, else nothing."""
    return f"; {c.detail}" if c.detail else ""


#: the kinds whose sentence names the op index itself (the others get an ``op N:`` prefix inside a graph)
_NAMES_INDEX = frozenset({CauseKind.SEQUENCE, CauseKind.DATA_FLOW, CauseKind.GROW})

_TEXT = {
    CauseKind.FIRST_OP: lambda c: "first time this op signature was seen",
    CauseKind.FIRST_GRAPH: lambda c: "first time this graph was seen",
    CauseKind.FIRST_FUNCTION: lambda c: "first time this function was compiled",
    CauseKind.FIRST_COMPILED: lambda c: f"first time this graph was compiled ({c.detail})",
    CauseKind.FIRST_EAGER: lambda c: f"first time this graph was seen; it runs op by op: {c.detail}",
    CauseKind.SEQUENCE: lambda c: (f"op sequence differs at op {c.index}: {c.old} vs {c.new}"
                                   if c.index is not None else f"{c.old} vs {c.new}"),
    CauseKind.DATA_FLOW: lambda c: f"same ops, different data flow into op {c.index} ({c.op})",
    CauseKind.GROW: lambda c: (f"graph has {c.new} ops where the nearest cached graph has {c.old} "
                               f"(identical for the first {c.index})"),
    CauseKind.TARGETS: lambda c: "same ops, but different tensors are still alive at the sync point",
    CauseKind.DONATION: lambda c: ("same graph, but a different set of inputs is still referenced elsewhere "
                                   "(donation differs)"),
    CauseKind.GRAPH_INPUTS: lambda c: "graph inputs changed shape or dtype",
    CauseKind.SIGNATURE: lambda c: f"{c.op} signature changed",
    CauseKind.SHAPE: lambda c: _shape_change(c, "changed shape"),
    CauseKind.DTYPE: lambda c: f"{c.input} of {c.op} changed dtype {c.old} -> {c.new}",
    CauseKind.BASE_SHAPE: lambda c: _shape_change(c, "views a storage that changed shape"),
    CauseKind.VIEW: lambda c: f"{c.input} of {c.op} is a different view of its storage (sizes/strides changed)",
    CauseKind.INPUT_KIND: lambda c: f"{c.input} of {c.op} changed kind",
    CauseKind.SCALAR: lambda c: (f"a Python scalar that changes every step was baked in as a constant "
                                 f"({c.op} {c.input}: {c.old!r} -> {c.new!r})"),
    CauseKind.STATIC_SIZE: _static_size,
    CauseKind.STATIC: lambda c: f"static argument {c.input} of {c.op} changed: {c.old} -> {c.new}",
    CauseKind.STRUCTURE: lambda c: f"the arguments of {c.op} changed structure",
    CauseKind.ARG_COUNT: lambda c: f"{c.op} was called with {c.new} arguments, previously {c.old}",
    CauseKind.PRECISION: lambda c: (f"float32 matmul precision changed {c.old!r} -> {c.new!r} "
                                    f"(torch.set_float32_matmul_precision{_in(c)})"),
    CauseKind.DEFAULT_DTYPE: lambda c: (f"the default dtype changed {c.old} -> {c.new} "
                                        f"(torch.set_default_dtype{_in(c)})"),
    CauseKind.DEVICE: lambda c: f"the graph ran on tpu:{c.new} ({c.detail})",
    CauseKind.DYNAMO_RECOMPILE: lambda c: f"Dynamo recompiled: {c.detail}",
    CauseKind.UNKNOWN: lambda c: "signature differs from every cached one",
}
