import os
import sys

import nbformat as nbf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import INSTALL  # noqa: E402

nb = nbf.v4.new_notebook()
md, code = nbf.v4.new_markdown_cell, nbf.v4.new_code_cell
BADGE = "[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/torchtpu-lab/torchtpu-lab/blob/main/notebooks/01_quickstart.ipynb)"
nb.cells = [
 md(BADGE + """

# Quickstart: PyTorch on a `tpu` device, eager, with the reasons it is slow

`torchtpu_lab` gives PyTorch a real `torch.device("tpu")` backed by JAX/XLA. On a Colab TPU runtime it runs on
the TPU; anywhere else it runs on XLA:GPU or XLA:CPU and says so. This notebook moves a model to `tpu`,
trains it for a few steps, and profiles one step."""),
 code(INSTALL),
 md("""## 1. Load the extension

`%load_ext torchtpu_lab` starts a tpu session for this kernel: it picks the best XLA platform, switches to
**fused** eager mode (ops are recorded and compiled together at sync points), turns on the persistent
compilation cache, and flushes pending work at the end of every cell. The banner tells you what you got."""),
 code("%load_ext torchtpu_lab"),
 md("## 2. Move a model to `tpu`, exactly as you would to `cuda`"),
 code("""import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(20, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 1)).to("tpu")
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)

x = torch.randn(256, 20)
y = x[:, :4].sum(dim=1, keepdim=True).sin()
x, y = x.to("tpu"), y.to("tpu")
print(next(model.parameters()).device, torch.tpu.get_device_name())"""),
 md("""## 3. Train a few steps

Each step is recorded as one graph and compiled the first time; after that every step is a cache hit. Note
that `loss.item()` is a **sync point**: the host waits for the device. Once per step is fine."""),
 code("""def train_step():
    opt.zero_grad()
    loss = F.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    return loss

losses = [train_step().item() for _ in range(30)]
print(f"loss: {losses[0]:.4f} -> {losses[-1]:.4f}")"""),
 md("""## 4. Profile one step

`%%tpu_profile` runs the cell normally and then shows what it did on the device. The report starts with up to
three **findings** (what cost the most, and the fix), then splits the wall time into *Python* (your code between
torch ops), *tracing* (recording ops into the graph), *compiling* and *waiting* for the device, and counts
executables three ways: *compiles* (XLA compiled), *disk loads* (from the persistent cache, after a kernel
restart) and *memory hits*. Below: ops, compiles grouped by cause, syncs with the line's source, device memory
(the peak includes a graph's outputs and temporaries while it runs) and a flame graph. If the cell raises, the
report is shown and then the error, as without the magic. The `Profile` object stays in `_tpu_profile`."""),
 code("""%%tpu_profile --top 5
loss = train_step()
print(f"loss {loss.item():.4f}")"""),
 code("""summary = _tpu_profile.summary()
print({k: summary[k] for k in ("ops", "graphs_executed", "compiles", "disk_loads", "memory_hits", "syncs", "peak_bytes")})"""),
 md("""## 5. A recompilation, explained

Change the batch size and the graph must be compiled again. The profile names the input whose shape changed
and the line that recorded it."""),
 code("""%%tpu_profile --no-flame
small = F.mse_loss(model(x[:100]), y[:100])
print(small.item())"""),
 code("""cause = _tpu_profile.compiles[-1].detail["cause"]
print(cause)"""),
 md("""## 6. The session at a glance

`%tpu` shows the session; `%tpu memory` lists live device tensors with the line that created each;
`%tpu metrics` is a PyTorch/XLA-style metrics report."""),
 code("%tpu"),
 code("%tpu memory --top 5"),
]
nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
nbf.write(nb, "notebooks/01_quickstart.ipynb")
