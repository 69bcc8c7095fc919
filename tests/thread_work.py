"""The workload of the kernel-lock tests (tests/test_kernel_lock.py, and tests/threads_storm.py in a child):
a chain of steps mixing an op made with ``jax_op``, built-in ops and a ``torch.compile(backend="tpu")`` module,
run on tpu tensors next to the same chain on CPU tensors, syncing every ``SYNC_EVERY`` steps."""

from __future__ import annotations

import copy

import jax
import jax.numpy as jnp
import torch

import torchtpu_lab

D = "tpu"
SYNC_EVERY = 7


class Ops:
    """The three kinds of kernel a step uses, made once per process (a ``jax_op`` name is process-wide)."""

    def __init__(self) -> None:
        @torchtpu_lab.jax_op("thread_work::scaled_tanh")
        def scaled_tanh(x: jax.Array, s: float) -> jax.Array:
            return jnp.tanh(x) * s

        self.scaled_tanh = scaled_tanh
        self.cpu_linear = torch.nn.Linear(16, 16)
        self.compiled = torch.compile(copy.deepcopy(self.cpu_linear).to(D), backend="tpu")

    def step(self, a: torch.Tensor, w: torch.Tensor, on_tpu: bool) -> torch.Tensor:
        if on_tpu:
            return torch.tanh(self.compiled(self.scaled_tanh(a @ w, 1.5) + 0.1))
        x = torch.tanh(a @ w) * 1.5 + 0.1  # what scaled_tanh computes, on CPU
        return torch.tanh(self.cpu_linear(x)).detach()


def inputs(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(4, 16, generator=g), torch.randn(16, 16, generator=g) * 0.3


def chain(ops: Ops, seed: int, steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``steps`` steps from the inputs of ``seed``: the tpu result (on the host) and the CPU one."""
    a, w = inputs(seed)
    at, wt = a.to(D), w.to(D)
    for i in range(steps):
        a = ops.step(a, w, False)
        at = ops.step(at, wt, True)
        if i % SYNC_EVERY == SYNC_EVERY - 1:
            torchtpu_lab.sync()
    return at.cpu(), a
