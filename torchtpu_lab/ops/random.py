"""random ops."""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from .error_flags import report, reports
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


@lower(aten.bernoulli.Tensor, rng=True)
def bernoulli_tensor(x, p, *, generator=None, key):
    return jnp.broadcast_to(jax.random.uniform(key, p.shape, dtype=jnp.float32) < p, x.shape)


def _sample_dtype(dtype):
    """The dtype to draw floats in: the output's if it is floating, else float32."""
    jdt = jnp.dtype(dtype)
    return jdt if jnp.issubdtype(jdt, jnp.floating) else jnp.dtype(jnp.float32)


def _uniform_open(key, shape, dtype):
    """Uniform in (0, 1]: safe under ``log``."""
    return 1 - jax.random.uniform(key, shape, dtype=_sample_dtype(dtype))


def _integers(key, shape, low: int, high: int):
    """Uniform integers in ``[low, high)`` as int64, for any range up to 2**64 (wrapping like PyTorch)."""
    span = high - low
    if span <= 0:
        raise RuntimeError(f"random_ expects 'from' to be less than 'to', but got from={low} >= to={high}")
    if span <= 2**62:
        return jax.random.randint(key, shape, low, high, dtype=jnp.int64)
    bits = jax.random.bits(key, shape, dtype=jnp.uint64)
    offset = bits if span == 2**64 else bits % jnp.uint64(span)
    return lax.bitcast_convert_type(offset + jnp.uint64(low % 2**64), jnp.int64)


def _dtype_top(dtype) -> int:
    """One past the largest value ``random_()`` without ``to`` draws for ``dtype`` (PyTorch's rule)."""
    jdt = jnp.dtype(dtype)
    if jdt == jnp.bool_:
        return 2
    if jnp.issubdtype(jdt, jnp.floating):
        return 2 ** jnp.finfo(jdt).nmant + 2  # [0, 2**digits] inclusive
    return int(jnp.iinfo(jdt).max) + 1


@lower(aten.randint.default, aten.randint.generator, rng=True)
def randint(high, size, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None, key):
    return _integers(key, tuple(size), 0, high)


@lower(aten.randint.low, aten.randint.low_generator, rng=True)
def randint_low(low, high, size, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None,
                key):
    return _integers(key, tuple(size), low, high)


@lower(aten.randint_like.default, aten.randint_like.generator, rng=True)
def randint_like(x, high, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None,
                 memory_format=None, key):
    return _integers(key, x.shape, 0, high)


@lower(aten.randint_like.low_dtype, aten.randint_like.low_generator_dtype, rng=True)
def randint_like_low(x, low, high, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None,
                     memory_format=None, key):
    return _integers(key, x.shape, low, high)


@lower(aten.randint_like.Tensor, aten.randint_like.Tensor_generator, rng=True)
def randint_like_tensor(x, high, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None,
                        memory_format=None, key):
    return jax.random.randint(key, x.shape, 0, high.astype(jnp.int64), dtype=jnp.int64)


@lower(aten.rand_like.default, aten.rand_like.generator, rng=True)
def rand_like(x, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None,
              key):
    return jax.random.uniform(key, x.shape, dtype=_sample_dtype(dtypes.to_jax(dtype) if dtype else x.dtype))


@lower(aten.randn_like.default, aten.randn_like.generator, rng=True)
def randn_like(x, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None,
               key):
    return jax.random.normal(key, x.shape, dtype=_sample_dtype(dtypes.to_jax(dtype) if dtype else x.dtype))


@lower(aten.random.default, rng=True)
def random(x, *, generator=None, key):
    return _integers(key, x.shape, 0, _dtype_top(x.dtype))


@lower(aten.random.to, rng=True)
def random_to(x, to, *, generator=None, key):
    return _integers(key, x.shape, 0, to)


@lower(getattr(aten.random, "from"), rng=True)
def random_from(x, from_, to=None, *, generator=None, key):
    return _integers(key, x.shape, from_, _dtype_top(x.dtype) if to is None else to)


@lower(aten.normal.Tensor_float, rng=True)
def normal_tensor_float(mean, std=1.0, *, generator=None, key):
    return mean + std * jax.random.normal(key, mean.shape, dtype=_sample_dtype(mean.dtype))


@lower(aten.normal.float_Tensor, rng=True)
def normal_float_tensor(mean, std, *, generator=None, key):
    return mean + std * jax.random.normal(key, std.shape, dtype=_sample_dtype(std.dtype))


@lower(aten.normal.Tensor_Tensor, rng=True)
def normal_tensor_tensor(mean, std, *, generator=None, key):
    shape = jnp.broadcast_shapes(mean.shape, std.shape)
    return mean + std * jax.random.normal(key, shape, dtype=_sample_dtype(jnp.result_type(mean, std)))


@lower(aten.normal.float_float, rng=True)
def normal_float_float(mean, std, size, *, generator=None, dtype=None, layout=None, device=None,
                       pin_memory=None, key):
    jdt = _float_dtype(dtype or torch.get_default_dtype())
    return mean + std * jax.random.normal(key, tuple(size), dtype=jdt)


@lower(aten.exponential.default, rng=True)
def exponential(x, lambd=1.0, *, generator=None, key):
    return -jnp.log(_uniform_open(key, x.shape, x.dtype)) / lambd


@lower(aten.geometric.default, rng=True)
def geometric(x, p, *, generator=None, key):
    """Number of Bernoulli(p) trials up to the first success: at least 1."""
    u = _uniform_open(key, x.shape, jnp.float64)
    return jnp.maximum(jnp.ceil(jnp.log(u) / jnp.log1p(-p)), 1)


@lower(aten.log_normal.default, rng=True)
def log_normal(x, mean=1.0, std=2.0, *, generator=None, key):
    return jnp.exp(mean + std * jax.random.normal(key, x.shape, dtype=_sample_dtype(x.dtype)))


@lower(aten.cauchy.default, rng=True)
def cauchy(x, median=0.0, sigma=1.0, *, generator=None, key):
    u = jax.random.uniform(key, x.shape, dtype=_sample_dtype(x.dtype))
    return median + sigma * jnp.tan(jnp.pi * (u - 0.5))


@lower(aten.multinomial.default, rng=True)
@reports
def multinomial(probs, num_samples, replacement=False, *, generator=None, key):
    """Rows of ``probs`` are unnormalized weights. Without replacement: Gumbel top-k (distinct indices)."""
    report(~(probs >= 0) | ~jnp.isfinite(probs), error=RuntimeError,
           message="probability tensor contains either `inf`, `nan` or element < 0")
    logits = jnp.log(probs.astype(jnp.float64) if probs.dtype == jnp.float64 else probs.astype(jnp.float32))
    if replacement:
        draws = jax.random.categorical(key, logits, axis=-1, shape=(num_samples, *logits.shape[:-1]))
        return jnp.moveaxis(draws, 0, -1).astype(jnp.int64)
    perturbed = logits + jax.random.gumbel(key, logits.shape, dtype=logits.dtype)
    return lax.top_k(perturbed, num_samples)[1].astype(jnp.int64)


@lower(aten.randperm.default, aten.randperm.generator, rng=True)
def randperm(n, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None, key):
    return jax.random.permutation(key, n).astype(jnp.int64)


@lower(aten.native_dropout.default, rng=True)
def native_dropout(x, p, train, *, key):
    """``(x * mask / (1 - p), mask)`` with ``mask`` kept with probability ``1 - p``; identity when not training."""
    if train is False:
        return x, jnp.ones(x.shape, jnp.bool_)
    keep = 1.0 - p
    mask = jax.random.uniform(key, x.shape, dtype=jnp.float32) < keep
    scale = 0.0 if keep == 0 else 1.0 / keep
    return x * mask * scale, mask


@lower(aten.native_dropout_backward.default)
def native_dropout_backward(grad, mask, scale):
    return grad * mask * scale
