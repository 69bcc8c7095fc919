"""Generates notebooks/03_recompilations.ipynb."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import INSTALL, badge, code, md, write  # noqa: E402

NAME = "03_recompilations.ipynb"

cells = [
    md(badge(NAME) + """

# Recompilations: when every batch has a new shape

XLA compiles a program for one set of input **shapes**. In fused mode the program is a whole training step, so
a step whose inputs have a shape the device has not seen before is compiled from scratch — which takes far
longer than running it. Text is the classic case: every batch of sentences has a different length.

In this notebook we train on batches of varying sequence length, watch the step recompile, find the cause with
`%%tpu_profile`, and fix it by padding to a few fixed lengths ("buckets")."""),
    code(INSTALL),
    code("%load_ext torchtpu_lab"),
    md("""## A toy sequence classifier

Token 0 is padding. The model embeds the tokens, averages them over the non-padding positions (the `mask`), and
classifies the sentence. Each step ends with `torchtpu_lab.sync()`: the step boundary (PyTorch/XLA's
`xm.mark_step()`), where the recorded step is compiled if needed and launched."""),
    code("""import random
import torch
import torch.nn as nn
import torch.nn.functional as F
import torchtpu_lab

class BagOfTokens(nn.Module):
    def __init__(self, vocab=50, dim=32):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim, padding_idx=0)
        self.proj = nn.Linear(dim, dim)
        self.head = nn.Linear(dim, 2)

    def forward(self, tokens):                       # tokens: [batch, length]
        mask = (tokens != 0).float()                  # 1 for real tokens, 0 for padding
        h = torch.relu(self.proj(self.emb(tokens)))   # [batch, length, dim]
        h = (h * mask.unsqueeze(-1)).sum(1) / mask.sum(1, keepdim=True)
        return self.head(h)

torch.manual_seed(0)
model = BagOfTokens().to("tpu")
opt = torch.optim.SGD(model.parameters(), lr=0.1)

def train_step(tokens, labels):
    opt.zero_grad()
    loss = F.cross_entropy(model(tokens), labels)
    loss.backward()
    opt.step()
    torchtpu_lab.sync()                               # step boundary
    return loss"""),
    md("""The data: 16 batches of 16 sentences, each batch with its own length between 5 and 40 tokens."""),
    code("""random.seed(0)
lengths = [random.randint(5, 40) for _ in range(16)]
batches = []
for n in lengths:
    tokens = torch.randint(1, 50, (16, n))
    batches.append((tokens, tokens[:, 0] % 2))       # label: parity of the first token
print("lengths:", lengths)
print(len(set(lengths)), "distinct lengths in", len(lengths), "batches")"""),
    md("""## Profile the loop

`%%tpu_profile` finds the **cause** of every compilation by comparing the new graph with the nearest one
compiled before, and groups compilations with the same cause into one row: *dim 1 of aten::ne.Scalar input 0
took 14 values 5…40 at cell [3], line 15*, with the fix (pad or bucket that dimension). The first finding above
the tables says what the recompilations cost."""),
    code("""%%tpu_profile --top 3 --no-flame
for tokens, labels in batches:
    loss = train_step(tokens.to("tpu"), labels.to("tpu"))"""),
    code("""def programs(summary):
    \"\"\"XLA programs built for the cell: compiled, or loaded from the disk cache after a kernel restart.\"\"\"
    return summary["compiles"] + summary["disk_loads"]

naive = _tpu_profile.summary()
print(f"{programs(naive)} compiles for {len(batches)} steps, {naive['wall_s']:.1f} s")
for c in _tpu_profile.compiles[1:4]:
    print(c.detail["cause"])"""),
    md("""Reading a cause: *op 0: input 0 of aten::ne.Scalar changed shape [16, 29] -> [16, 31] (recorded at cell [3],
line 15)*:

* the **dimension**: in `[16, 29] -> [16, 31]` the second dimension, the sequence length, changed;
* the **line**: cell [3] is the model's cell (the number in brackets is the cell's execution count) and its
  line 15 is `mask = (tokens != 0).float()`, the first op of the step that reads `tokens`.

Every new length is a new program: one compile per distinct length, each far slower than the step it runs."""),
    md("""## The fix: pad to a few bucket lengths

Pad each batch up to the next of a few fixed lengths with token 0. The mask already ignores padding, so the
model computes exactly the same loss; the device now sees at most three shapes. The price is some wasted
compute on padding — choose buckets that fit your length distribution."""),
    code("""BUCKETS = (16, 32, 48)

def pad_to_bucket(tokens):
    n = tokens.shape[1]
    target = next(b for b in BUCKETS if b >= n)
    return F.pad(tokens, (0, target - n), value=0)   # right-pad with the padding token

padded = [pad_to_bucket(t).shape[1] for t, _ in batches]
print("padded lengths:", padded)"""),
    md("""What the device sees, batch by batch: the raw lengths are all over the place, the padded ones take three
values."""),
    code("""import plotly.graph_objects as go

fig = go.Figure([go.Scatter(y=lengths, mode="lines+markers", name="raw length (a new shape almost every step)"),
                 go.Scatter(y=padded, mode="lines+markers", line_shape="hv", name="padded to a bucket")])
for b in BUCKETS:
    fig.add_hline(y=b, line_dash="dot", line_color="grey")
fig.update_layout(height=300, xaxis_title="step", yaxis_title="sequence length", margin={"t": 20, "b": 30})
fig"""),
    code("""%%tpu_profile --top 3 --no-flame
for tokens, labels in batches:
    loss = train_step(pad_to_bucket(tokens).to("tpu"), labels.to("tpu"))"""),
    code("""bucketed = _tpu_profile.summary()
print(f"compiles: {programs(naive)} unpadded -> {programs(bucketed)} bucketed")
print(f"time for {len(batches)} steps: {naive['wall_s']:.1f} s -> {bucketed['wall_s']:.1f} s")"""),
    code("""fig = go.Figure([go.Bar(x=["unpadded", "bucketed"], y=[programs(naive), programs(bucketed)],
                        text=[programs(naive), programs(bucketed)], marker_color=["#E45756", "#54A24B"])])
fig.update_layout(height=260, yaxis_title="compilations", margin={"t": 20, "b": 30})
fig"""),
    md("""## Takeaways

* In fused mode a step is compiled once per distinct combination of input shapes; `%%tpu_profile` names the
  dimension that changed and the line that first used it.
* Make shapes static: pad to buckets (as here), to a single maximum length, or sort examples by length so that
  batches share a bucket. Drop or pad the last, smaller batch of an epoch (`drop_last=True`).
* The same applies to Python numbers baked into the graph: the profile says so when a changing scalar caused a
  recompile. The persistent compilation cache (`%tpu cache`) saves compiles across kernel restarts, not
  within a run with ever-new shapes."""),
]

if __name__ == "__main__":
    print(write(NAME, cells))
