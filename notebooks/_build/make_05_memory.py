"""Generates notebooks/05_memory.ipynb."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import INSTALL, badge, code, md, write  # noqa: E402

NAME = "05_memory.ipynb"

cells = [
    md(badge(NAME) + """

# Where device memory goes

Running out of device memory is the most common way a model "doesn't fit". During training, device memory holds:

* the **parameters**;
* the **batch**;
* the **activations**: intermediate results of the forward pass that autograd keeps for the backward pass;
* the **gradients**, one per parameter;
* the **optimizer state**: for Adam, two more tensors per parameter.

We measure each with `torch.tpu.memory_allocated()` (the bytes held by live `tpu` tensors, like
`torch.cuda.memory_allocated()`), look at the largest tensors with `%tpu memory --top`, read the peak of a
training step from `%%tpu_profile`, halve parameter memory with bfloat16, and free memory with `del`.

On XLA:CPU there is no fixed device limit, but the bytes are the same as they would be in a TPU's memory."""),
    code(INSTALL),
    code("%load_ext torchtpu_lab"),
    md("""`memory_allocated()` first runs any pending fused work (a sync point), so that it describes buffers that
actually exist."""),
    code("""import copy
import torch
import torch.nn as nn
import torch.nn.functional as F
import torchtpu_lab

MiB = 2**20

def allocated():
    return torch.tpu.memory_allocated()

ledger = {}   # what each part of training costs, in bytes, for the chart below"""),
    md("""## Parameters

An MLP with about 1.6 million float32 parameters: 4 bytes each."""),
    code("""start = allocated()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(512, 1024), nn.GELU(),
                      nn.Linear(1024, 1024), nn.GELU(),
                      nn.Linear(1024, 10)).to("tpu")
param_bytes = allocated() - start
n_params = sum(p.numel() for p in model.parameters())
ledger["parameters"] = param_bytes
print(f"parameters: {param_bytes} bytes = {n_params} params x 4 bytes ({param_bytes / MiB:.2f} MiB)")"""),
    md("## The batch"),
    code("""before = allocated()
x = torch.randn(256, 512, device="tpu")
y = torch.randint(0, 10, (256,), device="tpu")
ledger["batch"] = allocated() - before
print(f"batch: {ledger['batch'] / MiB:.2f} MiB  (x: 256 x 512 x 4 bytes, y: 256 x 8 bytes)")"""),
    md("""## Activations

The forward pass keeps what the backward pass will need: the output of each `Linear` and of each `GELU`,
256 x 1024 float32 values (1 MiB) apiece. Activation memory grows with the **batch size**, not with the number
of parameters."""),
    code("""before = allocated()
logits = model(x)
loss = F.cross_entropy(logits, y)
ledger["activations"] = allocated() - before
print(f"activations kept for backward: {ledger['activations'] / MiB:.2f} MiB")"""),
    md("""## Gradients

`backward()` creates one gradient per parameter (as much memory as the parameters) and frees the activations
it no longer needs. The change is the difference of the two."""),
    code("""before = allocated()
loss.backward()
grad_bytes = sum(p.grad.nbytes for p in model.parameters())
ledger["gradients"] = grad_bytes
ledger["activations freed"] = allocated() - before - grad_bytes
print(f"backward: {(allocated() - before) / MiB:+.2f} MiB = gradients {grad_bytes / MiB:+.2f} MiB "
      f"and activations freed {ledger['activations freed'] / MiB:+.2f} MiB")"""),
    md("""## Optimizer state

Adam keeps two running averages per parameter (`exp_avg` and `exp_avg_sq`), created at the first
`step()`: twice the parameter memory. (Plain SGD without momentum keeps none.)"""),
    code("""opt = torch.optim.Adam(model.parameters(), lr=1e-3)
before = allocated()
opt.step()
adam_bytes = allocated() - before
ledger["Adam state"] = adam_bytes
print(f"Adam state: {adam_bytes / MiB:.2f} MiB = {adam_bytes / param_bytes:.2f} x the parameters")"""),
    md("""All together: parameters + gradients + Adam state is **4 x** the parameter memory before a single
activation is stored."""),
    code("""import plotly.graph_objects as go

fig = go.Figure(go.Waterfall(
    x=list(ledger) + ["allocated now"],
    y=[v / MiB for v in ledger.values()] + [0],
    measure=["relative"] * len(ledger) + ["total"],
    text=[f"{v / MiB:+.2f}" for v in ledger.values()] + [f"{allocated() / MiB:.2f}"],
))
fig.update_layout(height=340, yaxis_title="MiB on the device", margin={"t": 20, "b": 30}, showlegend=False)
fig"""),
    md("""## The largest tensors, and where they were created

`%tpu memory --top N` lists the live device tensors by size with the line that created each. The 1024 x 1024
weight appears four times: the weight, its gradient, and Adam's two averages."""),
    code("%tpu memory --top 8"),
    md("""## The peak of a training step

What you must fit is the **peak**, not what is left at the end. `%%tpu_profile` records every allocation and
free during the cell: the report gives start, end and peak, and the chart under it shows the memory timeline.

We profile one step in **strict** mode, where every intermediate result is a real device buffer, so the timeline
shows the activations piling up during the forward pass and going away during the backward pass, and the
temporaries of Adam's update. (In fused mode the step is one compiled program: the profile then counts the
program's outputs and temporaries, from XLA's memory analysis of it, while it runs, so the peak is just as real,
but the timeline shows one step up per graph instead of each activation.)"""),
    code("""%%tpu_profile --no-flame
with torchtpu_lab.eager_mode("strict"):
    opt.zero_grad()                      # set_to_none: the gradients are dropped...
    loss = F.cross_entropy(model(x), y)  # activations pile up
    loss.backward()                      # ...gradients are created, activations released
    opt.step()                           # Adam's update makes temporaries"""),
    code("""step_peak = _tpu_profile.summary()["peak_bytes"]
s = _tpu_profile.summary()
print(f"peak during the step: {step_peak / MiB:.2f} MiB (start {s['start_bytes'] / MiB:.2f} MiB, "
      f"end {s['end_bytes'] / MiB:.2f} MiB)")"""),
    md("""## bfloat16 halves parameter memory

bfloat16 has the same range as float32 with fewer mantissa bits, and takes 2 bytes instead of 4. TPUs compute in
it natively. The same model, with bfloat16 parameters:"""),
    code("""blueprint = copy.deepcopy(model).cpu()          # the same architecture and weights, on the host
before = allocated()
model_bf16 = copy.deepcopy(blueprint).to("tpu", dtype=torch.bfloat16)
bf16_bytes = allocated() - before
print(f"parameters fp32: {param_bytes} bytes, bf16: {bf16_bytes} bytes ({bf16_bytes / param_bytes:.2f} x)")"""),
    md("""Keeping float32 weights and running the forward pass under `torch.autocast("tpu", dtype=torch.bfloat16)`
(mixed precision) does the opposite trade: parameters and optimizer state stay float32, while matmul outputs —
most of the activations — are bfloat16."""),
    md("""## Freeing memory

A device buffer is freed when the last reference to its tensor goes away. `del name` removes one reference;
the memory comes back only if nothing else holds the tensor. Common hidden holders: the optimizer (its state),
parameters' `.grad`, a list you appended losses to, and IPython's output history (`Out`, `_`), which keeps
every value a cell *displayed* as its last expression."""),
    code("""before = allocated()
del model_bf16
print(f"del model_bf16 freed {before - allocated()} bytes")"""),
    code("""steps = [("now", allocated())]
opt.zero_grad()                      # set_to_none=True (the default): the gradients are released
steps.append(("opt.zero_grad()", allocated()))
del opt                              # the optimizer held Adam's state
steps.append(("del opt", allocated()))
del loss, logits
steps.append(("del loss, logits", allocated()))
for (label, now), (_, prev) in zip(steps[1:], steps):
    print(f"{label:<18} freed {(prev - now) / MiB:6.2f} MiB -> {now / MiB:6.2f} MiB allocated")"""),
    code("""fig = go.Figure(go.Bar(x=[label for label, _ in steps], y=[b / MiB for _, b in steps],
                       text=[f"{b / MiB:.2f}" for _, b in steps], marker_color="#4C78A8"))
fig.update_layout(height=300, yaxis_title="MiB allocated", margin={"t": 20, "b": 30})
fig"""),
    md("""What is left is the model's parameters and the batch:"""),
    code("%tpu memory --top 4"),
    md("""## Takeaways

* Training with Adam needs about **4 x** the parameter memory (parameters, gradients, two averages), plus
  activations that grow with the batch size.
* Size for the **peak** of a step: `%%tpu_profile` reports it, with a timeline.
* bfloat16 halves parameter (and activation) memory; `%tpu memory --top` tells you which tensors to look at.
* Memory returns when the last reference goes: `del` the name, and mind optimizers, `.grad` and `Out`."""),
]

if __name__ == "__main__":
    print(write(NAME, cells))
