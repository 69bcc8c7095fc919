"""``_foreach_*`` ops element by element: which per-tensor op computes one element, and with which arguments.

Why. PyTorch's own foreach fallback (what a backend without foreach kernels runs) calls one per-tensor op per
element of the lists. Compiled graphs (:mod:`torchtpu_lab.compile.lowering`) and fused eager
(:mod:`torchtpu_lab.runtime.foreach_kernels`) lower a foreach call to that same op applied to every element, in
one program, so both give what the per-element calls give; this module is what they share.
"""

from __future__ import annotations

import torch

from .registry import LOWERINGS, Lowering

aten = torch.ops.aten

#: the per-tensor overloads tried first, in order, after the foreach op's own overload name
_PREFERRED = ("Tensor", "default", "Scalar", "Tensor_Scalar", "List")
#: per-tensor ops of another name, tried after the foreach op's own: PyTorch's fallback of ``_foreach_maximum``
#: with a number is ``clamp_min``, of ``_foreach_minimum`` ``clamp_max`` (``maximum`` takes two tensors only)
_ALSO = {"maximum": "clamp_min", "minimum": "clamp_max"}


def element(args, i: int, n: int):
    """The ``i``-th per-tensor call's arguments of a ``_foreach_*`` call over ``n`` tensors: every list of
    length ``n`` (tensors, or a scalar per tensor) contributes its ``i``-th item, anything else is shared."""
    if isinstance(args, dict):
        return {k: (v[i] if isinstance(v, (list, tuple)) and len(v) == n else v) for k, v in args.items()}
    return [a[i] if isinstance(a, (list, tuple)) and len(a) == n else a for a in args]


def bind(op: torch._ops.OpOverload, args: list, kwargs: dict) -> tuple[list, dict] | None:
    """Positional arguments past ``op``'s positional parameters passed by the names of its keyword-only ones
    (``_foreach_addcmul.Scalar(self, t1, t2, value)`` -> ``addcmul(self, t1, t2, value=value)``); ``None`` where
    there are more of them than it has keyword-only parameters (they would be dropped)."""
    params = op._schema.arguments
    n_positional = sum(1 for p in params if not p.kwarg_only)
    if len(args) <= n_positional:
        return list(args), dict(kwargs)
    names = [p.name for p in params if p.kwarg_only]
    if len(args) - n_positional > len(names):
        return None
    extra = dict(zip(names, args[n_positional:]))
    return list(args[:n_positional]), {**extra, **kwargs}


def as_meta(v):
    """``v`` with every tensor in it a meta tensor of the same shape and dtype."""
    if isinstance(v, torch.Tensor):
        return torch.empty(tuple(v.shape), dtype=v.dtype, device="meta")
    if isinstance(v, (list, tuple)):
        return type(v)(as_meta(x) for x in v)
    return v


def per_tensor(op: torch._ops.OpOverload, args, kwargs: dict, n: int, shape: tuple, lowered: bool = True,
               pointwise: bool = False) -> torch._ops.OpOverload | None:
    """The op that computes one element of ``op`` (a ``_foreach_*`` op, ``_foreach_add.List`` ->
    ``aten.add.Tensor``) on these arguments (``args``/``kwargs``: meta tensors and values, ``n`` elements, the
    first output of ``shape``), chosen by running the candidates' meta kernels on the first element, so it is the
    one PyTorch's own per-element path would call; ``None`` when none fits. ``lowered``: only ops of the op table;
    ``pointwise``: only elementwise ones."""
    base = op._schema.name.split("::")[1][len("_foreach_"):].rstrip("_")
    if n == 0:
        return None
    a, k = element(args, 0, n), element(kwargs, 0, n)
    for packet in (getattr(aten, base, None), getattr(aten, _ALSO.get(base, ""), None)):
        if packet is None:
            continue
        overloads = packet.overloads()
        for name in dict.fromkeys((op._overloadname, *_PREFERRED, *overloads)):
            if name not in overloads:
                continue
            candidate = getattr(packet, name)
            if (lowered and candidate not in LOWERINGS) or candidate._schema.is_mutable:
                continue
            if pointwise and torch.Tag.pointwise not in candidate.tags:
                continue
            if _fits(candidate, a, k, shape):
                return candidate
    return None


def _fits(candidate: torch._ops.OpOverload, args: list, kwargs: dict, shape: tuple) -> bool:
    """Whether ``candidate`` takes one element's arguments (meta) and gives an output of ``shape``."""
    bound = bind(candidate, args, kwargs)
    if bound is None:
        return False
    try:
        got = candidate(*bound[0], **bound[1])
    except Exception:  # noqa: BLE001 — this overload does not take these arguments
        return False
    return isinstance(got, torch.Tensor) and tuple(got.shape) == tuple(shape)


def apply(per_tensor_op: torch._ops.OpOverload, args, kwargs: dict, n: int, each) -> list:
    """``[each(per_tensor_op, args_i, kwargs_i) for every element i]``: the per-tensor calls of a foreach call."""
    out = []
    for i in range(n):
        bound = bind(per_tensor_op, element(args, i, n), element(kwargs, i, n))
        out.append(each(per_tensor_op, *bound))
    return out


def lowering(op: torch._ops.OpOverload, per_tensor_op: torch._ops.OpOverload) -> Lowering:
    """The lowering of foreach op ``op`` through ``per_tensor_op``'s: every element's call, one list of outputs
    (the executor casts each to PyTorch's dtype for it)."""
    low = LOWERINGS[per_tensor_op]

    def fn(*args, **kwargs):
        n = len(args[0])
        return apply(per_tensor_op, args, kwargs, n, lambda _, a, k: low.fn(*a, **k))

    fn.__name__ = f"foreach_{low.fn.__name__}"
    return Lowering(op, fn, static_scalars=low.static_scalars, rng=low.rng, jit=low.jit)
