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

import functools
from datetime import timedelta

import torch
import torch.distributed as dist

from . import world
from .launch import LaunchError, RankResult, launch

NAMES = ("tpu", "tpu_dist")

__all__ = ["launch", "LaunchError", "RankResult", "register", "describe", "NAMES"]


def _create(name: str, opts, backend_options):
    """``Backend.register_backend`` creator for backend ``name`` (extended API: we need the group's global
    ranks)."""
    ranks = tuple(opts.global_ranks_in_group) or tuple(range(opts.group_size))
    timeout = opts.timeout if isinstance(opts.timeout, timedelta) else timedelta(seconds=float(opts.timeout))
    _meta_shape_propagation()
    _fsdp_storage_hooks()
    if world.current() is None:
        world.start(opts.group_rank, opts.group_size, opts.store, timeout.total_seconds())
    from .process_group import TpuProcessGroup

    return TpuProcessGroup(opts.group_rank, opts.group_size, ranks, timeout, name)


def register() -> None:
    """Register ``tpu`` and ``tpu_dist`` with ``torch.distributed`` (idempotent). The backend handles tpu and
    CPU tensors (PyTorch sends CPU tensors for object collectives and DDP's checks)."""
    for name in NAMES:
        if name.upper() not in dist.Backend._plugins:
            dist.Backend.register_backend(name, functools.partial(_create, name), extended_api=True,
                                          devices=["tpu", "cpu"])
    # "tpu" device -> "tpu" backend, so init_process_group() without a backend picks it for tpu.
    dist.Backend.default_device_backend_map["tpu"] = "tpu"


def _meta_shape_propagation() -> None:
    """DTensor derives an op's output shape by running it on fake tensors of the mesh's device type. A fake
    tensor of a device whose kernels are Python (ours) cannot be built for view outputs (PyTorch's
    ``_make_subclass`` meets a tensor that already has a Python object), so for ``tpu`` meshes the fake inputs
    are made on the ``meta`` device: shapes, strides and dtypes do not depend on the device."""
    from torch.distributed.tensor import _op_schema

    original = _op_schema._rebuild_tensor_from_dtensor_meta
    if getattr(original, "_torchtpu_lab", False):
        return

    def rebuild(arg):
        if arg.mesh.device_type == "tpu" and arg.tensor_meta is not None:
            m = arg.tensor_meta
            return torch.empty_strided(m.shape, m.stride, dtype=m.dtype, device="meta")
        return original(arg)

    rebuild._torchtpu_lab = True
    _op_schema._rebuild_tensor_from_dtensor_meta = rebuild


def _fsdp_storage_hooks() -> None:
    """FSDP2 frees an unsharded parameter between uses with ``untyped_storage().resize_(0)`` and reallocates it
    with ``resize_(nbytes)``. PyTorch routes a PrivateUse1 storage resize to C++ hooks a Python backend cannot
    provide, so for tpu tensors the two helpers act on the device buffer instead: free drops it (the memory is
    really released), allocate leaves the next write to create it. Other devices keep PyTorch's helpers."""
    from torch.distributed.fsdp._fully_shard import _fsdp_param, _fsdp_param_group

    from ..device import tensor as tpu_tensor

    if getattr(_fsdp_param.free_storage, "_torchtpu_lab", False):
        return
    original_free, original_alloc = _fsdp_param.free_storage, _fsdp_param.alloc_storage

    def free_storage(t: torch.Tensor) -> None:
        if tpu_tensor.on_tpu(t):
            tpu_tensor.adopt(t).tpu_storage.array = None
        else:
            original_free(t)

    def alloc_storage(t: torch.Tensor) -> None:
        if not tpu_tensor.on_tpu(t):
            original_alloc(t)

    free_storage._torchtpu_lab = alloc_storage._torchtpu_lab = True
    _fsdp_param.free_storage = free_storage
    _fsdp_param.alloc_storage = alloc_storage
    _fsdp_param_group.alloc_storage = alloc_storage


def changes() -> dict:
    """The process-wide changes made here (for ``torchtpu_lab.global_changes``); the last two happen when the
    first tpu process group is made."""
    import sys

    schema = sys.modules.get("torch.distributed.tensor._op_schema")
    fsdp = sys.modules.get("torch.distributed.fsdp._fully_shard._fsdp_param")
    return {
        "torch.distributed backends registered (and the default backend of device 'tpu')":
            [n for n in NAMES if n.upper() in dist.Backend._plugins],
        "DTensor's _rebuild_tensor_from_dtensor_meta wrapped (tpu meshes propagate shapes on meta)":
            getattr(getattr(schema, "_rebuild_tensor_from_dtensor_meta", None), "_torchtpu_lab", False),
        "FSDP2's free_storage/alloc_storage wrapped (tpu parameters free their buffer)":
            getattr(getattr(fsdp, "free_storage", None), "_torchtpu_lab", False),
    }


def describe() -> str | None:
    """``rank r of n (mesh ...)`` for banners and ``%tpu``; ``None`` outside a tpu process group."""
    w = world.current()
    return None if w is None else w.describe()
