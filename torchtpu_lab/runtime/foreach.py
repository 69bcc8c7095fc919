"""``_foreach_*`` ops (used by optimizers and ``clip_grad_norm_`` on every device PyTorch deems foreach-capable,
which includes PrivateUse1) derived from their per-tensor ops.

``_foreach_add.List(self: Tensor[], other: Tensor[], alpha)`` becomes one ``add.Tensor`` per pair; the matching
per-tensor overload is found by schema: list types map to their element types, in order. In-place variants
(``_foreach_add_``) assign each result back into its tensor.
"""

from __future__ import annotations

import torch

from . import mutation

aten = torch.ops.aten


def _element_type(t) -> str:
    s = str(t)
    for lst, elem in (("Tensor[]", "Tensor"), ("Scalar[]", "Scalar"), ("Tensor?[]", "Tensor?")):
        if s == lst:
            return elem
    return s


def _param_types(schema, drop_out: bool = True):
    return [
        _element_type(a.type) for a in schema.arguments
        if not (drop_out and a.kwarg_only and a.alias_info is not None and a.alias_info.is_write)
    ]


def _match_element_op(foreach_op, kernels: dict):
    """The per-tensor overload ``foreach_op`` applies elementwise, if we have a kernel for it."""
    name = foreach_op._schema.name.split("::")[-1][len("_foreach_"):]
    base = name[:-1] if name.endswith("_") else name
    packet = getattr(aten, base, None)
    if packet is None:
        return None
    want = _param_types(foreach_op._schema)
    for overload in packet.overloads():
        cand = getattr(packet, overload)
        if cand._schema.is_mutable or cand not in kernels:
            continue
        if [str(a.type) for a in cand._schema.arguments] == want:
            return cand
    return None


def _is_list(schema_arg) -> bool:
    return str(schema_arg.type).endswith("[]")


def make_foreach_kernel(foreach_op, element_op, element_kernel):
    f_args = foreach_op._schema.arguments
    e_args = element_op._schema.arguments
    inplace = foreach_op._schema.name.endswith("_")

    def kernel(*args, **kwargs):
        values = list(args) + [kwargs.get(a.name, a.default_value) for a in f_args[len(args):]]
        n = len(next(v for v, a in zip(values, f_args) if _is_list(a)))
        results = []
        for i in range(n):
            pos, kw = [], {}
            for v, fa, ea in zip(values, f_args, e_args):
                item = v[i] if _is_list(fa) and v is not None else v
                if ea.kwarg_only:
                    kw[ea.name] = item
                else:
                    pos.append(item)
            results.append(element_kernel(*pos, **kw))
        if inplace:
            for dst, r in zip(values[0], results):
                mutation.write_result(dst, r, inplace=True)
            return None
        return results

    kernel.__name__ = f"foreach_{foreach_op}"
    return kernel


def derive(kernels: dict) -> dict:
    """Kernels for every ``_foreach_*`` overload whose per-tensor op has a kernel."""
    out = {}
    names = {n.split("::")[-1].split(".")[0] for n in torch._C._dispatch_get_all_op_names()
             if n.startswith("aten::_foreach_")}
    for name in sorted(names):
        packet = getattr(aten, name, None)
        if packet is None:
            continue
        for overload in packet.overloads():
            op = getattr(packet, overload)
            if op in kernels or mutation.out_names(op._schema):
                continue
            elem = _match_element_op(op, kernels)
            if elem is not None:
                out[op] = make_foreach_kernel(op, elem, kernels[elem])
    return out
