"""torch.compile on the tpu device: fake tensors, PyTorch's debug backends, export, and our ``tpu`` backend."""

from __future__ import annotations

import pytest
import torch
from torch import nn


def _mlp_bn():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))


def _pair(make):
    cpu = make()
    tpu = make().to("tpu")
    tpu.load_state_dict({k: v.to("tpu") for k, v in cpu.state_dict().items()})
    return cpu, tpu


# ---- 0. fake tensors of device tpu never reach our kernels --------------------------------------------------


def test_fake_tensor_mode_on_tpu_views():
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode()
    x = mode.from_tensor(torch.randn(2, 4).to("tpu"))
    w = mode.from_tensor(torch.randn(3, 4).to("tpu"))
    with mode:
        y = torch.nn.functional.linear(x, w)  # t() is a view: its meta output carries tpu keys
        z = y.t().reshape(6)[1:].unsqueeze(0)
    assert y.device.type == "tpu" and tuple(y.shape) == (2, 3)
    assert tuple(z.shape) == (1, 5) and z.device.type == "tpu"


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_pytorch_debug_backends_on_a_tpu_module(backend):
    torch._dynamo.reset()
    cpu, tpu = _pair(_mlp_bn)
    x = torch.randn(6, 4)
    out = torch.compile(tpu, backend=backend)(x.to("tpu"))
    ref = cpu(x)
    torch.testing.assert_close(out.cpu(), ref.detach(), rtol=1e-5, atol=1e-5)
    out.sum().backward()
    ref.sum().backward()
    torch.testing.assert_close(tpu[0].weight.grad.cpu(), cpu[0].weight.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(tpu[1].running_mean.cpu(), cpu[1].running_mean, rtol=1e-5, atol=1e-6)


def test_dynamo_explain_and_export_on_tpu():
    torch._dynamo.reset()
    cpu, tpu = _pair(_mlp_bn)
    x = torch.randn(6, 4)
    cpu.eval(), tpu.eval()
    explanation = torch._dynamo.explain(tpu)(x.to("tpu"))
    assert explanation.graph_count == 1 and explanation.graph_break_count == 0
    exported = torch.export.export(tpu, (x.to("tpu"),))
    assert any(n.target is torch.ops.aten.linear.default for n in exported.graph.nodes)
    torch.testing.assert_close(exported.module()(x.to("tpu")).cpu(), cpu(x).detach(), rtol=1e-5, atol=1e-5)


# ---- 1. the tpu backend: real models train like CPU eager ---------------------------------------------------

import copy  # noqa: E402
import inspect  # noqa: E402
import re  # noqa: E402

import torch.nn.functional as F  # noqa: E402

import torchtpu_lab  # noqa: E402


class TinyGPT(nn.Module):
    """Embedding, causal attention, MLP, and an output head tied to the embedding."""

    def __init__(self, vocab=16, dim=8, ctx=6):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.randn(ctx, dim) * 0.02)
        self.att = nn.MultiheadAttention(dim, 2, batch_first=True)
        self.ln = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, idx):
        t = idx.shape[1]
        x = self.emb(idx) + self.pos[:t]
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool, device=idx.device), 1)
        a, _ = self.att(x, x, x, attn_mask=mask, need_weights=False)
        x = x + a
        return self.head(x + self.mlp(self.ln(x)))


def _ce(out, tgt):
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), tgt.reshape(-1))


def _train_both(make, inp, tgt, loss_fn, steps=3, compile_step=False):
    """Train a CPU model eagerly and its tpu copy under torch.compile(backend="tpu"); return both loss lists,
    the tpu model and the profile of the last (steady-state) step."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    cpu = make()
    tpu = copy.deepcopy(cpu).to("tpu")
    opt_cpu = torch.optim.Adam(cpu.parameters(), lr=1e-2)
    opt_tpu = torch.optim.Adam(tpu.parameters(), lr=1e-2)
    model = torch.compile(tpu, backend="tpu", dynamic=False)
    step = torch.compile(opt_tpu.step, backend="tpu", dynamic=False) if compile_step else opt_tpu.step
    losses_cpu, losses_tpu, prof = [], [], None
    for i in range(steps):
        opt_cpu.zero_grad()
        loss = loss_fn(cpu(inp), tgt)
        loss.backward()
        opt_cpu.step()
        losses_cpu.append(loss.item())
        with torchtpu_lab.profile() as p:
            opt_tpu.zero_grad()
            loss = loss_fn(model(inp.to("tpu")), tgt.to("tpu"))
            loss.backward()
            step()
            losses_tpu.append(loss.item())
        prof = p
    return losses_cpu, losses_tpu, tpu, prof


def _compiled_graphs(prof):
    return [e for e in prof.compiles if e.detail.get("kind") == "compiled"]


def test_gpt_with_tied_weights_trains_like_cpu():
    idx, tgt = torch.randint(0, 16, (2, 6)), torch.randint(0, 16, (2, 6))
    before = len([e for e in torchtpu_lab.telemetry.compile_log if e.detail.get("kind") == "compiled"])
    losses_cpu, losses_tpu, tpu, prof = _train_both(TinyGPT, idx, tgt, _ce)
    for a, b in zip(losses_cpu, losses_tpu):
        assert abs(a - b) < 1e-4
    assert tpu.head.weight is tpu.emb.weight
    compiled = [e for e in torchtpu_lab.telemetry.compile_log if e.detail.get("kind") == "compiled"][before:]
    assert {e.name.split()[1] for e in compiled} >= {"forward", "backward"}  # one XLA program each
    assert any("aten::embedding" in e.detail["ops"] for e in compiled)
    assert prof.compiles == []  # steady state: nothing compiles
    assert any(e.name.startswith("compiled forward") for e in prof.graphs)


def test_cnn_with_batchnorm_trains_like_cpu_and_updates_running_stats():
    def make():
        return nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                             nn.Linear(36, 3))

    x, y = torch.randn(4, 1, 8, 8), torch.randint(0, 3, (4,))
    losses_cpu, losses_tpu, tpu, prof = _train_both(make, x, y, F.cross_entropy)
    for a, b in zip(losses_cpu, losses_tpu):
        assert abs(a - b) < 1e-4
    assert prof.compiles == []
    assert int(tpu[1].num_batches_tracked.cpu()) == 3
    assert float(tpu[1].running_var.cpu().sub(1).abs().max()) > 1e-3  # the running stats moved


def test_lstm_trains_like_cpu():
    x, y = torch.randn(2, 3, 4), torch.randn(2, 3, 5)
    with torch._dynamo.config.patch(allow_rnn=True):  # Dynamo skips RNN modules unless asked
        losses_cpu, losses_tpu, _, prof = _train_both(lambda: nn.LSTM(4, 5, batch_first=True), x, y,
                                                      lambda o, t: F.mse_loss(o[0], t))
    for a, b in zip(losses_cpu, losses_tpu):
        assert abs(a - b) < 1e-4
    assert prof.compiles == [] and any(e.name.startswith("compiled forward") for e in prof.graphs)


def test_compiled_optimizer_step_updates_parameters_in_place():
    def make():
        return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))

    x, y = torch.randn(5, 4), torch.randn(5, 1)
    torch.manual_seed(0)
    losses_cpu, losses_tpu, tpu, prof = _train_both(make, x, y, F.mse_loss, compile_step=True)
    for a, b in zip(losses_cpu, losses_tpu):
        assert abs(a - b) < 1e-4
    assert prof.compiles == []
    steps = [e for e in prof.graphs if e.name.startswith("compiled inference")]
    assert steps, "the optimizer step ran as one compiled graph"
    # the parameter objects are the ones the optimizer holds, updated in place
    weight = tpu[0].weight
    before = weight.detach().cpu().clone()
    storage = weight.tpu_storage
    torch._dynamo.reset()
    opt = torch.optim.SGD(tpu.parameters(), lr=0.5)
    F.mse_loss(tpu(x.to("tpu")), y.to("tpu")).backward()
    torch.compile(opt.step, backend="tpu", dynamic=False)()
    assert weight.tpu_storage is storage
    torch.testing.assert_close(weight.detach().cpu(), before - 0.5 * weight.grad.cpu(), rtol=1e-6, atol=1e-6)


def test_dropout_draws_from_the_tpu_generator_each_call():
    torch._dynamo.reset()
    f = torch.compile(lambda x: F.dropout(x, 0.5, training=True), backend="tpu", dynamic=False)
    x = torch.ones(64, device="tpu")
    torch.manual_seed(1)
    a, b = f(x).cpu(), f(x).cpu()
    torch.manual_seed(1)
    c = f(x).cpu()
    assert not torch.equal(a, b)  # the key is an input, not a constant
    torch.testing.assert_close(a, c)  # and it comes from the seeded generator
    assert set(a.unique().tolist()) <= {0.0, 2.0}


def test_outputs_aliasing_inputs_and_no_grad():
    torch._dynamo.reset()

    def f(x, w):
        with torch.no_grad():
            y = x @ w
        return x.t(), y, x[1:]

    x, w = torch.randn(3, 4), torch.randn(4, 2, requires_grad=True)
    xt = x.to("tpu")
    t, y, tail = torch.compile(f, backend="tpu", dynamic=False)(xt, w.detach().to("tpu").requires_grad_())
    torch.testing.assert_close(y.cpu(), x @ w.detach(), rtol=1e-5, atol=1e-5)
    assert not y.requires_grad
    torch.testing.assert_close(t.cpu(), x.t())
    tail.mul_(0)  # a view of the input: writing it writes the input
    assert float(xt[1:].abs().sum().cpu()) == 0.0 and float(xt[0].abs().sum().cpu()) > 0


def test_autocast_inside_compiled_region():
    torch._dynamo.reset()

    def f(a, b):
        with torch.autocast("tpu", dtype=torch.bfloat16):
            return a @ b

    a, b = torch.randn(4, 4), torch.randn(4, 4)
    out = torch.compile(f, backend="tpu", dynamic=False)(a.to("tpu"), b.to("tpu"))
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.cpu().float(), a @ b, rtol=2e-2, atol=2e-2)


# ---- 2. graph breaks and recompiles are telemetry events ----------------------------------------------------


class _Breaks(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 1)

    def forward(self, x):
        h = self.a(x)
        scale = h.sum().item()  # BREAK: a host read
        return self.b(h) * scale


def test_graph_break_is_reported_with_its_line():
    torch._dynamo.reset()
    model = _Breaks().to("tpu")
    line = next(i for i, text in enumerate(inspect.getsource(_Breaks).splitlines()) if "BREAK" in text)
    line += inspect.getsourcelines(_Breaks)[1]
    with torchtpu_lab.profile() as prof:
        torch.compile(model, backend="tpu", dynamic=False)(torch.randn(2, 4).to("tpu"))
    breaks = prof.graph_breaks
    assert breaks, "the .item() graph break was reported"
    assert breaks[0].source.lineno == line and breaks[0].source.filename == __file__
    assert "item" in breaks[0].detail["reason"].lower()
    assert "graph break" in torchtpu_lab.metrics_report().lower()
    from torchtpu_lab.jupyter.status import status, status_lines

    assert status().graph_breaks >= 1 and any("graph breaks" in line for line in status_lines(status()))


def test_a_compiled_region_is_one_node_with_its_aten_ops_in_the_flame_graph_and_op_table():
    from torchtpu_lab.profiling import processors

    torch._dynamo.reset()
    model = torch.compile(nn.Sequential(nn.Linear(4, 8), nn.ReLU()).to("tpu"), backend="tpu", dynamic=False)
    x = torch.randn(3, 4).to("tpu")
    model(x)
    with torchtpu_lab.profile() as prof:
        model(x).sum().item()  # REGION
    line = next(i for i, text in enumerate(inspect.getsource(
        test_a_compiled_region_is_one_node_with_its_aten_ops_in_the_flame_graph_and_op_table).splitlines())
        if "# REGION" in text and "next(" not in text)
    line += inspect.getsourcelines(test_a_compiled_region_is_one_node_with_its_aten_ops_in_the_flame_graph_and_op_table)[1]
    tree = processors.flame_tree(prof)
    region = [i for i, label in enumerate(tree.labels) if label.startswith("XLA run: compiled")]
    assert region, tree.labels
    i = region[0]
    assert "aten::addmm" in tree.hover[i] and "aten::relu" in tree.hover[i], tree.hover[i]
    parent = tree.labels[tree.ids.index(tree.parents[i])]
    assert parent.endswith(f":{line}"), (parent, line)  # under the user's line, not at the cell's root
    rows = processors.op_table(prof, 10).by_time
    assert any(r.op.startswith("compiled") and r.line.endswith(f":{line}") for r in rows), rows


def test_batch_size_change_reports_the_recompile_reason():
    torch._dynamo.reset()
    model = torch.compile(nn.Linear(4, 2).to("tpu"), backend="tpu", dynamic=False)
    model(torch.randn(3, 4).to("tpu"))
    with torchtpu_lab.profile() as prof:
        model(torch.randn(5, 4).to("tpu"))
    dynamo = [e for e in prof.compiles if e.detail.get("kind") == "dynamo"]
    assert dynamo and dynamo[0].detail["recompile"]
    cause = str(dynamo[0].detail["cause"])
    assert "size mismatch at index 0" in cause and "expected 3, actual 5" in cause


def test_a_graph_traced_again_reuses_its_executable():
    layer = nn.Linear(3, 3).to("tpu")
    counted = []
    for _ in range(2):
        torch._dynamo.reset()
        with torchtpu_lab.profile() as prof:
            torch.compile(layer, backend="tpu", dynamic=False)(torch.ones(2, 3, device="tpu")).sum().backward()
        counted.append(len([e for e in prof.compiles if e.detail.get("kind") == "compiled"]))
    assert counted[0] == 2 and counted[1] == 0  # forward and backward compiled once, reused after the reset


# ---- 3. collectives inside compiled graphs (2 ranks: tests/test_distributed.py) -----------------------------


@pytest.fixture
def one_rank_group():
    """A world-1 tpu process group in this process (no multi-process runtime needed)."""
    import torch.distributed as dist

    dist.init_process_group("tpu", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


@pytest.mark.skipif(not __import__("dist_jobs").dynamo_reads_python_group_names(),
                    reason="torch 2.11's Dynamo breaks the graph at a Python group's group_name")
def test_collectives_lower_into_the_compiled_program(one_rank_group):
    import dist_jobs

    torch._dynamo.reset()
    x, w = (t.to("tpu") for t in dist_jobs.collective_inputs(0))
    with torchtpu_lab.profile() as prof:
        got = torch.compile(dist_jobs.collective_step, backend="tpu", dynamic=False)(x, w, one_rank_group)
    want = dist_jobs.collective_step(x, w, one_rank_group)  # the eager collectives
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a.cpu(), b.cpu())
    assert not [e for e in prof.compiles if e.detail.get("kind") == "eager-graph"]
    (event,) = _compiled_graphs(prof)
    assert "_c10d_functional::all_to_all_single" in event.detail["collectives"]
    assert "aten::mm" in event.detail["ops"] and event.detail["group"].startswith("group [0] (1 x ")


def test_a_collective_on_an_unknown_group_runs_eagerly_saying_why(one_rank_group):
    torch._dynamo.reset()
    f = torch.compile(lambda t: torch.ops._c10d_functional.all_reduce(t, "sum", "no-such-group") * 2,
                      backend="tpu", dynamic=False)
    with torchtpu_lab.profile() as prof, pytest.raises(Exception, match="no-such-group"):
        f(torch.ones(3, device="tpu"))  # eagerly, the collective raises its own error: nothing is made up
    (event,) = [e for e in prof.compiles if e.detail.get("kind") == "eager-graph"]
    assert "no-such-group" in str(event.detail["cause"]) and "cannot resolve" in str(event.detail["cause"])


def test_a_copy_to_the_cpu_inside_a_compiled_function_runs_that_graph_eagerly_saying_why():
    """``.cpu()`` in a compiled function (not ``fullgraph``) leaves the program: the graph runs op by op, with its
    gradient, instead of failing when XLA traces it (OpenReg's test_device_transfer_traces_fully)."""
    torch._dynamo.reset()
    f = torch.compile(lambda t: ((t * 3).cpu() + 1, t.sin()), backend="tpu")
    x = torch.randn(5, device="tpu", requires_grad=True)
    with torchtpu_lab.profile() as prof:
        on_cpu, on_tpu = f(x)
    on_tpu.sum().backward()
    assert on_cpu.device.type == "cpu" and on_tpu.device.type == "tpu"
    torch.testing.assert_close(on_cpu, x.detach().cpu() * 3 + 1)
    torch.testing.assert_close(x.grad.cpu(), x.detach().cpu().cos())
    causes = [str(e.detail["cause"]) for e in prof.compiles if e.detail.get("kind") == "eager-graph"]
    assert causes and all("aten::_to_copy to cpu" in c for c in causes), causes


def test_scaled_dot_product_attention_under_torch_compile_is_lowered_not_run_eagerly():
    """sdpa's tpu kernel (runtime/padded_attention.py) is for eager tpu tensors: Dynamo and AOTAutograd still
    see PyTorch's decomposition, so a no_grad graph with attention is one lowered program, not op by op."""
    torch._dynamo.reset()
    q, k, v = (torch.randn(1, 2, 3, 8, generator=torch.Generator().manual_seed(i)) for i in range(3))
    f = torch.compile(lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True) * 2,
                      backend="tpu", dynamic=False)
    with torch.no_grad(), torchtpu_lab.profile() as prof:
        got = f(q.to("tpu"), k.to("tpu"), v.to("tpu"))
    torch.testing.assert_close(got.cpu(), torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True) * 2)
    assert not [e for e in prof.compiles if e.detail.get("kind") == "eager-graph"], \
        [e.detail["cause"] for e in prof.compiles]


# ---- 4. compiled graphs go through the executable caches, keyed with the matmul precision -------------------


def test_a_fresh_process_loads_compiled_graphs_from_a_warm_cache(tmp_path):
    from fresh_process import CACHE_COUNTERS, run_with_cache

    script = """
        import torch, torchtpu_lab
        from torchtpu_lab import telemetry
        torch.manual_seed(0)
        model = torch.compile(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
                              .to("tpu"), backend="tpu", dynamic=False)
        loss = model(torch.ones(4, 8, device="tpu")).square().mean()
        loss.backward()
        extra = {"loss": loss.item(),
                 "graphs": [[e.name.split()[1], e.detail["disk"]] for e in telemetry.compile_log
                            if e.detail["kind"] == "compiled"]}
    """
    counters = CACHE_COUNTERS + ("compiles", "disk_loads")
    cold = run_with_cache(script, tmp_path / "cache", counters)
    warm = run_with_cache(script, tmp_path / "cache", counters)
    assert sorted(cold["graphs"]) == [["backward", False], ["forward", False]], cold
    assert cold["xla_compiles"] > 0 and cold["disk_loads"] == 0
    # the warm process loads both graphs' executables (and every eager op's) from disk: nothing is traced,
    # lowered or compiled, and the compile events say "loaded from disk"
    assert sorted(warm["graphs"]) == [["backward", True], ["forward", True]], warm
    assert warm["jax_traces"] == warm["jax_lowerings"] == warm["xla_compiles"] == 0, warm
    assert warm["persistent_cache_misses"] == 0 and warm["disk_loads"] >= 2, warm
    assert warm["loss"] == cold["loss"]


def test_a_matmul_precision_change_recompiles_the_graph_under_the_new_setting():
    from torchtpu_lab.compile import backend

    torch._dynamo.reset()
    a, b = torch.randn(16, 16), torch.randn(16, 16)
    f = torch.compile(lambda x, y: (x @ y).relu(), backend="tpu", dynamic=False)
    first = f(a.to("tpu"), b.to("tpu")).cpu()
    torch.set_float32_matmul_precision("medium")
    with torchtpu_lab.profile() as prof:
        f(a.to("tpu"), b.to("tpu")).cpu()
        f(a.to("tpu"), b.to("tpu")).cpu()  # the new executable is reused
    (event,) = _compiled_graphs(prof)
    assert "matmul precision changed 'highest' -> 'medium'" in str(event.detail["cause"])
    graph = next(g for g in backend._DYNAMO_GRAPHS.values() if {k[0] for k in g.executables} == {"highest", "medium"})
    hlo = {k[0]: built.exe.as_text() for k, built in graph.executables.items()}
    assert "operand_precision={highest,highest}" in hlo["highest"]
    assert "operand_precision={highest" not in hlo["medium"]  # traced again: one bf16 pass, not the old program
    torch.testing.assert_close(first, (a @ b).relu(), rtol=1e-5, atol=1e-5)


# ---- 5. dynamic=None: a dynamic-shape graph is one XLA program per concrete shape ---------------------------


def test_dynamic_shape_graphs_compile_one_program_per_shape():
    torch._dynamo.reset()
    cpu, tpu = _pair(lambda: nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)))
    model = torch.compile(tpu, backend="tpu")  # dynamic=None, PyTorch's default: sizes go symbolic on a change
    counts = []
    for n in (3, 5, 7, 5):
        x = torch.randn(n, 4)
        with torchtpu_lab.profile() as prof:
            out = model(x.to("tpu"))
            out.square().sum().backward()
        ref = cpu(x)
        ref.square().sum().backward()
        torch.testing.assert_close(out.cpu(), ref.detach(), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(tpu[0].weight.grad.cpu(), cpu[0].weight.grad, rtol=1e-5, atol=1e-5)
        assert not [e for e in prof.compiles if e.detail.get("kind") == "eager-graph"]
        counts.append([str(e.detail["cause"]) for e in _compiled_graphs(prof)])
    assert len(counts[0]) == 2 and not any("specialized" in c for c in counts[0])  # static at first
    for causes, n in ((counts[1], 5), (counts[2], 7)):  # the dynamic graph, specialized per batch size
        assert len(causes) == 2 and all(re.search(rf"dynamic shapes specialized to s\d+={n}\)$", c)
                                        for c in causes), causes
    assert counts[3] == []  # batch 5 again: its programs are reused


def test_a_size_input_and_a_captured_item_specialize_too():
    torch._dynamo.reset()
    f = torch.compile(lambda x: x * x.sum().item() + x.shape[0], backend="tpu")
    with torch._dynamo.config.patch(capture_scalar_outputs=True), torchtpu_lab.profile() as prof:
        for n in (3, 5, 6):
            x = torch.randn(n)
            torch.testing.assert_close(f(x.to("tpu")).cpu(), x * x.sum().item() + n, rtol=1e-5, atol=1e-5)
    assert not [e for e in prof.compiles if e.detail.get("kind") == "eager-graph"]
    assert len(_compiled_graphs(prof)) == 3  # one program per size: 3 (static), then 5 and 6 (specialized)


def test_dynamos_device_interface_for_tpu_is_this_device():
    """``get_interface_for_device("tpu")`` was PyTorch's torch_xla stub: no devices, device 0 always, no float64,
    NotImplementedError for device_count and synchronize (OpenReg's TestDeviceInterface)."""
    from torch._dynamo.device_interface import get_interface_for_device

    interface = get_interface_for_device("tpu")
    assert interface.device_count() == torch.tpu.device_count() >= 1
    assert interface.current_device() == torch.tpu.current_device()
    assert interface.is_available() and interface.is_dtype_supported(torch.float64)
    assert interface.is_dtype_supported(torch.bfloat16) and not interface.is_dtype_supported(torch.complex32)
    x = torch.ones(3, device="tpu") * 2
    interface.synchronize()
    assert interface.current_stream() == torch.accelerator.current_stream()
    assert get_interface_for_device("tpu:0") is interface
    assert x.sum().item() == 6


# ---- the outputs of a compiled graph, and its inputs that are views -----------------------------------------


def _many_outputs(x, i):
    return x * 2, (x + 1).to(torch.bfloat16), x > 0, i * 3, x.sum()


@pytest.mark.parametrize("native_wrap", [True, False])
def test_compiled_outputs_are_tensors_of_cpus_values_counted_by_memory(native_wrap, monkeypatch):
    from torchtpu_lab.device import tensor

    if native_wrap and tensor._WRAP[0] is None:
        pytest.skip("the native core is not loaded (pure-Python mode makes each output in Python)")
    made = []
    if native_wrap:
        wrap = tensor._WRAP[0]
        monkeypatch.setattr(tensor, "_WRAP", [lambda *a: made.append(len(a[0])) or wrap(*a)])
    else:
        monkeypatch.setattr(tensor, "_WRAP", [None])
    torch._dynamo.reset()
    x, i = torch.randn(3, 5), torch.arange(6).reshape(2, 3)
    want = _many_outputs(x, i)
    xt, it = x.to("tpu"), i.to("tpu")
    fn = torch.compile(_many_outputs, backend="tpu")
    fn(xt, it)
    made.clear()
    before = torch.tpu.memory_allocated()
    got = fn(xt, it)
    nbytes = sum(t.numel() * t.element_size() for t in got)
    assert torch.tpu.memory_allocated() - before == nbytes
    for g, w in zip(got, want):
        assert g.device.type == "tpu" and g.dtype == w.dtype and g.shape == w.shape and g.is_contiguous()
        torch.testing.assert_close(g.cpu(), w)
    assert made == ([5] if native_wrap else [])
    del got, g
    assert torch.tpu.memory_allocated() == before


def test_wrap_arrays_refuses_what_is_not_an_array_with_a_dtype_and_a_device():
    from torchtpu_lab.device import tensor

    if tensor._WRAP[0] is None:
        pytest.skip("the native core is not loaded")
    import jax.numpy as jnp

    with pytest.raises(TypeError, match="output 1 is not a JAX array"):
        tensor._WRAP[0]([jnp.ones(2), 3.0], (torch.float32, torch.float32), (0, 0))
    with pytest.raises(TypeError, match="of equal length"):
        tensor._WRAP[0]([jnp.ones(2)], (torch.float32,), (0, 0))


def test_a_view_input_of_a_compiled_graph_neither_waits_for_nor_raises_an_earlier_ops_error(monkeypatch):
    import torchtpu_lab
    from torchtpu_lab.runtime import fused, pending_errors

    torch._dynamo.reset()
    fn = torch.compile(lambda v: v * 2 + 1, backend="tpu")
    emb = torch.randn(4, 3).to("tpu")
    base = torch.arange(12.0).to("tpu")
    fn(base[2:8])
    blocking = []
    real = pending_errors.raise_pending
    monkeypatch.setattr(pending_errors, "raise_pending",
                        lambda block=True, limit=None: blocking.append(block) or real(block, limit))
    with torchtpu_lab.eager_mode("fused"):
        bad = torch.nn.functional.embedding(torch.tensor([1, 9]).to("tpu"), emb)  # index 9 is out of range
        fused.sync()  # launched, not read: its check's flag is pending
        assert pending_errors.pending() >= 1
        out = fn(base[2:8])  # the view is gathered for the graph: a read on the device, not on the host
        assert blocking == []
        with pytest.raises(IndexError, match="index out of range"):  # the next host read raises it, once
            out.cpu()
        torch.testing.assert_close(out.cpu(), torch.arange(2.0, 8.0) * 2 + 1)
    del bad
