"""``torch.tpu``: the ``torch.cuda``-shaped module PyTorch finds for the ``tpu`` device.

PyTorch itself calls into it: ``torch.manual_seed`` seeds every device through :func:`manual_seed_all`, autocast
asks :func:`get_amp_supported_dtype`, ``Module.tpu()`` and friends check :func:`is_available`. Libraries probe the
rest the way they probe ``torch.cuda`` (transformers, accelerate, Lightning): RNG state of all devices,
device properties, free memory, bf16 support, streams and events, ``amp``.

Streams and events are *ordering no-ops*: XLA orders the work of one device itself (every computation runs in
issue order on its stream), so ``torch.tpu.Stream`` has nothing to reorder; ``synchronize`` on a stream or event
waits for all pending work, which is the strongest (and here the only) guarantee.
"""

from __future__ import annotations

import contextlib
import dataclasses

import torch

from .. import native, platform, telemetry
from ..units import fmt_bytes
from ..device import context, memory, rng
from ..runtime import fused
from . import fork_guard
from .device_wait import wait_for_device
from .streams import Event, Stream, current_stream, default_stream, stream  # noqa: F401

__all__ = [
    "is_available", "is_initialized", "init", "device_count", "current_device", "set_device", "device",
    "get_device_name", "get_device_properties", "synchronize", "manual_seed", "manual_seed_all", "seed",
    "seed_all", "initial_seed", "get_rng_state", "set_rng_state", "memory_allocated", "max_memory_allocated",
    "reset_peak_memory_stats", "memory_stats", "memory_summary", "mem_get_info", "platform_name",
    "get_amp_supported_dtype", "get_rng_state_all", "set_rng_state_all", "is_bf16_supported", "empty_cache",
    "Stream", "Event", "current_stream", "default_stream", "stream", "amp", "get_device_capability",
    "DeviceProperties",
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
    return not fork_guard.in_bad_fork()


def init() -> None:
    """Start the device (JAX's backends); in a child forked after it started, PyTorch's re-initialization error
    (:mod:`.fork_guard`)."""
    fork_guard.check()
    platform.info()


_lazy_init = init


def _is_in_bad_fork() -> bool:
    return fork_guard.in_bad_fork()


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


@dataclasses.dataclass(frozen=True)
class DeviceProperties:
    """What ``torch.cuda.get_device_properties`` gives, where it means something for an XLA device; also
    readable as a mapping (``props["name"]``)."""

    name: str
    platform: str
    device_kind: str
    total_memory: int | None  # bytes XLA may use on the device; None where it reports no limit (XLA:CPU)
    jax_device: str

    def __getitem__(self, key: str):
        return getattr(self, key)

    def keys(self):
        return [f.name for f in dataclasses.fields(self)]


def get_device_properties(device=None) -> DeviceProperties:
    d = platform.jax_device(_index(device))
    stats = d.memory_stats() or {}
    return DeviceProperties(get_device_name(device), d.platform, d.device_kind, stats.get("bytes_limit"), str(d))


def get_device_capability(device=None) -> tuple[int, int]:
    """``(0, 0)``: compute capability is a CUDA notion; code that branches on it takes the generic path."""
    return (0, 0)


def synchronize(device=None) -> None:
    """Run pending fused work and wait until every buffer held by tpu tensors on the device is computed."""
    wait_for_device(_index(device))


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


def get_rng_state_all() -> list[torch.Tensor]:
    """The generator state of every device (what ``torch.random.fork_rng`` and checkpointing save)."""
    return [rng.get_state(i) for i in range(device_count())]


def set_rng_state_all(new_states) -> None:
    states = list(new_states)
    if len(states) != device_count():
        raise RuntimeError(f"set_rng_state_all: got {len(states)} states for {device_count()} tpu devices")
    for i, state in enumerate(states):
        rng.set_state(state, i)


def _flush() -> None:
    # Memory figures describe buffers that exist: pending fused work is run first (a sync point).
    fused.sync(telemetry.SyncReason.MEMORY_QUERY)


def memory_allocated(device=None) -> int:
    """Bytes held by live tpu tensors (our own count; on CPU it matches ``jax.live_arrays()``)."""
    index = _index(device)
    _flush()
    return memory.allocated(index)


def max_memory_allocated(device=None) -> int:
    index = _index(device)
    _flush()
    return memory.peak(index)


def memory_reserved(device=None) -> int:
    """Bytes XLA holds for this device, as PyTorch's caching allocator would report them: our count of live
    buffers (XLA gives no pool figure that ``torch.cuda.memory_reserved`` could mean; ``torch.accelerator`` says
    the same from :func:`memory_stats`)."""
    return memory_stats(device)["reserved_bytes.all.current"]


def max_memory_reserved(device=None) -> int:
    return memory_stats(device)["reserved_bytes.all.peak"]


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


def memory_summary(device=None, abbreviated: bool = False) -> str:
    idx = _index(device)
    _flush()
    stats = memory.stats(idx)
    info = mem_get_info(idx)
    lines = [
        f"tpu:{idx} memory ({platform_name()}; source: {stats['source']})",
        f"  allocated now : {fmt_bytes(stats['allocated_bytes.all.current'])}",
        f"  peak          : {fmt_bytes(stats['allocated_bytes.all.peak'])}",
        f"  live buffers  : {stats['active.all.current']}",
        f"  allocs / frees: {stats['allocation.all.allocated']} / {stats['allocation.all.freed']}",
        f"  device limit  : {fmt_bytes(info[1]) if info else 'n/a (no fixed limit on this platform)'}",
    ]
    return "\n".join(lines)


def __getattr__(name: str):
    """``torch.tpu.default_generators``: one ``torch.Generator`` per device, as ``torch.cuda``'s (made when first
    asked: the device count is known once the platform is)."""
    if name == "default_generators":
        if native.module() is None:
            raise AttributeError(f"torch.tpu.default_generators needs the native core ({native.status().describe()})")
        return tuple(rng.default_generator(i) for i in range(device_count()))
    raise AttributeError(f"module 'torch.tpu' has no attribute {name!r}")


def get_amp_supported_dtype() -> list[torch.dtype]:
    return [torch.bfloat16, torch.float16]


def is_bf16_supported(including_emulation: bool = True) -> bool:
    """bfloat16 is native on TPU and computed by XLA everywhere else."""
    return True


def empty_cache() -> None:
    """Release what can be released: pending fused work is run (its inputs can then be freed) and JAX's
    freed buffers go back to the device. XLA keeps no user-visible cache beyond that."""
    _flush()
    import gc

    gc.collect()


class _Amp:
    """``torch.tpu.amp``: the ``torch.cuda.amp``-shaped helpers, over ``torch.amp`` with ``device_type="tpu"``."""

    @staticmethod
    def autocast(enabled: bool = True, dtype: torch.dtype = torch.bfloat16, cache_enabled: bool = True):
        return torch.autocast("tpu", dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)

    @staticmethod
    def GradScaler(*args, **kwargs):  # noqa: N802 (torch.cuda.amp.GradScaler's spelling)
        """A ``torch.amp.GradScaler`` for tpu (needed for float16; bfloat16 trains without scaling)."""
        return torch.amp.GradScaler("tpu", *args, **kwargs)

    @staticmethod
    def is_autocast_available() -> bool:
        return torch.amp.is_autocast_available("tpu")


amp = _Amp()
