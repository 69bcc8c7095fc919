"""Generates notebooks/02_eager_modes.ipynb."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import INSTALL, badge, code, md, write  # noqa: E402

NAME = "02_eager_modes.ipynb"

cells = [
    md(badge(NAME) + """

# Eager modes: debug, strict and fused

The `tpu` device can run your PyTorch code in three ways. They compute the same numbers; they differ in **when**
work reaches the device and **how much** of it is compiled at once:

| mode | what happens when you call an op | use it for |
|---|---|---|
| `debug` | the op is compiled (once per signature), run, and **waited for** | finding the line that breaks: errors and NaNs surface at the op that made them |
| `strict` | the op is compiled (once per signature) and launched; Python moves on | code whose shapes change a lot; behaving like plain PyTorch, one op at a time |
| `fused` (default) | the op is only **recorded**; at the next sync point the whole recorded graph is compiled once and run as one XLA program | training and inference: XLA fuses ops and the host stops paying per-op overhead |

In this notebook we time the same small training step in each mode, count compilations and XLA launches, and
then use `debug` mode to find the exact line that produces a NaN."""),
    code(INSTALL),
    md("""## Set up

`%load_ext torchtpu_lab` starts a tpu session in **fused** mode. You can switch with `%tpu mode debug`, with
`torchtpu_lab.set_eager_mode("debug")`, or for one block with `with torchtpu_lab.eager_mode("debug"):`.
Switching is always safe: leaving `fused` first runs whatever was recorded."""),
    code("%load_ext torchtpu_lab"),
    md("""A small MLP regression, with AdamW. One training step is about a hundred torch ops (forward, backward,
optimizer update)."""),
    code("""import time
import torch
import torch.nn as nn
import torch.nn.functional as F
import torchtpu_lab

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 128), nn.GELU(),
                      nn.Linear(128, 128), nn.GELU(),
                      nn.Linear(128, 128), nn.GELU(),
                      nn.Linear(128, 1)).to("tpu")
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
x = torch.randn(128, 64, device="tpu")
y = torch.randn(128, 1, device="tpu")

def train_step():
    opt.zero_grad()
    loss = F.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    return loss

print("mode now:", torchtpu_lab.eager_mode_name())"""),
    md("""## Measuring a step in each mode

For each mode, `measure` profiles the first step in that mode with `torchtpu_lab.profile()` (this is where
compilations happen), then profiles and times a few more steps (ops and XLA programs launched per step).
`torch.tpu.synchronize()` after each step makes the timer include the device work, not just the Python that
launched it. (The very first step, in `debug` below, also creates AdamW's state.)"""),
    code("""def measure(mode, steps=8):
    with torchtpu_lab.eager_mode(mode):
        with torchtpu_lab.profile() as first:     # the first step in this mode: compiles what it needs
            train_step()
            torch.tpu.synchronize()
        times = []
        with torchtpu_lab.profile() as steady:    # the steps after it: cached executables only
            for _ in range(steps):
                t0 = time.perf_counter()
                train_step()
                torch.tpu.synchronize()
                times.append(time.perf_counter() - t0)
    s = steady.summary()
    launches = s["graphs_executed"] if mode == "fused" else s["ops"]  # per-op modes launch once per op
    return {"ms_per_step": 1e3 * sorted(times)[len(times) // 2], "first_step_s": first.summary()["wall_s"],
            # a program loaded from the disk cache (a restarted kernel) counts: the step needed it
            "compiles": sum(x.summary()[k] for x in (first, steady) for k in ("compiles", "disk_loads")),
            "ops": s["ops"] // steps,
            "launches": launches // steps}"""),
    code("""results = {mode: measure(mode) for mode in ("debug", "strict", "fused")}
for mode, r in results.items():
    print(f"{mode:<6} | {r['ms_per_step']:6.1f} ms/step | {r['compiles']:3d} compiles | {r['ops']:3d} ops/step | "
          f"{r['launches']:3d} XLA launches/step | first step {r['first_step_s']:.2f} s")"""),
    md("""How to read this:

* **XLA launches per step.** `debug` and `strict` launch one small XLA program per op; `fused` launches **one**
  program for the whole step. Fewer launches means less host overhead, and XLA can fuse the elementwise ops
  (GELU, the AdamW arithmetic) into the matmuls around them.
* **Compiles.** `debug` compiles one executable per distinct op *signature* (op + shapes + dtypes) the first
  time it sees it. `strict` uses the very same per-op cache, so after `debug` it finds everything compiled: 0.
  `fused` compiles the whole step once; every later step with the same structure is a cache hit.
* **ms/step.** On a real TPU the gap between per-op and fused execution is far larger than on this CPU, where
  each "launch" is cheap. `debug` is the slowest because it waits for every op."""),
    code("""from plotly.subplots import make_subplots
import plotly.graph_objects as go

modes = list(results)
fig = make_subplots(rows=1, cols=2, subplot_titles=("time per step (ms)", "XLA programs launched per step"))
fig.add_trace(go.Bar(x=modes, y=[results[m]["ms_per_step"] for m in modes], marker_color="#4C78A8",
                     text=[f"{results[m]['ms_per_step']:.1f}" for m in modes]), row=1, col=1)
fig.add_trace(go.Bar(x=modes, y=[results[m]["launches"] for m in modes], marker_color="#F58518",
                     text=[results[m]["launches"] for m in modes]), row=1, col=2)
fig.update_layout(height=320, showlegend=False, margin={"t": 40, "b": 30})
fig"""),
    md("""## Debug mode finds the line that makes a NaN

A classic bug: normalizing each row by its norm, with a batch that contains an all-zero row. `0 / 0` is NaN,
and the NaN spreads through everything after it.

In **fused** mode nothing runs until the sync point, so all you see is a NaN loss at the end, with no hint of
where it came from:"""),
    code("""def normalize(v):
    return v / v.norm(dim=1, keepdim=True)     # 0 / 0 for an all-zero row

features = torch.randn(8, 64)
features[3] = 0                                # one bad example in the batch
features = features.to("tpu")

loss = F.mse_loss(model(normalize(features)), torch.zeros(8, 1, device="tpu"))
print("fused: loss =", loss.item())"""),
    md("""In **debug** mode every op runs and is waited for as it is called. With
`torchtpu_lab.debug.check_finite(True)`, each op's output is also checked, and the first op that produces a NaN or
Inf raises `FloatingPointError` naming the op, and the function and line in *your* code that called it.

(We catch the error and print it, so that the notebook keeps going; in your own debugging, let it raise and read
the traceback.)"""),
    code("""torchtpu_lab.debug.check_finite(True)
try:
    with torchtpu_lab.eager_mode("debug"):
        loss = F.mse_loss(model(normalize(features)), torch.zeros(8, 1, device="tpu"))
except FloatingPointError as e:
    print(f"{type(e).__name__}: {e}")
finally:
    torchtpu_lab.debug.check_finite(False)"""),
    md("""The message points at the division inside `normalize` (line 2 of the cell that defines it), not at the loss
that eventually turned into NaN. The fix is the usual one: guard the denominator."""),
    code("""def normalize(v):
    return v / v.norm(dim=1, keepdim=True).clamp_min(1e-6)

with torchtpu_lab.eager_mode("debug"):
    torchtpu_lab.debug.check_finite(True)
    loss = F.mse_loss(model(normalize(features)), torch.zeros(8, 1, device="tpu"))
    torchtpu_lab.debug.check_finite(False)
print("debug, fixed: loss =", loss.item(), "| back in", torchtpu_lab.eager_mode_name(), "mode")"""),
    md("""## Summary

* Develop and debug in `debug` (with `check_finite(True)` when chasing NaNs): slow, but every failure points at
  its line.
* `strict` behaves like ordinary eager PyTorch: each op runs when called, compiled once per signature.
* Train in `fused` (the default): one compiled program per step. Its two enemies — shapes that keep changing,
  and syncs in the middle of the step — are the subjects of
  [03_recompilations](03_recompilations.ipynb) and [04_host_syncs](04_host_syncs.ipynb)."""),
]

if __name__ == "__main__":
    print(write(NAME, cells))
