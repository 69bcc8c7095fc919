"""A short training demo on the ``tpu`` device: ``python -m torchtpu_lab.demo`` (what ``HEADLESS=1 make lab`` runs).

Trains a small MLP on a synthetic regression task for a few steps, printing the loss of each step next to the
same model trained on the CPU from the same seed, so the output shows both that it runs and that it agrees.
"""

from __future__ import annotations

import time

import torch

import torchtpu_lab


def _train(device: str, steps: int) -> list[float]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(128, 16, generator=gen)
    y = x.sum(dim=1, keepdim=True).sin()
    x, y = x.to(device), y.to(device)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def main(steps: int = 10) -> None:
    print(f"torchtpu-lab {torchtpu_lab.__version__}: tpu device = {torch.tpu.platform_name()}")
    t0 = time.perf_counter()
    tpu = _train("tpu", steps)
    elapsed = time.perf_counter() - t0
    cpu = _train("cpu", steps)
    print(f"{'step':>4}  {'loss (tpu)':>12}  {'loss (cpu)':>12}")
    for i, (a, b) in enumerate(zip(tpu, cpu)):
        print(f"{i:4d}  {a:12.6f}  {b:12.6f}")
    print(f"{steps} steps on tpu in {elapsed:.2f}s (first steps include XLA compilation)")
    print(torch.tpu.memory_summary())


if __name__ == "__main__":
    main()
