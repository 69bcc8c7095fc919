"""Functions that tests/test_distributed.py runs on several ranks with torchtpu_lab.distributed.launch.

Each job runs one set of checks on tpu tensors (the ``tpu`` backend) and, where there is one, the same on CPU
tensors through a Gloo group in the same processes, and returns both for the test to compare.
"""

from __future__ import annotations

import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn

REDUCE_OPS = ("SUM", "AVG", "MIN", "MAX", "PRODUCT")
BITWISE_OPS = ("BAND", "BOR", "BXOR")



def dynamo_reads_python_group_names() -> bool:
    """Whether Dynamo reads a Python process group's ``group_name`` without tracing it: torch 2.11's calls the
    property (torchtpu_lab code, which Dynamo is told never to trace) and breaks the graph at every functional
    collective; 2.12's and 2.13's read it as a constant."""
    return tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 12)

def _suite(dev: str, group) -> dict:
    """Every collective once, on ``dev`` tensors through ``group``; this rank's results (CPU tensors)."""
    r, w = dist.get_rank(), dist.get_world_size()
    out: dict = {}

    def T(x):
        return x.to(dev)

    for op in REDUCE_OPS:
        t = T(torch.arange(6.0).reshape(2, 3) * (r + 1) - 2)
        if op == "AVG" and dev == "cpu":  # Gloo has no AVG: the reference is SUM / world size
            dist.all_reduce(t, op=dist.ReduceOp.SUM, group=group)
            t = t / w
        else:
            dist.all_reduce(t, op=getattr(dist.ReduceOp, op), group=group)
        out["all_reduce_" + op] = t.cpu()
    for op in BITWISE_OPS:
        t = T(torch.tensor([5, 3, 12]) + r * 7)
        dist.all_reduce(t, op=getattr(dist.ReduceOp, op), group=group)
        out["all_reduce_" + op] = t.cpu()
    t = T(torch.tensor([1, 2, 3]) * (r + 2))
    dist.all_reduce(t, group=group)
    out["all_reduce_int64"] = t.cpu()
    g = [T(torch.zeros(2, 2)) for _ in range(w)]
    dist.all_gather(g, T(torch.full((2, 2), r + 0.5)), group=group)
    out["all_gather"] = torch.stack([x.cpu() for x in g])
    o = T(torch.zeros(2 * w, 3))
    dist.all_gather_into_tensor(o, T(torch.ones(2, 3) * r), group=group)
    out["all_gather_into_tensor"] = o.cpu()
    o = T(torch.zeros(2, 3))
    dist.reduce_scatter_tensor(o, T(torch.arange(6.0 * w).reshape(2 * w, 3) + r), group=group)
    out["reduce_scatter_tensor"] = o.cpu()
    b = T(torch.arange(4.0) + 10 * r)
    dist.broadcast(b, src=w - 1, group=group)
    out["broadcast"] = b.cpu()
    t = T(torch.arange(4.0) + r)
    dist.reduce(t, dst=0, group=group)
    if r == 0:
        out["reduce"] = t.cpu()
    gl = [T(torch.zeros(3)) for _ in range(w)] if r == 0 else None
    dist.gather(T(torch.full((3,), float(r))), gl, dst=0, group=group)
    if r == 0:
        out["gather"] = torch.stack([x.cpu() for x in gl])
    s = T(torch.zeros(2))
    sl = [T(torch.full((2,), 3.0 * i + 1)) for i in range(w)] if r == 1 else None
    dist.scatter(s, sl, src=1, group=group)
    out["scatter"] = s.cpu()
    o = T(torch.zeros(2 * w))
    dist.all_to_all_single(o, T(torch.arange(2.0 * w) + 100 * r), group=group)
    out["all_to_all_single"] = o.cpu()
    ins, outs_s = [i + 1 + r for i in range(w)], [r + 1 + j for j in range(w)]
    o = T(torch.zeros(sum(outs_s)))
    dist.all_to_all_single(o, T(torch.arange(float(sum(ins))) + 1000 * r), outs_s, ins, group=group)
    out["all_to_all_single_uneven"] = o.cpu()
    outs = [T(torch.zeros(2)) for _ in range(w)]
    ins = [T(torch.full((2,), 10.0 * r + i)) for i in range(w)]
    try:
        dist.all_to_all(outs, ins, group=group)
    except RuntimeError as e:  # torch 2.11's Gloo has no alltoall (refused before any exchange): the same, flat
        if group is None or "does not support alltoall" not in str(e):
            raise
        flat = T(torch.zeros(2 * w))
        dist.all_to_all_single(flat, torch.cat(ins), group=group)
        outs = list(flat.chunk(w))
    out["all_to_all"] = torch.stack([x.cpu() for x in outs])
    if r == 0:
        dist.send(T(torch.arange(3.0) + 7), dst=1, group=group)
    elif r == 1:
        t = T(torch.zeros(3))
        dist.recv(t, src=0, group=group)
        out["send_recv"] = t.cpu()
    t = T(torch.ones(2) * (r + 1))
    work = dist.all_reduce(t, async_op=True, group=group)
    work.wait()
    out["async_all_reduce"] = t.cpu()
    dist.barrier(group=group)
    return out


def collectives() -> dict:
    """All collectives on tpu tensors vs Gloo on CPU tensors; functional collectives; subgroups; objects;
    telemetry."""
    import torch.distributed._functional_collectives as fc

    import torchtpu_lab

    dist.init_process_group("tpu")
    r, w = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    with torchtpu_lab.profile() as prof:
        tpu = _suite("tpu", None)
    cpu = _suite("cpu", gloo)
    x = torch.arange(4.0, device="tpu") + r
    functional = {
        "all_reduce": fc.all_reduce(x, "sum", dist.group.WORLD).cpu(),
        "all_gather_tensor": fc.all_gather_tensor(x, 0, dist.group.WORLD).cpu(),
        "reduce_scatter_tensor": fc.reduce_scatter_tensor(torch.arange(4.0 * w, device="tpu") + r, "sum", 0,
                                                          dist.group.WORLD).cpu(),
        "all_to_all_single": fc.all_to_all_single(torch.arange(2.0 * w, device="tpu") + 10 * r, None, None,
                                                  dist.group.WORLD).cpu(),
        "broadcast": fc.broadcast(x, 1, dist.group.WORLD).cpu(),
    }
    sub = dist.new_group([0])
    subgroup = None
    if r == 0:
        t = torch.ones(2, device="tpu") * 5
        dist.all_reduce(t, group=sub)
        subgroup = t.cpu()
    objs = [{"from": "rank0", "list": [1, 2]}] if r == 0 else [None]
    dist.broadcast_object_list(objs, src=0)
    gathered = [None] * w
    dist.all_gather_object(gathered, {"rank": r})
    events = [(e.name, e.nbytes, e.detail["participants"], e.dur, str(e.source)) for e in prof.of_kind("collective")]
    report = prof.text()
    try:
        torch.distributed.recv(torch.zeros(1, device="tpu"))
        recv_any = None
    except NotImplementedError as e:
        recv_any = str(e)
    return {"tpu": tpu, "cpu": cpu, "functional": functional, "subgroup": subgroup, "object": objs[0],
            "gathered_objects": gathered, "events": events, "report": report,
            "metrics": torchtpu_lab.metrics_report(), "status": torchtpu_lab.distributed.describe(),
            "recv_any": recv_any}


def collective_step(x: torch.Tensor, w: torch.Tensor, group) -> tuple:
    """Compute between functional collectives (what DTensor and FSDP2 emit): compiled with backend="tpu" it is one
    program over the group's mesh (tests/test_compile.py in one process, :func:`compiled_collectives` on 2)."""
    import torch.distributed._functional_collectives as fc

    s = fc.all_reduce(x @ w, "sum", group)
    h = torch.relu(s) * 2 + 1
    m = fc.all_reduce(h - x.sum(), "max", group)
    g = fc.all_gather_tensor(h, 0, group)  # all_gather_single and reduce_scatter_single: torch 2.13 on
    rs = fc.reduce_scatter_tensor(g * 3, "sum", 0, group)
    t = fc.all_to_all_single(h + m, None, None, group)
    b = fc.broadcast(t * 0.5, group.size() - 1, group)
    return s, m, g, rs, t, b, (b * s).sum()


def collective_inputs(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's inputs of :func:`collective_step` (different on every rank, so the collectives matter)."""
    g = torch.Generator().manual_seed(10 + rank)
    return torch.randn(4, 3, generator=g), torch.randn(3, 6, generator=g)


def compiled_collectives() -> dict:
    """:func:`collective_step` under torch.compile(backend="tpu") on tpu tensors, twice, and eagerly through Gloo
    on CPU tensors; the compile events of the compiled runs."""
    import torch.distributed._functional_collectives as fc

    import torchtpu_lab

    dist.init_process_group("tpu")
    r = dist.get_rank()
    gloo = dist.new_group(backend="gloo")
    x, w = collective_inputs(r)
    step = torch.compile(collective_step, backend="tpu", dynamic=False)
    # uneven splits (rank-dependent sizes) are not lowered: that graph runs eagerly, and says so
    ins, outs = [i + 1 + r for i in range(dist.get_world_size())], [r + 1 + j for j in range(dist.get_world_size())]
    uneven = torch.compile(lambda t, group: fc.all_to_all_single(t, outs, ins, group), backend="tpu", dynamic=False)
    v = torch.arange(float(sum(ins))) + 100 * r
    with torchtpu_lab.profile() as prof:
        first = [o.cpu() for o in step(x.to("tpu"), w.to("tpu"), dist.group.WORLD)]
        second = [o.cpu() for o in step((x * 2).to("tpu"), w.to("tpu"), dist.group.WORLD)]
        first.append(uneven(v.to("tpu"), dist.group.WORLD).cpu())
    events = [(e.detail["kind"], str(e.detail["cause"]), e.detail.get("collectives"), e.detail.get("group"))
              for e in prof.compiles]
    # Gloo's results are AsyncCollectiveTensors: wait for each (reading one before its work is done reads garbage)
    cpu = [[fc.wait_tensor(o) for o in collective_step(a, w, gloo)] for a in (x, x * 2)]
    cpu[0].append(fc.wait_tensor(fc.all_to_all_single(v, outs, ins, gloo)))
    return {"tpu": [first, second], "cpu": cpu, "events": events}


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))


def _batch():
    g = torch.Generator().manual_seed(1)
    return torch.randn(16, 16, generator=g), torch.randn(16, 4, generator=g)


def _shard(x, r: int, w: int):
    n = x.shape[0] // w
    return x[r * n:(r + 1) * n]


def reference(optimizer: str, steps: int = 5) -> list[torch.Tensor]:
    """Single-process training on the full batch, on the CPU: what the distributed runs must equal."""
    m = _mlp()
    opt = torch.optim.SGD(m.parameters(), lr=0.1) if optimizer == "sgd" else torch.optim.AdamW(m.parameters(), lr=0.01)
    x, y = _batch()
    for _ in range(steps):
        opt.zero_grad()
        ((m(x) - y) ** 2).mean().backward()
        opt.step()
    return [p.detach().clone() for p in m.parameters()]


def training(ckpt_dir: str) -> dict:
    """DDP (SGD) and FSDP2 (AdamW) for 5 steps on each rank's half of the batch; DTensor; a DCP save."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("tpu_dist")  # TorchTPU's name for the backend
    r, w = dist.get_rank(), dist.get_world_size()
    x, y = _batch()
    xs, ys = _shard(x, r, w).to("tpu"), _shard(y, r, w).to("tpu")
    out: dict = {"backend_name": dist.group.WORLD._get_backend_name()}

    ddp = DDP(_mlp().to("tpu"))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for _ in range(5):
        opt.zero_grad()
        ((ddp(xs) - ys) ** 2).mean().backward()
        opt.step()
    out["ddp"] = [p.detach().cpu() for p in ddp.module.parameters()]

    mesh = init_device_mesh("tpu", (w,))
    model = _mlp().to("tpu")
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    out["fsdp_local_bytes"] = sum(p.to_local().numel() * p.element_size() for p in model.parameters())
    out["fsdp_param_types"] = sorted({type(p).__name__ for p in model.parameters()})
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    for _ in range(5):
        opt.zero_grad()
        ((model(xs) - ys) ** 2).mean().backward()
        opt.step()
    out["fsdp"] = [p.full_tensor().cpu() for p in model.parameters()]

    torch.manual_seed(0)
    a, b = torch.randn(8, 6), torch.randn(6, 4)
    da = distribute_tensor(a.to("tpu"), mesh, [Shard(0)])
    db = distribute_tensor(b.to("tpu"), mesh, [Replicate()])
    out["dtensor_local_shape"] = tuple(da.to_local().shape)
    out["dtensor_matmul"] = (da @ db).redistribute(mesh, [Replicate()]).to_local().cpu()
    out["dtensor_redistribute"] = distribute_tensor(a.to("tpu"), mesh, [Shard(1)]).redistribute(
        mesh, [Shard(0)]).full_tensor().cpu()
    out["dtensor_inputs"] = (a, b)

    state = {"w": distribute_tensor(a.to("tpu"), mesh, [Shard(0)]), "step": torch.tensor(5, device="tpu")}
    dcp.save(state, checkpoint_id=ckpt_dir)
    return out


def fails_after_first_collective(rank_that_fails: int) -> None:
    dist.init_process_group("tpu")
    t = torch.ones(2, device="tpu")
    dist.all_reduce(t)
    if dist.get_rank() == rank_that_fails:
        raise ValueError(f"rank {rank_that_fails} fails on purpose")
    dist.all_reduce(t)  # the other rank waits here for a partner that is gone


def skips_a_collective(timeout_s: float) -> None:
    """Rank 1 never calls the second all_reduce (but stays alive): rank 0's watchdog must end it."""
    dist.init_process_group("tpu", timeout=timedelta(seconds=timeout_s))
    t = torch.ones(2, device="tpu")
    dist.all_reduce(t)
    if dist.get_rank() == 1:
        time.sleep(120)
    dist.all_reduce(t)


def tpu_tensor_before_init() -> None:
    torch.ones(1, device="tpu") + 1  # JAX's backend starts here
    dist.init_process_group("tpu")
