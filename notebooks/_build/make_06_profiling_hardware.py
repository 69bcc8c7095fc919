"""Generates notebooks/06_profiling_hardware.ipynb."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import INSTALL, badge, code, md, write  # noqa: E402

NAME = "06_profiling_hardware.ipynb"

cells = [
    md(badge(NAME) + """

# How far from the hardware: roofline, MFU, compare and expect

A profile says what a cell did. This notebook asks how *good* that was and what a change *changed*:

1. **FLOPs, MFU and the roofline**: XLA's cost analysis of every program that ran, its device time, and where it
   sits against the device's peak compute and memory bandwidth;
2. **compare** two versions of a training cell (with `--repeat` medians, since one run's time is noisy);
3. **`torchtpu_lab.log_scalar`**: log the loss without stopping the device every step;
4. **`torchtpu_lab.expect`**: assert that warm steps compile nothing (for tests and serving loops);
5. **memory at the peak** and exports for Perfetto and speedscope."""),
    code(INSTALL),
    code("%load_ext torchtpu_lab"),
    md("""## A small CNN, written twice

`train_slow` has the classic mistake: `loss.item()` every step makes the host wait for the device each time.
`train_fast` logs the loss with `torchtpu_lab.log_scalar` instead: the values stay on the device and come back
together at a sync that happens anyway. Both end each step with `torchtpu_lab.sync()`, the step boundary."""),
    code("""import torch
import torch.nn as nn
import torch.nn.functional as F
import torchtpu_lab

torch.manual_seed(0)
model = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 16 * 16, 10)).to("tpu")
opt = torch.optim.SGD(model.parameters(), lr=0.05)
images, labels = torch.randn(64, 1, 16, 16).to("tpu"), torch.randint(0, 10, (64,)).to("tpu")

def step(x, y):
    loss = F.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss

def train_slow(steps, batch=64):
    losses = []
    for _ in range(steps):
        loss = step(images[:batch], labels[:batch])
        losses.append(loss.item())          # the mistake: a host sync per step
        torchtpu_lab.sync()                 # step boundary
    return losses

def train_fast(steps, batch=64):
    for _ in range(steps):
        loss = step(images[:batch], labels[:batch])
        torchtpu_lab.log_scalar("loss", loss)   # no sync: fetched at the next sync that happens anyway
        torchtpu_lab.sync()                     # step boundary

train_slow(2); train_fast(2)                   # warm up: compile both versions once
print("warm")"""),
    md("""## FLOPs, MFU and the roofline

Run the slow version three times (`--repeat 3`): the report shows the medians. Its *hardware* line gives the
FLOPs XLA counted for every program run, the programs' device time, and the **MFU**: achieved FLOP/s over the
device's peak. The peaks come from a table of known chips (TPU v4 to v7, A100/H100/H200) or, on a CPU or an
unknown chip, from a short calibration cached on disk; `peak_source` always says which."""),
    code("""%%tpu_profile --no-flame --repeat 3
losses = train_slow(5)"""),
    code("""slow = _tpu_profile
s = slow.summary()
print(f"FLOPs {s['flops']:.3g}, bytes accessed {s['bytes_accessed']:.3g}, device time {s['device_s'] * 1e3:.1f} ms")
print(f"MFU {100 * s['mfu']:.2f}% of {s['peak_flops']:.3g} FLOP/s")
print("peaks:", s["peak_source"])
for p in slow.programs():
    print(f"{p['name']:<16} x{p['runs']}  {p['flops']:.3g} FLOPs  intensity {p['intensity']:.1f} FLOP/B  "
          f"{p['bound']}-bound  at {p['source']}")"""),
    md("""Each program is a point on the **roofline**: its arithmetic intensity (FLOPs per byte it reads and writes)
on the x axis, its achieved FLOP/s on the y axis, its size its device time. Left of the ridge a program is
bound by memory bandwidth, right of it by compute; the distance to the line is what is left on the table. When
the costliest program sits far below its roof, the report says so and what usually helps."""),
    code("slow.roofline()"),
    md("""## Compare the fixed cell

`--compare slow` profiles the cell and compares it with the saved profile (any variable holding one, or an
index into `_tpu_profiles`, the history of profiled cells: `--compare -1` is the previous one). The syncs at the
`.item()` line are gone."""),
    code("""%%tpu_profile --no-flame --repeat 3 --compare slow
train_fast(5)"""),
    code("""fast = _tpu_profile
c = torchtpu_lab.compare(slow, fast)
print("syncs (before, after):", c.summary()["syncs"])
print("logged losses:", [round(v, 4) for v in torchtpu_lab.scalars()["loss"][-5:]])"""),
    md("""## Expectations

`torchtpu_lab.expect(compiles=0, syncs=None, cpu_fallbacks=0)` checks a block when it ends and raises
`torchtpu_lab.ExpectationError` naming the first offending event, its cause and its line. A warm step passes; a
new batch size compiles, and the error says where and why."""),
    code("""with torchtpu_lab.expect(compiles=0):
    train_fast(2)
print("warm steps: no compile")
try:
    with torchtpu_lab.expect(compiles=0):
        train_fast(1, batch=48)
except torchtpu_lab.ExpectationError as e:
    print("ExpectationError:", e)"""),
    md("""## Memory at the peak

`memory_at_peak()` lists what held device memory at the cell's peak: tensors with the line that created them,
and the outputs and temporaries of the XLA program that was running. The owners add up to `peak_bytes`."""),
    code("""owners = fast.memory_at_peak()
for o in owners[:6]:
    print(f"{o['bytes']:>9} B  {o['kind']:<20} {o['dtype']}{o['shape'] or ''}  {o['source']}")
print(f"{len(owners)} owners, {sum(o['bytes'] for o in owners)} B; peak_bytes {fast.summary()['peak_bytes']} B")"""),
    md("""## Exports

`to_perfetto(path)` writes a Chrome/Perfetto trace (open it at https://ui.perfetto.dev): torch ops, syncs,
compiles and program runs on their own lanes, device memory as a counter. `to_speedscope(path)` writes the
flame graph for https://www.speedscope.app."""),
    code("""import json, os, tempfile

out = tempfile.mkdtemp(prefix="torchtpu_lab_export_")
trace = fast.to_perfetto(os.path.join(out, "fast.trace.json"))
flame = fast.to_speedscope(os.path.join(out, "fast.speedscope.json"))
with open(trace) as f:
    events = json.load(f)["traceEvents"]
print("perfetto:", trace, len(events), "events")
print("speedscope:", flame, os.path.getsize(flame), "bytes")"""),
    md("""## Takeaways

* `summary()` has `flops`, `bytes_accessed`, `device_s`, `mfu` and the peaks with their source; `programs()` one
  row per XLA program with its intensity and `bound`; `roofline()` the picture.
* `torchtpu_lab.compare(a, b)` (or `%%tpu_profile --compare NAME`) shows what a change changed;
  `--repeat N` gives medians on a noisy machine.
* `torchtpu_lab.log_scalar` instead of `.item()` in a loop; `torchtpu_lab.scalars()` returns the history.
* `with torchtpu_lab.expect(compiles=0):` guards warm steps in tests and serving loops."""),
]

if __name__ == "__main__":
    print(write(NAME, cells))
