"""A fused graph's Python numbers reach its executable in one array per kind (runtime/packed_numbers.py): the
values, dtypes and type promotion are what one argument per number gave, a new value recompiles nothing, and the
executable takes two arrays instead of hundreds of scalars."""

import os
import subprocess
import sys

import torch

import torchtpu_lab
from torchtpu_lab import caches, telemetry
from torchtpu_lab.runtime import fused, packed_numbers


def _compute(a, h, i, s: float, n: int):
    """Numbers of both kinds meeting float32, bfloat16 and int64 tensors (weak types decide every result dtype)."""
    return (a * s + 3, h * s, h + n, i * n + 2, i / n, a * True, (a > s).to(torch.int64) * n, a.pow(n) - s * n)


def test_numbers_are_packed_and_keep_values_dtypes_and_one_program():
    steps = 3
    x = torch.randn(4)
    h = torch.randn(4).bfloat16()
    i = torch.arange(1, 5)
    ta, th, ti = x.to("tpu"), h.to("tpu"), i.to("tpu")
    torchtpu_lab.sync()
    compiles = []
    with torchtpu_lab.eager_mode("fused"):
        for k in range(steps):
            s, n = 0.1 + 0.37 * k, 2 + k  # a schedule: new values every step
            before = telemetry.counters.get("xla_compile_requests", 0)
            got = _compute(ta, th, ti, s, n)
            torchtpu_lab.sync()
            compiles.append(telemetry.counters.get("xla_compile_requests", 0) - before)
            for g, e in zip(got, _compute(x, h, i, s, n)):
                assert g.dtype == e.dtype, (k, g.dtype, e.dtype)
                torch.testing.assert_close(g.cpu(), e)
    assert compiles[1:] == [0] * (steps - 1), compiles  # the values are inputs, not part of the program
    packed = [g for g in fused.GRAPHS.values() if g.packing is not None and g.packing.floats and g.packing.ints]
    assert packed, "no graph took its numbers packed"
    p = packed[-1].packing
    assert len(packed[-1].fn.in_avals[0]) == len(p.passed) + 2  # the arrays, then one array per kind of number
    assert p.count == len(p.passed) + len(p.floats) + len(p.ints)


def test_packed_numbers_give_the_bits_one_argument_per_number_gives(monkeypatch, tmp_path):
    """Packing changes how numbers reach the program, never a result: every bit is what the graph gives with
    each number an argument of its own (float32, bfloat16 and int64 tensors meeting floats and ints). With the
    persistent cache on, each convention finds its own executable on disk, never the other's."""
    from torchtpu_lab.runtime import compile_cache

    previous = compile_cache.settings()
    assert compile_cache.enable(str(tmp_path / "cache")) is not None
    try:
        _bits_both_ways(monkeypatch)
    finally:
        compile_cache.use_settings(previous)


def _bits_both_ways(monkeypatch):
    x, h, i = torch.randn(64), torch.randn(64).bfloat16(), torch.arange(1, 65)
    ta, th, ti = x.to("tpu"), h.to("tpu"), i.to("tpu")
    results = []
    for packing in (False, True):
        caches.clear_all()
        with monkeypatch.context() as m:
            if not packing:
                m.setattr(packed_numbers, "plan", lambda leaves: None)
            with torchtpu_lab.eager_mode("fused"):
                got = _compute(ta, th, ti, 0.37, 3)
                torchtpu_lab.sync()
            results.append([g.cpu() for g in got])
        assert any(g.packing is not None for g in fused.GRAPHS.values()) == packing
    for unpacked, packed in zip(*results):
        assert torch.equal(unpacked, packed)


def test_a_graph_without_numbers_is_not_packed():
    assert packed_numbers.plan([]) is None
    assert packed_numbers.plan([True, None]) is None  # a bool is a strong type in JAX: passed as it is
    p = packed_numbers.plan([0.5, True, 3, "x", 2.0])
    assert (p.passed, p.floats, p.ints, p.count) == ((1, 3), (0, 4), (2,), 5)
    args = packed_numbers.arguments(p, [0.5, True, 3, "x", 2.0])
    assert args[:2] == [True, "x"] and args[2].tolist() == [0.5, 2.0] and args[3].tolist() == [3]
    assert packed_numbers.donated(p, (1, 3)) == (0, 1)


def test_numbers_are_packed_as_jax_converts_them_with_x64_off():
    """Without x64 a Python float is JAX's float32 and an int its int32: the packed arrays are those dtypes, and
    the results are CPU's."""
    code = r"""
import torch, torchtpu_lab
from torchtpu_lab.runtime import fused
x = torch.randn(4)
i = torch.arange(1, 5, dtype=torch.int32)
ta, ti = x.to("tpu"), i.to("tpu")
for s, n in ((0.5, 2), (1.25, 3)):
    got = (ta * s + n, ti * n + 1, ti * s)
    torchtpu_lab.sync()
    for g, e in zip(got, (x * s + n, i * n + 1, i * s)):
        assert g.dtype == e.dtype, (g.dtype, e.dtype)
        torch.testing.assert_close(g.cpu(), e)
p = [g.packing for g in fused.GRAPHS.values() if g.packing is not None][-1]
assert (str(p.float_dtype), str(p.int_dtype)) == ("float32", "int32"), p
print("ok")
"""
    env = dict(os.environ, TORCHTPU_LAB_X64="0")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "ok" in out.stdout
