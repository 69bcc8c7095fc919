"""The whole training step compiled as one graph (issue 25): ``fullgraph=True`` around forward,
``loss.backward()`` and ``opt.step()`` for the standard optimizers, with parameters and optimizer state donated."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import torchtpu_lab
from torchtpu_lab import telemetry

OPTIMIZERS = {
    "sgd": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
    "sgd_foreach": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, foreach=True),
    "adam": lambda p: torch.optim.Adam(p, lr=1e-2),
    "adam_foreach": lambda p: torch.optim.Adam(p, lr=1e-2, foreach=True),
    "adamw": lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1),
    "adamw_foreach": lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1, foreach=True),
    # Dynamo wraps torch.optim's _fused_* step functions in torch.compiler.disable; traced through for tpu
    # parameters under fullgraph=True, their ops calling our torch-level kernels (compile/fused_optimizers.py)
    "sgd_fused": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, fused=True),
    "sgd_fused_no_momentum": lambda p: torch.optim.SGD(p, lr=0.1, fused=True),
    "adam_fused": lambda p: torch.optim.Adam(p, lr=1e-2, fused=True),
    "adamw_fused": lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1, fused=True),
    "adamw_fused_amsgrad": lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1, amsgrad=True, fused=True),
}
#: in every run; the other flavours are the sweep
_QUICK = {"sgd", "adamw_foreach", "sgd_fused", "adamw_fused"}


def _run(make_opt, compiled: bool, steps: int = 4):
    """Losses and XLA compiles per step of a small MLP trained on tpu, eagerly or compiled with fullgraph=True."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4)).to("tpu")
    opt = make_opt(model.parameters())
    x, y = torch.randn(5, 8).to("tpu"), torch.randn(5, 4).to("tpu")

    def step(x, y):
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss.detach()

    fn = torch.compile(step, backend="tpu", fullgraph=True) if compiled else step
    losses, compiles, programs = [], [], []
    for _ in range(steps):
        opt.zero_grad()
        before = telemetry.counters["compiles"]
        with torchtpu_lab.profile() as prof:
            losses.append(fn(x, y).item())
        compiles.append(telemetry.counters["compiles"] - before)
        programs.append(prof.summary()["graphs_executed"])
    return losses, compiles, programs, model


@pytest.mark.parametrize("name", [n if n in _QUICK else pytest.param(n, marks=pytest.mark.sweep)
                                  for n in OPTIMIZERS])
def test_fullgraph_whole_step_matches_eager_step_for_step(name):
    """One Dynamo graph (fullgraph=True raises on any break) with backward traced by Dynamo, run as one XLA
    program; losses and parameters equal eager's step for step and steady-state steps compile nothing."""
    torch._dynamo.reset()
    eager, _, _, eager_model = _run(OPTIMIZERS[name], compiled=False)
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    with torch._dynamo.config.patch(trace_autograd_ops=True):
        compiled, compiles, programs, model = _run(OPTIMIZERS[name], compiled=True)
    assert compiled == pytest.approx(eager, rel=2e-5), (eager, compiled)
    for p, q in zip(model.parameters(), eager_model.parameters()):
        torch.testing.assert_close(p.detach().cpu(), q.detach().cpu(), rtol=1e-4, atol=1e-6)
    assert compiles[-2:] == [0, 0], compiles
    assert programs[-2:] == [1, 1], programs  # forward, backward and the update: one XLA program
    # the first step creates the optimizer state (one graph), the next ones reuse a second: no more
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs <= 2


def test_fullgraph_is_left_alone_for_cpu_optimizers():
    """The change is scoped to tpu parameters: a CPU step with fullgraph=True still stops at PyTorch's own
    graph break in Optimizer.step, as it does without torchtpu_lab."""
    torch._dynamo.reset()
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(x):
        model(x).sum().backward()
        opt.step()

    with torch._dynamo.config.patch(trace_autograd_ops=True), pytest.raises(Exception, match="graph_break"):
        torch.compile(step, backend="eager", fullgraph=True)(torch.randn(2, 3))
    assert any("Optimizer.step" in k for k, v in torchtpu_lab.global_changes().items() if v)


def _state_tensors(opt) -> list:
    return [v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor) and v.is_tpu]


@pytest.mark.parametrize("hold_old_values", [False, True])
def test_whole_step_donates_parameters_and_optimizer_state(hold_old_values):
    """The compiled step's program writes the new parameters and AdamW state into their old buffers: the old
    arrays are deleted, and the memory peak of a step grows by less than the model and its state (without
    donation it grows by at least that: the old and new values are both on the device). Holding another
    reference to the parameters' buffers turns donation off for those inputs, and the peak shows it."""
    from torchtpu_lab.device.tensor import from_array

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64)).to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=True)
    x = torch.randn(4, 64).to("tpu")

    def step(x):
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        return loss.detach()

    fn = torch.compile(step, backend="tpu", fullgraph=True)
    with torch._dynamo.config.patch(trace_autograd_ops=True):
        for _ in range(2):  # the first step creates the state, the second is the steady step
            opt.zero_grad()
            fn(x)
        opt.zero_grad()
        params = list(model.parameters())
        # another storage holding the same arrays (``detach()`` shares the parameter's storage: not one)
        held = [from_array(p.tpu_storage.array, p.dtype, 0) for p in params] if hold_old_values else []
        old = [p.tpu_storage.array for p in params] + [s.tpu_storage.array for s in _state_tensors(opt)]
        model_and_state = sum(a.nbytes for a in old)
        torch.tpu.reset_peak_memory_stats()
        before = torch.tpu.memory_allocated()
        fn(x).item()
        growth = torch.tpu.max_memory_allocated() - before
    deleted = [a.is_deleted() for a in old]
    param_bytes = sum(a.nbytes for a in old[:len(params)])
    print(f"peak growth of a step: {growth} B; parameters {param_bytes} B, with AdamW state {model_and_state} B")
    if hold_old_values:  # the new gradients, and the parameters twice
        assert not any(deleted[:len(params)]) and all(deleted[len(params):])
        assert growth >= 2 * param_bytes, growth
        assert all(torch.equal(h.cpu(), h.cpu()) for h in held)  # the held old values are still readable
    else:  # the new gradients and the program's temporaries: not the model and its state again
        assert all(deleted), deleted
        assert growth < model_and_state, (growth, model_and_state)


def test_fused_sgd_step_fakes_on_tpu_and_checks_its_lists():
    """Dynamo runs a fused step on fake tensors while tracing: ``_fused_sgd_`` (no Meta kernel in PyTorch) has
    ours, which leaves the fake tensors as they are and rejects lists that do not match the parameters."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    import torchtpu_lab.compile  # noqa: F401  (Dynamo is imported by this file's other tests; install now)

    torch._dynamo.reset()
    options = {"weight_decay": 0.0, "momentum": 0.9, "lr": 0.1, "dampening": 0.0, "nesterov": False,
               "maximize": False, "is_first_step": False}
    with FakeTensorMode():
        p, g, buf = (torch.randn(3, device="tpu") for _ in range(3))
        torch._fused_sgd_([p], [g], [buf], **options)
        assert p.device.type == "tpu" and tuple(p.shape) == (3,)
        with pytest.raises(RuntimeError, match="1 parameters but a list of 2 tensors"):
            torch._fused_sgd_([p], [g], [buf, buf], **options)
    said = [k for k, v in torchtpu_lab.global_changes().items() if k.startswith("aten._fused_sgd_")]
    assert len(said) == 1 and torchtpu_lab.global_changes()[said[0]] is True
