"""The profile's host time split against the same loop on PyTorch CPU eager (issue 23 item 11).

A small CNN trained with AdamW for ``--steps`` steps: run on CPU eager (median of ``--reps``), then on tpu
under ``torchtpu_lab.profile()`` once warm (median of ``--reps``). Prints what the report calls "Python: your
code" and "torchtpu_lab host overhead" next to the whole CPU loop: "your code" should be of the order of the
CPU loop's Python, not several times the whole CPU step.

    python bench/host_split.py [--steps 20] [--reps 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import torchtpu_lab


def make(device: str):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                                torch.nn.Linear(4 * 6 * 6, 10)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randn(8, 1, 8, 8).to(device), torch.randint(0, 10, (8,)).to(device)
    return model, opt, x, y


def loop(model, opt, x, y, steps: int, device: str) -> None:
    for _ in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        if device == "tpu":
            torchtpu_lab.sync()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    cpu = make("cpu")
    loop(*cpu, 2, "cpu")
    cpu_s = []
    for _ in range(a.reps):
        t = time.perf_counter()
        loop(*cpu, a.steps, "cpu")
        cpu_s.append(time.perf_counter() - t)
    tpu = make("tpu")
    loop(*tpu, 3, "tpu")  # warm: the step's programs are compiled
    rows = []
    for _ in range(a.reps):
        with torchtpu_lab.profile() as prof:
            loop(*tpu, a.steps, "tpu")
        rows.append(prof.report().summary)
    med = {k: statistics.median(getattr(s, k) for s in rows)
           for k in ("wall_s", "python_s", "overhead_s", "tracing_s", "compile_s", "wait_s")}
    cpu_step = statistics.median(cpu_s) / a.steps
    print(f"{a.steps} AdamW steps of a small CNN; medians of {a.reps}; per step:")
    print(f"| {'what':<46} | {'ms/step':>8} | {'x CPU step':>10} |")
    print(f"|{'-' * 48}|{'-' * 10}|{'-' * 12}|")
    print(f"| {'PyTorch CPU eager: the whole step':<46} | {cpu_step * 1e3:8.2f} | {1.0:10.2f} |")
    for key, label in (("wall_s", "tpu: wall"), ("python_s", "tpu: Python (your code, dispatcher, autograd)"),
                       ("overhead_s", "tpu: torchtpu_lab host overhead"), ("tracing_s", "tpu: recording ops"),
                       ("wait_s", "tpu: waiting for the device")):
        per = med[key] / a.steps
        print(f"| {label:<46} | {per * 1e3:8.2f} | {per / cpu_step:10.2f} |")


if __name__ == "__main__":
    main()
