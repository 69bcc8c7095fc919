"""PyTorch-style stateful random numbers on top of a counter-based hash.

Each ``tpu:i`` has a default generator: a seed and an offset. Every random op takes ``(seed, offset)`` from the
generator it was given (``generator=``) or from its device's default one, and advances the offset by one; the
lowering hashes ``(offset, element)`` under the seed *inside* the compiled function (``ops/random_bits``), so
the key is a graph input rather than a constant: a fused training step with dropout draws a fresh mask every
step without recompiling, and a generator gives the same stream in debug, strict and fused modes.
``torch.manual_seed`` reaches :func:`manual_seed_all` through ``torch.tpu``, so seeding is the same call as on
CUDA and runs are reproducible. The streams differ from PyTorch's CPU generator (as CUDA's do).

With the native core the generators are real ``torch.Generator`` objects of device ``tpu`` (the core's
``TpuGenerator``: ``torch.Generator("tpu")`` works, and so do ``torch.tpu.default_generators`` and
``fork_rng``). In pure-Python mode the defaults are :class:`_HostGenerator` objects with the same methods and
the same 16-byte state, and ``torch.Generator("tpu")`` cannot be made (PyTorch asks a C++ hook for it).
"""

from __future__ import annotations

import random

import torch

from .. import native

_DEFAULT_SEED = 67280421310721  # PyTorch's default_rng_seed_val
_U64 = 1 << 64


class _HostGenerator:
    """The default generator of one device when there is no native core: ``torch.Generator``'s methods that
    the random ops and ``torch.tpu`` use, over a seed and an offset."""

    __slots__ = ("_offset", "_seed")

    def __init__(self) -> None:
        self._seed, self._offset = _DEFAULT_SEED, 0

    def manual_seed(self, seed: int) -> _HostGenerator:
        self._seed, self._offset = int(seed) % _U64, 0
        return self

    def initial_seed(self) -> int:
        return self._seed

    def get_offset(self) -> int:
        return self._offset

    def set_offset(self, offset: int) -> None:
        self._offset = offset

    def get_state(self) -> torch.Tensor:
        """16 bytes: seed and offset, each a little-endian 64-bit integer (the native generator's layout)."""
        signed = self._seed - _U64 if self._seed >= 1 << 63 else self._seed
        return torch.tensor([signed, self._offset], dtype=torch.int64).view(torch.uint8)

    def set_state(self, state: torch.Tensor) -> None:
        s, c = state.contiguous().view(torch.int64).tolist()
        self._seed, self._offset = s % _U64, c


_host: dict[int, _HostGenerator] = {}


def default_generator(device_index: int):
    """The generator random ops on ``tpu:device_index`` draw from when they are given none."""
    core = native.module()
    if core is not None:
        return core.default_generator(device_index)
    g = _host.get(device_index)
    if g is None:
        g = _host[device_index] = _HostGenerator()
    return g


def manual_seed(seed: int, device_index: int = 0) -> None:
    default_generator(device_index).manual_seed(int(seed) % _U64)


def manual_seed_all(seed: int, device_count: int) -> None:
    for i in range(device_count):
        manual_seed(seed, i)


def seed(device_index: int = 0) -> int:
    """Seed ``tpu:device_index`` from a non-deterministic source and return the seed."""
    s = random.getrandbits(63)
    manual_seed(s, device_index)
    return s


def initial_seed(device_index: int = 0) -> int:
    return default_generator(device_index).initial_seed()


def _check_generator(generator: torch.Generator, device_index: int) -> None:
    device = generator.device
    if device.type != "tpu":
        raise RuntimeError(f"Expected a 'tpu' device type for generator but found '{device.type}'")
    if device.index is not None and device.index != device_index:
        raise RuntimeError(f"Expected a generator of tpu:{device_index}, but got one of tpu:{device.index}")


def next_seed_and_counter(device_index: int, generator: torch.Generator | None = None, n: int = 1
                          ) -> tuple[int, int]:
    """The ``(seed, offset)`` inputs of one random op, advancing ``generator`` (default: the device's); with
    ``n``, of ``n`` random ops in a row (a compiled graph's), which take the offsets ``offset .. offset + n - 1``."""
    if generator is None:
        g = default_generator(device_index)
    else:
        _check_generator(generator, device_index)
        g = generator
    seed_value, offset = g.initial_seed(), g.get_offset() + 1
    g.set_offset(offset + n - 1)
    # seeds are folded to 32 bits: the hash's key words are uint32
    return (seed_value ^ (seed_value >> 32)) & 0xFFFF_FFFF, offset


def get_state(device_index: int = 0) -> torch.Tensor:
    """The generator state as 16 bytes (seed and offset, each a 64-bit two's-complement integer, as PyTorch's
    CUDA generator state is a CPU byte tensor): every seed, including those at or above 2**63, round-trips."""
    return default_generator(device_index).get_state()


def set_state(state: torch.Tensor, device_index: int = 0) -> None:
    """Restore a state from :func:`get_state`; anything but 16 bytes in a CPU uint8 tensor is refused (as CUDA
    refuses it), leaving the generator as it was."""
    if (not isinstance(state, torch.Tensor) or state.dtype != torch.uint8 or state.numel() != 16
            or state.device.type != "cpu"):
        got = (f"a {state.dtype} tensor of {state.numel()} elements on {state.device}"
               if isinstance(state, torch.Tensor) else type(state).__name__)
        raise RuntimeError("set_rng_state: expected a torch.uint8 tensor of 16 bytes on the CPU "
                           f"(from get_rng_state), got {got}")
    default_generator(device_index).set_state(state.detach().contiguous())
