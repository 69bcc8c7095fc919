"""Which JAX platform backs the ``tpu`` device, decided once per process.

The ``tpu`` device is whatever XLA backend is best here: a real TPU when JAX finds one, else a GPU, else the
CPU. ``TORCHTPU_LAB_PLATFORM=cpu|gpu|tpu`` overrides the choice. Whatever backs it is reported honestly: a
CPU-backed ``tpu`` device says "XLA:CPU" everywhere it describes itself.

64-bit types: PyTorch's defaults need int64 (indices, ``arange``) and float64 to keep their meaning, so this
module turns on ``jax_enable_x64`` when the package is imported. That changes the default dtypes of the user's
own ``jnp`` code in this process (``jnp.arange(3)`` becomes int64); we accept that, because the alternative
silently truncates PyTorch's int64 indices and float64 math. ``TORCHTPU_LAB_X64=0`` keeps JAX's 32-bit default,
in which case creating a 64-bit ``tpu`` tensor raises instead of silently narrowing.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import jax

from . import native

_PREFERENCE = ("tpu", "gpu", "cpu")
_ENV_PLATFORM = "TORCHTPU_LAB_PLATFORM"
#: what :func:`when_known` was asked to call once the platform is decided
_waiting: list = []


def x64_enabled() -> bool:
    """Whether 64-bit dtypes are real on the device (see the module docstring)."""
    return bool(jax.config.jax_enable_x64)


_ENV_CPU_ISA = "TORCHTPU_LAB_CPU_ISA"


def configure_cpu_codegen() -> None:
    """Cap the instruction set XLA:CPU generates code for at AVX2 (unless the user's ``XLA_FLAGS`` names one,
    ``TORCHTPU_LAB_CPU_ISA`` names another, or is ``native``).

    Why: the eager modes promise that every op's result is rounded to its dtype, as CPU's kernels round it
    (``compile_cache.EAGER_OPTIONS``). With AVX-512 XLA:CPU breaks that for float16 inside a fused kernel: a
    multiply feeding an add or a subtract is computed with one rounding (plain ``jax.jit`` of ``a * x - x`` on
    float16: 5 of 257 values 1 ulp off CPU's, at any AVX-512 level; right at AVX2), and no HLO written around it
    keeps it apart (XLA drops an optimization barrier and folds convert or bitcast round trips). XLA reads the
    ceiling only from ``XLA_FLAGS``, when its CPU client starts, so it is set here, before the platform is
    chosen; a process whose JAX started its backends earlier keeps what it has. On a CPU without AVX-512 the cap
    changes nothing; the large matmuls are Eigen's and YNNPACK's own kernels, which choose their ISA at run time."""
    isa = os.environ.get(_ENV_CPU_ISA, "AVX2")
    flags = os.environ.get("XLA_FLAGS", "")
    if isa.lower() == "native" or "xla_cpu_max_isa" in flags:
        return
    from jax._src import xla_bridge

    if xla_bridge.backends_are_initialized():
        return
    os.environ["XLA_FLAGS"] = f"{flags} --xla_cpu_max_isa={isa}".strip()
    _isa_cap[:] = [isa]


_isa_cap: list = []


def cpu_isa_cap() -> str | None:
    """The ISA ceiling :func:`configure_cpu_codegen` added to ``XLA_FLAGS`` (``None``: it added none)."""
    return _isa_cap[0] if _isa_cap else None


def configure_x64() -> None:
    """Turn on JAX's x64 mode unless the user opted out with ``TORCHTPU_LAB_X64=0``."""
    if os.environ.get("TORCHTPU_LAB_X64", "1") != "0":
        jax.config.update("jax_enable_x64", True)


@dataclass(frozen=True)
class PlatformInfo:
    """What backs the ``tpu`` device: the JAX platform name, its devices and a human description."""

    platform: str
    devices: tuple
    device_kind: str

    @property
    def description(self) -> str:
        label = {"tpu": "TPU", "gpu": "GPU", "cpu": "CPU"}.get(self.platform, self.platform.upper())
        honest = " (no TPU here: the tpu device runs on XLA:CPU)" if self.platform == "cpu" else ""
        return f"XLA:{label} {self.device_kind} x{len(self.devices)}{honest}"


def _available(platform: str) -> tuple:
    # This process's own devices: under JAX's multi-process runtime (torchtpu_lab.distributed) ``jax.devices``
    # lists every process's devices, and ``tpu:i`` must name one this process can address.
    try:
        return tuple(jax.local_devices(backend=platform))
    except RuntimeError:
        return ()


@functools.lru_cache(maxsize=1)
def info() -> PlatformInfo:
    """The platform for this process: the environment override, else the best of TPU, GPU, CPU. Decided on
    first use, never at import (``jax.distributed.initialize`` must run before JAX's backends start); the
    native core's device guard learns the device count here."""
    found = _discover()
    native.set_device_count(len(found.devices))
    waiting, _waiting[:] = list(_waiting), []
    for callback in waiting:
        callback(found)
    return found


def started() -> bool:
    """Whether the platform is decided, so JAX's backends (client, thread pools) are running in this process."""
    return bool(info.cache_info().currsize)


def when_known(callback) -> None:
    """Call ``callback(info)`` once the platform is decided: now if it is, else at the end of the first
    :func:`info`. For work a higher layer starts with the device (the persistent cache's prefetch) without
    deciding the platform itself, which would start JAX's backends early. ``callback`` must not raise or call
    :func:`info` (it runs inside it)."""
    if started():
        callback(info())
    else:
        _waiting.append(callback)


def _discover() -> PlatformInfo:
    wanted = os.environ.get(_ENV_PLATFORM, "").strip().lower()
    if wanted:
        if wanted not in _PREFERENCE:
            raise ValueError(f"{_ENV_PLATFORM}={wanted!r}: expected one of {', '.join(_PREFERENCE)}")
        devices = _available(wanted)
        if not devices:
            raise RuntimeError(
                f"{_ENV_PLATFORM}={wanted} but JAX finds no {wanted} device "
                f"(JAX sees: {', '.join(str(d) for d in jax.devices())})"
            )
        return PlatformInfo(wanted, devices, devices[0].device_kind)
    for name in _PREFERENCE:
        devices = _available(name)
        if devices:
            return PlatformInfo(name, devices, devices[0].device_kind)
    raise RuntimeError("JAX reports no devices at all")


def jax_device(index: int | None) -> jax.Device:
    """The JAX device behind ``tpu:index``; a clear error lists what exists when the index does not."""
    devices = info().devices
    i = 0 if index is None else index
    if not 0 <= i < len(devices):
        names = ", ".join(f"tpu:{k} ({d})" for k, d in enumerate(devices))
        hint = ""
        if info().platform == "cpu":
            hint = (f"; XLA:CPU makes one device unless told otherwise: set XLA_FLAGS="
                    f"--xla_force_host_platform_device_count={i + 1} (or more) before the process imports JAX")
        raise RuntimeError(f"tpu:{i} does not exist; available devices: {names}{hint}")
    return devices[i]
