"""The ``fused=True`` optimizer steps (``aten::_fused_adam_``, ``_fused_adamw_``, ``_fused_sgd_``) inside a
compiled graph.

A whole training step traced with ``fullgraph=True`` (:mod:`.whole_step`) of ``Adam(fused=True)``,
``AdamW(fused=True)`` or ``SGD(fused=True)`` puts one of these ops into the Dynamo graph, with lists of
parameters, gradients and state that it updates in place. AOTAutograd cannot functionalize them: PyTorch's
generated functionalization kernel counts an empty tensor list (``max_exp_avg_sqs`` without ``amsgrad``,
``momentum_buffer_list`` without momentum) as "not functional" and fails ("mutating a non-functional tensor with
a functional tensor is not allowed"). So before AOTAutograd sees the graph, each such node calls the op's
torch-level kernel instead (:mod:`torchtpu_lab.ops.optimizer_kernels`, the one fused eager mode runs): plain
ATen ops and ``copy_`` into the updated tensors, which AOTAutograd functionalizes into the graph's input
mutations like any other optimizer's. The compiled step therefore computes exactly what the eager fused step
does, in the same order and precision.

Dynamo runs each node on fake tensors while it traces, which needs the op's Meta kernel; PyTorch has one for
``_fused_adam_``/``_fused_adamw_`` but not for ``_fused_sgd_`` nor for the ``tensor_lr`` overloads (a fake tpu
tensor then reached our eager kernel). :func:`install` registers a Meta kernel for each of these that has none:
it checks the lists' lengths, as the real kernels do, and changes nothing (the ops return nothing and update
tensors in place, whose metadata stays). Listed in :func:`torchtpu_lab.global_changes`.
"""

from __future__ import annotations

import torch

from ..ops import optimizer_kernels

aten = torch.ops.aten

#: each fused step's torch function and overloads (as Dynamo or a hand-made graph may name it) -> its kernel
_KERNELS = {
    target: kernel
    for packet, kernel in ((aten._fused_adam_, optimizer_kernels.fused_adam_),
                           (aten._fused_adamw_, optimizer_kernels.fused_adamw_),
                           (aten._fused_sgd_, optimizer_kernels.fused_sgd_))
    for target in (getattr(torch, packet.__name__), packet, packet.default, packet.tensor_lr)
}


def _fused_adam_(*args, **kwargs) -> None:
    optimizer_kernels.fused_adam_(*args, **kwargs)


def _fused_adamw_(*args, **kwargs) -> None:
    optimizer_kernels.fused_adamw_(*args, **kwargs)


def _fused_sgd_(*args, **kwargs) -> None:
    optimizer_kernels.fused_sgd_(*args, **kwargs)


#: module-level functions, so that the graph's generated code can name them
_CALLS = {optimizer_kernels.fused_adam_: _fused_adam_, optimizer_kernels.fused_adamw_: _fused_adamw_,
          optimizer_kernels.fused_sgd_: _fused_sgd_}


def _meta_step(params, grads, *lists, **_options) -> None:
    """Meta kernel of a fused step: the lists that hold one tensor per parameter must have one."""
    for n in (len(grads), *map(len, lists)):
        torch._check(n in (0, len(params)),
                     lambda n=n: f"fused optimizer step: {len(params)} parameters but a list of {n} tensors")


#: the Meta kernels registered here (the library must stay alive for them to stay registered)
_META = {"library": None, "ops": []}


def install() -> None:
    """Register :func:`_meta_step` as the Meta kernel of every fused step overload without one (idempotent)."""
    if _META["library"] is not None:
        return
    library = torch.library.Library("aten", "IMPL")
    for packet in (aten._fused_adam_, aten._fused_adamw_, aten._fused_sgd_):
        for overload in packet.overloads():
            op = getattr(packet, overload)
            if not torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "Meta"):
                library.impl(op, _meta_step, "Meta")
                _META["ops"].append(str(op))
    _META["library"] = library


def meta_kernels() -> list[str]:
    """The ops whose Meta kernel :func:`install` registered."""
    return list(_META["ops"])


def inline(gm: torch.fx.GraphModule) -> int:
    """Make every fused optimizer step of ``gm`` call its torch-level kernel; the number of steps changed."""
    changed = 0
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in _KERNELS:
            node.target = _CALLS[_KERNELS[node.target]]
            changed += 1
    if changed:
        gm.recompile()
    return changed
