"""Generates notebooks/08_multichip.ipynb."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import INSTALL, badge, code, md, write  # noqa: E402

NAME = "08_multichip.ipynb"

cells = [
    md(badge(NAME) + """

# Multi-chip: DDP and FSDP2 on two ranks, from a notebook

PyTorch code moves to several TPU chips by changing the device and the distributed backend:
`dist.init_process_group("tpu")` (or TorchTPU's name, `"tpu_dist"`), then `DistributedDataParallel(model)`,
`fully_shard(model)` on `init_device_mesh("tpu", ...)`, DTensor. The collectives are XLA collectives run by
JAX's multi-process runtime: over ICI/DCN on a TPU slice, and over Gloo between processes on a CPU, which is
what this notebook uses, so it runs anywhere.

A notebook is one process, and a distributed job is one process per rank. Scripts use
`torchrun --nproc-per-node=2 train.py`; from a notebook, `torchtpu_lab.distributed.launch(fn, nprocs=2)`
starts the ranks on this machine, runs `fn` in each and brings back each rank's return value and printed
output.

We train the same small MLP three ways and check they agree: on one device with the full batch, with DDP on
two ranks (each sees half the batch; gradients are averaged), and with FSDP2 on two ranks (each rank also holds
only half of every parameter)."""),
    code(INSTALL),
    code("%load_ext torchtpu_lab"),
    md("""## One function for all three runs

`launch` sends a function defined in a notebook cell to the ranks *by its source code*, so it does its own
imports. `mode` picks single-process, DDP or FSDP2. Like a script under `torchrun`, the distributed modes call
`init_process_group("tpu")` **before** creating any tpu tensor: JAX fixes its set of devices when it starts,
so a process must join the multi-process runtime first."""),
    code('''def train(mode, steps=5):
    import torch, torch.nn as nn
    import torch.distributed as dist
    import torchtpu_lab

    rank, world = 0, 1
    if mode != "single":
        dist.init_process_group("tpu")
        rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8)).to("tpu")
    n_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    if mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP
        model = DDP(model)                                   # no device_ids: the rank's tpu device
    elif mode == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        mesh = init_device_mesh("tpu", (world,))
        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    local_bytes = sum((p.to_local() if hasattr(p, "to_local") else p).numel() * 4 for p in model.parameters())

    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(32, 32, generator=g), torch.randn(32, 8, generator=g)
    part = slice(rank * 32 // world, (rank + 1) * 32 // world)   # this rank's share of the batch
    x, y = x[part].to("tpu"), y[part].to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    with torchtpu_lab.profile() as prof:
        for step in range(steps):
            opt.zero_grad()
            loss = ((model(x) - y) ** 2).mean()
            loss.backward()
            opt.step()
    params = [(p.full_tensor() if hasattr(p, "full_tensor") else p).detach().cpu() for p in model.parameters()]
    kinds = sorted({e.name for e in prof.of_kind("collective")})
    print(f"[{mode} rank {rank}/{world}] loss {loss.item():.5f}, holds {local_bytes} of {n_bytes} parameter "
          f"bytes, collectives: {', '.join(kinds) or 'none'}")
    return {"params": params, "local_bytes": local_bytes, "model_bytes": n_bytes}'''),
    md("## One process, the full batch"),
    code('''single = train("single")'''),
    md("""## DDP on two ranks

Each rank computes gradients on its 16 rows; DDP all-reduces them (an `all_reduce` per gradient bucket), so
every rank takes the same step the single process took on all 32 rows."""),
    code('''from torchtpu_lab.distributed import launch

ddp = launch(train, nprocs=2, args=("ddp",), timeout=240)
for r in ddp:
    print(r.stdout.strip().splitlines()[-1])
diff = max((a - b).abs().max().item() for r in ddp for a, b in zip(r.value["params"], single["params"]))
print(f"DDP vs single process: largest parameter difference {diff:.2e}")'''),
    md("""## FSDP2 on two ranks

`fully_shard` keeps half of every parameter on each rank (a `DTensor` sharded on dim 0), all-gathers a layer's
parameters just before it runs and reduce-scatters its gradients; AdamW's state is sharded too."""),
    code('''fsdp = launch(train, nprocs=2, args=("fsdp",), timeout=240)
for r in fsdp:
    print(r.stdout.strip().splitlines()[-1])
diff = max((a - b).abs().max().item() for r in fsdp for a, b in zip(r.value["params"], single["params"]))
share = fsdp[0].value["local_bytes"] / fsdp[0].value["model_bytes"]
print(f"FSDP2 vs single process: largest parameter difference {diff:.2e}; each rank holds {share:.0%} of the parameters")'''),
    md("""## Running it as a script

The same function runs under `torchrun`, which sets `RANK`, `WORLD_SIZE`, `MASTER_ADDR` and `MASTER_PORT`
(on several hosts add `--nnodes` and the rendezvous options):

```bash
torchrun --nproc-per-node=2 train.py      # train.py: import torchtpu_lab; ...; train("fsdp")
```

If a rank fails, the others do not wait forever: `launch` stops them and raises `LaunchError` with every
rank's error; under `torchrun`, a collective that does not complete within the process group's `timeout`
ends its process with an error naming the collective and the line that called it."""),
]

if __name__ == "__main__":
    print(write(NAME, cells))
