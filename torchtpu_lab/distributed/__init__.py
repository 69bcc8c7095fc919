"""``torch.distributed`` on the tpu device: the ``tpu`` process-group backend (alias ``tpu_dist``) and a launcher.

``import torchtpu_lab`` registers the backend; then unchanged PyTorch code runs across processes::

    dist.init_process_group("tpu")           # or "tpu_dist" (TorchTPU's name); under torchrun
    model = DDP(model.to("tpu"))             # no device_ids
    fully_shard(model, mesh=init_device_mesh("tpu", (dist.get_world_size(),)))

The engine is JAX's multi-process runtime (:mod:`.world`) and compiled XLA collectives over a global mesh of
the ranks' devices (:mod:`.collectives`): Gloo between CPU processes, ICI/DCN on a TPU slice, NCCL on GPUs.

**Ordering rule**: call ``init_process_group("tpu")`` before the process creates its first tpu tensor — JAX
fixes its device set when its backend starts (see :mod:`.world`). From a notebook (one process), run ranks
with :func:`launch`.
"""

from __future__ import annotations

from datetime import timedelta

import torch.distributed as dist

from . import world
from .launch import LaunchError, RankResult, launch

NAMES = ("tpu", "tpu_dist")

__all__ = ["launch", "LaunchError", "RankResult", "register", "describe", "NAMES"]


def _create(opts, backend_options):
    """``Backend.register_backend`` creator (extended API: we need the group's global ranks)."""
    ranks = tuple(opts.global_ranks_in_group) or tuple(range(opts.group_size))
    timeout = opts.timeout if isinstance(opts.timeout, timedelta) else timedelta(seconds=float(opts.timeout))
    if world.current() is None:
        world.start(opts.group_rank, opts.group_size, opts.store, timeout.total_seconds())
    from .process_group import TpuProcessGroup

    return TpuProcessGroup(opts.group_rank, opts.group_size, ranks, timeout)


def register() -> None:
    """Register ``tpu`` and ``tpu_dist`` with ``torch.distributed`` (idempotent). The backend handles tpu and
    CPU tensors (PyTorch sends CPU tensors for object collectives and DDP's checks)."""
    for name in NAMES:
        if name.upper() not in dist.Backend._plugins:
            dist.Backend.register_backend(name, _create, extended_api=True, devices=["tpu", "cpu"])
    # "tpu" device -> "tpu" backend, so init_process_group() without a backend picks it for tpu.
    dist.Backend.default_device_backend_map["tpu"] = "tpu"


def describe() -> str | None:
    """``rank r of n (mesh ...)`` for banners and ``%tpu``; ``None`` outside a tpu process group."""
    w = world.current()
    return None if w is None else w.describe()
