"""torch.distributed on the tpu device, across 2 processes on the CPU (JAX's multi-process runtime over Gloo).

Each multi-process check is one :func:`torchtpu_lab.distributed.launch` of a job in ``dist_jobs.py`` (several
checks per job, since starting ranks is the slow part); the launcher kills every rank on failure or timeout,
and each test also has a pytest timeout.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import torchtpu_lab
from torchtpu_lab.distributed import LaunchError, launch

import dist_jobs

WORLD = 2
# one worker runs this file under xdist (--dist loadgroup), so the module's 2-rank launch runs once
pytestmark = [pytest.mark.timeout(240), pytest.mark.xdist_group("distributed")]


@pytest.fixture(scope="module")
def collectives_run():
    return launch(dist_jobs.collectives, nprocs=WORLD, timeout=200)


def test_backend_is_registered_under_both_names():
    for name in ("tpu", "tpu_dist"):
        assert name in dist.Backend.backend_list
        assert "tpu" in dist.Backend.backend_capability[name]
    assert dist.Backend.default_device_backend_map["tpu"] == "tpu"


def test_importing_the_package_leaves_jax_uninitialised_so_ranks_can_join():
    """``init_process_group('tpu')`` must find JAX's backend not yet made: no module may make an array on import
    (one did, to take ``type(jnp.zeros(()))``, and every rank of every launch then refused to start)."""
    import subprocess
    import sys

    code = ("import torchtpu_lab, torchtpu_lab.runtime.optimizer_step, torchtpu_lab.runtime.bounded\n"
            "from jax._src import xla_bridge\n"
            "print('initialised' if xla_bridge._backends else 'untouched')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().endswith("untouched"), out.stdout


def test_every_collective_equals_gloo_on_cpu_tensors(collectives_run):
    for r in collectives_run:
        tpu, cpu = r.value["tpu"], r.value["cpu"]
        assert set(tpu) == set(cpu)
        assert len(tpu) >= 19
        for name in tpu:
            a, b = tpu[name], cpu[name]
            assert a.dtype == b.dtype, name
            torch.testing.assert_close(a, b, msg=f"rank {r.rank}: {name}")
    # spot-check absolute values, so the comparison itself cannot be vacuous
    r0, r1 = (r.value["tpu"] for r in collectives_run)
    assert r0["all_reduce_SUM"].tolist() == [[-4.0, -1.0, 2.0], [5.0, 8.0, 11.0]]
    assert r1["send_recv"].tolist() == [7.0, 8.0, 9.0]
    assert r0["scatter"].tolist() == [1.0, 1.0] and r1["scatter"].tolist() == [4.0, 4.0]
    assert r0["async_all_reduce"].tolist() == [3.0, 3.0]


def test_functional_collectives_subgroups_and_objects(collectives_run):
    for r in collectives_run:
        f = r.value["functional"]
        rank = r.rank
        assert f["all_reduce"].tolist() == [1.0, 3.0, 5.0, 7.0]
        assert f["all_gather_tensor"].tolist() == [0.0, 1.0, 2.0, 3.0, 1.0, 2.0, 3.0, 4.0]
        assert f["reduce_scatter_tensor"].tolist() == ([1.0, 3.0, 5.0, 7.0] if rank == 0 else [9.0, 11.0, 13.0, 15.0])
        assert f["all_to_all_single"].tolist() == ([0.0, 1.0, 10.0, 11.0] if rank == 0 else [2.0, 3.0, 12.0, 13.0])
        assert f["broadcast"].tolist() == [1.0, 2.0, 3.0, 4.0]
        assert r.value["object"] == {"from": "rank0", "list": [1, 2]}
        assert r.value["gathered_objects"] == [{"rank": 0}, {"rank": 1}]
        assert "recv without src=" in r.value["recv_any"]
        assert r.value["status"].startswith(f"rank {rank} of 2")
    assert collectives_run[0].value["subgroup"].tolist() == [5.0, 5.0]  # a group of rank 0 alone


def test_collectives_are_telemetry_events(collectives_run):
    v = collectives_run[0].value
    events = v["events"]
    kinds = {e[0] for e in events}
    assert {"all_reduce", "all_gather", "reduce_scatter_tensor", "broadcast", "all_to_all_single", "barrier",
            "send/recv"} <= kinds
    name, nbytes, participants, dur, source = next(e for e in events if e[0] == "all_reduce")
    assert nbytes == 6 * 4 and participants == 2 and dur > 0
    assert "dist_jobs.py" in source  # the user line that called it
    assert "collectives:" in v["report"] and "all_reduce over 2 ranks" in v["report"]
    assert "collective:all_reduce" in v["metrics"] and "CollectiveTime" in v["metrics"]


@pytest.mark.skipif(not dist_jobs.dynamo_reads_python_group_names(),
                    reason="torch 2.11's Dynamo breaks the graph at a Python group's group_name")
def test_compiled_graph_with_collectives_is_one_program_equal_to_gloo():
    """torch.compile(backend="tpu") of compute between functional collectives: one XLA program over the group's
    mesh per rank (the compile event says so; a second call compiles nothing), results equal to Gloo on CPU."""
    results = launch(dist_jobs.compiled_collectives, nprocs=WORLD, timeout=200)
    for r in results:
        v = r.value
        for got_run, want_run in zip(v["tpu"], v["cpu"], strict=True):
            for got, want in zip(got_run, want_run, strict=True):
                torch.testing.assert_close(got, want, msg=f"rank {r.rank}")
        compiled = [e for e in v["events"] if e[0] == "compiled"]
        assert len(compiled) == 1, v["events"]  # lowered once, reused by the second call
        kind, cause, inside, group = compiled[0]
        assert inside == ["_c10d_functional::" + c for c in ("all_reduce", "all_reduce", "all_gather_into_tensor",
                                                              "reduce_scatter_tensor", "all_to_all_single",
                                                              "broadcast")]
        assert group.startswith("group [0, 1] (2 x ")
        eager = [e for e in v["events"] if e[0] == "eager-graph"]
        assert len(eager) == 1 and "uneven splits" in eager[0][1]  # the uneven all_to_all ran op by op
    assert results[0].value["tpu"][0][0].abs().sum() > 0  # not vacuous: the all_reduce has values


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # DCP loading in one process says so
def test_ddp_fsdp2_dtensor_and_dcp(tmp_path):
    ckpt = str(tmp_path / "ckpt")
    results = launch(dist_jobs.training, nprocs=WORLD, args=(ckpt,), timeout=200)
    sgd, adamw = dist_jobs.reference("sgd"), dist_jobs.reference("adamw")
    model_bytes = sum(p.numel() * p.element_size() for p in sgd)
    for r in results:
        v = r.value
        assert v["backend_name"] == "tpu_dist"  # the name the group was created under
        for got, want in zip(v["ddp"], sgd, strict=True):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
        for got, want in zip(v["fsdp"], adamw, strict=True):
            torch.testing.assert_close(got, want, atol=1e-4, rtol=0)
        assert v["fsdp_param_types"] == ["DTensor"]
        assert abs(v["fsdp_local_bytes"] - model_bytes / WORLD) <= 0.05 * model_bytes  # really sharded
        a, b = v["dtensor_inputs"]
        assert v["dtensor_local_shape"] == (8 // WORLD, 6)
        torch.testing.assert_close(v["dtensor_matmul"], a @ b)
        torch.testing.assert_close(v["dtensor_redistribute"], a)
    # the checkpoint written by 2 ranks loads into this one process, onto the tpu device
    import torch.distributed.checkpoint as dcp

    state = {"w": torch.zeros(8, 6, device="tpu"), "step": torch.tensor(0, device="tpu")}
    dcp.load(state, checkpoint_id=ckpt, no_dist=True)
    torch.testing.assert_close(state["w"].cpu(), results[0].value["dtensor_inputs"][0])
    assert state["step"].item() == 5


def test_a_failing_rank_stops_the_others_and_names_the_collective():
    with pytest.raises(LaunchError) as info:
        launch(dist_jobs.fails_after_first_collective, nprocs=WORLD, args=(1,), timeout=120)
    text = str(info.value)
    assert "rank 1 fails on purpose" in text
    r0 = info.value.results[0]
    assert r0.returncode != 0
    # rank 0 was in the second all_reduce: either the transport saw its partner go, or the launcher stopped it
    assert "all_reduce" in (r0.error or "") + r0.stderr


def test_a_rank_that_skips_a_collective_times_out_naming_it():
    with pytest.raises(LaunchError) as info:
        launch(dist_jobs.skips_a_collective, nprocs=WORLD, args=(4.0,), timeout=120)
    r0 = info.value.results[0]
    assert r0.returncode == 124
    assert "timeout: all_reduce on group [0, 1]" in r0.stderr and "dist_jobs.py" in r0.stderr


def test_init_after_the_first_tpu_tensor_is_a_clear_error():
    with pytest.raises(LaunchError) as info:
        launch(dist_jobs.tpu_tensor_before_init, nprocs=WORLD, timeout=120)
    assert "must run before this process creates its first tpu tensor" in str(info.value)


def test_launch_sends_a_notebook_function_by_source_and_returns_output():
    def cell_function(scale):  # stands for a function defined in a notebook cell
        import torch
        import torch.distributed as dist

        dist.init_process_group("tpu")
        t = torch.ones(2, device="tpu") * (dist.get_rank() + 1) * scale
        dist.all_reduce(t)
        print("rank", dist.get_rank(), "done")
        return t

    results = launch(cell_function, nprocs=WORLD, args=(2.0,), timeout=120)
    assert [r.value.tolist() for r in results] == [[6.0, 6.0], [6.0, 6.0]]
    assert [r.rank for r in results] == [0, 1]
    assert "rank 1 done" in results[1].stdout


def test_launch_rejects_what_cannot_be_sent():
    with pytest.raises(ValueError, match="lambda"):
        launch(lambda: None, nprocs=2)
    with pytest.raises(ValueError, match="module:function"):
        launch("no_colon", nprocs=2)
    with pytest.raises(ValueError, match="nprocs"):
        launch(dist_jobs.collectives, nprocs=0)


def test_single_process_group_in_this_process():
    """World size 1 needs no multi-process runtime: the group works in the test process itself."""
    store = dist.HashStore()
    dist.init_process_group("tpu", store=store, rank=0, world_size=1)
    try:
        t = torch.arange(3.0, device="tpu")
        dist.all_reduce(t)
        assert t.cpu().tolist() == [0.0, 1.0, 2.0]
        with pytest.raises(NotImplementedError, match="PREMUL_SUM is not supported"):
            dist.all_reduce(t, op=dist._make_nccl_premul_sum(2.0))
        with pytest.raises(TypeError, match="AVG"):
            dist.all_reduce(torch.ones(2, dtype=torch.int64, device="tpu"), op=dist.ReduceOp.AVG)
        assert torchtpu_lab.distributed.describe().startswith("rank 0 of 1")
        from torchtpu_lab.jupyter.status import status, status_lines

        assert any("torch.distributed" in line and "rank 0 of 1" in line for line in status_lines(status()))
    finally:
        dist.destroy_process_group()


def test_stream_api_that_fsdp2_calls():
    """One ordered queue per device: ordering calls are no-ops, waiting really waits."""
    s = torch.tpu.Stream(priority=-1)
    cur = torch.tpu.current_stream()
    s.wait_stream(cur)
    x = torch.ones(3, device="tpu") * 2
    with torch.tpu.stream(s):
        e = torch.tpu.Event()
        e.record()
        s.wait_event(e)
    e.synchronize()
    s.synchronize()
    assert e.query() and cur == torch.tpu.current_stream() and x.cpu().tolist() == [2.0, 2.0, 2.0]


def test_tensor_list_out_variant():
    """``split_with_sizes_copy(..., out=[...])`` (FSDP2's all-gather copy-out) writes every output."""
    x = torch.arange(12.0).reshape(6, 2)
    outs = [torch.empty(2, 2, device="tpu"), torch.empty(4, 2, device="tpu")]
    torch.split_with_sizes_copy(x.to("tpu"), [2, 4], out=outs)
    assert [o.cpu().tolist() for o in outs] == [x[:2].tolist(), x[2:].tolist()]


def test_ranks_sharing_a_host_each_take_their_own_accelerator():
    from torchtpu_lab.distributed.world import local_device_ids

    assert local_device_ids({"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4"}) == [1]
    assert local_device_ids({"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}) is None  # one rank per host
    assert local_device_ids({"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "CUDA_VISIBLE_DEVICES": "3"}) is None
    assert local_device_ids({}) is None  # not under torchrun
