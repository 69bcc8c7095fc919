"""Per-op cost of eager execution on the tpu device.

    python bench/eager_overhead.py [--iters 2000] [--reps 7]

* strict mode, cache hit: one small op (64x64 float32) as a tpu tensor op vs one call of the same jitted JAX
  function (target: at most 1.5x);
* fused mode capture: the cost of recording one op into the lazy graph (no execution; target: at most 8 us);
* the floor: PyTorch's own dispatch into an empty Python PrivateUse1 kernel (no backend could be cheaper).

Each figure is the median over ``--reps`` repetitions of the mean per op over ``--iters`` ops.
"""

from __future__ import annotations

import argparse

import common  # noqa: F401  (sets sys.path)
import jax
import jax.numpy as jnp
import torch

import torchtpu_lab
from torchtpu_lab.runtime import fused

OPS = {
    "add": (lambda a, b: a + b, lambda a, b: a + b),
    "mul": (lambda a, b: a * b, lambda a, b: a * b),
    "relu": (lambda a, b: torch.relu(a), lambda a, b: jax.nn.relu(a)),
    "matmul": (lambda a, b: a @ b, lambda a, b: a @ b),
    "sum": (lambda a, b: a.sum(), lambda a, b: a.sum()),
}


def strict_rows(iters: int, reps: int) -> list[tuple]:
    from common import median_time

    x = torch.randn(64, 64)
    a, b = x.to("tpu"), x.to("tpu")
    aj, bj = jnp.asarray(x.numpy()), jnp.asarray(x.numpy())
    rows = []
    with torchtpu_lab.eager_mode("strict"):
        for name, (tfn, jfn) in OPS.items():
            jitted = jax.jit(jfn)
            t_tpu = median_time(lambda: tfn(a, b), lambda o: torch.tpu.synchronize(), iters, reps)
            t_jax = median_time(lambda: jitted(aj, bj), lambda o: o.block_until_ready(), iters, reps)
            rows.append((name, f"{t_tpu * 1e6:.1f}", f"{t_jax * 1e6:.1f}", f"{t_tpu / t_jax:.2f}x"))
    return rows


_floor_lib = None


def floor_rows(iters: int, reps: int) -> list[tuple]:
    """The floor of any op on a pure-Python PrivateUse1 backend: PyTorch's dispatch into an empty Python kernel
    (returning an input), and into one that only creates an output tensor (what every real op must do)."""
    global _floor_lib
    from common import median_time

    from torchtpu_lab.device import tensor

    if _floor_lib is None:
        _floor_lib = torch.library.Library("tpu_bench", "DEF")
        _floor_lib.define("noop(Tensor a, Tensor b) -> Tensor")
        _floor_lib.define("new(Tensor a, Tensor b) -> Tensor")
        _floor_lib.impl("noop", lambda a, b: a, "PrivateUse1")
        _floor_lib.impl("new", lambda a, b: tensor.empty(a.shape, a.dtype), "PrivateUse1")
    a = torch.randn(64, 64).to("tpu")
    noop, new = torch.ops.tpu_bench.noop.default, torch.ops.tpu_bench.new.default
    return [("empty Python kernel", f"{median_time(lambda: noop(a, a), lambda o: None, iters, reps) * 1e6:.1f}"),
            ("kernel creating one output tensor",
             f"{median_time(lambda: new(a, a), lambda o: None, iters, reps) * 1e6:.1f}")]


def capture_rows(iters: int, reps: int) -> list[tuple]:
    from common import median_time

    a = torch.randn(64, 64).to("tpu")
    rows = []
    # measure recording only; the graph is dropped unexecuted by the sync below
    with torchtpu_lab.config.patch(max_graph_ops=10**9, eager_mode="fused"):
        for name, (tfn, _) in OPS.items():
            state = {"x": a}

            def record():
                state["x"] = tfn(state["x"], a) if name != "sum" else tfn(a, a)
                return state["x"]

            def finish(_):
                state["x"] = a
                fused.PENDING.storages.clear()  # drop the recorded graph unexecuted
                fused.PENDING.recorded = 0

            t = median_time(record, finish, iters, reps)
            rows.append((name, f"{t * 1e6:.1f}"))
    return rows


def main(argv=None) -> None:
    from common import add_clock_option, set_clock, table

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--iters", type=int, default=2000)
    p.add_argument("--reps", type=int, default=7)
    add_clock_option(p)
    args = p.parse_args(argv)
    set_clock(args.clock)
    print(f"platform: {torch.tpu.platform_name()}")
    print(table("\nstrict mode, per op (cache hit), 64x64 float32",
                strict_rows(args.iters, args.reps), ("op", "tpu us", "jax.jit us", "ratio")))
    print(table("\nfused mode, capture cost per recorded op", capture_rows(args.iters, args.reps),
                ("op", "us/op")))
    print(table("\nfloor: PyTorch dispatch to a Python PrivateUse1 kernel", floor_rows(args.iters, args.reps),
                ("kernel", "us/call")))


if __name__ == "__main__":
    main()
