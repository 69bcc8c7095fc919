"""Per-op overhead of ``a + b`` on a 64x64 float32 tensor in strict mode: tpu device vs one jitted JAX add vs
CPU torch.

    python bench/op_overhead.py [--iters 2000] [--reps 7]

Each figure is the median over ``--reps`` repetitions of the mean time per op in a loop of ``--iters`` ops
(async dispatch included; each loop waits for its last result). Ratios are against the jitted JAX add, all
measured in this one run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import torch  # noqa: E402

import torchtpu_lab  # noqa: E402,F401


def _per_op_us(step, finish, iters: int, reps: int) -> float:
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(iters):
            out = step()
        finish(out)
        samples.append((time.perf_counter() - t0) / iters * 1e6)
    return statistics.median(samples)


def measure(iters: int = 2000, reps: int = 7) -> dict[str, float]:
    x = torch.randn(64, 64)
    a_t, b_t = x.to("tpu"), x.to("tpu")
    a_j, b_j = jnp.asarray(x.numpy()), jnp.asarray(x.numpy())
    jadd = jax.jit(lambda p, q: p + q)
    torchtpu_lab.set_eager_mode("strict")  # one op = one execution; fused capture is bench/eager_overhead.py
    for _ in range(10):  # warm every cache
        (a_t + b_t), jadd(a_j, b_j).block_until_ready(), (x + x)
    return {
        "tpu tensor a + b": _per_op_us(lambda: a_t + b_t, lambda o: torch.tpu.synchronize(), iters, reps),
        "jax.jit(add)": _per_op_us(lambda: jadd(a_j, b_j), lambda o: o.block_until_ready(), iters, reps),
        "cpu torch a + b": _per_op_us(lambda: x + x, lambda o: None, iters, reps),
    }


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--iters", type=int, default=2000)
    p.add_argument("--reps", type=int, default=7)
    args = p.parse_args(argv)
    results = measure(args.iters, args.reps)
    ref = results["jax.jit(add)"]
    print(f"platform: {torch.tpu.platform_name()}")
    print(f"{'path':<20} {'us/op (median)':>15} {'vs jax.jit':>11}")
    for name, us in results.items():
        print(f"{name:<20} {us:15.2f} {us / ref:10.2f}x")


if __name__ == "__main__":
    main()
