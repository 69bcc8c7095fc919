"""``torch.tpu``: the ``torch.cuda``-shaped module PyTorch finds for the ``tpu`` device.

PyTorch itself calls into it: ``torch.manual_seed`` seeds every device through :func:`manual_seed_all`, autocast
asks :func:`get_amp_supported_dtype`, ``Module.tpu()`` and friends check :func:`is_available`.
"""

from __future__ import annotations

import contextlib

import torch

from .. import platform, telemetry
from ..device import context, memory, rng
from ..runtime import checks, lazy

__all__ = [
    "is_available", "is_initialized", "init", "device_count", "current_device", "set_device", "device",
    "get_device_name", "get_device_properties", "synchronize", "manual_seed", "manual_seed_all", "seed",
    "seed_all", "initial_seed", "get_rng_state", "set_rng_state", "memory_allocated", "max_memory_allocated",
    "reset_peak_memory_stats", "memory_stats", "memory_summary", "mem_get_info", "platform_name",
    "get_amp_supported_dtype",
]


def _index(device=None) -> int:
    """The index ``device`` (``None``, an int, ``"tpu"``, ``"tpu:i"`` or a ``torch.device``) names; anything that
    is not an existing tpu device raises, naming the argument, as ``torch.cuda`` does."""
    if device is None:
        return context.current_index()
    if isinstance(device, bool) or not isinstance(device, (int, str, torch.device)):
        raise ValueError(f"Expected a tpu device (an int, 'tpu', 'tpu:i' or a torch.device), but got: {device!r}")
    if isinstance(device, int):
        index = device
    else:
        try:
            d = torch.device(device)
        except RuntimeError as e:
            raise ValueError(f"Expected a tpu device, but got: {device!r} ({e})") from None
        if d.type != "tpu":
            raise ValueError(f"Expected a tpu device, but got: {str(d)!r}")
        if d.index is None:
            return context.current_index()
        index = d.index
    count = device_count()
    if not 0 <= index < count:
        raise ValueError(f"Invalid device tpu:{index}: there {'is' if count == 1 else 'are'} {count} tpu "
                         f"device{'s' if count != 1 else ''} (tpu:0 to tpu:{count - 1})")
    return index


def is_available() -> bool:
    return True


def is_initialized() -> bool:
    return True


def init() -> None:
    platform.info()


def _is_in_bad_fork() -> bool:
    return False


def device_count() -> int:
    """Number of ``tpu:i`` devices: one per JAX device of the chosen platform."""
    return len(platform.info().devices)


def current_device() -> int:
    """The device ``device="tpu"`` (no index) means; changed by :func:`set_device`."""
    return context.current_index()


def set_device(device) -> None:
    index = _index(device)
    platform.jax_device(index)  # raises, listing the devices, if it does not exist
    context.set_current_index(index)


@contextlib.contextmanager
def device(device):
    """Make ``tpu:device`` the current device inside the block."""
    previous = context.current_index()
    set_device(device)
    try:
        yield
    finally:
        context.set_current_index(previous)


def platform_name() -> str:
    """What really backs the device, e.g. ``"XLA:CPU cpu x1 (no TPU here: ...)"``."""
    return platform.info().description


def get_device_name(device=None) -> str:
    info = platform.info()
    return f"{info.device_kind} (XLA:{info.platform.upper()})"


def get_device_properties(device=None) -> dict:
    d = platform.jax_device(_index(device))
    stats = d.memory_stats() or {}
    return {
        "name": get_device_name(device),
        "platform": d.platform,
        "device_kind": d.device_kind,
        "total_memory": stats.get("bytes_limit"),
        "jax_device": str(d),
    }


def synchronize(device=None) -> None:
    """Run pending fused work and wait until every buffer held by tpu tensors on the device is computed."""
    index = _index(device)
    with telemetry.sync_event(telemetry.SyncReason.SYNCHRONIZE, lazy.pending_ops()):
        lazy.sync(telemetry.SyncReason.SYNCHRONIZE, record=False)
        for array in memory.live_buffers(index):
            array.block_until_ready()
    checks.raise_pending()  # everything has run: every reported error is known


def manual_seed(seed: int) -> None:
    rng.manual_seed(seed, current_device())


def manual_seed_all(seed: int) -> None:
    rng.manual_seed_all(seed, device_count())


def seed() -> None:
    rng.seed(current_device())


def seed_all() -> None:
    s = rng.seed(0)
    rng.manual_seed_all(s, device_count())


def initial_seed() -> int:
    return rng.initial_seed(current_device())


def get_rng_state(device="tpu") -> torch.Tensor:
    return rng.get_state(_index(device))


def set_rng_state(new_state: torch.Tensor, device="tpu") -> None:
    rng.set_state(new_state, _index(device))


def _flush() -> None:
    # Memory figures describe buffers that exist: pending fused work is run first (a sync point).
    lazy.sync(telemetry.SyncReason.MEMORY_QUERY)


def memory_allocated(device=None) -> int:
    """Bytes held by live tpu tensors (our own count; on CPU it matches ``jax.live_arrays()``)."""
    index = _index(device)
    _flush()
    return memory.allocated(index)


def max_memory_allocated(device=None) -> int:
    index = _index(device)
    _flush()
    return memory.peak(index)


def reset_peak_memory_stats(device=None) -> None:
    memory.reset_peak(_index(device))


def memory_stats(device=None) -> dict:
    index = _index(device)
    _flush()
    return memory.stats(index)


def mem_get_info(device=None) -> tuple[int, int] | None:
    """``(free, total)`` bytes where XLA reports a limit, else ``None`` (XLA:CPU has no fixed limit)."""
    stats = platform.jax_device(_index(device)).memory_stats()
    if not stats or "bytes_limit" not in stats:
        return None
    return stats["bytes_limit"] - stats.get("bytes_in_use", 0), stats["bytes_limit"]


def _fmt(n: int | None) -> str:
    if n is None:
        return "n/a"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return str(n)


def memory_summary(device=None, abbreviated: bool = False) -> str:
    idx = _index(device)
    _flush()
    stats = memory.stats(idx)
    info = mem_get_info(idx)
    lines = [
        f"tpu:{idx} memory ({platform_name()}; source: {stats['source']})",
        f"  allocated now : {_fmt(stats['allocated_bytes.all.current'])}",
        f"  peak          : {_fmt(stats['allocated_bytes.all.peak'])}",
        f"  live buffers  : {stats['active.all.current']}",
        f"  allocs / frees: {stats['allocation.all.allocated']} / {stats['allocation.all.freed']}",
        f"  device limit  : {_fmt(info[1]) if info else 'n/a (no fixed limit on this platform)'}",
    ]
    return "\n".join(lines)


def get_amp_supported_dtype() -> list[torch.dtype]:
    return [torch.bfloat16, torch.float16]
