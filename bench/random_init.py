"""A model initialized on the device: what its random draws cost the first time, against raw JAX.

    python bench/random_init.py [--layers 50] [--reps 3]

``nn.Linear(..., device="tpu")`` layers of distinct shapes (``kaiming_uniform_`` for the weight, ``uniform_`` for
the bias: two draws each) are built in fused mode and read once; the time from the first layer to that read is
recording plus one graph's compile and run. The same draws in raw JAX (``jax.random.uniform`` per tensor, one
``jax.jit``, compile and run) are the reference; PyTorch's CPU eager initialization of the same layers, and the
layers built on the CPU and moved to tpu (what compiles nothing), are the other rows. Each measurement is a fresh
process with no persistent cache; figures are medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

import common  # noqa: F401

_SHAPES = "[(32 + i % 7, 64 + i) for i in range(N)]"

CASES = {
    "tpu": f"""
import torch, torchtpu_lab
from torch import nn
with torchtpu_lab.eager_mode("fused"):
    t0 = time.perf_counter()
    layers = [nn.Linear(i_, o_, device="tpu") for o_, i_ in {_SHAPES}]
    float(layers[0].weight.sum())
    seconds = time.perf_counter() - t0
""",
    "tpu_moved": f"""
import torch, torchtpu_lab
from torch import nn
t0 = time.perf_counter()
layers = [nn.Linear(i_, o_).to("tpu") for o_, i_ in {_SHAPES}]
float(layers[0].weight.sum())
seconds = time.perf_counter() - t0
""",
    "cpu": f"""
import torch
from torch import nn
torch.set_num_threads(1)
t0 = time.perf_counter()
layers = [nn.Linear(i_, o_) for o_, i_ in {_SHAPES}]
float(layers[0].weight.sum())
seconds = time.perf_counter() - t0
""",
    "jax": f"""
import jax, math
shapes = {_SHAPES}
def init(key):
    keys, out = jax.random.split(key, 2 * len(shapes)), []
    for i, (o_, i_) in enumerate(shapes):
        bound = 1 / math.sqrt(i_)
        out += [jax.random.uniform(keys[2 * i], (o_, i_), minval=-bound, maxval=bound),
                jax.random.uniform(keys[2 * i + 1], (o_,), minval=-bound, maxval=bound)]
    return out
t0 = time.perf_counter()
params = jax.jit(init)(jax.random.key(0))
float(params[0].sum())
seconds = time.perf_counter() - t0
""",
}

ROWS = (("tpu", "nn.Linear(device='tpu'), fused, first read"),
        ("jax", "raw JAX: jax.random.uniform per tensor, one jax.jit"),
        ("tpu_moved", "nn.Linear on CPU, .to('tpu'), first read"),
        ("cpu", "PyTorch CPU eager, nn.Linear (1 thread)"))


def _run(case: str, layers: int) -> float:
    env = dict(os.environ)
    env.pop("TORCHTPU_LAB_CACHE_DIR", None)  # nothing from disk
    env.setdefault("TORCHTPU_LAB_PLATFORM", "cpu")
    code = f"import json, time\nN = {layers}\n{CASES[case]}\nprint(json.dumps(seconds))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> None:
    from common import table

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=50)
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args(argv)
    times: dict[str, list[float]] = {case: [] for case, _ in ROWS}
    for _ in range(args.reps):  # the cases alternate, so the machine's changing load falls on each
        for case, _ in ROWS:
            times[case].append(_run(case, args.layers))
    med = {case: statistics.median(v) for case, v in times.items()}
    rows = [(label, f"{med[case]:.3f}", f"{med[case] / med['jax']:.3f}x") for case, label in ROWS]
    print(table(f"{args.layers} nn.Linear layers of distinct shapes ({2 * args.layers} random draws), first "
                f"read (median of {args.reps} fresh processes)", rows, ("path", "seconds", "vs raw JAX")))


if __name__ == "__main__":
    main()
