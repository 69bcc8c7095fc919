"""Compile time of the fused transformer training step, the first time (no persistent cache), and where it goes:
our side (recording the ops, PyTorch meta kernels, tracing our lowerings into one jaxpr, lowering to MLIR) vs
XLA's compiler.

    python bench/compile_time.py [--reps 3]

Each repetition is a fresh process (nothing cached in memory or on disk); figures are medians. The split comes
from JAX's own monitoring events (trace, lowering, backend compile), counted by torchtpu_lab.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

import common  # noqa: F401

STEP = r"""
import json, sys, time, torch
sys.path.insert(0, BENCH_DIR)
import torchtpu_lab
from torchtpu_lab import telemetry
from torchtpu_lab.runtime import compile_cache
import train_step as ts
compile_cache.listen()
torch.manual_seed(0)
model = ts.Transformer().to("tpu")
x, y = (t.to("tpu") for t in ts.data("transformer"))
with torchtpu_lab.eager_mode("fused"):
    step = ts.torch_step_fn("transformer", model, x, y, torchtpu_lab.sync)
    t0 = time.perf_counter()
    step(); torch.tpu.synchronize()
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    step(); torch.tpu.synchronize()
    second = time.perf_counter() - t0
c = telemetry.counters
print(json.dumps({"first": first, "second": second, "trace": c.get("jax_traces_seconds", 0),
                  "lower": c.get("jax_lowerings_seconds", 0), "xla": c.get("xla_compiles_seconds", 0),
                  "compiles": c.get("xla_compiles", 0)}))
"""


def _run() -> dict:
    env = dict(os.environ)
    env.pop("TORCHTPU_LAB_CACHE_DIR", None)  # nothing from disk
    env.setdefault("TORCHTPU_LAB_PLATFORM", "cpu")
    code = f"BENCH_DIR = {os.path.dirname(os.path.abspath(__file__))!r}\n" + STEP
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> None:
    from common import table

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args(argv)
    runs = [_run() for _ in range(args.reps)]
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    overhead = med["first"] - med["second"]  # what the first step costs beyond a steady-state one
    ours = med["trace"] + med["lower"]
    rows = [("first step (fresh process, empty cache)", f"{med['first']:.2f}", ""),
            ("steady-state step", f"{med['second']:.2f}", ""),
            ("first-step extra", f"{overhead:.2f}", "100%"),
            ("  tracing our lowerings into jaxprs (JAX trace)", f"{med['trace']:.2f}",
             f"{med['trace'] / overhead:.0%}"),
            ("  lowering jaxprs to StableHLO (JAX)", f"{med['lower']:.2f}", f"{med['lower'] / overhead:.0%}"),
            ("  XLA compile", f"{med['xla']:.2f}", f"{med['xla'] / overhead:.0%}"),
            ("  rest: recording, meta kernels, signatures", f"{overhead - ours - med['xla']:.2f}",
             f"{(overhead - ours - med['xla']) / overhead:.0%}")]
    print(table(f"fused transformer step, compile time (median of {args.reps} fresh processes, "
                f"{med['compiles']:.0f} XLA compiles)", rows, ("part", "seconds", "share")))


if __name__ == "__main__":
    main()
