"""Generates notebooks/04_host_syncs.ipynb."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import INSTALL, badge, code, md, write  # noqa: E402

NAME = "04_host_syncs.ipynb"

cells = [
    md(badge(NAME) + """

# Host syncs: when Python waits for the device

In fused mode your Python code runs **ahead** of the device: it only records ops, and the device executes them
later, as one compiled graph. That works until Python needs an actual **value** from a tensor. Then the host must
stop, compile and run everything recorded so far, wait for it, and copy the value back. That is a *host sync*.

Three innocent-looking lines cause them in a training loop:

1. `loss.item()` (also `float(loss)`, `int(t)`, `t.tolist()`),
2. printing a tensor (`print(loss)`, an f-string with `{loss}`),
3. Python control flow on a tensor value: `if loss > 0.5:` calls `bool()` on a tensor.

Each one stops the device in the middle of the loop and can cut the step into several smaller graphs. In this
notebook we find them with `%%tpu_profile` and remove them."""),
    code(INSTALL),
    code("%load_ext torchtpu_lab"),
    code("""import torch
import torch.nn as nn
import torch.nn.functional as F
import torchtpu_lab

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1)).to("tpu")
opt = torch.optim.SGD(model.parameters(), lr=0.05)
x = torch.randn(128, 16, device="tpu")
y = x[:, :1].sin()
initial = {k: v.clone() for k, v in model.state_dict().items()}
torchtpu_lab.sync()

def train_step():
    opt.zero_grad()
    loss = F.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    return loss

def restart():  # back to the initial weights: both loops below train the same model from the same start
    model.load_state_dict(initial)
    torchtpu_lab.sync()

train_step().item()  # compile the step once, so the profiles below show syncs, not first-time compiles
N = 20"""),
    md("""## A loop with three syncs

This is how many training loops look: a running total, a check on the loss, a progress print."""),
    code("restart()"),
    code("""%%tpu_profile --no-flame
total = 0.0
high_loss_steps = 0
for step in range(N):
    loss = train_step()
    total += loss.item()                     # 1. .item(): copies the value to Python
    if loss > 0.3:                           # 2. `if` on a tensor: bool() needs its value
        high_loss_steps += 1
    if step % 5 == 0:
        print(f"step {step}: loss {loss}")   # 3. printing a tensor shows its value
print(f"mean loss {total / N:.4f}, {high_loss_steps} high-loss steps")"""),
    md("""The **syncs** section groups syncs by reason and line. A count equal to the number of loop iterations
(20 here) at one line means that line runs inside the loop, and the report's hint says so. The profile also shows
extra small graphs compiled for `loss > 0.3`: the comparison became a program of its own, because Python needed
its answer immediately.

Let's count syncs per training step, split into **value reads** (a value copied back to Python: `.item()`,
`bool()`, printing, `.cpu()`) and the rest."""),
    code("""from collections import Counter

VALUE_READS = ("item()", "print", "copy to host")

def syncs_per_step(prof, steps):
    by_reason = Counter(e.name for e in prof.syncs)
    reads = sum(n for reason, n in by_reason.items() if reason.startswith(VALUE_READS))
    return {"all": len(prof.syncs) / steps, "reads": reads / steps, "by_reason": by_reason}

before = syncs_per_step(_tpu_profile, N)
print(f"{before['all']:.2f} syncs per step, {before['reads']:.2f} of them value reads")
for reason, n in before["by_reason"].most_common():
    print(f"  {n:3d} x {reason}")"""),
    md("""## Remove them: keep values on the device, read once

* accumulate the loss in a **tensor** on the device instead of a Python float;
* replace the `if` with arithmetic on tensors: count the high-loss steps as a tensor (`(loss > 0.3).float()`);
* keep the per-step losses as device tensors in a list, and print them **after** the loop;
* read everything back with **one** `.cpu()` at the end.

What remains in the loop is `torchtpu_lab.sync()`, the step boundary (PyTorch/XLA's `xm.mark_step()`): it
launches the recorded step as one graph but reads nothing back, so Python does not wait for a value. Without any
boundary, the whole loop would be recorded as one huge graph. The profiler still lists it as a sync at a line in a
loop; here, one per step is exactly what we want."""),
    code("restart()"),
    code("""%%tpu_profile --no-flame
total = torch.zeros((), device="tpu")
high_loss_steps = torch.zeros((), device="tpu")
history = []
for step in range(N):
    loss = train_step().detach()
    total += loss                                  # accumulate on the device
    high_loss_steps += (loss > 0.3).float()        # count on the device instead of branching in Python
    history.append(loss)                           # keep per-step losses as device tensors
    torchtpu_lab.sync()                            # step boundary: launches the step, reads nothing
summary = torch.stack([total / N, high_loss_steps, *history]).cpu()   # the one read, after the loop
print(f"mean loss {summary[0]:.4f}, {int(summary[1])} high-loss steps")
for step in range(0, N, 5):
    print(f"step {step}: loss {summary[2 + step]:.4f}")"""),
    md("""Same losses, same count of high-loss steps as before: the numbers did not change, only when Python
looks at them. (This profile's compiles are for the new code: the step graph now includes the accumulations,
and the final read is a small graph of its own.)"""),
    code("""after = syncs_per_step(_tpu_profile, N)
print(f"syncs per step: {before['all']:.2f} before -> {after['all']:.2f} after")
print(f"value reads per step: {before['reads']:.2f} before -> {after['reads']:.2f} after")
for reason, n in after["by_reason"].most_common():
    print(f"  {n:3d} x {reason}")"""),
    md("""The same numbers as a picture: syncs per training step, by reason."""),
    code("""import plotly.graph_objects as go

reasons = sorted(set(before["by_reason"]) | set(after["by_reason"]))
fig = go.Figure([go.Bar(name=r, x=["before", "after"],
                        y=[before["by_reason"][r] / N, after["by_reason"][r] / N]) for r in reasons])
fig.update_layout(barmode="stack", height=320, yaxis_title="syncs per step", margin={"t": 20, "b": 30})
fig"""),
    md("""## Takeaways

* A sync inside the loop stops the device every iteration; `%%tpu_profile` shows each with its line and a loop
  hint.
* Keep values on the device (`total += loss`, `count += (loss > x).float()`), store per-step tensors, and read
  them once after the loop (or every *k* steps, for a progress bar).
* When control flow really must depend on a value — early stopping, skipping a step on NaN — check it every
  *k* steps rather than every step, or express it as tensor arithmetic (`torch.where`).
* One step boundary per step (`torchtpu_lab.sync()`) is the sync you want: it launches work without reading
  anything back."""),
]

if __name__ == "__main__":
    print(write(NAME, cells))
