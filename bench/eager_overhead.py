"""Per-op and per-step host cost of eager execution on the tpu device, against PyTorch's own CPU eager.

    python bench/eager_overhead.py [--iters 2000] [--reps 7] [--steps 10] [--gc-steps 0] [--clock host]

* strict mode, cache hit: one small op (64x64 float32) as a tpu tensor op vs one call of the same jitted JAX
  function (target: at most 1.5x), and the same op with the native core's kernel off (``config.native_recording``:
  the Python kernel runs the executable);
* fused mode capture: the cost of recording one op into the lazy graph (no execution) on tiny 8x8 tensors, next
  to the same op in PyTorch's CPU eager on the same sizes (target: at most 2x), and the same capture with the
  native core's recording kernel off (``config.native_recording``: every op through its Python kernel);
* a tiny transformer's training step (2 layers, d 64, batch 2, 16 tokens; forward, backward, AdamW) in fused
  mode — recording, the sync (graph key, lookup, launch, commit; and the program's run on XLA:CPU's threads
  with ``--clock cpu`` or ``wall``) and the whole step — vs the same step in PyTorch CPU eager with one intra-op
  thread (target: host time no more than CPU eager's whole step: ``--clock host`` measures host time, the CPU
  of the calling thread and of PyTorch's autograd thread, where a tpu backward runs, not XLA:CPU's threads;
  CPU eager's one thread does all its work, backward and compute included); and the same step's recording with ``AdamW(fused=True)`` (``transformers``' ``Trainer`` default), against its CPU step;
* tensors made from the host: ``torch.tensor``, ``.to("tpu")`` and factories (``full``, ``arange``, ``zeros``)
  in fused mode with nothing pending (a cell's set-up, a batch, a step's first mask), vs the same call on the CPU;
* the floor: PyTorch's own dispatch into an empty Python PrivateUse1 kernel (no Python backend could be cheaper);
* with ``--gc-steps N``: Python's garbage collector over N steps of the same transformer, fused vs CPU eager (its
  time per step, collections per generation; full collections are rare, so N of 2000 or more).

Each per-op figure is the median over ``--reps`` repetitions of the mean per op over ``--iters`` ops; the step
figures are medians over ``--steps`` steady-state steps, tpu and CPU steps interleaved so that load from other
jobs falls on both. Ratios compare figures of the same run; the strict and capture ratios are medians of
per-repetition ratios, tpu and the reference measured alternately (``common.median_pair``), and the capture's CPU
figure runs the same chained loop as the tpu one (each op takes the previous result).
"""

from __future__ import annotations

import argparse
import contextlib

import common  # noqa: F401  (sets sys.path)
import jax
import jax.numpy as jnp
import torch

import torchtpu_lab
from torchtpu_lab.runtime import fused, recording

OPS = {
    "add": (lambda a, b: a + b, lambda a, b: a + b),
    "mul": (lambda a, b: a * b, lambda a, b: a * b),
    "relu": (lambda a, b: torch.relu(a), lambda a, b: jax.nn.relu(a)),
    "matmul": (lambda a, b: a @ b, lambda a, b: a @ b),
    "sum": (lambda a, b: a.sum(), lambda a, b: a.sum()),
    "to(bf16)": (lambda a, b: a.to(torch.bfloat16), lambda a, b: a.astype(jnp.bfloat16)),
}
#: ops whose output is not an input of the next call when capturing (a reduction, a cast to another dtype)
UNCHAINED = {"sum", "to(bf16)"}


def strict_rows(iters: int, reps: int) -> list[tuple]:
    from common import median_pair, median_time

    x = torch.randn(64, 64)
    a, b = x.to("tpu"), x.to("tpu")
    aj, bj = jnp.asarray(x.numpy()), jnp.asarray(x.numpy())
    rows = []
    with torchtpu_lab.eager_mode("strict"):
        for name, (tfn, jfn) in OPS.items():
            jitted = jax.jit(jfn)
            t_tpu, t_jax, ratio = median_pair(lambda: tfn(a, b), lambda o: torch.tpu.synchronize(),
                                              lambda: jitted(aj, bj), lambda o: o.block_until_ready(), iters, reps)
            with torchtpu_lab.config.native_recording(False):
                t_py = median_time(lambda: tfn(a, b), lambda o: torch.tpu.synchronize(), iters, reps)
            rows.append((name, f"{t_tpu * 1e6:.1f}", f"{t_py * 1e6:.1f}", f"{t_jax * 1e6:.1f}",
                         f"{ratio:.2f}x", f"{t_py / t_jax:.2f}x"))
    return rows


_floor_lib = None


def floor_rows(iters: int, reps: int) -> list[tuple]:
    """The floor of any op on a pure-Python PrivateUse1 backend: PyTorch's dispatch into an empty Python kernel
    (returning an input), and into one that only creates an output tensor (what every real op must do)."""
    global _floor_lib
    from common import median_time

    from torchtpu_lab.device import tensor

    if _floor_lib is None:
        _floor_lib = torch.library.Library("tpu_bench", "DEF")
        _floor_lib.define("noop(Tensor a, Tensor b) -> Tensor")
        _floor_lib.define("new(Tensor a, Tensor b) -> Tensor")
        _floor_lib.impl("noop", lambda a, b: a, "PrivateUse1")
        _floor_lib.impl("new", lambda a, b: tensor.empty(a.shape, a.dtype), "PrivateUse1")
    a = torch.randn(64, 64).to("tpu")
    noop, new = torch.ops.tpu_bench.noop.default, torch.ops.tpu_bench.new.default
    return [("empty Python kernel", f"{median_time(lambda: noop(a, a), lambda o: None, iters, reps) * 1e6:.1f}"),
            ("kernel creating one output tensor",
             f"{median_time(lambda: new(a, a), lambda o: None, iters, reps) * 1e6:.1f}")]


def _chained(fn, unchained: bool, x0):
    """The loop both devices run: each call takes the previous call's result (``x0`` again after ``reset``), or
    ``x0`` itself for an op whose output cannot feed it (a reduction, a cast to another dtype)."""
    state = {"x": x0}

    def call():
        state["x"] = fn(x0, x0) if unchained else fn(state["x"], x0)
        return state["x"]

    def reset() -> None:
        state["x"] = x0

    return call, reset


def capture_rows(iters: int, reps: int) -> list[tuple]:
    from common import median_pair, median_time

    x = torch.randn(8, 8)
    a, ca = x.to("tpu"), x.clone()
    rows = []
    # measure recording only; the graph is dropped unexecuted by the sync below
    with torchtpu_lab.config.patch(max_graph_ops=10**9, eager_mode="fused"):
        for name, (tfn, _) in OPS.items():
            record, reset = _chained(tfn, name in UNCHAINED, a)

            def finish(_):
                reset()
                fused.PENDING.storages.clear()  # drop the recorded graph unexecuted
                fused.PENDING.recorded = 0
                fused.PENDING.segment.reset()

            cpu_call, cpu_reset = _chained(tfn, name in UNCHAINED, ca)  # the same loop on the CPU
            t, t_cpu, ratio = median_pair(record, finish, cpu_call, lambda _: cpu_reset(), iters, reps)
            with torchtpu_lab.config.native_recording(False):
                t_py = median_time(record, finish, iters, reps)
            rows.append((name, f"{t * 1e6:.1f}", f"{t_py * 1e6:.1f}", f"{t_cpu * 1e6:.1f}", f"{ratio:.2f}x"))
    return rows


CREATION = {
    "torch.tensor([])": lambda dev, host: torch.tensor([], device=dev),
    ".to(device, copy=True), 8x8": lambda dev, host: host.to(dev, copy=True),  # a copy on the CPU too
    "torch.full((8, 8), 2.0)": lambda dev, host: torch.full((8, 8), 2.0, device=dev),
    "torch.arange(8)": lambda dev, host: torch.arange(8, device=dev),
    "torch.zeros(8, 8)": lambda dev, host: torch.zeros(8, 8, device=dev),
}


def creation_rows(iters: int, reps: int) -> list[tuple]:
    """Tensors made on the device from the host (a copy, a factory) in fused mode with no pending work, as a
    cell's set-up, a data loader's batch or a step's first mask meets them, vs the same call on the CPU."""
    from common import median_time

    host = torch.randn(8, 8)
    rows = []
    with torchtpu_lab.eager_mode("fused"):
        torchtpu_lab.sync()
        for name, make in CREATION.items():
            t_tpu = median_time(lambda: make("tpu", host), lambda o: None, iters, reps)
            t_cpu = median_time(lambda: make("cpu", host), lambda o: None, iters, reps)
            rows.append((name, f"{t_tpu * 1e6:.1f}", f"{t_cpu * 1e6:.1f}", f"{t_tpu / t_cpu:.1f}x"))
    return rows


def _transformer_steps(fused_optimizer: bool = False):
    """``(step, tpu args, cpu args)``: a tiny transformer's AdamW step and the same model and data on tpu and CPU
    (``fused_optimizer``: ``AdamW(fused=True)``, ``transformers``' ``Trainer`` default; else PyTorch's default,
    the foreach path)."""
    import torch.nn.functional as F
    from train_step import Transformer

    torch.manual_seed(0)
    cpu_model = Transformer(vocab=128, d=64, seq=16)
    tpu_model = Transformer(vocab=128, d=64, seq=16)
    tpu_model.load_state_dict(cpu_model.state_dict())
    tpu_model.to("tpu")
    idx = torch.randint(0, 128, (2, 16))
    target = torch.roll(idx, -1, 1)
    options = {"fused": True} if fused_optimizer else {}
    cpu_opt = torch.optim.AdamW(cpu_model.parameters(), lr=1e-3, **options)
    tpu_opt = torch.optim.AdamW(tpu_model.parameters(), lr=1e-3, **options)

    def step(model, opt, x, y):
        opt.zero_grad(set_to_none=True)
        out = model(x)
        F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1)).backward()
        opt.step()

    return step, (tpu_model, tpu_opt, idx.to("tpu"), target.to("tpu")), (cpu_model, cpu_opt, idx, target)


def step_rows(steps: int) -> list[tuple]:
    """A tiny transformer's AdamW step: fused on tpu (recording, sync, whole) vs PyTorch CPU eager."""
    import statistics

    from common import clock

    now = clock()
    step, (tpu_model, tpu_opt, idx_t, target_t), (cpu_model, cpu_opt, idx, target) = _transformer_steps()
    _, fused_tpu, fused_cpu = _transformer_steps(fused_optimizer=True)
    record, sync, whole, cpu, python, fused_record, fused_cpu_step = [], [], [], [], [], [], []
    threads = torch.get_num_threads()
    # one intra-op thread for the CPU step: on a small shared machine OpenMP's workers spin while they wait, which
    # --clock cpu would count as the step's time (and the tiny model gains nothing from a second thread)
    torch.set_num_threads(1)
    with torchtpu_lab.eager_mode("fused"):
        for i in range(steps + 3):  # three warm-up steps compile the step's graphs
            t0 = now()
            step(tpu_model, tpu_opt, idx_t, target_t)
            t1 = now()
            torchtpu_lab.sync()
            t2 = now()
            step(cpu_model, cpu_opt, idx, target)
            t3 = now()
            step(*fused_tpu)
            t4 = now()
            torchtpu_lab.sync()
            t5 = now()
            step(*fused_cpu)
            t6 = now()
            with torchtpu_lab.config.native_recording(False):
                step(tpu_model, tpu_opt, idx_t, target_t)
                t7 = now()
                torchtpu_lab.sync()
            if i >= 3:
                record.append(t1 - t0)
                sync.append(t2 - t1)
                whole.append(t2 - t0)
                cpu.append(t3 - t2)
                fused_record.append(t4 - t3)
                fused_cpu_step.append(t6 - t5)
                python.append(t7 - t6)
    torch.set_num_threads(threads)
    ms = {k: statistics.median(v) * 1e3 for k, v in
          {"record": record, "sync": sync, "whole": whole, "cpu": cpu, "python": python, "fused_record": fused_record,
           "fused_cpu": fused_cpu_step}.items()}
    return [("fused: recording (host)", f"{ms['record']:.2f}", f"{ms['record'] / ms['cpu']:.2f}x"),
            ("fused: recording, Python path only", f"{ms['python']:.2f}", f"{ms['python'] / ms['cpu']:.2f}x"),
            ("fused: sync (key, lookup, launch; XLA:CPU run but with --clock host)", f"{ms['sync']:.2f}", f"{ms['sync'] / ms['cpu']:.2f}x"),
            ("fused: whole step", f"{ms['whole']:.2f}", f"{ms['whole'] / ms['cpu']:.2f}x"),
            ("PyTorch CPU eager: whole step", f"{ms['cpu']:.2f}", "1.00x"),
            ("AdamW(fused=True): fused recording", f"{ms['fused_record']:.2f}",
             f"{ms['fused_record'] / ms['fused_cpu']:.2f}x (of its CPU step)"),
            ("AdamW(fused=True): PyTorch CPU eager whole step", f"{ms['fused_cpu']:.2f}",
             f"{ms['fused_cpu'] / ms['cpu']:.2f}x")]


def gc_rows(steps: int) -> list[tuple]:
    """Python's cyclic garbage collector during ``steps`` tiny transformer AdamW steps, fused on tpu vs PyTorch CPU
    eager: its time per step and collections per step by generation (a full collection walks every object torch
    and JAX keep, ~0.2 s; how often one comes due depends on how many tracked objects a step makes and keeps).
    Measured with ``gc.callbacks``, after three warm-up steps."""
    import gc
    import time

    step, tpu_args, cpu_args = _transformer_steps()
    rows = []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    for name, args, on_tpu in (("fused (tpu)", tpu_args, True), ("PyTorch CPU eager", cpu_args, False)):
        spent = {0: [0.0, 0], 1: [0.0, 0], 2: [0.0, 0]}
        started: list = []

        def watch(phase, info):
            if phase == "start":
                started.append(time.perf_counter())
            elif started:
                entry = spent[info["generation"]]
                entry[0] += time.perf_counter() - started.pop()
                entry[1] += 1

        with torchtpu_lab.eager_mode("fused") if on_tpu else contextlib.nullcontext():
            for _ in range(3):
                step(*args)
                if on_tpu:
                    torchtpu_lab.sync()
            gc.callbacks.insert(0, watch)
            try:
                for _ in range(steps):
                    step(*args)
                    if on_tpu:
                        torchtpu_lab.sync()
            finally:
                gc.callbacks.remove(watch)
        total = sum(v[0] for v in spent.values())
        rows.append((name, f"{total / steps * 1e3:.3f}", *(f"{spent[g][1] / steps:.3f}" for g in (0, 1)),
                     f"{spent[2][1]} ({spent[2][0] / max(spent[2][1], 1) * 1e3:.0f} ms each)"))
    torch.set_num_threads(threads)
    return rows


def main(argv=None) -> None:
    from common import add_clock_option, set_clock, table

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--iters", type=int, default=2000)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--gc-steps", type=int, default=0,
                   help="also measure the garbage collector over this many steps of each (full collections are "
                        "rare: use 2000 or more)")
    add_clock_option(p, host=True)
    args = p.parse_args(argv)
    set_clock(args.clock)
    print(f"platform: {torch.tpu.platform_name()}")
    print(table("\nstrict mode, per op (cache hit), 64x64 float32",
                strict_rows(args.iters, args.reps),
                ("op", "tpu us", "Python path us", "jax.jit us", "ratio", "Python path ratio")))
    print(table("\nfused mode, capture cost per recorded op (8x8 float32) vs PyTorch CPU eager",
                capture_rows(args.iters, args.reps),
                ("op", "tpu fused us", "Python path us", "CPU eager us", "fused vs CPU")))
    print(table("\ntensors made from the host (fused mode, nothing pending) vs the same call on the CPU",
                creation_rows(args.iters, args.reps), ("call", "tpu us", "CPU us", "tpu vs CPU")))
    print(f"recording kernel: {recording.stats() or 'not built (pure-Python mode)'}")
    print(table(f"\ntiny transformer AdamW step (median of {args.steps}) vs PyTorch CPU eager",
                step_rows(args.steps), ("part", "ms/step", "vs CPU step")))
    print(table("\nfloor: PyTorch dispatch to a Python PrivateUse1 kernel", floor_rows(args.iters, args.reps),
                ("kernel", "us/call")))
    if args.gc_steps:
        print(table(f"\ngarbage collection over {args.gc_steps} tiny transformer AdamW steps",
                    gc_rows(args.gc_steps),
                    ("path", "gc ms/step", "gen0 per step", "gen1 per step", "full collections")))


if __name__ == "__main__":
    main()
