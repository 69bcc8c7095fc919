"""Training steps of real models, eager and compiled, on the tpu device and on the CPU, in one run.

    python bench/compile_step.py [--reps 3] [--iters 5] [--models gpt2,llama,bert,t5,resnet,vit,transformer]
                                 [--paths fused,compiled-forward,compiled-step,fullgraph-step,cpu,inductor]

Per model (the tiny random-init Hugging Face configs of ``tests/test_compile_users.py``, and the 2-layer
transformer of ``bench/train_step.py``), one AdamW step (forward, ``loss.backward()``, ``opt.step()``) as:

* **fused eager**: fused mode, ``torchtpu_lab.sync()`` at the end of the step;
* **compiled forward**: ``torch.compile(model, backend="tpu")``, backward and the optimizer eager (fused);
* **compiled step**: the whole step under ``torch.compile(backend="tpu")`` with PyTorch's compiled autograd
  (``torch._dynamo.config.compiled_autograd``): forward, backward and the optimizer as compiled programs
  (Dynamo's ``trace_autograd_ops`` is not used: in torch 2.13 it silently drops ``loss.backward()`` when the
  forward has a graph break, as GPT-2's does);
* **fullgraph step**: the whole step under ``torch.compile(backend="tpu", fullgraph=True)`` with Dynamo's
  ``trace_autograd_ops`` (no graph break, so the backward is traced): one XLA program per step, parameters and
  AdamW state donated (``torchtpu_lab/compile/whole_step.py``); transformers' ``logger.warning_once`` is in
  Dynamo's ``ignore_logging_functions`` (GPT-2's forward calls it, a graph break otherwise). A model whose
  forward still has a graph break cannot be traced so; the table then says why in place of a time;
* **torch CPU eager** and **Inductor CPU** (``torch.compile(model)`` on the CPU: forward and backward compiled);
* for ``transformer`` also **jax.jit AdamW, donated**: the same model and AdamW update hand-written in JAX, its
  parameters and optimizer state donated, the reference of the issue's 1.1x target.

Each figure is the median over ``--reps`` of the mean step time over ``--iters`` steady-state steps, the paths
timed in turn within each rep (``bench/train_step.py``'s ``median_interleaved``); ratios are against CPU eager,
and for ``transformer`` also against the JAX step, measured in the same run.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys

import common  # noqa: F401  (sets sys.path)
import jax
import jax.numpy as jnp
import torch
import train_step as ts

import torchtpu_lab

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

LR, BETAS, EPS, WD = 1e-3, (0.9, 0.999), 1e-8, 0.01
PATHS = ("fused", "compiled-forward", "compiled-step", "fullgraph-step", "cpu", "inductor")
#: Dynamo's settings while each compiled step runs (read when it is traced): compiled autograd for the
#: compiled step's ``loss.backward()``, Dynamo's own backward tracing for the fullgraph step
COMPILED_AUTOGRAD = {"compiled_autograd": True}
TRACED_BACKWARD = {"trace_autograd_ops": True, "compiled_autograd": False}


def _ignored_logging() -> set:
    """Transformers' ``logger.warning_once`` (GPT-2's forward calls it when it reads ``loss_function``): Dynamo
    cannot trace a logger call and breaks the graph there; ``torch._dynamo.config.ignore_logging_functions`` is
    PyTorch's switch that makes it a no-op in the traced graph."""
    try:
        from transformers.utils.logging import warning_once
    except ImportError:
        return set()
    return {warning_once}


def _model(name: str):
    """(model on the CPU, loss function ``(model, batch) -> loss``, batch on the CPU)."""
    torch.manual_seed(0)
    if name == "transformer":
        x, y = ts.data("transformer")
        return ts.Transformer(), lambda m, b: ts.torch_loss("transformer", m, b["x"], b["y"]), {"x": x, "y": y}
    from test_compile_users import MODELS

    build, make_batch = MODELS[name]
    return build().train(), lambda m, b: m(**b).loss, make_batch(torch.Generator().manual_seed(1))


def _step(model, loss_fn, batch, *, compile_step=False, fullgraph=False, finish=lambda: None):
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=WD, foreach=True)
    settings = {**TRACED_BACKWARD, "ignore_logging_functions": _ignored_logging()} if fullgraph else COMPILED_AUTOGRAD

    def step():
        loss = loss_fn(model, batch)
        loss.backward()
        opt.step()
        return loss.detach()

    if fullgraph:
        # Dynamo keeps its compiled entries per code object, and its guards do not tell this closure from the
        # compiled step's (same code, different model): sharing the code, the fullgraph path ran the compiled
        # step's graphs with its backward left eager. A code object of its own keeps the two apart.
        step.__code__ = step.__code__.replace(co_name="fullgraph_step")
    inner = torch.compile(step, backend="tpu", fullgraph=fullgraph) if compile_step else step

    def run():
        opt.zero_grad(set_to_none=True)
        with torch._dynamo.config.patch(settings):
            out = inner()
        finish()
        return out

    return run


def _jax_adamw(model, batch):
    """The transformer's AdamW step hand-written in JAX, parameters and moments donated."""
    b1, b2 = BETAS

    def step(p, m, v, t, x, y):
        loss, g = jax.value_and_grad(ts.jax_transformer_loss)(p, x, y)
        t = t + 1
        m = jax.tree_util.tree_map(lambda m_, g_: b1 * m_ + (1 - b1) * g_, m, g)
        v = jax.tree_util.tree_map(lambda v_, g_: b2 * v_ + (1 - b2) * g_ * g_, v, g)
        step_size = LR / (1 - b1 ** t)
        root_bc2 = jnp.sqrt(1 - b2 ** t)
        p = jax.tree_util.tree_map(lambda p_, m_, v_: p_ * (1 - LR * WD) - step_size * m_ / (jnp.sqrt(v_) / root_bc2
                                                                                             + EPS), p, m, v)
        return loss, p, m, v, t

    jitted = jax.jit(step, donate_argnums=(0, 1, 2))
    p = ts.jax_params(model)
    zeros = jax.tree_util.tree_map(jnp.zeros_like, p)
    state = {"s": (p, zeros, jax.tree_util.tree_map(jnp.zeros_like, p), jnp.float32(0))}
    x, y = jnp.asarray(batch["x"].numpy()), jnp.asarray(batch["y"].numpy())

    def run():
        loss, *rest = jitted(*state["s"], x, y)
        state["s"] = tuple(rest)
        return loss

    return run


def measure(name: str, iters: int, reps: int, paths: tuple) -> dict[str, float | str]:
    """Seconds per step by path (a path that cannot run this model: why, as a string)."""
    base, loss_fn, batch = _model(name)
    tpu_batch = {k: v.to("tpu") for k, v in batch.items()}
    tpu_wait = lambda o: torch.tpu.synchronize()
    runs, skipped = [], {}
    if name == "transformer":
        runs.append(ts.Path("jax.jit AdamW, donated", _jax_adamw(base, batch), lambda o: o.block_until_ready()))
    if "fused" in paths:
        runs.append(ts.Path("fused eager", _step(copy.deepcopy(base).to("tpu"), loss_fn, tpu_batch,
                                                 finish=torchtpu_lab.sync), tpu_wait, "fused"))
    if "compiled-forward" in paths:
        torch._dynamo.reset()
        model = torch.compile(copy.deepcopy(base).to("tpu"), backend="tpu")
        runs.append(ts.Path("compiled forward", _step(model, loss_fn, tpu_batch, finish=torchtpu_lab.sync),
                            tpu_wait, "fused"))
    if "compiled-step" in paths:
        step = _step(copy.deepcopy(base).to("tpu"), loss_fn, tpu_batch, compile_step=True)
        runs.append(ts.Path("compiled step", step, tpu_wait, "strict"))
    if "fullgraph-step" in paths:
        step = _step(copy.deepcopy(base).to("tpu"), loss_fn, tpu_batch, compile_step=True, fullgraph=True)
        try:
            with torchtpu_lab.eager_mode("strict"):
                step()  # traced and compiled here; a graph break is an error
            runs.append(ts.Path("fullgraph step", step, tpu_wait, "strict"))
        except Exception as e:  # noqa: BLE001 — reported in the table instead of a time
            skipped["fullgraph step"] = f"{type(e).__name__}: {str(e).splitlines()[0][:90]}"
    if "cpu" in paths:
        runs.append(ts.Path("torch CPU eager", _step(copy.deepcopy(base), loss_fn, batch), lambda o: None))
    if "inductor" in paths:
        runs.append(ts.Path("Inductor CPU", _step(torch.compile(copy.deepcopy(base)), loss_fn, batch),
                            lambda o: None))
    return {**ts.median_interleaved(runs, iters, reps), **skipped}


def main(argv=None) -> None:
    from common import add_clock_option, set_clock, table

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--models", default="gpt2,llama,bert,t5,resnet,vit,transformer")
    p.add_argument("--paths", default=",".join(PATHS), help=f"which of {', '.join(PATHS)} to measure")
    add_clock_option(p)
    args = p.parse_args(argv)
    set_clock(args.clock)
    print(f"platform: {torch.tpu.platform_name()}; medians of {args.reps} x {args.iters} steps")
    for name in args.models.split(","):
        r = measure(name, args.iters, args.reps, tuple(args.paths.split(",")))
        cpu = r.get("torch CPU eager")
        jx = r.get("jax.jit AdamW, donated")
        rows = [(k, f"{v * 1e3:.2f}", f"{v / cpu:.2f}x" if cpu else "-", f"{v / jx:.2f}x" if jx else "-")
                if isinstance(v, float) else (k, v, "-", "-") for k, v in r.items()]
        print(table(f"\n{name}: AdamW training step", rows, ("path", "ms/step", "vs CPU eager", "vs jax.jit")),
              flush=True)


if __name__ == "__main__":
    main()
