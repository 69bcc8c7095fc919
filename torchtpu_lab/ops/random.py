"""random ops."""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from .registry import aten, lower

import jax
import torch

from .. import dtypes


def _float_dtype(dtype):
    return dtypes.to_jax(dtype) if dtype is not None and dtype.is_floating_point else jnp.float32


@lower(aten.uniform.default, rng=True)
def uniform(x, low=0.0, high=1.0, *, generator=None, key):
    u = jax.random.uniform(key, x.shape, dtype=x.dtype if jnp.issubdtype(x.dtype, jnp.floating) else jnp.float32)
    return u * (high - low) + low


@lower(aten.normal_functional.default, rng=True)
def normal_functional(x, mean=0.0, std=1.0, *, generator=None, key):
    return jax.random.normal(key, x.shape, dtype=x.dtype) * std + mean


@lower(aten.randn.default, aten.randn.generator, rng=True)
def randn(size, *args, dtype=None, layout=None, device=None, pin_memory=None, generator=None, key):
    return jax.random.normal(key, tuple(size), dtype=_float_dtype(dtype or torch.get_default_dtype()))


@lower(aten.rand.default, aten.rand.generator, rng=True)
def rand(size, *args, dtype=None, layout=None, device=None, pin_memory=None, generator=None, key):
    return jax.random.uniform(key, tuple(size), dtype=_float_dtype(dtype or torch.get_default_dtype()))


@lower(aten.bernoulli.default, rng=True)
def bernoulli(x, *, generator=None, key):
    return jax.random.uniform(key, x.shape, dtype=jnp.float32) < x


@lower(aten.bernoulli.p, rng=True)
def bernoulli_p(x, p=0.5, *, generator=None, key):
    return jax.random.uniform(key, x.shape, dtype=jnp.float32) < p
