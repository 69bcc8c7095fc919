"""What each live device buffer is for, read from the objects in the user's namespace (``%tpu memory``).

A buffer's bytes alone do not say whether shrinking the model, the optimizer or the batch would free it. The
namespace does: a module's parameters and buffers, their ``.grad``, an optimizer's state (Adam's moments),
tensors the user named. Whatever none of them holds is an intermediate: activations autograd saved for
backward, results not yet released. Buffers are matched by the JAX array they hold, so a view and its base
count once.
"""

from __future__ import annotations

import torch

#: the roles, in the order ``%tpu memory`` lists their totals
ROLES = ("parameter", "gradient", "optimizer state", "module buffer", "named tensor",
         "activation / intermediate")


def _array_id(t) -> int | None:
    """The id of the JAX array behind a tpu tensor (``None`` for other tensors or one without data yet)."""
    from ..device import tensor as tpu_tensor

    if not isinstance(t, torch.Tensor) or t.device.type != "tpu" or not tpu_tensor.has_data(t):
        return None
    storage = tpu_tensor.adopt(t).tpu_storage
    array = getattr(storage, "_array", None)  # never .array: reading it would allocate or compute
    return id(array) if array is not None else None


def roles_by_array(namespace: dict) -> dict[int, str]:
    """``id(jax array) -> role`` for every tpu buffer the namespace's modules, optimizers and tensors hold (the
    first role found wins: a parameter the user also named stays a parameter)."""
    found: dict[int, str] = {}

    def note(t, role: str) -> None:
        key = _array_id(t)
        if key is not None:
            found.setdefault(key, role)

    values = [v for k, v in namespace.items() if not k.startswith("_")]
    for v in values:
        if isinstance(v, torch.nn.Module):
            for p in v.parameters():
                note(p, "parameter")
                if p.grad is not None:
                    note(p.grad, "gradient")
            for b in v.buffers():
                note(b, "module buffer")
    for v in values:
        if isinstance(v, torch.optim.Optimizer):
            for group in v.param_groups:
                for p in group["params"]:
                    note(p, "parameter")
                    if p.grad is not None:
                        note(p.grad, "gradient")
            for state in v.state.values():
                for s in state.values():
                    if isinstance(s, torch.Tensor):
                        note(s, "optimizer state")
    for name, v in namespace.items():
        if isinstance(v, torch.Tensor) and not name.startswith("_"):
            note(v, f"named tensor `{name}`")
    return found


def role_of(row: dict, roles: dict[int, str]) -> str:
    """The role of a :func:`torchtpu_lab.device.memory.largest` row (a named tensor says its name)."""
    return roles.get(row.get("array_id"), ROLES[-1])


def role_kind(role: str) -> str:
    """The role without a tensor's name: one of :data:`ROLES`."""
    return role.split(" `", 1)[0]
