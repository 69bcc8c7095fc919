"""The keys of every executable cache, as named structures (the compile-cause analysis reads them by name).

An :class:`OpSignature` identifies one compiled op: the op, an argument *template* (tensors replaced by
:class:`Slot` s naming dtype, shape and view geometry; configuration kept as :class:`Static` values; dynamic
scalars as slots) and the matmul precision and default dtype in force. A :class:`GraphSignature` identifies
one fused graph: its nodes (op signatures plus their wiring), its leaf inputs' shapes and dtypes, the outputs
it must produce, and which inputs it donates. Values never appear in a signature, so a step that repeats compiles once.
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
    #: torch.get_default_dtype() when it was traced: what a factory without a dtype, or an integer division,
    #: produces (PyTorch's meta kernels and our lowerings read it), so a change makes another program
    default_dtype: Any = None


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


# ---- a canonical, process-independent encoding (the persistent cache's keys) ---------------------------------


#: Ops whose program is user Python that may differ in another process under the same name (made by
#: ``torchtpu_lab.jax_op``: the notebook cell defining the kernel is edited and re-run, or another script names
#: its op alike). Their name says nothing about their program, so a signature holding one is never keyed on
#: disk; the in-memory caches key them by the op object, which a redefinition replaces.
USER_DEFINED_OPS: set = set()


class Unencodable(TypeError):
    """A signature holds a value with no stable encoding (an object identified only by its address): such a
    signature is cached in memory only, never on disk."""


#: id(OpSignature) -> (the signature, its encoding): a graph's key encodes every node's op signature, and a
#: step's graph repeats the same few signature objects hundreds of times. Keyed by identity (with the object held,
#: so an id is never reused while its entry lives), not equality: 0.0 == -0.0 but their encodings differ.
_OP_TEXT: dict = {}
_OP_TEXT_MAX = 16384


def _encode(v, out: list) -> None:
    # Order matters: bool before int (True == 1), named tuples before tuples (their class is part of the key).
    if type(v) is OpSignature:
        hit = _OP_TEXT.get(id(v))
        if hit is None or hit[0] is not v:
            part: list = []
            _encode_fields(v, part)
            if len(_OP_TEXT) >= _OP_TEXT_MAX:
                _OP_TEXT.clear()
            hit = _OP_TEXT[id(v)] = (v, "".join(part))
        out.append(hit[1])
    elif v is None:
        out.append("N")
    elif isinstance(v, bool):
        out.append("b1" if v else "b0")
    elif isinstance(v, int):
        out.append(f"i{v};")
    elif isinstance(v, float):
        out.append(f"f{v.hex()};")
    elif isinstance(v, complex):
        out.append(f"c{v.real.hex()},{v.imag.hex()};")
    elif isinstance(v, str):
        out.append(f"s{len(v)}:{v}")
    elif isinstance(v, tuple) and hasattr(type(v), "_fields"):
        _encode_fields(v, out)
    elif isinstance(v, (tuple, list)):
        out.append("(" if isinstance(v, tuple) else "[")
        for x in v:
            _encode(x, out)
        out.append(")" if isinstance(v, tuple) else "]")
    elif isinstance(v, type):
        out.append(f"Y{_type_name(v)};")
    else:
        out.append(_encode_other(v))


def _encode_fields(v: tuple, out: list) -> None:
    """A named tuple: its class, then its fields."""
    out.append(f"T{_type_name(type(v))}(")
    for x in v:
        _encode(x, out)
    out.append(")")


def _type_name(t: type) -> str:
    name = f"{t.__module__}.{t.__qualname__}"
    if "<" in name:  # a class defined inside a function: not the same class in another process
        raise Unencodable(name)
    return name


def _encode_other(v) -> str:
    import enum

    import numpy as np
    import torch

    if isinstance(v, torch._ops.OpOverload):
        if v in USER_DEFINED_OPS:
            raise Unencodable(f"{v} is defined by user code (jax_op): its name does not identify its program")
        return f"O{v._schema.name}.{v._overloadname};"
    if isinstance(v, (torch.dtype, torch.device, torch.layout, torch.memory_format)):
        return f"P{type(v).__name__}:{v};"
    if isinstance(v, np.dtype):
        return f"D{v.str}{v.name};"
    if isinstance(v, enum.Enum):
        return f"E{_type_name(type(v))}.{v.name};"
    if isinstance(v, (bytes, bytearray)):
        return f"B{bytes(v).hex()};"
    if isinstance(v, (frozenset, set)):
        parts = sorted(encode(x) for x in v)
        return "{" + "".join(f"{len(p)}:{p}" for p in parts) + "}"
    if isinstance(v, dict):
        parts = sorted(f"{encode(k)}={encode(x)}" for k, x in v.items())
        return "<" + "".join(f"{len(p)}:{p}" for p in parts) + ">"
    if isinstance(v, np.generic):
        return "G" + encode(v.dtype) + encode(v.item())
    raise Unencodable(f"no stable encoding for a {type(v).__module__}.{type(v).__qualname__}")


def encode(value) -> str:
    """A canonical text for ``value`` (a signature or any part of one) that is the same in every process and
    on every machine: ops by their ATen name, dtypes and devices by name, named tuples with their class, floats
    bit-exact. Raises :class:`Unencodable` for values identified only by their address (a function, an
    arbitrary object), so two different programs can never share a key."""
    out: list = []
    _encode(value, out)
    return "".join(out)


def digest(*parts) -> str | None:
    """SHA-256 (hex) of the canonical encoding of ``parts``, or ``None`` when one of them cannot be encoded."""
    import hashlib

    try:
        text = encode(parts)
    except Unencodable:
        return None
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
