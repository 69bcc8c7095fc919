"""Generates notebooks/06_profiling.ipynb."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import INSTALL, badge, code, md, write  # noqa: E402

NAME = "06_profiling.ipynb"

TENSORBOARD = """To look at the trace, run the command the report printed under *XProf trace* in a terminal: it
starts the `xprof` server (installed by `tensorboard-plugin-profile`, part of the `lab` extras; TensorBoard itself
is not needed), for example

```
.venv/bin/xprof server --logdir /tmp/torchtpu_lab_xprof_XXXXXXXX --port 8791
```

then browse http://localhost:8791. We don't launch it in this notebook (it is a web server that keeps running).
The *trace viewer* shows a timeline of host threads and XLA device activity; *op profile* breaks XLA time down
by HLO op — the level below the torch ops of the table above."""

cells = [
    md(badge(NAME) + """

# Profiling: flame graph, op table, JSON and XProf

`%%tpu_profile` runs a cell and reports what happened on the device. The report is built from a `Profile`
object, which the magic leaves in the variable `_tpu_profile`, so every part of the report is also available as
data. This notebook takes one profile of a small transformer's training steps apart:

1. the **flame graph**: where the time of the cell went, from your lines down to XLA programs;
2. the **op table**: which torch ops ran, how often, for how long, and from which line;
3. **`to_json()`**: everything as plain data, to save or compare;
4. an **XProf trace** (`--xprof`) for the XProf profiler, the same tool used for TPU programs."""),
    code(INSTALL),
    code("%load_ext torchtpu_lab"),
    md("""## A tiny transformer language model

One encoder layer (attention + feed-forward) over embeddings, predicting the next token. AdamW."""),
    code("""import torch
import torch.nn as nn
import torch.nn.functional as F
import torchtpu_lab

class TinyLM(nn.Module):
    def __init__(self, vocab=100, dim=32):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.block = nn.TransformerEncoderLayer(dim, nhead=4, dim_feedforward=64, dropout=0.0, batch_first=True)
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens):
        return self.head(self.block(self.emb(tokens)))

torch.manual_seed(0)
model = TinyLM().to("tpu")
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
tokens = torch.randint(0, 100, (8, 33), device="tpu")

def train_step():
    opt.zero_grad()
    logits = model(tokens[:, :-1])
    loss = F.cross_entropy(logits.reshape(-1, 100), tokens[:, 1:].reshape(-1))
    loss.backward()
    opt.step()
    torchtpu_lab.sync()          # step boundary
    return loss"""),
    md("""Profile warm steps, not the first ones: the first step compiles, and AdamW's first step differs from the
later ones (it creates its state), so the second compiles too. A profile of steady steps shows what every step
of a long run costs."""),
    code("""for _ in range(2):
    loss = train_step()
print(f"two warm-up steps, loss {loss.item():.4f}")"""),
    md("""## The report

`--top 8` keeps the op tables short. Below the text report come the flame graph and, when memory moved, the
memory timeline."""),
    code("""%%tpu_profile --top 8
for step in range(3):
    loss = train_step()
print(f"loss {loss.item():.4f}")"""),
    md("""## Reading the flame graph

The chart is an *icicle*: each box is as wide as the time spent in it, and boxes under it split that time.

* **top row**: the whole cell (wall time);
* **second row**: your source lines (`cell [N], line L`; hover for the line's text);
* **then your functions** (`train_step() · cell [N], line L`), as deep as your own code goes, each with a
  *Python* box for the host time spent in it between torch ops;
* **then** the torch ops each line issued (recording them, in fused mode) and the syncs;
* **below a sync**: `XLA run: N ops` — running the compiled step —, `compile: N ops` if it had to compile, and
  *wait for device / copy to host* for the rest, so the boxes under a sync add up to it.

In fused mode recording an op is cheap, so most of the time sits under the sync lines. Click a box to zoom in;
hover for times.

`_tpu_profile.flamegraph()` returns the same figure as a plotly object, to restyle or save with
`fig.write_html("flame.html")`:"""),
    code("""fig = _tpu_profile.flamegraph()
fig.update_layout(height=360, title="Three warm training steps of TinyLM")
fig"""),
    md("""## The op table

`_tpu_profile.report(top)` returns the report as data. `report.ops` has the torch ops sorted **by time**
(where host time went) and **by count** (what the model does most), each with the line that issued most of
them; `backward (autograd)` marks ops run by autograd's backward pass."""),
    code("""report = _tpu_profile.report(top=8)
ops = report.ops
print(f"{ops.distinct} distinct ops; top 8 by time:")
for row in ops.by_time:
    print(f"  {row.op:<34} x{row.count:<4} {row.total_s * 1e3:7.2f} ms  {row.line}")
print("top 8 by count:")
for row in ops.by_count:
    print(f"  {row.op:<34} x{row.count:<4} {row.line}")"""),
    code("""import plotly.graph_objects as go

rows = ops.by_count[::-1]
fig = go.Figure(go.Bar(x=[r.count / 3 for r in rows], y=[r.op for r in rows], orientation="h",
                       marker_color="#72B7B2"))
fig.update_layout(height=320, xaxis_title="calls per training step", margin={"t": 20, "b": 30, "l": 10})
fig"""),
    md("""## `to_json()`: the profile as plain data

`to_dict()` / `to_json()` give the summary and every event (ops, compiles, syncs, graph runs, memory samples)
as plain data. Save it next to a training log, compare two runs, or check in a test that a change did not add
a recompile or a sync."""),
    code("""import json, os, tempfile

data = json.loads(_tpu_profile.to_json())
print("keys:", list(data))
print({k: data["summary"][k] for k in ("ops", "graphs_executed", "compiles", "syncs", "peak_bytes")})
print("first op event:", data["ops"][0])

path = os.path.join(tempfile.gettempdir(), "tinylm_profile.json")
with open(path, "w") as f:
    f.write(_tpu_profile.to_json(indent=1))
print("saved", path, os.path.getsize(path), "bytes")"""),
    md("""For instance, the ops of each step, from the saved events: three steps, the same number of ops each."""),
    code("""syncs = [e["t"] for e in data["syncs"] if e["name"] == "torchtpu_lab.sync()"]  # the step boundaries
per_step = [sum(1 for e in data["ops"] if lo <= e["t"] < hi) for lo, hi in zip([0.0] + syncs, syncs)]
print("ops per step:", per_step)"""),
    md("""## An XProf trace

`%%tpu_profile --xprof` also records a `jax.profiler` trace of the cell: the XLA programs as the runtime saw
them. `--output DIR` chooses the directory (without it, a temporary one is used); the cell line expands
`{variables}` like any IPython magic. On TPU and GPU the report then adds *device execution* time read from the trace;
XLA:CPU records no device lane, so here the report shows the host's *waiting* time only."""),
    code("""XPROF_DIR = tempfile.mkdtemp(prefix="torchtpu_lab_xprof_")
print(XPROF_DIR)"""),
    code("""%%tpu_profile --xprof --no-flame --top 3 --output {XPROF_DIR}
for step in range(3):
    loss = train_step()"""),
    code("""import glob

xplanes = glob.glob(os.path.join(XPROF_DIR, "**", "*.xplane.pb"), recursive=True)
print("XProf files:")
for p in xplanes:
    print(" ", p)
print(f"{len(xplanes)} trace(s), {sum(os.path.getsize(p) for p in xplanes)} bytes")"""),
    md(TENSORBOARD),
    md("""## Takeaways

* `%%tpu_profile` answers *what ran, what compiled, where it synced, and where the time and memory went*; the
  `Profile` in `_tpu_profile` has it all as data (`summary()`, `report()`, `to_json()`, `flamegraph()`).
* Outside notebooks, `with torchtpu_lab.profile() as prof:` does the same in a script.
* For the XLA-level view, add `--xprof --output DIR` and run the `xprof server` command the report prints."""),
]

if __name__ == "__main__":
    print(write(NAME, cells))
