"""Warm start: the first training step in a fresh process with a populated persistent compile cache vs an empty one.

    python bench/warm_start.py [--reps 5]

Each repetition runs two fresh processes per condition: ``cold`` gets a new empty cache directory, ``warm`` reuses
a directory a previous process filled. The figure is the median wall time of the first (compiling) step.
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
import json, time, torch, torch.nn as nn, torch.nn.functional as F
import torchtpu_lab
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(256, 512), nn.GELU(), nn.Linear(512, 512), nn.GELU(), nn.Linear(512, 10)).to("tpu")
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
x, y = torch.randn(64, 256).to("tpu"), torch.randint(0, 10, (64,)).to("tpu")
t0 = time.perf_counter()
opt.zero_grad(); loss = F.cross_entropy(model(x), y); loss.backward(); opt.step(); loss.item()
first = time.perf_counter() - t0
from torchtpu_lab import telemetry
print(json.dumps({"first_step_s": first, "cache_hits": telemetry.counters.get("persistent_cache_hits", 0),
                  "cache_misses": telemetry.counters.get("persistent_cache_misses", 0)}))
"""


def _run(cache_dir: str) -> dict:
    env = dict(os.environ, TORCHTPU_LAB_CACHE_DIR=cache_dir)
    env.setdefault("TORCHTPU_LAB_PLATFORM", "cpu")
    out = subprocess.run([sys.executable, "-c", STEP], capture_output=True, text=True, env=env, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> None:
    from common import table

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reps", type=int, default=5)
    args = p.parse_args(argv)
    cold, warm = [], []
    for _ in range(args.reps):
        with tempfile.TemporaryDirectory() as d:
            cold.append(_run(d))
            warm.append(_run(d))
    c = statistics.median(r["first_step_s"] for r in cold)
    w = statistics.median(r["first_step_s"] for r in warm)
    rows = [("empty cache (cold)", f"{c:.3f}", f"{cold[0]['cache_misses']:.0f} misses"),
            ("populated cache (warm)", f"{w:.3f}", f"{warm[0]['cache_hits']:.0f} hits, "
                                                    f"{warm[0]['cache_misses']:.0f} misses")]
    print(table(f"first training step in a fresh process (median of {args.reps})", rows,
                ("persistent cache", "seconds", "disk cache")))
    print(f"warm start is {c / w:.1f}x faster")


if __name__ == "__main__":
    main()
