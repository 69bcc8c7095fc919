"""JAX's multi-process runtime, started from ``torch.distributed``'s rank, world size and store.

``init_process_group("tpu")`` calls :func:`start` with the rank and world size PyTorch resolved (from
``torchrun``'s ``RANK``/``WORLD_SIZE``/``MASTER_ADDR``/``MASTER_PORT``, or explicit arguments) and the
process group's store. Rank 0 picks a free port on ``MASTER_ADDR`` for JAX's coordinator and publishes
``host:port`` through the store; every rank reads it and calls ``jax.distributed.initialize`` with its torch
rank as JAX's process id, so torch rank ``r`` *is* JAX process ``r``. ``TORCHTPU_LAB_COORDINATOR=host:port``
overrides the choice (multi-host set-ups where rank 0's address differs from ``MASTER_ADDR``).

**The ordering rule.** JAX fixes its set of devices when its backend first initialises (lazily, at the first
``jax.devices()``, array or computation). ``import torchtpu_lab`` does not initialise it; the first ``tpu``
tensor does. So in a multi-process job ``init_process_group("tpu")`` must come before the first ``tpu``
tensor (``model.to("tpu")`` included); otherwise :func:`start` raises and says so. A single-process group
(world size 1) needs no multi-process runtime and has no such rule.

Each rank uses its first local device: ``tpu:0`` in that process, and position ``r`` of every global mesh.
(Several devices per process work for the process's own computations, but the collectives use one device per
rank; run one process per chip, e.g. with ``TPU_VISIBLE_CHIPS``/``CUDA_VISIBLE_DEVICES`` per process.)
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

import jax

_KEY = "torchtpu_lab/jax_coordinator"


@dataclass(frozen=True)
class World:
    """The global view: this process's rank, the world size and each rank's device (index = rank)."""

    rank: int
    size: int
    devices: tuple
    coordinator: str | None

    def describe(self) -> str:
        where = f", coordinator {self.coordinator}" if self.coordinator else ""
        return f"rank {self.rank} of {self.size} (mesh of {self.size} x {self.devices[self.rank].platform}{where})"


_world: list[World | None] = [None]


def current() -> World | None:
    """The world this process joined, or ``None`` before ``init_process_group("tpu")``."""
    return _world[0]


def require() -> World:
    w = _world[0]
    if w is None:
        raise RuntimeError("torch.distributed is not initialised with the tpu backend: call "
                           "torch.distributed.init_process_group('tpu') first")
    return w


def _backends_initialised() -> bool:
    from jax._src import xla_bridge

    return bool(xla_bridge._backends)


def _jax_distributed_running() -> bool:
    from jax._src import distributed

    return distributed.global_state.client is not None


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host if host not in ("localhost",) else "127.0.0.1", 0))
        return s.getsockname()[1]


def _coordinator(store, rank: int, timeout_s: float) -> str:
    explicit = os.environ.get("TORCHTPU_LAB_COORDINATOR")
    if explicit:
        return explicit
    if rank == 0:
        host = os.environ.get("MASTER_ADDR", "127.0.0.1")
        address = f"{host}:{_free_port(host)}"
        store.set(_KEY, address)
        return address
    store.wait([_KEY])
    return store.get(_KEY).decode()


_USER_DEVICE_CHOICE = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "JAX_LOCAL_DEVICE_IDS")


def local_device_ids(env=os.environ) -> list[int] | None:
    """The accelerator this rank should own when several ranks share a host: torchrun's ``LOCAL_RANK``.

    Each process takes part in collectives with one device, so ranks on one host must not all pick the host's
    first GPU. JAX applies ``local_device_ids`` to CUDA/ROCm visibility only (XLA:CPU has one device per
    process anyway; a TPU host is one process owning its chips, or ``TPU_VISIBLE_CHIPS`` set by the user).
    ``None`` leaves the choice alone: one rank per host, or a user who already chose devices."""
    if any(env.get(name) for name in _USER_DEVICE_CHOICE):
        return None
    try:
        local_rank, local_size = int(env["LOCAL_RANK"]), int(env.get("LOCAL_WORLD_SIZE", "1"))
    except (KeyError, ValueError):
        return None
    return [local_rank] if local_size > 1 else None


def start(rank: int, size: int, store, timeout_s: float) -> World:
    """Join JAX's multi-process runtime as process ``rank`` of ``size`` (idempotent for the same rank/size)."""
    w = _world[0]
    if w is not None:
        if (w.rank, w.size) != (rank, size):
            raise RuntimeError(f"this process already joined the tpu world as rank {w.rank} of {w.size}; "
                               f"it cannot become rank {rank} of {size} (JAX's runtime starts once per process)")
        return w
    coordinator = None
    if size > 1:
        if _jax_distributed_running():
            if (jax.process_index(), jax.process_count()) != (rank, size):
                raise RuntimeError(
                    f"jax.distributed is already initialised as process {jax.process_index()} of "
                    f"{jax.process_count()}, but torch.distributed says rank {rank} of {size}")
        else:
            if _backends_initialised():
                raise RuntimeError(
                    "init_process_group('tpu') must run before this process creates its first tpu tensor "
                    "(or otherwise uses JAX): JAX's backend is already initialised, so it can no longer join a "
                    "multi-process runtime. Move init_process_group to the top of the script, before "
                    "model.to('tpu').")
            # XLA:CPU's collectives between processes go over Gloo; TPU (ICI/DCN) and GPU (NCCL) ignore this.
            jax.config.update("jax_cpu_collectives_implementation", "gloo")
            coordinator = _coordinator(store, rank, timeout_s)
            jax.distributed.initialize(coordinator_address=coordinator, num_processes=size, process_id=rank,
                                       local_device_ids=local_device_ids(),
                                       initialization_timeout=max(int(timeout_s), 1))
    from .. import platform

    platform_name = platform.info().platform
    if size > 1:
        firsts: dict[int, object] = {}
        for d in sorted(jax.devices(platform_name), key=lambda d: d.id):
            firsts.setdefault(d.process_index, d)
        if sorted(firsts) != list(range(size)):
            raise RuntimeError(f"JAX sees devices of processes {sorted(firsts)}, expected 0..{size - 1}")
        devices = tuple(firsts[r] for r in range(size))
    else:
        devices = (platform.jax_device(0),)
    w = World(rank, size, devices, coordinator)
    _world[0] = w
    return w
