"""What a real model's fused training step still hands to Python: the ``transformers`` models of the test zoo
(``tests/test_zoo.py``: tiny GPT-2, Llama with grouped-query heads, T5, ViT, ResNet, ConvNeXt), each trained on
tpu (fused eager) and on PyTorch's CPU with AdamW, ``loss.item()`` every step as a training loop logs it.

Per model: ms per step (median of ``--steps`` after a warm-up), the syncs per step, and the calls the native
recording kernel handed to Python per step, by op (each costs tens of µs of Python; in a model of real depth,
one per layer is milliseconds a step). A call listed here is where the per-op path still leaves C++.

    python bench/zoo_steps.py [--steps 5] [--models gpt2,llama] [--clock cpu]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

import torch  # noqa: E402

import torchtpu_lab  # noqa: E402
from bench.common import add_clock_option, clock, set_clock, table  # noqa: E402
from torchtpu_lab import telemetry  # noqa: E402
from torchtpu_lab.runtime import recording  # noqa: E402


def _trainer(model, batch: dict, device: str):
    """One AdamW step of ``model`` on ``batch`` moved to ``device`` each step, as a training loop moves it; returns
    the loss as a number (a host read)."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step() -> float:
        inputs = {k: v.to(device) for k, v in batch.items()}
        opt.zero_grad()
        loss = model(**inputs).loss
        loss.backward()
        opt.step()
        return loss.item()

    return step


def _timed(step, steps: int) -> list[float]:
    now = clock()
    times = []
    for _ in range(steps):
        t0 = now()
        step()
        times.append(now() - t0)
    return times


def measure(name: str, build, make_batch, steps: int) -> tuple:
    """``(name, tpu ms, cpu ms, syncs per step, calls handed to Python per step, by op)`` for one zoo model."""
    torch.manual_seed(0)
    cpu_model = build().train()
    tpu_model = build().train()
    tpu_model.load_state_dict(cpu_model.state_dict())
    tpu_model.to("tpu")
    batch = make_batch(torch.Generator().manual_seed(1))
    tpu_step, cpu_step = _trainer(tpu_model, batch, "tpu"), _trainer(cpu_model, batch, "cpu")
    for _ in range(3):  # compile, warm up
        tpu_step()
        cpu_step()
    before, syncs = recording.stats(), telemetry.counters["syncs"]
    tpu = _timed(tpu_step, steps)
    after, syncs = recording.stats(), telemetry.counters["syncs"] - syncs
    cpu = _timed(cpu_step, steps)
    was = before.get("python_ops", {})
    handed = {op: n - was.get(op, 0) for op, n in after.get("python_ops", {}).items() if n != was.get(op, 0)}
    ops = ", ".join(f"{op.removeprefix('aten::')} {n / steps:g}"
                    for op, n in sorted(handed.items(), key=lambda kv: -kv[1]))
    total = (after.get("python", 0) - before.get("python", 0)) / steps
    return (name, f"{statistics.median(tpu) * 1e3:.1f}", f"{statistics.median(cpu) * 1e3:.1f}",
            f"{statistics.median(tpu) / statistics.median(cpu):.2f}x", f"{syncs / steps:g}",
            f"{total:g}" + (f" ({ops})" if ops else ""))


def main() -> None:
    from test_zoo import ZOO

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--models", default=",".join(ZOO))
    add_clock_option(parser)
    args = parser.parse_args()
    set_clock(args.clock)
    torch.set_num_threads(1)  # the CPU rows: one intra-op thread (a 2-core machine shared with XLA's threads)
    rows = []
    with torchtpu_lab.eager_mode("fused"):
        for name in args.models.split(","):
            build, make_batch = ZOO[name]
            rows.append(measure(name, build, make_batch, args.steps))
    print(table(f"zoo training steps, fused eager vs PyTorch CPU eager (AdamW, loss.item() each step; median of "
                f"{args.steps}, clock {args.clock}; load average {' '.join(f'{x:.1f}' for x in os.getloadavg())})",
                rows, ("model", "tpu ms/step", "cpu ms/step", "tpu/cpu", "syncs/step",
                       "calls handed to Python/step (by op)")))


if __name__ == "__main__":
    main()
