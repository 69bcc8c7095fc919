"""PyTorch-style stateful random numbers on top of JAX's explicit keys.

Each ``tpu:i`` has a seed and a counter. Every random op takes ``(seed, counter)`` and advances the counter; the
lowering derives its key as ``fold_in(key(seed), counter)`` *inside* the compiled function, so the key is a
graph input rather than a constant: a fused training step with dropout draws a fresh mask every step without
recompiling. ``torch.manual_seed`` reaches :func:`manual_seed_all` through ``torch.tpu``, so seeding is the same
call as on CUDA and runs are reproducible. The streams differ from PyTorch's CPU generator (as CUDA's do).
"""

from __future__ import annotations

import random

import torch

_DEFAULT_SEED = 67280421310721  # PyTorch's default_rng_seed_val
_state: dict[int, list[int]] = {}


def _get(device_index: int) -> list[int]:
    st = _state.get(device_index)
    if st is None:
        st = _state[device_index] = [_DEFAULT_SEED, 0]
    return st


def manual_seed(seed: int, device_index: int = 0) -> None:
    _state[device_index] = [int(seed) & 0xFFFF_FFFF_FFFF_FFFF, 0]


def manual_seed_all(seed: int, device_count: int) -> None:
    for i in range(device_count):
        manual_seed(seed, i)


def seed(device_index: int = 0) -> int:
    """Seed ``tpu:device_index`` from a non-deterministic source and return the seed."""
    s = random.getrandbits(63)
    manual_seed(s, device_index)
    return s


def initial_seed(device_index: int = 0) -> int:
    return _get(device_index)[0]


def next_seed_and_counter(device_index: int) -> tuple[int, int]:
    st = _get(device_index)
    st[1] += 1
    # seeds are folded to 32 bits: jax.random.key takes a uint32 seed on every platform
    return (st[0] ^ (st[0] >> 32)) & 0xFFFF_FFFF, st[1]


_U64 = 1 << 64


def get_state(device_index: int = 0) -> torch.Tensor:
    """The generator state as 16 bytes (seed and counter, each a 64-bit two's-complement int64, as PyTorch's
    CUDA generator state is a byte tensor): every seed, including those at or above 2**63, round-trips."""
    s, c = _get(device_index)
    signed = s - _U64 if s >= 1 << 63 else s
    return torch.tensor([signed, c], dtype=torch.int64).view(torch.uint8)


def set_state(state: torch.Tensor, device_index: int = 0) -> None:
    if not isinstance(state, torch.Tensor) or state.dtype != torch.uint8 or state.numel() != 16:
        got = (f"a {state.dtype} tensor of {state.numel()} elements" if isinstance(state, torch.Tensor)
               else type(state).__name__)
        raise RuntimeError(f"set_rng_state: expected a torch.uint8 tensor of 16 bytes (from get_rng_state), got {got}")
    s, c = state.detach().cpu().contiguous().view(torch.int64).tolist()
    _state[device_index] = [s % _U64, c]
