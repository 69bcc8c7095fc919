"""Profiling overhead and report cost.

    python bench/profile_overhead.py [--reps 7] [--iters 10]

* the fused MLP training step of ``bench/train_step.py`` with and without ``torchtpu_lab.profile()`` around the
  loop (target: profiled <= 1.15x unprofiled);
* building and rendering (text + HTML + flame figure) the report of a profile holding 10,000 recorded ops
  (target: under one second).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import common  # noqa: F401
import torch

import torchtpu_lab
from train_step import data, torch_mlp, torch_step_fn


def step_overhead(iters: int, reps: int) -> tuple[float, float]:
    torch.manual_seed(0)
    model = copy.deepcopy(torch_mlp()).to("tpu")
    x, y = data("mlp")
    step = torch_step_fn("mlp", model, x.to("tpu"), y.to("tpu"), torchtpu_lab.sync)
    for _ in range(3):
        step()
    torch.tpu.synchronize()

    def loop(profiled: bool) -> float:
        t0 = time.perf_counter()
        if profiled:
            with torchtpu_lab.profile():
                for _ in range(iters):
                    step()
                torch.tpu.synchronize()
        else:
            for _ in range(iters):
                step()
            torch.tpu.synchronize()
        return (time.perf_counter() - t0) / iters

    plain, profiled = [], []
    for _ in range(reps):  # interleaved, so drift on a noisy machine hits both alike
        plain.append(loop(False))
        profiled.append(loop(True))
    return statistics.median(plain), statistics.median(profiled)


def report_cost(n_ops: int = 10_000) -> tuple[float, int]:
    a = torch.randn(8, 8).to("tpu")
    with torchtpu_lab.profile() as prof:
        x = a
        for _ in range(n_ops):
            x = x + a
        x.sum().item()
    t0 = time.perf_counter()
    report = prof.report(10)
    from torchtpu_lab.render import html, plot, text

    text.profile_text(report)
    html.profile_html(report)
    plot.flame_figure(report["flame"]).to_dict()
    return time.perf_counter() - t0, len(prof.ops)


def main(argv=None) -> None:
    from common import table

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--iters", type=int, default=10)
    args = p.parse_args(argv)
    plain, profiled = step_overhead(args.iters, args.reps)
    seconds, n = report_cost()
    print(table("profiling overhead, fused MLP training step (medians)",
                [("unprofiled", f"{plain * 1e3:.2f}", "1.00x"),
                 ("inside torchtpu_lab.profile()", f"{profiled * 1e3:.2f}", f"{profiled / plain:.2f}x")],
                ("", "ms/step", "ratio")))
    print(f"\nbuilding + rendering the report of {n} recorded ops: {seconds:.3f} s")


if __name__ == "__main__":
    main()
