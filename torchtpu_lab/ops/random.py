"""random ops.

Draws need not equal CPU's stream (another generator), but their ranges, dtypes and distributions do, and so do
CPU's checks of the arguments: those run at the call (``checks_args``/``checks_calls``), never inside a graph's
trace, where an error would surface at some later, unrelated op."""

from __future__ import annotations

import math

import jax.numpy as jnp
from jax import lax

from . import cpu_rules, random_bits
from .error_flags import report, reports
from .registry import _CPP_TYPES, NoKernel, aten, checks_args, checks_calls, lower

import torch

from .. import dtypes, telemetry


def _factory_dtype(dtype):
    """The JAX dtype a factory draws in: its ``dtype=``, else PyTorch's default dtype."""
    return dtypes.to_jax(dtype or torch.get_default_dtype())


def _uniform(key, shape, dtype, low=0.0, high=1.0):
    """Uniform in ``[low, high)``, drawn in ``dtype`` (float32 for a non-float one). Complex: both parts so, as
    CPU's kernel fills ``view_as_real`` of the tensor (``rand`` of a complex dtype is not real)."""
    jdt = jnp.dtype(dtype)
    if jnp.issubdtype(jdt, jnp.complexfloating):
        re, im = _uniform(key, (2, *shape), jnp.finfo(jdt).dtype, low, high)
        return lax.complex(re, im)
    return random_bits.uniform(key, shape, _sample_dtype(jdt), low, high)


def _normal(key, shape, dtype, mean=0.0, std=1.0):
    """Normal draws of ``mean`` and ``std`` in ``dtype`` (float32 for a non-float one). Complex: each part
    N(mean, std**2 / 2), as CPU's kernel fills ``view_as_real`` of the tensor with ``std / sqrt(2)``."""
    jdt = jnp.dtype(dtype)
    if jnp.issubdtype(jdt, jnp.complexfloating):
        re, im = _normal(key, (2, *shape), jnp.finfo(jdt).dtype, mean, std / math.sqrt(2))
        return lax.complex(re, im)
    return random_bits.normal(key, shape, _sample_dtype(jdt), mean, std)


@checks_args(aten.uniform.default)
def _uniform_args(op, x, low=0.0, high=1.0, *, generator=None) -> None:
    """CPU's checks of ``uniform_``'s bounds against the tensor's dtype (a complex one's parts), which PyTorch's
    meta kernel does not make: without them an inverted or overflowing range draws silently wrong numbers."""
    dtype = x.dtype.to_real() if x.dtype.is_complex else x.dtype
    if not dtype.is_floating_point:
        raise NoKernel(f'"check_uniform_bounds" not implemented for \'{dtypes.scalar_name(dtype)}\'')
    if x.dtype.is_complex and x.numel() == 0:
        return
    lowest, highest = torch.finfo(dtype).min, torch.finfo(dtype).max
    for value, name in ((low, "from"), (high, "to")):
        if not lowest <= value <= highest:
            raise RuntimeError(f"{name} is out of bounds for {dtypes.TYPE_META_NAMES[dtype]}")
    if low > high:
        raise RuntimeError(f"uniform_ expects to return a [from, to) range, but found from={low:g} > to={high:g}")
    if high - low > highest:
        raise RuntimeError(f"uniform_ expects to-from <= std::numeric_limits<{dtypes.scalar_name(dtype)}>::max(), "
                           f"but found to={high:g} and from={low:g} which result in to-from to exceed the limit")


@lower(aten.uniform.default, rng=True)
def uniform(x, low=0.0, high=1.0, *, generator=None, key):
    return _uniform(key, x.shape, x.dtype, low, high)


@lower(aten.normal_functional.default, rng=True)
def normal_functional(x, mean=0.0, std=1.0, *, generator=None, key):
    return _normal(key, x.shape, x.dtype, mean, std)


@lower(aten.randn.default, aten.randn.generator, rng=True)
def randn(size, *args, dtype=None, layout=None, device=None, pin_memory=None, generator=None, key):
    return _normal(key, tuple(size), _factory_dtype(dtype))


@checks_args(aten.rand.default, aten.rand.generator, aten.rand_like.default, aten.rand_like.generator)
def _rand_args(op, first, *args, dtype=None, **kwargs) -> None:
    """CPU has no uniform draws of an integer or bool dtype (PyTorch's meta kernel makes them)."""
    dtype = dtype or (first.dtype if isinstance(first, torch.Tensor) else torch.get_default_dtype())
    if not (dtype.is_floating_point or dtype.is_complex):
        raise NoKernel(f'"check_uniform_bounds" not implemented for \'{dtypes.scalar_name(dtype)}\'')


@lower(aten.rand.default, aten.rand.generator, rng=True)
def rand(size, *args, dtype=None, layout=None, device=None, pin_memory=None, generator=None, key):
    return _uniform(key, tuple(size), _factory_dtype(dtype))


@lower(aten.bernoulli.default, rng=True)
def bernoulli(x, *, generator=None, key):
    return random_bits.unit_uniform(key, x.shape, _probability_dtype(x)) < x


@checks_args(aten.bernoulli.p)
def _bernoulli_p_args(op, x, p=0.5, *, generator=None) -> None:
    """CPU's check of a float ``p``, which PyTorch's meta kernel does not make: outside ``[0, 1]`` the draws would
    silently be all ones or all zeros."""
    if not 0 <= p <= 1:
        raise RuntimeError(f"bernoulli_ expects p to be in [0, 1], but got p={p:g}")


@lower(aten.bernoulli.p, rng=True)
def bernoulli_p(x, p=0.5, *, generator=None, key):
    return random_bits.unit_uniform(key, x.shape, _probability_dtype(x)) < p


@lower(aten.bernoulli.Tensor, rng=True)
def bernoulli_tensor(x, p, *, generator=None, key):
    return jnp.broadcast_to(random_bits.unit_uniform(key, p.shape, _probability_dtype(p)) < p, x.shape)


def _probability_dtype(p):
    """The float a probability tensor is compared in: float64 for float64 (CPU draws a double), else float32."""
    return jnp.float64 if p.dtype == jnp.float64 else jnp.float32


def _sample_dtype(dtype):
    """The dtype to draw floats in: the output's if it is floating, else float32."""
    jdt = jnp.dtype(dtype)
    return jdt if jnp.issubdtype(jdt, jnp.floating) else jnp.dtype(jnp.float32)


def _uniform_open(key, shape, dtype):
    """Uniform in (0, 1]: safe under ``log``."""
    sample = _sample_dtype(dtype)
    return (1 - random_bits.unit_uniform(key, shape, sample)).astype(sample)


def _integers(key, shape, low: int, high: int):
    """Uniform integers in ``[low, high)`` as int64, for any range up to 2**64 (wrapping like PyTorch). The
    bounds were checked at the call (:func:`random_bounds`)."""
    return random_bits.integers(key, tuple(shape), low, high - low)


# ---- random_'s bounds: CPU's random_from_to_impl (ATen/native/DistributionTemplates.h) -------------------------

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def _digits(dtype: torch.dtype) -> int:
    """``std::numeric_limits<T>::digits`` of a float dtype: its significand's bits, the hidden one included."""
    return int(jnp.finfo(dtypes.to_jax(dtype)).nmant) + 1


def _rounded(value: int, dtype: torch.dtype) -> int:
    """``value`` cast to ``dtype`` and back, as C++'s ``static_cast`` does (nearest, ties to even); a value that
    overflows the dtype is returned as is, for the range check to refuse."""
    digits, magnitude = _digits(dtype), abs(value)
    shift = magnitude.bit_length() - digits
    if shift <= 0:
        return value
    q, r = divmod(magnitude, 1 << shift)
    q += r > 1 << (shift - 1) or (r == 1 << (shift - 1) and q & 1)
    out = q << shift
    return value if out > torch.finfo(dtype).max else out if value >= 0 else -out


def _update_from(from_: int, dtype: torch.dtype) -> int:
    """CPU's ``update_from``: the least ``from`` whose draws, rounded to ``dtype``, stay at or above it."""
    up = _rounded(from_ + 1, dtype)
    if up < from_:
        from_ = up + (1 << (abs(from_ + 1).bit_length() - 1 - _digits(dtype) + 1))
    return from_


def _update_to(to: int, dtype: torch.dtype) -> int:
    """CPU's ``update_to``: the greatest ``to`` whose draws, rounded to ``dtype``, stay below it."""
    down = _rounded(to - 1, dtype)
    if down >= to:
        to = down - (1 << (abs(to - 1).bit_length() - 1 - _digits(dtype) + 1))
    return to


def _in_range(dtype: torch.dtype, from_: int, to_inc: int, warn: bool) -> None:
    """CPU's ``check_from_to_in_range``: both ends must fit ``dtype``; a float dtype warns past ``2**digits``,
    beyond which it cannot hold every integer of the range."""
    if dtype.is_floating_point:
        lowest, highest = torch.finfo(dtype).min, torch.finfo(dtype).max
    else:
        lowest, highest = (0, 1) if dtype == torch.bool else (torch.iinfo(dtype).min, torch.iinfo(dtype).max)
    for value, name in ((from_, "from"), (to_inc, "to - 1")):
        if not lowest <= value <= highest:
            raise RuntimeError(f"{name} is out of bounds for {dtypes.TYPE_META_NAMES[dtype]}")
    if not (warn and dtype.is_floating_point):
        return
    digits = _digits(dtype)
    for value, name in ((from_, "from"), (to_inc, "to - 1")):
        if not -(1 << digits) <= value <= 1 << digits:
            cpp = dtypes.TYPE_META_NAMES[dtype]
            telemetry.warn_at_user_line(
                f"{name} is out of bounds [-(2^{digits}), 2^{digits}]. Due to precision limitations {cpp} can support "
                "discrete uniform distribution only within this range. This warning will become an error in version "
                "1.7 release, please fix the code in advance")


def random_bounds(dtype: torch.dtype, from_: int, to: int | None, warn: bool = False) -> tuple[int, int]:
    """``[low, high)`` that ``random_(from_, to)`` draws for a tensor of ``dtype`` (``high - low`` up to 2**64),
    with CPU's errors (and, with ``warn``, its precision warnings). A float dtype's bounds move inward to values
    that rounding to it cannot push out of the range; ``to=None`` means up to the dtype's largest value (for a
    float dtype, ``2**digits``: every integer up to it is exact), and from the int64 minimum, all 2**64 values."""
    if dtype.is_complex:
        raise RuntimeError("check_random_bounds handles only integral, floating-point and boolean types")
    if to is not None:
        if from_ >= to:
            raise RuntimeError(f"random_ expects 'from' to be less than 'to', but got from={from_} >= to={to}")
        if dtype.is_floating_point:
            from_, to = _update_from(from_, dtype), _update_to(to, dtype)
            if from_ >= to:
                raise RuntimeError("random_ expects 'from' casted to dtype to be less than 'to' casted to dtype, "
                                   f"but got from={from_} >= to={to}")
        to_inc = to - 1
    elif from_ == _INT64_MIN:
        if dtype not in (torch.int64, torch.float64, torch.float32, torch.bfloat16):
            raise RuntimeError("random_full_64_bits_range_kernel_cpu handles only int64, double, float and bfloat16")
        return from_, from_ + 2**64
    elif dtype.is_floating_point:
        to_inc = min(1 << _digits(dtype), _INT64_MAX)
        from_ = _update_from(from_, dtype)
        if from_ >= to_inc:
            raise RuntimeError("random_ expects 'from' casted to dtype to be less than or equal to 'to_inc' casted "
                               f"to dtype, but got from={from_} > to_inc={to_inc}")
    else:
        to_inc = 1 if dtype == torch.bool else torch.iinfo(dtype).max
    _in_range(dtype, from_, to_inc, warn)
    return from_, to_inc + 1


def _random_draws(key, shape, dtype, from_: int, to: int | None):
    """A lowering's ``random_(from_, to)`` draws for a result of (JAX or torch) ``dtype``, as int64."""
    torch_dtype = dtype if isinstance(dtype, torch.dtype) else dtypes.to_torch(dtype)
    return _integers(key, shape, *random_bounds(torch_dtype, from_, to))


@checks_calls(aten.random.to)
def _random_to_args(op, x, to, *, generator=None) -> None:
    random_bounds(x.dtype, 0, to, warn=True)


@checks_calls(getattr(aten.random, "from"))
def _random_from_args(op, x, from_, to=None, *, generator=None) -> None:
    random_bounds(x.dtype, from_, to, warn=True)


@checks_calls(aten.randint.default, aten.randint.generator, aten.randint.low, aten.randint.low_generator)
def _randint_args(op, *args, dtype=None, **_) -> None:
    """``randint`` is ``random_`` of a new tensor on CPU: the same checks, for its ``dtype`` (int64 by default)."""
    low, high = (0, args[0]) if op in (aten.randint.default, aten.randint.generator) else args[:2]
    random_bounds(dtype or torch.int64, low, high, warn=True)


@checks_calls(aten.randint_like.default, aten.randint_like.generator, aten.randint_like.low_dtype,
              aten.randint_like.low_generator_dtype)
def _randint_like_args(op, x, *args, dtype=None, **_) -> None:
    low, high = (0, args[0]) if op in (aten.randint_like.default, aten.randint_like.generator) else args[:2]
    random_bounds(dtype or x.dtype, low, high, warn=True)


@lower(aten.randint.default, aten.randint.generator, rng=True)
def randint(high, size, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None, key):
    return _random_draws(key, tuple(size), dtype or torch.int64, 0, high)


@lower(aten.randint.low, aten.randint.low_generator, rng=True)
def randint_low(low, high, size, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None,
                key):
    return _random_draws(key, tuple(size), dtype or torch.int64, low, high)


@lower(aten.randint_like.default, aten.randint_like.generator, rng=True)
def randint_like(x, high, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None,
                 memory_format=None, key):
    return _random_draws(key, x.shape, dtype or x.dtype, 0, high)


@lower(aten.randint_like.low_dtype, aten.randint_like.low_generator_dtype, rng=True)
def randint_like_low(x, low, high, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None,
                     memory_format=None, key):
    return _random_draws(key, x.shape, dtype or x.dtype, low, high)


@lower(aten.randint_like.Tensor, aten.randint_like.Tensor_generator, rng=True)
def randint_like_tensor(x, high, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None,
                        memory_format=None, key):
    return random_bits.integers_below(key, x.shape, high)


@lower(aten.rand_like.default, aten.rand_like.generator, rng=True)
def rand_like(x, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None,
              key):
    return _uniform(key, x.shape, dtypes.to_jax(dtype) if dtype else x.dtype)


@lower(aten.randn_like.default, aten.randn_like.generator, rng=True)
def randn_like(x, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None,
               key):
    return _normal(key, x.shape, dtypes.to_jax(dtype) if dtype else x.dtype)


@lower(aten.random.default, rng=True)
def random(x, *, generator=None, key):
    return _random_draws(key, x.shape, x.dtype, 0, None)  # CPU's random_() draws what random_(0) does


@lower(aten.random.to, rng=True)
def random_to(x, to, *, generator=None, key):
    return _random_draws(key, x.shape, x.dtype, 0, to)


@lower(getattr(aten.random, "from"), rng=True)
def random_from(x, from_, to=None, *, generator=None, key):
    return _random_draws(key, x.shape, x.dtype, from_, to)


def _std_not_negative(std) -> None:
    """CPU's check of a tensor ``std``: a data-dependent error, reported (raised at the next sync), where drawing
    with a negative scale would silently give numbers of the wrong sign."""
    report(std < 0, error=RuntimeError, message="normal expects all elements of std >= 0.0")


@lower(aten.normal.Tensor_float, rng=True)
def normal_tensor_float(mean, std=1.0, *, generator=None, key):
    return mean + _normal(key, mean.shape, mean.dtype, 0.0, std)


@lower(aten.normal.float_Tensor, rng=True)
@reports
def normal_float_tensor(mean, std, *, generator=None, key):
    _std_not_negative(std)
    return mean + std * _normal(key, std.shape, std.dtype)


@lower(aten.normal.Tensor_Tensor, rng=True)
@reports
def normal_tensor_tensor(mean, std, *, generator=None, key):
    _std_not_negative(std)
    shape = jnp.broadcast_shapes(mean.shape, std.shape)
    return mean + std * _normal(key, shape, jnp.result_type(mean, std))


@lower(aten.normal.float_float, rng=True)
def normal_float_float(mean, std, size, *, generator=None, dtype=None, layout=None, device=None,
                       pin_memory=None, key):
    return _normal(key, tuple(size), _factory_dtype(dtype), mean, std)


def _about_parameters(e: BaseException) -> bool:
    return isinstance(e, RuntimeError)  # NotImplementedError included: CPU's refusal of an integer tensor


@checks_args(aten.normal_functional.default, aten.exponential.default, aten.geometric.default,
             aten.log_normal.default, aten.cauchy.default)
def _distribution_args(op, *args, **kwargs) -> None:
    """CPU's errors for a distribution's parameters and the tensor's dtype, asked of its kernel on a stand-in:
    PyTorch's meta kernels print a parameter as Python does ('std=-1.0' for C++'s 'std=-1'), name a dtype as
    ``torch.int64`` ('Long') and raise RuntimeError where CPU raises NotImplementedError."""
    cpu_rules.raise_refusal(op, args, kwargs, _about_parameters, values=True)


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
    return jnp.exp(mean + std * _normal(key, x.shape, x.dtype))


@lower(aten.cauchy.default, rng=True)
def cauchy(x, median=0.0, sigma=1.0, *, generator=None, key):
    u = random_bits.unit_uniform(key, x.shape, _sample_dtype(x.dtype))
    return median + sigma * jnp.tan(jnp.pi * (u - 0.5))


@checks_args(aten.multinomial.default)
def _multinomial_args(op, probs, num_samples, replacement=False, **_) -> None:
    """CPU's checks, in its order and wording, where PyTorch's meta kernel words the rank check otherwise and makes
    none of the others: an integer input, ``num_samples <= 0``, or more samples than categories without replacement
    ran (JAX's ``top_k`` raising ValueError for the last)."""
    if not 0 < probs.dim() <= 2:
        raise RuntimeError("prob_dist must be 1 or 2 dim")
    if not probs.dtype.is_floating_point:
        raise RuntimeError(f"multinomial only supports floating-point dtypes for input, got: "
                           f"{dtypes.scalar_name(probs.dtype)}")
    if num_samples <= 0:
        raise RuntimeError("cannot sample n_sample <= 0 samples")
    if not replacement and num_samples > probs.shape[-1]:
        raise RuntimeError("cannot sample n_sample > prob_dist.size(-1) samples without replacement")
    if probs.shape[-1] > 2**24:
        raise RuntimeError("number of categories cannot exceed 2^24")


@lower(aten.multinomial.default, rng=True)
@reports
def multinomial(probs, num_samples, replacement=False, *, generator=None, key):
    """Rows of ``probs`` are unnormalized weights. Without replacement: Gumbel top-k (distinct indices). A row of
    zeros is CPU's error (reported): its draws would be arbitrary indices, a silent wrong answer."""
    report(~(probs >= 0) | ~jnp.isfinite(probs), error=RuntimeError,
           message="probability tensor contains either `inf`, `nan` or element < 0")
    report(jnp.sum(probs, axis=-1) == 0, error=RuntimeError,
           message="invalid multinomial distribution (sum of probabilities <= 0)")
    logits = jnp.log(probs.astype(jnp.float64) if probs.dtype == jnp.float64 else probs.astype(jnp.float32))
    if replacement:  # Gumbel-max: one independent draw per sample
        noise = random_bits.gumbel(key, (*logits.shape[:-1], num_samples, logits.shape[-1]), logits.dtype)
        return jnp.argmax(logits[..., None, :] + noise, axis=-1).astype(jnp.int64)
    perturbed = logits + random_bits.gumbel(key, logits.shape, logits.dtype)
    return lax.top_k(perturbed, num_samples)[1].astype(jnp.int64)


#: The largest ``n`` CPU's ``randperm`` permutes into a float dtype, as its message spells it: past it, some of
#: ``0..n-1`` would round onto others (CPU makes no such check for bfloat16)
_RANDPERM_LIMITS = {torch.float16: (2**11 + 1, "2049"), torch.float32: (2**24 + 1, "2^24+1"),
                    torch.float64: (2**53 + 1, "2^53+1")}


@checks_args(aten.randperm.default, aten.randperm.generator)
def _randperm_args(op, n, *, dtype=None, **_) -> None:
    """CPU's check that ``0..n-1`` fit the result's dtype, which PyTorch's meta kernel does not make: without it
    an integer dtype wraps and a float one rounds, and the "permutation" repeats values."""
    dtype = dtype or torch.int64
    limit = _RANDPERM_LIMITS.get(dtype)
    if limit is not None and n > limit[0]:
        raise RuntimeError(f"n cannot be greater than {limit[1]} for {dtypes.scalar_name(dtype)} type.")
    if not dtype.is_floating_point and dtype != torch.bool and n - 1 > torch.iinfo(dtype).max:
        raise RuntimeError(f"value cannot be converted to type {_CPP_TYPES[str(dtype).split('.')[-1]]} "
                           "without overflow")


@lower(aten.randperm.default, aten.randperm.generator, rng=True)
def randperm(n, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None, key):
    return random_bits.permutation(key, n)


@lower(aten.native_dropout.default, rng=True)
def native_dropout(x, p, train, *, key):
    """``(x * mask / (1 - p), mask)`` with ``mask`` kept with probability ``1 - p``; identity when not training."""
    if train is False:
        return x, jnp.ones(x.shape, jnp.bool_)
    keep = 1.0 - p
    mask = random_bits.unit_uniform(key, x.shape, jnp.float32) < keep
    scale = 0.0 if keep == 0 else 1.0 / keep
    return x * mask * scale, mask


@lower(aten.native_dropout_backward.default)
def native_dropout_backward(grad, mask, scale):
    return grad * mask * scale
