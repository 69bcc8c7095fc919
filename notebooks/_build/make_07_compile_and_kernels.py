"""Generates notebooks/07_compile_and_kernels.ipynb."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import INSTALL, badge, code, md, write  # noqa: E402

NAME = "07_compile_and_kernels.ipynb"

cells = [
    md(badge(NAME) + """

# `torch.compile` and custom JAX kernels

Eager mode runs one ATen op at a time, and every op costs Python time on the host. A training step of a real
model is thousands of ops, so eager mode spends much of its time in Python. `torch.compile(model,
backend="tpu")` captures the step once with Dynamo and lowers it, through the same op table eager mode uses,
into **one** XLA program per graph.

In this notebook we profile an eager training step, compile it, read the graph breaks `torch.compile`
reports and fix one, and finally write a kernel in JAX (and in Pallas) and use it as a PyTorch op."""),
    code(INSTALL),
    code("%load_ext torchtpu_lab"),
    md("""## An eager training step

A small MLP block with LayerNorm and a residual, trained with AdamW. We use strict eager mode (one XLA launch
per op), the mode closest to PyTorch's own eager."""),
    code("""import time
import torch
import torch.nn as nn
import torch.nn.functional as F
import torchtpu_lab

torchtpu_lab.set_eager_mode("strict")

class Block(nn.Module):
    def __init__(self, dim=64):
        super().__init__()
        self.ln = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, 4 * dim)
        self.down = nn.Linear(4 * dim, dim)
        self.head = nn.Linear(dim, 10)

    def forward(self, x):
        for _ in range(2):                              # the same block twice: many small ops
            x = x + self.down(F.gelu(self.up(self.ln(x))))
        return self.head(x)

torch.manual_seed(0)
model = Block().to("tpu")
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
x = torch.randn(32, 64).to("tpu")
y = torch.randint(0, 10, (32,)).to("tpu")

def train_step(model, opt):
    opt.zero_grad()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    return loss

def ms_per_step(step, n=3):
    step().item()                                       # warm up (compiles)
    t0 = time.perf_counter()
    for _ in range(n):
        loss = step()
    loss.item()
    return 1000 * (time.perf_counter() - t0) / n"""),
    md("""## Find the slow part

`%%tpu_profile` counts the ATen ops of one step and where the time went."""),
    code("""train_step(model, opt).item()                           # warm up: compile each op once"""),
    code("""%%tpu_profile --top 5 --no-flame
loss = train_step(model, opt)
loss.item()"""),
    code("""eager = _tpu_profile.summary()
eager_ms = ms_per_step(lambda: train_step(model, opt))
print(f"eager: {eager['ops']} ATen ops per step, {eager_ms:.1f} ms/step")"""),
    md("""Every one of those ops pays the host's per-op cost. That is what `torch.compile` removes.

## `torch.compile(backend="tpu")`

Compile the model *and* the optimizer step. `dynamic=False` asks for static shapes: one XLA program per
input shape (a new shape recompiles, and the profile says why)."""),
    code("""compiled_model = torch.compile(model, backend="tpu", dynamic=False)
compiled_step = torch.compile(opt.step, backend="tpu", dynamic=False)

def compiled_train_step():
    opt.zero_grad()
    loss = F.cross_entropy(compiled_model(x), y)
    loss.backward()
    compiled_step()
    return loss

compiled_train_step().item()                           # first call: Dynamo traces, XLA compiles"""),
    code("""%%tpu_profile --top 5 --no-flame
loss = compiled_train_step()
loss.item()"""),
    code("""steady = _tpu_profile.summary()
compiled_ms = ms_per_step(compiled_train_step)
graphs = sorted({e.name for e in _tpu_profile.graphs if e.name.startswith("compiled")})
print(f"compiled: {steady['compiles']} compiles in the steady state, graphs per step: {graphs}")
print(f"eager {eager_ms:.1f} ms/step -> compiled {compiled_ms:.1f} ms/step ({eager_ms / compiled_ms:.1f}x)")"""),
    md("""The forward, the backward and the optimizer update each run as one compiled program (the ATen ops of each
are listed in its compile event), and nothing compiles in the steady state.

## Graph breaks

Dynamo cannot put a host read such as `.item()` into a graph: it *breaks* the graph there, runs the read
eagerly and starts a new graph after it. Each break costs a device round trip and splits the XLA program.
The profile lists every break with Dynamo's reason and your line."""),
    code("""class Clipped(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(64, 64)

    def forward(self, x):
        h = self.lin(x)
        peak = h.abs().max().item()                    # a Python float: a graph break
        return h / max(peak, 1.0)

clipped = Clipped().to("tpu")"""),
    code("""%%tpu_profile --no-flame
out = torch.compile(clipped, backend="tpu", dynamic=False)(x)"""),
    code("""for b in _tpu_profile.graph_breaks:
    print(f"graph break at {torchtpu_lab.telemetry.describe(b.source)}: {b.name}")"""),
    md("""The fix: keep the value on the device. `torch.clamp(peak, min=1.0)` does what `max(peak, 1.0)` did,
without leaving the graph."""),
    code("""class ClippedFixed(Clipped):
    def forward(self, x):
        h = self.lin(x)
        peak = h.abs().max()                           # stays a tensor
        return h / torch.clamp(peak, min=1.0)

fixed = ClippedFixed().to("tpu")
fixed.load_state_dict(clipped.state_dict())
torch._dynamo.reset()"""),
    code("""%%tpu_profile --no-flame
out_fixed = torch.compile(fixed, backend="tpu", dynamic=False)(x)"""),
    code("""print(f"graph breaks after the fix: {len(_tpu_profile.graph_breaks)}")
print("same result:", torch.allclose(out.cpu(), out_fixed.cpu(), atol=1e-6))"""),
    md("""## A JAX kernel as a PyTorch op

`torchtpu_lab.jax_op` turns a type-annotated JAX function into a PyTorch op on the tpu device: `jax.Array`
arguments become tensors, `int`/`float`/`bool`/`str` static values. Its shapes come from `jax.eval_shape`, so
it works under `torch.compile` (inlined into the compiled program), in every eager mode and under
`FakeTensorMode`. `autograd="vjp"` derives the backward from `jax.vjp`."""),
    code("""import jax
import jax.numpy as jnp

@torchtpu_lab.jax_op("tutorial::swiglu", autograd="vjp")
def swiglu(x: jax.Array, gate: jax.Array) -> jax.Array:
    return x * jax.nn.silu(gate)

a = torch.randn(4, 8, device="tpu", requires_grad=True)
g = torch.randn(4, 8, device="tpu")
out = swiglu(a, g)
out.sum().backward()
reference = a.detach().cpu() * F.silu(g.cpu())
print("matches PyTorch:", torch.allclose(out.detach().cpu(), reference, atol=1e-6))
print("gradient matches:", torch.allclose(a.grad.cpu(), F.silu(g.cpu()), atol=1e-6))"""),
    md("""A Pallas kernel is written the same way: `pl.pallas_call` inside the JAX function. Off a TPU (on XLA:CPU)
torchtpu_lab runs it in Pallas's TPU interpret mode, so the kernel is written exactly as for a TPU and the same
notebook runs on a laptop."""),
    code("""from jax.experimental import pallas as pl

def _scale_add(x_ref, y_ref, o_ref):
    o_ref[...] = 2.0 * x_ref[...] + y_ref[...]

@torchtpu_lab.jax_op("tutorial::scale_add")
def scale_add(x: jax.Array, y: jax.Array) -> jax.Array:
    return pl.pallas_call(_scale_add, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x, y)

p, q = torch.randn(8, 128), torch.randn(8, 128)
print("pallas matches:", torch.allclose(scale_add(p.to("tpu"), q.to("tpu")).cpu(), 2 * p + q))"""),
    md("""Both ops inside a compiled function: they are inlined into the one XLA program, next to the ATen ops."""),
    code("""@torch.compile(backend="tpu", dynamic=False)
def fused(a, g, q):
    return scale_add(swiglu(a, g).repeat(1, 16), q).sum()

torch._dynamo.reset()
with torchtpu_lab.profile() as prof:
    total = fused(a.detach(), g, q.to("tpu")[:4])
forward = next(e for e in prof.compiles if e.detail.get("kind") == "compiled")
print("ops in the compiled program:", forward.detail["ops"])
expected = (2 * (a.detach().cpu() * F.silu(g.cpu())).repeat(1, 16) + q[:4]).sum()
print("result matches:", torch.allclose(total.cpu(), expected, atol=1e-4))"""),
    md("""## Takeaways

* `torch.compile(model, backend="tpu")` turns the forward, the backward and a compiled optimizer step into one
  XLA program each; parameters and buffers are inputs, so the steady state compiles nothing.
* Graph breaks (`.item()`, printing, data-dependent Python control flow) split programs; `%%tpu_profile` shows
  each with its line. Keep values on the device to remove them.
* `torchtpu_lab.jax_op` (and `torchtpu_lab.call_jax` for one-off calls) make JAX and Pallas code PyTorch ops
  that run in eager mode, under `torch.compile` and with autograd."""),
]

if __name__ == "__main__":
    print(write(NAME, cells))
