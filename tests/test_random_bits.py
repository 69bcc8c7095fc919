"""The random ops' own hash (``ops/random_bits``): it is Threefry-2x32-20 (Random123's known answers), every
distribution built on it draws what it says (grids exact in the dtype, moments, ranges, permutations), a draw
compiles to one hash per element without the concatenation that made XLA:CPU emit it twice, and fused graphs of
many draws give what each op gives alone. (Importing torchtpu_lab enables JAX's 64-bit types.)"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import torchtpu_lab
from torchtpu_lab.ops import random_bits as rb


@pytest.mark.parametrize("key, counter, expected", [
    # Random123's known-answer vectors for threefry2x32_20 (kat_vectors)
    ((0, 0), (0, 0), (0x6B200159, 0x99BA4EFE)),
    ((0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF), (0x1CB996FC, 0xBB002BE7)),
    ((0x13198A2E, 0x03707344), (0x243F6A88, 0x85A308D3), (0xC4923A9C, 0x483DF7A0)),
])
def test_the_hash_is_threefry_2x32_20(key, counter, expected):
    words = rb.threefry2x32(*(jnp.uint32(v) for v in key + counter))
    assert tuple(int(w) for w in words) == expected


def _key(seed=7, counter=3):
    return rb.DrawKey(jnp.int64(seed), jnp.int64(counter))


def test_draws_depend_on_seed_counter_and_the_counters_high_word():
    base = np.asarray(rb.bits32(_key(), 64))
    assert np.array_equal(base, np.asarray(rb.bits32(_key(), 64)))
    for other in (_key(seed=8), _key(counter=4), _key(counter=3 + 2**32)):
        assert (base != np.asarray(rb.bits32(other, 64))).mean() > 0.99
    # a longer draw of the same key starts with the shorter one: an element's bits depend on its index only
    assert np.array_equal(base, np.asarray(rb.bits32(_key(), 100))[:64])


@pytest.mark.parametrize("dtype, digits", [(jnp.bfloat16, 8), (jnp.float16, 11), (jnp.float32, 24),
                                           (jnp.float64, 53)])
def test_unit_uniform_is_on_the_dtypes_grid_in_zero_one(dtype, digits):
    u = np.asarray(rb.unit_uniform(_key(), (20000,), dtype), np.float64)
    assert u.min() >= 0 and u.max() < 1
    scaled = u * 2.0**digits
    assert np.array_equal(scaled, np.floor(scaled))  # every value exact in dtype, none rounds up to 1
    assert abs(u.mean() - 0.5) < 0.01 and abs(u.std() - math.sqrt(1 / 12)) < 0.01
    assert np.array_equal(np.asarray(jnp.asarray(u).astype(dtype), np.float64), u)


def test_normal_moments_and_tails():
    z = np.asarray(rb.normal(_key(), (200000,), jnp.float32), np.float64)
    assert abs(z.mean()) < 0.01 and abs(z.std() - 1) < 0.01
    assert abs((np.abs(z) > 2).mean() - 0.0455) < 0.003 and np.isfinite(z).all()
    w = np.asarray(rb.normal(_key(counter=9), (200000,), jnp.float32, 3.0, 0.5), np.float64)
    assert abs(w.mean() - 3) < 0.01 and abs(w.std() - 0.5) < 0.01
    assert abs(np.corrcoef(z, w)[0, 1]) < 0.01


@pytest.mark.parametrize("low, span", [(0, 7), (-5, 2**32), (2**40, 2**33 + 5), (-(2**63), 2**64)])
def test_integers_cover_their_range(low, span):
    x = np.asarray(rb.integers(_key(), (4000,), low, span)).astype(object)
    wrapped = [(v - low) % 2**64 for v in x]
    assert all(0 <= w < span for w in wrapped)
    if span == 7:
        counts = np.bincount(np.asarray(x, np.int64), minlength=7)
        assert counts.min() > 4000 / 7 * 0.85
    else:  # the draws spread over the range, not its low 32 bits only
        assert max(wrapped) > span * 0.9 and min(wrapped) < span * 0.1


def test_permutation_is_a_uniform_permutation():
    perms = [np.asarray(rb.permutation(_key(counter=c), 6)) for c in range(3000)]
    assert all(sorted(p) == list(range(6)) for p in perms)
    first = np.bincount([p[0] for p in perms], minlength=6) / 3000
    assert np.abs(first - 1 / 6).max() < 0.03
    big = np.asarray(rb.permutation(_key(), 1000))
    assert abs(np.abs(big - np.arange(1000)).mean() - 333) < 25  # E|p(i) - i| = (n^2 - 1) / 3n


def test_a_draw_compiles_to_one_hash_per_element_without_concatenation():
    hlo = jax.jit(lambda s, c: rb.uniform(rb.DrawKey(s, c), (37, 5), jnp.float32, -1, 1)).lower(
        np.int64(1), np.int64(2)).as_text()
    assert "concatenate" not in hlo
    # one Threefry-20 over the 185 elements: 20 rounds, one xor each, less the last (its word is unused by a
    # 32-bit draw); the key schedule's xors are on scalars
    assert len([line for line in hlo.splitlines() if "stablehlo.xor" in line and "185x" in line]) == 19


def test_a_fused_graph_of_many_draws_gives_each_ops_own_draws():
    shapes = [(3 + i, 5) for i in range(6)]

    def draws():
        torch.manual_seed(11)
        return [f(s) for s in shapes for f in (
            lambda s: torch.rand(s, device="tpu"), lambda s: torch.randn(s, device="tpu", dtype=torch.float64),
            lambda s: torch.randint(-3, 9, s, device="tpu"), lambda s: torch.empty(s, device="tpu").bernoulli_(0.3))]

    with torchtpu_lab.eager_mode("strict"):
        alone = [t.cpu() for t in draws()]
    with torchtpu_lab.eager_mode("fused"):
        fused = [t.cpu() for t in draws()]
    for a, b in zip(alone, fused):
        assert torch.equal(a, b)
    assert all(len(set(t.flatten().tolist())) > 1 for t in alone)
