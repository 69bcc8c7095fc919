"""all_reduce bus bandwidth on the tpu backend vs Gloo on CPU tensors, and the step-time overhead of DDP.

    python bench/allreduce.py [--nprocs 2] [--reps 5] [--max-mib 64] [--skip-ddp]

Both collectives run in the same 2 processes (started with ``torchtpu_lab.distributed.launch``): the ``tpu``
process group on tpu tensors (a compiled XLA all-reduce, Gloo underneath on XLA:CPU) and a Gloo group on CPU
tensors. Each size is timed as the median over ``--reps`` of a loop of calls, each waited for. Bus bandwidth
follows NCCL's convention: ``2 (n - 1) / n * bytes / time``.

DDP overhead: the MLP of bench/train_step.py (3 x Linear(1024, 1024), SGD) on a global batch of 64, one
process on the full batch vs DDP on ``nprocs`` ranks with 64 / nprocs rows each; each step ends with
``torchtpu_lab.sync()`` and the loop waits for the loss.
"""

from __future__ import annotations

import argparse
import statistics
import time

import common


def _timed(fn, reps: int, iters: int) -> float:
    fn()
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        samples.append((time.perf_counter() - t0) / iters)
    return statistics.median(samples)


def allreduce_job(sizes: list[int], reps: int) -> list[tuple]:
    import torch
    import torch.distributed as dist

    dist.init_process_group("tpu")
    gloo = dist.new_group(backend="gloo")
    rows = []
    for nbytes in sizes:
        n = nbytes // 4
        iters = max(2, min(50, (8 << 20) // nbytes))
        t_tpu = torch.ones(n, device="tpu")
        t_cpu = torch.ones(n)

        def tpu():
            dist.all_reduce(t_tpu)

        def cpu():
            dist.all_reduce(t_cpu, group=gloo)

        rows.append((nbytes, _timed(tpu, reps, iters), _timed(cpu, reps, iters)))
    return rows


def _mlp():
    import torch.nn as nn

    return nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1024))


def ddp_job(distributed: bool, batch: int, reps: int, iters: int) -> float:
    import torch
    import torch.distributed as dist

    import torchtpu_lab

    if distributed:
        dist.init_process_group("tpu")
    torch.manual_seed(0)
    model = _mlp().to("tpu")
    if distributed:
        from torch.nn.parallel import DistributedDataParallel as DDP

        model = DDP(model)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(batch, 1024, device="tpu"), torch.randn(batch, 1024, device="tpu")

    def step():
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        torchtpu_lab.sync()
        return loss

    def run():
        step().item()

    for _ in range(2):
        run()
    return _timed(run, reps, iters)


def main() -> None:
    from torchtpu_lab.distributed import launch

    ap = argparse.ArgumentParser()
    ap.add_argument("--nprocs", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--max-mib", type=int, default=64)
    ap.add_argument("--skip-ddp", action="store_true")
    a = ap.parse_args()
    n = a.nprocs
    sizes = [4 << 10]
    while sizes[-1] * 4 <= a.max_mib << 20:
        sizes.append(sizes[-1] * 4)
    res = launch("allreduce:allreduce_job", nprocs=n, args=(sizes, a.reps), timeout=1800)[0].value
    factor = 2 * (n - 1) / n

    def gbs(nbytes, t):
        return f"{factor * nbytes / t / 1e9:.3f}"

    rows = [(f"{b / 1024:.0f} KiB" if b < 1 << 20 else f"{b >> 20} MiB", f"{tt * 1e3:.3f}", gbs(b, tt),
             f"{tc * 1e3:.3f}", gbs(b, tc), f"{tt / tc:.2f}") for b, tt, tc in res]
    print(common.table(f"all_reduce, float32, {n} CPU processes (median of {a.reps})", rows,
                       ("size", "tpu ms", "tpu bus GB/s", "gloo ms", "gloo bus GB/s", "tpu/gloo time")))
    if a.skip_ddp:
        return
    single = launch("allreduce:ddp_job", nprocs=1, args=(False, 64, a.reps, 5), timeout=1800)[0].value
    ddp = launch("allreduce:ddp_job", nprocs=n, args=(True, 64 // n, a.reps, 5), timeout=1800)[0].value
    print()
    print(common.table("DDP overhead, MLP 3 x 1024, global batch 64, SGD", [
        ("1 process, batch 64", f"{single * 1e3:.1f}", "1.00"),
        (f"DDP, {n} ranks x batch {64 // n}", f"{ddp * 1e3:.1f}", f"{ddp / single:.2f}"),
    ], ("run", "step ms", "vs 1 process")))


if __name__ == "__main__":
    main()
