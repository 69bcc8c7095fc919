"""Warm start: the first training step in a fresh process with a populated persistent compile cache vs an empty one.

    python bench/warm_start.py [--reps 5] [--models mlp,transformer] [--no-prefetch]

Each repetition runs two fresh processes per model: ``cold`` gets a new empty cache directory, ``warm`` reuses
the directory the cold process filled. The figure is the median wall time of the first (compiling) AdamW step.
Models: an MLP (256-512-512-10, batch 64) and a tiny transformer (bench/train_step.py's, 2 layers, d 64, batch 2,
16 tokens). ``--no-prefetch`` runs the warm process with ``TORCHTPU_LAB_PREFETCH=0`` (runtime/prefetch.py off).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

import common  # noqa: F401

STEP = r"""
import json, sys, time, torch, torch.nn as nn, torch.nn.functional as F
import torchtpu_lab
torch.manual_seed(0)
if MODEL == "mlp":
    model = nn.Sequential(nn.Linear(256, 512), nn.GELU(), nn.Linear(512, 512), nn.GELU(), nn.Linear(512, 10))
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
else:
    sys.path.insert(0, BENCH)
    from train_step import Transformer
    model = Transformer(vocab=128, d=64, seq=16)
    x = torch.randint(0, 128, (2, 16))
    y = torch.roll(x, -1, 1).reshape(-1)
model.to("tpu")
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
x, y = x.to("tpu"), y.to("tpu")
t0 = time.perf_counter()
opt.zero_grad(); out = model(x); loss = F.cross_entropy(out.reshape(-1, out.shape[-1]), y); loss.backward()
opt.step(); loss.item()
first = time.perf_counter() - t0
from torchtpu_lab import telemetry
print(json.dumps({"first_step_s": first, "cache_hits": telemetry.counters.get("persistent_cache_hits", 0),
                  "cache_misses": telemetry.counters.get("persistent_cache_misses", 0)}))
"""


def _run(cache_dir: str, model: str, prefetch: bool = True) -> dict:
    env = dict(os.environ, TORCHTPU_LAB_CACHE_DIR=cache_dir)
    env.setdefault("TORCHTPU_LAB_PLATFORM", "cpu")
    if not prefetch:
        env["TORCHTPU_LAB_PREFETCH"] = "0"
    script = f"MODEL = {model!r}\nBENCH = {os.path.dirname(os.path.abspath(__file__))!r}\n" + STEP
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> None:
    from common import table

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--models", default="mlp,transformer")
    p.add_argument("--no-prefetch", action="store_true", help="warm processes run with TORCHTPU_LAB_PREFETCH=0")
    args = p.parse_args(argv)
    rows = []
    for model in args.models.split(","):
        cold, warm = [], []
        for _ in range(args.reps):  # cold and warm alternate, so the machine's changing load falls on both
            with tempfile.TemporaryDirectory() as d:
                cold.append(_run(d, model))
                warm.append(_run(d, model, prefetch=not args.no_prefetch))
        c = statistics.median(r["first_step_s"] for r in cold)
        w = statistics.median(r["first_step_s"] for r in warm)
        rows.append((model, f"{c:.3f}", f"{w:.3f}", f"{c / w:.1f}x",
                     f"{warm[0]['cache_hits']:.0f} hits, {warm[0]['cache_misses']:.0f} misses"))
    print(table(f"first AdamW step in a fresh process, seconds (median of {args.reps})", rows,
                ("model", "empty cache (cold)", "warm cache", "warm start", "warm disk cache")))


if __name__ == "__main__":
    main()
