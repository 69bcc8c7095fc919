"""The device's peak compute (FLOP/s) and memory bandwidth (bytes/s), the roofs a profile measures against.

Known chips come from a table of vendor figures (dense, no sparsity; the source of each in a comment). On a CPU
or a chip not in the table the figures are measured by a short calibration (a large matmul and a large
elementwise copy through JAX, best of a few runs), cached on disk per machine so it runs once, and
:attr:`Peaks.source` says ``"measured: ..."`` with what was measured. A roofline is only as good as its roofs:
a profile always shows where its peaks come from.

The calibration cache is ``$TORCHTPU_LAB_PEAKS_FILE`` or ``$XDG_CACHE_HOME/torchtpu_lab/peaks.json``
(``~/.cache/...``); an unreadable or unwritable file means calibrating again, never an error.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass

#: (matched in ``jax.Device.device_kind``, lower case) -> {dtype: peak FLOP/s, "bandwidth": HBM bytes/s}.
#: The first entry whose key occurs in the device kind wins, so the more specific names come first.
#: On TPUs a float32 matmul at the default precision runs as one bfloat16 pass of the MXU: its peak is the
#: bfloat16 one.
KNOWN_CHIPS: dict[str, dict[str, float]] = {
    # Google Cloud TPU docs, "TPU v4": 275 TFLOP/s bf16 and int8, 1,200 GB/s HBM2 (1228.8 GB/s in the paper)
    "tpu v4": {"bfloat16": 275e12, "float32": 275e12, "int8": 275e12, "bandwidth": 1228e9},
    # Google Cloud TPU docs, "TPU v5e" ("TPU v5 lite" in device_kind): 197 TFLOP/s bf16, 394 TOP/s int8, 819 GB/s
    "tpu v5 lite": {"bfloat16": 197e12, "float32": 197e12, "int8": 394e12, "bandwidth": 819e9},
    "tpu v5e": {"bfloat16": 197e12, "float32": 197e12, "int8": 394e12, "bandwidth": 819e9},
    # Google Cloud TPU docs, "TPU v5p": 459 TFLOP/s bf16, 918 TOP/s int8, 2,765 GB/s
    "tpu v5p": {"bfloat16": 459e12, "float32": 459e12, "int8": 918e12, "bandwidth": 2765e9},
    "tpu v5": {"bfloat16": 459e12, "float32": 459e12, "int8": 918e12, "bandwidth": 2765e9},
    # Google Cloud TPU docs, "TPU v6e" (Trillium, "TPU v6 lite"): 918 TFLOP/s bf16, 1,836 TOP/s int8, 1,640 GB/s
    "tpu v6 lite": {"bfloat16": 918e12, "float32": 918e12, "int8": 1836e12, "bandwidth": 1640e9},
    "tpu v6e": {"bfloat16": 918e12, "float32": 918e12, "int8": 1836e12, "bandwidth": 1640e9},
    # Google Cloud TPU docs, "TPU7x" (Ironwood): 4,614 TFLOP/s fp8 per chip, bf16 half of it, 7,380 GB/s HBM3e
    "tpu7": {"float8": 4614e12, "bfloat16": 2307e12, "float32": 2307e12, "bandwidth": 7380e9},
    "tpu v7": {"float8": 4614e12, "bfloat16": 2307e12, "float32": 2307e12, "bandwidth": 7380e9},
    # NVIDIA H200 datasheet (SXM): the H100 SXM's compute, 4.8 TB/s HBM3e
    "h200": {"float32": 67e12, "tfloat32": 494.7e12, "bfloat16": 989.4e12, "float16": 989.4e12, "float8": 1979e12,
             "bandwidth": 4.8e12},
    # NVIDIA H100 datasheet (SXM5): 67 TFLOP/s fp32, 494.7 tf32, 989.4 bf16/fp16, 1,979 fp8 (dense), 3.35 TB/s
    "h100": {"float32": 67e12, "tfloat32": 494.7e12, "bfloat16": 989.4e12, "float16": 989.4e12, "float8": 1979e12,
             "bandwidth": 3.35e12},
    # NVIDIA A100 datasheet (SXM 80GB): 19.5 TFLOP/s fp32, 156 tf32, 312 bf16/fp16 (dense), 2,039 GB/s
    "a100": {"float32": 19.5e12, "tfloat32": 156e12, "bfloat16": 312e12, "float16": 312e12, "bandwidth": 2039e9},
}


@dataclass(frozen=True)
class Peaks:
    """Peak FLOP/s and bytes/s of one device, and where the figures come from."""

    flops: float
    bandwidth: float
    source: str

    @property
    def ridge(self) -> float:
        """The arithmetic intensity (FLOPs per byte) where the memory roof meets the compute roof."""
        return self.flops / self.bandwidth


def from_table(device_kind: str, dtype: str = "float32") -> Peaks | None:
    """The table's peaks for a device kind (``None`` when the chip is not in it)."""
    kind = device_kind.lower()
    for name, figures in KNOWN_CHIPS.items():
        if name in kind:
            flops = figures.get(dtype) or figures.get("float32")
            return Peaks(flops, figures["bandwidth"], f"table: {device_kind} {dtype if dtype in figures else 'float32'}"
                         " peak (vendor datasheet)")
    return None


def cache_file() -> str:
    explicit = os.environ.get("TORCHTPU_LAB_PEAKS_FILE")
    if explicit:
        return explicit
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "torchtpu_lab", "peaks.json")


def _machine_key(device) -> str:
    import jax

    return f"{device.platform}|{device.device_kind}|{os.cpu_count()}|jax {jax.__version__}"


def _best_seconds(fn, arg, runs: int) -> float:
    import jax

    jax.block_until_ready(fn(arg))  # compile and warm up
    best = float("inf")
    for _ in range(runs):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(arg))
        best = min(best, time.perf_counter() - t0)
    return best


def calibrate(device, matmul_n: int = 1024, copy_mib: int = 64, runs: int = 5) -> Peaks:
    """Measure the device: an ``n x n`` float32 matmul (2n³ FLOPs) and an elementwise pass over ``copy_mib``
    MiB (read once, written once), best of ``runs``. Takes about a second on a CPU."""
    import jax
    import jax.numpy as jnp

    a = jax.device_put(jnp.ones((matmul_n, matmul_n), jnp.float32), device)
    matmul_s = _best_seconds(jax.jit(lambda x: x @ x), a, runs)
    flops = 2.0 * matmul_n ** 3 / matmul_s
    n = copy_mib * 2**20 // 4
    b = jax.device_put(jnp.ones((n,), jnp.float32), device)
    copy_s = _best_seconds(jax.jit(lambda x: x + 1.0), b, runs)
    bandwidth = 2.0 * n * 4 / copy_s
    what = (f"measured: {matmul_n}x{matmul_n} float32 matmul {flops / 1e9:.1f} GFLOP/s, {copy_mib} MiB copy "
            f"{bandwidth / 1e9:.1f} GB/s on {device.device_kind} ({os.cpu_count()} CPUs), best of {runs}")
    return Peaks(flops, bandwidth, what)


def _load_cached(key: str) -> Peaks | None:
    try:
        with open(cache_file()) as f:
            entry = json.load(f).get(key)
        return Peaks(float(entry["flops"]), float(entry["bandwidth"]), str(entry["source"])) if entry else None
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None


def _save_cached(key: str, peaks: Peaks) -> None:
    path = cache_file()
    try:
        with open(path) as f:
            data = json.load(f)
        if not isinstance(data, dict):
            data = {}
    except (OSError, ValueError):
        data = {}
    data[key] = {"flops": peaks.flops, "bandwidth": peaks.bandwidth, "source": peaks.source}
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(data, f, indent=1)
        os.replace(tmp, path)
    except OSError:
        pass  # not cached: the next process calibrates again


_memo: dict[str, Peaks] = {}


def peaks(device_index: int = 0, dtype: str = "float32") -> Peaks:
    """The peaks of ``tpu:device_index``: the table's for a known chip, else a calibration (cached on disk)."""
    from .. import platform

    device = platform.jax_device(device_index)
    known = from_table(device.device_kind, dtype)
    if known is not None:
        return known
    key = _machine_key(device)
    found = _memo.get(key) or _load_cached(key)
    if found is None:
        found = calibrate(device)
        _save_cached(key, found)
    _memo[key] = found
    return found


def at_least(device_index: int, flops: float, dtype: str = "float32") -> Peaks:
    """:func:`peaks`, where they were measured, with a compute peak no lower than ``flops``: a rate a program was
    seen to reach. A calibration is a lower bound of the device's peak (on a machine shared with other work it can
    measure half of it), and a roof below what a program ran at would put it above 100 % of its peak. The raised
    figure replaces the cached calibration, and the source says so. A table's figures stay as they are, and so does
    the bandwidth: a program whose data stays in a cache moves more bytes per second than memory can, which says
    nothing about the memory roof."""
    found = peaks(device_index, dtype)
    if not found.source.startswith("measured: ") or flops <= found.flops:
        return found
    from .. import platform

    raised = Peaks(flops, found.bandwidth, f"{found.source.split('; raised to ')[0]}; raised to "
                                           f"{flops / 1e9:.1f} GFLOP/s, a rate a profiled program reached")
    key = _machine_key(platform.jax_device(device_index))
    _memo[key] = raised
    _save_cached(key, raised)
    return raised
