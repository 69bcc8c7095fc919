"""Counter-based random bits for the random lowerings, and the draws built from them.

Every random op gets a key of two numbers, the generator's seed and the op's offset (its counter), and hashes
``(counter, element index)`` with Threefry-2x32 (20 rounds) under the seed. Why our own hash rather than
``jax.random``: XLA:CPU spends ~0.15 s compiling each ``jax.random`` draw in a graph (a ``fold_in`` of the key is
a second hash, and JAX's partitionable threefry adds 64-bit index arithmetic), so a graph that initializes 25
``nn.Linear`` layers compiled for 17 s; one plain hash per draw, with the key as graph inputs, compiles about
three times faster (docs/perf.md, thirty-fourth pass). The numbers depend only on (seed, counter, element): the
same on CPU, GPU and TPU, and in debug, strict and fused mode, where a draw is one node of a larger graph.

The distributions follow CPU's kernels (ATen's ``uniform_real_distribution``, ``normal_distribution`` and
``random_from_to``): a float takes as many bits as its significand holds and the arithmetic runs in float32 (in
float64 for float64) before one rounding to the result's dtype; normals are Box-Muller's; integer draws
reduce 32 random bits modulo the range, or 64 bits for a range past 2**32.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np
from jax import lax

_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_PARITY = np.uint32(0x1BD11BDA)  # Threefry's key-schedule constant


class DrawKey(NamedTuple):
    """The key of one random op inside a trace: the generator's seed (folded to 32 bits) and the op's offset, as
    traced integers (graph inputs, so a new offset runs the same executable)."""

    seed: object
    counter: object


def _u32(value):
    return jnp.asarray(value).astype(jnp.uint32)


def _rotl(x, r: int):
    return (x << np.uint32(r)) | (x >> np.uint32(32 - r))


def threefry2x32(k0, k1, x0, x1):
    """Threefry-2x32 with 20 rounds (Salmon et al., 2011) of the counter words ``(x0, x1)`` under the key words
    ``(k0, k1)``, all uint32 and broadcastable: two uint32 words per counter."""
    keys = (k0, k1, k0 ^ k1 ^ _PARITY)
    x0, x1 = x0 + k0, x1 + k1
    for block in range(5):
        for r in _ROTATIONS[block % 2]:
            x0 = x0 + x1
            x1 = _rotl(x1, r) ^ x0
        x0 = x0 + keys[(block + 1) % 3]
        x1 = x1 + keys[(block + 2) % 3] + np.uint32(block + 1)
    return x0, x1


def _words(key: DrawKey, n: int, start: int = 0):
    """The two hash words of elements ``start .. start+n-1`` of the draw ``key`` names. The counter's high 32 bits
    go into the hashed words, so offsets past 2**32 stay distinct. A draw takes one hash per element and uses
    its words in place: splitting one hash's two words across elements (a concatenation) made XLA:CPU emit the
    hash twice and doubled the draw's compile time."""
    counter = jnp.asarray(key.counter)
    high = (counter >> 32).astype(jnp.uint32) if counter.dtype.itemsize == 8 else jnp.uint32(0)
    index = lax.iota(jnp.uint32, n) + np.uint32(start) if start else lax.iota(jnp.uint32, n)
    return threefry2x32(_u32(key.seed), _u32(counter), index, jnp.broadcast_to(high, (n,)))


def bits32(key: DrawKey, n: int):
    """``n`` random uint32 words."""
    return _words(key, n)[0]


def bits64(key: DrawKey, n: int, start: int = 0):
    """``n`` random uint64 words (elements ``start ..`` of the draw)."""
    first, second = _words(key, n, start)
    return (first.astype(jnp.uint64) << np.uint64(32)) | second.astype(jnp.uint64)


def _grid(words, digits: int):
    """Random words as floats in [0, 1), ``2**-digits`` apart (the top ``digits`` bits)."""
    if words.dtype == jnp.uint64:
        return (words >> np.uint64(64 - digits)).astype(jnp.float64) * (2.0 ** -digits)
    return (words >> np.uint32(32 - digits)).astype(jnp.float32) * np.float32(2.0 ** -digits)


def compute_dtype(dtype) -> jnp.dtype:
    """The dtype a float draw of ``dtype`` computes in: float64 for float64, float32 otherwise (CPU's accumulate
    type for the half types)."""
    return jnp.dtype(jnp.float64) if jnp.dtype(dtype) == jnp.float64 else jnp.dtype(jnp.float32)


def _digits(dtype) -> int:
    return int(jnp.finfo(dtype).nmant) + 1


def unit_uniform(key: DrawKey, shape: tuple, dtype):
    """Uniform in [0, 1) on the grid of ``dtype``'s significand (``2**-digits`` apart: every value exact in
    ``dtype``), in :func:`compute_dtype`."""
    n = math.prod(shape)
    words = bits64(key, n) if compute_dtype(dtype) == jnp.float64 else bits32(key, n)
    return _grid(words, _digits(dtype)).reshape(shape)


def uniform(key: DrawKey, shape: tuple, dtype, low=0.0, high=1.0):
    """Uniform in ``[low, high)`` as CPU's kernel draws it: ``low + (high - low) * u`` in the compute dtype,
    rounded once to float ``dtype``."""
    return (unit_uniform(key, shape, dtype) * (high - low) + low).astype(dtype)


def normal(key: DrawKey, shape: tuple, dtype, mean=0.0, std=1.0):
    """Normal draws of ``mean`` and ``std`` in float ``dtype``: Box-Muller on two uniforms per element (the two
    words of its hash; two 64-bit draws for float64), its cosine half, in the compute dtype, rounded once."""
    n, digits = math.prod(shape), _digits(dtype)
    if compute_dtype(dtype) == jnp.float64:
        u, v = _grid(bits64(key, n), digits), _grid(bits64(key, n, n), digits)
    else:
        u, v = (_grid(w, digits) for w in _words(key, n))
    radius = jnp.sqrt(-2.0 * jnp.log1p(-u))  # 1 - u is in (0, 1]
    return (radius * jnp.cos((2 * math.pi) * v) * std + mean).reshape(shape).astype(dtype)


def gumbel(key: DrawKey, shape: tuple, dtype):
    """Standard Gumbel draws ``-log(-log(u))``, ``u`` in ``[tiny, 1)``: finite everywhere."""
    cdt = compute_dtype(dtype)
    u = jnp.maximum(unit_uniform(key, shape, dtype), jnp.finfo(cdt).tiny)
    return (-jnp.log(-jnp.log(u))).astype(dtype)


def integers(key: DrawKey, shape: tuple, low: int, span: int):
    """Integers in ``[low, low + span)`` as int64 (wrapping past the int64 range, as PyTorch's do), ``span`` up to
    2**64: 32 random bits modulo the span, 64 for a span past 2**32 (CPU's ``random_from_to``)."""
    n = math.prod(shape)
    if span <= 2**32:
        words = bits32(key, n)
        offset = (words if span == 2**32 else words % np.uint32(span)).astype(jnp.uint64)
    else:
        words = bits64(key, n)
        offset = words if span == 2**64 else words % np.uint64(span)
    return lax.bitcast_convert_type(offset + np.uint64(low % 2**64), jnp.int64).reshape(shape)


def integers_below(key: DrawKey, shape: tuple, high):
    """Integers in ``[0, high)`` for a traced ``high`` (64 random bits modulo it); ``high <= 0`` draws zeros."""
    span = jnp.maximum(jnp.asarray(high).astype(jnp.int64), 1).astype(jnp.uint64)
    return (bits64(key, math.prod(shape)).reshape(shape) % span).astype(jnp.int64)


def permutation(key: DrawKey, n: int):
    """A uniformly random permutation of ``0 .. n-1`` (int64): the indices sorted by 64 random bits each, as two
    uint32 sort keys (ties, 2**-64 apart, keep index order)."""
    first, second = _words(key, n)
    return lax.sort((first, second, lax.iota(jnp.int64, n)), num_keys=2)[2]
