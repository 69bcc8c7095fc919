"""Custom kernels: JAX and Pallas functions as PyTorch ops on the tpu device (:mod:`.jax_op`)."""

from __future__ import annotations

from .jax_op import call_jax, jax_op, op_of

__all__ = ["jax_op", "call_jax", "op_of"]
