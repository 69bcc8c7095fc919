"""Fused and ``torch.compile(backend="tpu")`` training steps on the tpu device vs a hand-written ``jax.jit``
step, PyTorch CPU eager and ``torch.compile`` on CPU — the same model, data and SGD update in each.

    python bench/train_step.py [--reps 5] [--iters 10] [--models mlp,transformer] [--overhead-only] [--no-overhead] [--hlo]

The compiled step is the whole step under ``torch.compile(backend="tpu", dynamic=False)`` (Dynamo cuts it at
``backward()``: a forward+backward graph pair and an optimizer-step graph, each one XLA program); it runs in
strict mode so the few eager ops between graphs (the loss seed, ``zero_grad``) run as they come. A second
table gives the host (Python) time of one compiled call for graphs of 10 to 1000 ops — the overhead that
should not grow with the graph — next to a bare ``jax.jit`` call of the same function.

Models: an MLP (3 layers of 1024, batch 64) and a 2-layer transformer (d_model 256, 4 heads, sequence 128,
batch 16). Each figure is the median over ``--reps`` of the mean step time over ``--iters`` steady-state steps;
within each rep every path is timed in turn (interleaved), so load from other jobs falls on all paths alike.
The tpu step ends with ``torchtpu_lab.sync()`` (the step boundary, like ``xm.mark_step()``); every loop waits
for its last result. Ratios are against the hand-written JAX step, measured in the same run.

``--hlo`` prints, per model, how many dots, transposes, copies and fusions XLA's optimized program of the fused
step has next to the hand-written step's (with and without donating its parameters): a gap in time that is not
host overhead shows up here as a different program (``docs/perf.md``).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import math
import re
import statistics
from typing import Any, Callable, NamedTuple

import common  # noqa: F401  (sets sys.path)
import jax
import jax.numpy as jnp
import torch
import torch.nn as nn
import torch.nn.functional as F

import torchtpu_lab

LR = 1e-3


# ---- the models, in PyTorch ---------------------------------------------------------------------------------


def torch_mlp():
    return nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1024))


class Block(nn.Module):
    def __init__(self, d=256, heads=4):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(a)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class Transformer(nn.Module):
    def __init__(self, vocab=512, d=256, seq=128):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.blocks = nn.Sequential(Block(d), Block(d))
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab)

    def forward(self, idx):
        pos = torch.arange(idx.shape[1], device=idx.device)
        return self.head(self.ln(self.blocks(self.tok(idx) + self.pos(pos))))


def data(name):
    g = torch.Generator().manual_seed(0)
    if name == "mlp":
        return torch.randn(64, 1024, generator=g), torch.randn(64, 1024, generator=g)
    idx = torch.randint(0, 512, (16, 128), generator=g)
    return idx, torch.roll(idx, -1, 1)


def torch_loss(name, model, x, y):
    out = model(x)
    if name == "mlp":
        return F.mse_loss(out, y)
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))


def torch_step_fn(name, model, x, y, sync):
    opt = torch.optim.SGD(model.parameters(), lr=LR)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = torch_loss(name, model, x, y)
        loss.backward()
        opt.step()
        sync()
        return loss

    return step


# ---- the same models, hand-written in JAX ----------------------------------------------------------------------


def jax_params(model):
    return {k: jnp.asarray(v.detach().numpy()) for k, v in model.state_dict().items()}


def _linear(p, name, x):
    return x @ p[f"{name}.weight"].T + p[f"{name}.bias"]


def _layer_norm(p, name, x):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / jnp.sqrt(var + 1e-5) * p[f"{name}.weight"] + p[f"{name}.bias"]


def jax_mlp_loss(p, x, y):
    h = jax.nn.relu(_linear(p, "0", x))
    h = jax.nn.relu(_linear(p, "2", h))
    return jnp.mean((_linear(p, "4", h) - y) ** 2)


def jax_transformer_loss(p, idx, y):
    t = idx.shape[1]
    x = p["tok.weight"][idx] + p["pos.weight"][jnp.arange(t)]
    mask = jnp.tril(jnp.ones((t, t), bool))
    for i in range(2):
        b = f"blocks.{i}"
        q, k, v = jnp.split(_linear(p, f"{b}.qkv", _layer_norm(p, f"{b}.ln1", x)), 3, axis=-1)
        q, k, v = (z.reshape(z.shape[0], t, 4, 64).transpose(0, 2, 1, 3) for z in (q, k, v))
        s = jnp.where(mask, q @ k.transpose(0, 1, 3, 2) / math.sqrt(64), -jnp.inf)
        a = (jax.nn.softmax(s, -1) @ v).transpose(0, 2, 1, 3).reshape(x.shape)
        x = x + _linear(p, f"{b}.proj", a)
        x = x + _linear(p, f"{b}.fc2", jax.nn.gelu(_linear(p, f"{b}.fc1", _layer_norm(p, f"{b}.ln2", x)),
                                                   approximate=False))
    logits = _linear(p, "head", _layer_norm(p, "ln", x))
    logp = jax.nn.log_softmax(logits, -1)
    return -jnp.mean(jnp.take_along_axis(logp, y[..., None], -1))


def jax_step(name):
    """The hand-written SGD step ``(params, x, y) -> (loss, new params)``, not jitted."""
    loss_fn = jax_mlp_loss if name == "mlp" else jax_transformer_loss

    def step(p, x, y):
        loss, g = jax.value_and_grad(loss_fn)(p, x, y)
        return loss, jax.tree_util.tree_map(lambda a, b: a - LR * b, p, g)

    return step


def jax_step_fn(name, model, x, y):
    step = jax.jit(jax_step(name))
    state = {"p": jax_params(model)}
    xj, yj = jnp.asarray(x.numpy()), jnp.asarray(y.numpy())

    def run():
        loss, state["p"] = step(state["p"], xj, yj)
        return loss

    return run


PATHS = ("jax", "fused", "strict", "tpu-compile", "cpu", "compile")


class Path(NamedTuple):
    """One way of running the step: ``step()`` runs one step, ``finish(out)`` waits for its result, ``mode`` is
    the eager mode it runs in (``None``: no tpu tensors)."""

    label: str
    step: Callable[[], Any]
    finish: Callable[[Any], None]
    mode: str | None = None
    iters: int | None = None  # steps per sample (default: --iters)
    warmup: int = 3


def _timed(path: Path, iters: int, warmup: int = 0) -> float:
    """Mean seconds per step of ``iters`` steps of ``path`` (after ``warmup`` untimed ones), waited for."""
    from common import clock

    now = clock()
    with torchtpu_lab.eager_mode(path.mode) if path.mode else contextlib.nullcontext():
        for _ in range(warmup):
            path.finish(path.step())
        if not iters:
            return 0.0
        t0 = now()
        out = None
        for _ in range(iters):
            out = path.step()
        path.finish(out)
        return (now() - t0) / iters


def median_interleaved(paths: list[Path], iters: int, reps: int) -> dict[str, float]:
    """Median over ``reps`` of each path's mean step time, the paths timed in turn within every rep: on a machine
    shared with other jobs a burst of load then falls on all of them alike, so their ratios stay meaningful
    (timing one path's reps, then the next's, compared different moments of the neighbours' load)."""
    samples: dict[str, list[float]] = {p.label: [] for p in paths}
    for p in paths:
        _timed(p, 0, p.warmup)
    for _ in range(reps):
        for p in paths:
            samples[p.label].append(_timed(p, p.iters or iters))
    return {label: statistics.median(v) for label, v in samples.items()}


def measure(name: str, iters: int, reps: int, paths=PATHS) -> dict[str, float]:
    import copy

    torch.manual_seed(0)
    ctor = torch_mlp if name == "mlp" else Transformer
    base = ctor()
    x, y = data(name)
    tpu_wait = lambda o: torch.tpu.synchronize()  # noqa: E731
    runs = [Path("jax.jit (hand-written)", jax_step_fn(name, base, x, y), lambda o: o.block_until_ready())]
    tpu_model = copy.deepcopy(base).to("tpu")
    if "fused" in paths:
        runs.append(Path("torchtpu_lab fused", torch_step_fn(name, tpu_model, x.to("tpu"), y.to("tpu"),
                                                             torchtpu_lab.sync), tpu_wait, "fused"))
    if "strict" in paths:
        runs.append(Path("torchtpu_lab strict", torch_step_fn(name, tpu_model, x.to("tpu"), y.to("tpu"),
                                                              lambda: None), tpu_wait, "strict", max(2, iters // 2)))
    if "tpu-compile" in paths:
        torch._dynamo.reset()
        compiled_model = copy.deepcopy(base).to("tpu")
        with torchtpu_lab.eager_mode("strict"):
            step = torch.compile(torch_step_fn(name, compiled_model, x.to("tpu"), y.to("tpu"), lambda: None),
                                 backend="tpu", dynamic=False)
        runs.append(Path("torch.compile tpu backend", step, tpu_wait, "strict"))
    if "cpu" in paths:
        runs.append(Path("torch CPU eager", torch_step_fn(name, copy.deepcopy(base), x, y, lambda: None),
                         lambda o: None))
    if "compile" in paths:
        runs.append(Path("torch.compile CPU", torch_step_fn(name, torch.compile(copy.deepcopy(base)), x, y,
                                                            lambda: None), lambda o: None))
    return median_interleaved(runs, iters, reps)


HLO_OPS = ("dot", "transpose", "copy", "fusion")


def hlo_counts(text: str) -> dict[str, int]:
    """Instructions of each kind in :data:`HLO_OPS` in an optimized HLO module's text (all computations)."""
    # an instruction is "name = type opcode(operands)"; a tuple type is "(...)" (no parentheses inside)
    found = collections.Counter(re.findall(r"= (?:\([^()]*\)|\S+) ([\w-]+)\(", text))
    return {op: found[op] for op in HLO_OPS}


def hlo_programs(name: str) -> dict[str, str]:
    """Optimized HLO text of the fused tpu step (its largest graph, after warm-up steps) and of the hand-written
    JAX step jitted without and with its parameters donated (the fused graph donates them)."""
    import copy

    from torchtpu_lab.runtime import state

    torch.manual_seed(0)
    base = torch_mlp() if name == "mlp" else Transformer()
    x, y = data(name)
    with torchtpu_lab.eager_mode("fused"):
        step = torch_step_fn(name, copy.deepcopy(base).to("tpu"), x.to("tpu"), y.to("tpu"), torchtpu_lab.sync)
        for _ in range(3):
            step()
    fused = max(state.STATE.graph_executables.values(), key=lambda g: g.n_nodes).fn.as_text()
    args = (jax_params(base), jnp.asarray(x.numpy()), jnp.asarray(y.numpy()))
    texts = {"torchtpu_lab fused": fused}
    for label, donate in (("jax.jit (hand-written)", ()), ("jax.jit, params donated", (0,))):
        texts[label] = jax.jit(jax_step(name), donate_argnums=donate).lower(*args).compile().as_text()
    return texts


def call_overhead(n_ops: int, reps: int, calls: int = 200) -> dict[str, float]:
    """Host seconds per call of a compiled function of ``n_ops`` elementwise ops on a tiny tensor (the device
    work is negligible, and dispatch is asynchronous), via torch.compile(backend="tpu") and via jax.jit."""
    import statistics
    import time

    def chain(x):
        for i in range(n_ops):
            x = x * 1.0001 if i % 2 else x + 0.0001
        return x

    torch._dynamo.reset()
    compiled = torch.compile(chain, backend="tpu", dynamic=False)
    jitted = jax.jit(chain)
    xt, xj = torch.ones(8, device="tpu"), jnp.ones(8)
    out = {}
    for label, fn, arg, wait in (("torch.compile tpu", compiled, xt, lambda o: torch.tpu.synchronize()),
                                 ("jax.jit", jitted, xj, lambda o: o.block_until_ready())):
        wait(fn(arg))
        samples = []
        for _ in range(reps):
            t0 = time.perf_counter()
            for _ in range(calls):
                r = fn(arg)
            samples.append((time.perf_counter() - t0) / calls)
            wait(r)
        out[label] = statistics.median(samples)
    return out


def main(argv=None) -> None:
    from common import add_clock_option, set_clock, table

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--models", default="mlp,transformer")
    p.add_argument("--overhead-only", action="store_true", help="only the per-call overhead table")
    p.add_argument("--no-overhead", action="store_true", help="skip the per-call overhead table")
    p.add_argument("--hlo", action="store_true", help="only the optimized-HLO instruction counts per model")
    p.add_argument("--paths", default=",".join(PATHS),
                   help="which of jax (always), fused, strict, cpu, compile to measure")
    add_clock_option(p)
    args = p.parse_args(argv)
    set_clock(args.clock)
    if args.hlo:
        for name in args.models.split(","):
            rows = [(k, *hlo_counts(t).values()) for k, t in hlo_programs(name).items()]
            print(table(f"\n{name} step, optimized HLO", rows, ("program", *HLO_OPS)))
        return
    print(f"platform: {torch.tpu.platform_name()}; medians of {args.reps} x {args.iters} steps")
    if not args.no_overhead:
        with torchtpu_lab.eager_mode("strict"):
            rows = []
            for n in (10, 100, 1000):
                o = call_overhead(n, args.reps)
                rows.append((n, f"{o['torch.compile tpu'] * 1e6:.1f}", f"{o['jax.jit'] * 1e6:.1f}",
                             f"{(o['torch.compile tpu'] - o['jax.jit']) * 1e6:.1f}"))
            print(table("\nhost time of one compiled call (us)", rows,
                        ("ops in graph", "torch.compile tpu", "jax.jit", "our overhead")))
    if args.overhead_only:
        return
    for name in args.models.split(","):
        r = measure(name, args.iters, args.reps, tuple(args.paths.split(",")))
        ref = r["jax.jit (hand-written)"]
        rows = [(k, f"{v * 1e3:.2f}", f"{v / ref:.2f}x") for k, v in r.items()]
        print(table(f"\n{name} training step", rows, ("path", "ms/step", "vs jax.jit")))


if __name__ == "__main__":
    main()
