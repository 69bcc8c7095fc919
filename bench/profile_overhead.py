"""Profiling overhead and report cost.

    python bench/profile_overhead.py [--reps 7] [--iters 10] [--clock cpu] [--steps-only]

* the fused MLP training step of ``bench/train_step.py`` with and without ``torchtpu_lab.profile()`` around the
  loop (target: profiled <= 1.15x unprofiled), and the same for a tiny transformer's AdamW step (2 layers, d 64,
  batch 2, 16 tokens: many small ops, so the per-op cost of profiling shows; target: under 1.10x);
* building and rendering (text + HTML + flame figure) the report of a profile holding 10,000 recorded ops
  (target: under one second);
* the live status updates a JupyterLab frontend receives while a cell runs (at most one push every
  ``comm.LIVE_INTERVAL_S``): the cost of one push, its worst-case share of a running cell, and the same fused
  step with and without a listening frontend (target: under 2% slower).
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


class _Listener:
    """A frontend's comm as the kernel sees it: an id and ``send``; what a real one does with the bytes (the
    websocket) happens off the kernel's main thread."""

    comm_id = "bench-listener"

    def __init__(self) -> None:
        self.sent = 0

    def send(self, data=None, **_) -> None:
        self.sent += 1

    def on_msg(self, callback) -> None:
        pass

    def on_close(self, callback) -> None:
        pass


def _mlp_step():
    torch.manual_seed(0)
    model = copy.deepcopy(torch_mlp()).to("tpu")
    x, y = data("mlp")
    step = torch_step_fn("mlp", model, x.to("tpu"), y.to("tpu"), torchtpu_lab.sync)
    for _ in range(3):
        step()
    torch.tpu.synchronize()
    return step


def _transformer_step():
    import torch.nn.functional as F
    from train_step import Transformer

    torch.manual_seed(0)
    model = Transformer(vocab=128, d=64, seq=16).to("tpu")
    idx = torch.randint(0, 128, (2, 16))
    x, y = idx.to("tpu"), torch.roll(idx, -1, 1).to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step():
        opt.zero_grad(set_to_none=True)
        out = model(x)
        F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1)).backward()
        opt.step()
        torchtpu_lab.sync()

    for _ in range(3):
        step()
    torch.tpu.synchronize()
    return step


def step_overhead(iters: int, reps: int, make_step=_mlp_step) -> tuple[float, float]:
    step = make_step()

    from common import clock

    now = clock()

    def loop(profiled: bool) -> float:
        t0 = now()
        if profiled:
            with torchtpu_lab.profile():
                for _ in range(iters):
                    step()
                torch.tpu.synchronize()
        else:
            for _ in range(iters):
                step()
            torch.tpu.synchronize()
        return (now() - t0) / iters

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
    plot.flame_bundle(report.flame)._repr_mimebundle_()  # what %%tpu_profile displays
    plot.memory_bundle(report.memory.timeline, report.memory.limit)._repr_mimebundle_()
    return time.perf_counter() - t0, len(prof.ops)


def live_update_cost(iters: int, reps: int) -> tuple[float, float, float, int]:
    """Seconds per status push, and the fused step's seconds without and with a listening frontend."""
    from torchtpu_lab.jupyter import comm

    step = _mlp_step()
    listener = _Listener()
    n = 200
    t0 = time.perf_counter()
    comm._adopt(listener)
    try:
        for _ in range(n):
            comm.push("live")
        per_push = (time.perf_counter() - t0) / n

        def loop(listening: bool) -> float:
            (comm._adopt if listening else comm._forget)(listener)
            t = time.perf_counter()
            for _ in range(iters):
                step()
                comm.live()  # what telemetry calls after each sync and compile
            torch.tpu.synchronize()
            return (time.perf_counter() - t) / iters

        quiet, listened = [], []
        for _ in range(reps):
            quiet.append(loop(False))
            listened.append(loop(True))
    finally:
        comm._forget(listener)
    return per_push, statistics.median(quiet), statistics.median(listened), listener.sent - n


def main(argv=None) -> None:
    from common import add_clock_option, set_clock, table

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--steps-only", action="store_true", help="only the profiled-vs-unprofiled step tables")
    add_clock_option(p)
    args = p.parse_args(argv)
    set_clock(args.clock)
    for name, make_step in (("fused MLP training step", _mlp_step),
                            ("fused tiny transformer AdamW step", _transformer_step)):
        plain, profiled = step_overhead(args.iters, args.reps, make_step)
        print(table(f"profiling overhead, {name} (medians)",
                    [("unprofiled", f"{plain * 1e3:.2f}", "1.00x"),
                     ("inside torchtpu_lab.profile()", f"{profiled * 1e3:.2f}", f"{profiled / plain:.2f}x")],
                    ("", "ms/step", "ratio")) + "\n")
    if args.steps_only:
        return
    seconds, n = report_cost()
    print(f"\nbuilding + rendering the report of {n} recorded ops: {seconds:.3f} s")
    from torchtpu_lab.jupyter import comm

    per_push, quiet, listened, pushes = live_update_cost(args.iters, args.reps)
    print(table("live status updates while a cell runs (fused MLP step, medians)",
                [("one status push", f"{per_push * 1e3:.3f}",
                  f"{per_push / comm.LIVE_INTERVAL_S:.2%} of a cell at most (one push per "
                  f"{comm.LIVE_INTERVAL_S} s)"),
                 ("step, no frontend listening", f"{quiet * 1e3:.2f}", "1.00x"),
                 ("step, a frontend listening", f"{listened * 1e3:.2f}", f"{listened / quiet:.3f}x ({pushes} pushes)")],
                ("", "ms", "")))


if __name__ == "__main__":
    main()
