"""``aten::_fused_adam_``, ``_fused_adamw_`` and ``_fused_sgd_`` (the ``fused=True`` optimizer steps) on tpu against
PyTorch's CPU kernels, option by option: every tensor they update in place must match, and none may fall back
to the CPU."""

from __future__ import annotations

import pytest
import torch

from torchtpu_lab import telemetry


def _tensors(n_lists: int, seed: int = 0) -> list[list[torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    shapes = [(3, 4), (5,)]
    return [[torch.randn(s, generator=g).abs() + 0.1 for s in shapes] for _ in range(n_lists)]


def _run_both(op, lists, steps, **kwargs):
    """The op on CPU copies and on tpu copies of ``lists``; the updated lists of both."""
    cpu = [[t.clone() for t in lst] for lst in lists]
    tpu = [[t.to("tpu") for t in lst] for lst in lists]
    extra_cpu = {k: v for k, v in kwargs.items()}
    extra_tpu = {k: v.to("tpu") if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    fallbacks = telemetry.counters["cpu_fallbacks"]
    op(*cpu, *([[s.clone() for s in steps]] if steps else []), **extra_cpu)
    op(*tpu, *([[s.to("tpu") for s in steps]] if steps else []), **extra_tpu)
    assert telemetry.counters["cpu_fallbacks"] == fallbacks, "the fused step fell back to the CPU"
    return cpu, tpu


def _check(cpu, tpu):
    for lc, lt in zip(cpu, tpu):
        for c, t in zip(lc, lt):
            torch.testing.assert_close(t.cpu(), c, rtol=1e-5, atol=1e-6)


ADAM_OPTIONS = [
    {},
    {"weight_decay": 0.1},
    {"amsgrad": True, "maximize": True, "weight_decay": 0.05},
    {"grad_scale": torch.tensor(4.0)},
    {"grad_scale": torch.tensor(4.0), "found_inf": torch.tensor(1.0)},
    {"lr": torch.tensor(0.02)},
]


@pytest.mark.parametrize("op", [torch._fused_adam_, torch._fused_adamw_], ids=["adam", "adamw"])
@pytest.mark.parametrize("options", ADAM_OPTIONS, ids=lambda o: ",".join(o) or "plain")
def test_fused_adam_matches_cpu(op, options):
    kwargs = {"lr": 0.01, "beta1": 0.9, "beta2": 0.99, "weight_decay": 0.0, "eps": 1e-8, "amsgrad": False,
              "maximize": False, **options}
    steps = [torch.tensor(3.0), torch.tensor(3.0)]
    lists = _tensors(5)
    if not kwargs["amsgrad"]:
        lists[4] = []  # max_exp_avg_sqs: PyTorch wants none without amsgrad
    cpu, tpu = _run_both(op, lists, steps, **kwargs)
    _check(cpu, tpu)
    if "found_inf" in options:  # a step that found an inf changes nothing
        _check(_tensors(5)[:4], tpu[:4])


SGD_OPTIONS = [
    {"momentum": 0.0},
    {"momentum": 0.9, "dampening": 0.1, "is_first_step": True},
    {"momentum": 0.9, "dampening": 0.1, "nesterov": False, "weight_decay": 0.01, "maximize": True},
    {"momentum": 0.9, "nesterov": True, "grad_scale": torch.tensor(2.0)},
    {"momentum": 0.9, "grad_scale": torch.tensor(2.0), "found_inf": torch.tensor(1.0)},
]


@pytest.mark.parametrize("options", SGD_OPTIONS, ids=lambda o: ",".join(o))
def test_fused_sgd_matches_cpu(options):
    kwargs = {"weight_decay": 0.0, "lr": 0.05, "dampening": 0.0, "nesterov": False, "maximize": False,
              "is_first_step": False, **options}
    lists = _tensors(3 if options["momentum"] else 2)
    if not options["momentum"]:
        lists.append([])
    cpu, tpu = _run_both(torch._fused_sgd_, lists, None, **kwargs)
    _check(cpu, tpu)


def _adam_lists(amsgrad: bool):
    g = torch.Generator().manual_seed(1)
    shapes = [(3, 4), (5,), (2, 2, 2)]
    lists = [[torch.randn(s, generator=g).abs() + 0.1 for s in shapes] for _ in range(5)]
    if not amsgrad:
        lists[4] = []
    return lists, [torch.tensor(3.0) for _ in shapes]


@pytest.mark.parametrize("decoupled", [False, True], ids=["adam", "adamw"])
@pytest.mark.parametrize("options", ADAM_OPTIONS + [{"lr": torch.tensor(0.02), "weight_decay": 0.1},
                                                    {"grad_scale": torch.tensor(4.0), "found_inf": torch.tensor(0.0)}],
                         ids=lambda o: ",".join(o) or "plain")
@pytest.mark.parametrize("viewed", [False, True], ids=["bases", "whole_views"])
def test_a_fused_adam_step_is_one_recorded_op_with_the_per_op_kernels_values(decoupled, options, viewed):
    """In fused mode the whole step is one node of the pending graph (runtime/optimizer_step.py), and its values
    are bit for bit those of the per-op kernel (ops/optimizer_kernels.py) it replaces. ``whole_views``: every
    tensor is a view reading its whole storage in order, as a bias's gradient is (``sum_to_size`` views the summed
    ``[1, n]`` as ``[n]``: every ``Conv1D`` bias of GPT-2, a parameter group of their own in a ``Trainer``); it is
    still one op, written through to the storages."""
    import torchtpu_lab
    from torchtpu_lab.ops import optimizer_kernels
    from torchtpu_lab.runtime import fused

    op = torch._fused_adamw_ if decoupled else torch._fused_adam_
    kwargs = {"lr": 0.01, "beta1": 0.9, "beta2": 0.99, "weight_decay": 0.0, "eps": 1e-8, "amsgrad": False,
              "maximize": False, **options}
    lists, steps = _adam_lists(kwargs["amsgrad"])
    with torchtpu_lab.eager_mode("fused"):
        bases, one = _on_tpu(lists, viewed)
        per_op = [[t.to("tpu") for t in lst] for lst in lists]
        tpu_kwargs = {k: v.to("tpu") if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
        tpu_steps = [s.to("tpu") for s in steps]
        torchtpu_lab.sync()
        for _ in range(2):
            before = fused.pending_ops()
            op(*one, tpu_steps, **tpu_kwargs)
            assert fused.pending_ops() == before + 1
            optimizer_kernels._adam(*per_op, tpu_steps, decoupled=decoupled, **tpu_kwargs)
        _check_written(bases, one, per_op)


def _on_tpu(lists, viewed: bool) -> tuple[list, list]:
    """``(bases, tensors)``: each list's tensors on tpu, as base tensors (``bases`` is ``tensors`` then) or, when
    ``viewed``, as views of ``[1, *shape]`` bases that read the whole storage in order."""
    if not viewed:
        tensors = [[t.to("tpu") for t in lst] for lst in lists]
        return tensors, tensors
    bases = [[t.unsqueeze(0).to("tpu") for t in lst] for lst in lists]
    tensors = [[b.view(t.shape) for b, t in zip(lb, lst)] for lb, lst in zip(bases, lists)]
    assert all(t.tpu_view is not None for t in sum(tensors, []))
    return bases, tensors


def _check_written(bases, tensors, want) -> None:
    """Each tensor, and its base, holds exactly the per-op kernel's value."""
    for b, t, w in zip(sum(bases, []), sum(tensors, []), sum(want, [])):
        assert torch.equal(t.cpu(), w.cpu()) and torch.equal(b.cpu().reshape(w.shape), w.cpu())


def test_a_fused_adam_step_it_does_not_cover_takes_the_per_op_kernel():
    """A view among the parameters (or a non-float32 tensor) is not one program's input: the per-op kernel runs
    the step, with the values CPU's kernel gives."""
    lists, steps = _adam_lists(False)
    cpu = [[t.clone() for t in lst] for lst in lists]
    tpu = [[t.to("tpu") for t in lst] for lst in lists]
    whole = torch.randn(2, 3, 4)
    cpu[0][0], tpu[0][0] = whole[1].clone(), whole.to("tpu")[1]  # a view of a bigger tensor
    kwargs = {"lr": 0.01, "beta1": 0.9, "beta2": 0.99, "weight_decay": 0.1, "eps": 1e-8, "amsgrad": False,
              "maximize": False}
    torch._fused_adamw_(*cpu, [s.clone() for s in steps], **kwargs)
    torch._fused_adamw_(*tpu, [s.to("tpu") for s in steps], **kwargs)
    _check(cpu, tpu)


def test_tensors_over_one_storage_take_the_per_op_kernel():
    """Two tensors of the lists over one storage (whole-storage views of it): one program would read both before
    writing either, where the per-op kernel writes one after the other; so the per-op kernel runs the step."""
    import torchtpu_lab
    from torchtpu_lab.runtime import fused

    with torchtpu_lab.eager_mode("fused"):
        shared = torch.randn(12).to("tpu")
        params = [shared.view(3, 4), shared.view(3, 4)]  # one storage, twice
        grads, exp_avgs, exp_avg_sqs = ([torch.rand(3, 4).to("tpu") for _ in range(2)] for _ in range(3))
        steps = [torch.tensor(3.0).to("tpu") for _ in range(2)]
        torchtpu_lab.sync()
        before = fused.pending_ops()
        torch._fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, [], steps, lr=0.01, beta1=0.9, beta2=0.99,
                            weight_decay=0.0, eps=1e-8, amsgrad=False, maximize=False)
        assert fused.pending_ops() > before + 1


def test_adamw_fused_training_matches_cpu_and_a_learning_rate_schedule_compiles_nothing_new():
    """``AdamW(fused=True)`` (``transformers``' default optimizer) on a small model: losses equal CPU's step by
    step, and once warm, steps whose learning rate a scheduler changes build no new program."""
    import torchtpu_lab
    from torchtpu_lab import caches

    torch.manual_seed(0)
    cpu_model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    tpu_model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    tpu_model.load_state_dict(cpu_model.state_dict())
    tpu_model.to("tpu")
    x, y = torch.randn(6, 8), torch.randn(6, 4)
    xt, yt = x.to("tpu"), y.to("tpu")
    runs = []
    for model, inputs in ((cpu_model, (x, y)), (tpu_model, (xt, yt))):
        opt = torch.optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.01, fused=True)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.7)
        losses, compiles = [], []
        with torchtpu_lab.eager_mode("fused"):
            for _ in range(6):
                opt.zero_grad(set_to_none=True)
                loss = torch.nn.functional.mse_loss(model(inputs[0]), inputs[1])
                loss.backward()
                opt.step()
                sched.step()
                losses.append(loss.item())
                compiles.append(telemetry.counters["compiles"])
        runs.append((losses, compiles))
    (cpu_losses, _), (tpu_losses, compiles) = runs
    torch.testing.assert_close(tpu_losses, cpu_losses, rtol=1e-5, atol=1e-6)
    assert compiles[-1] == compiles[2], compiles  # steps 4-6: new learning rates, the same programs
    assert caches.stats()["fused_adam_programs"]["entries"] >= 1  # the one-op step ran


@pytest.mark.parametrize("options", SGD_OPTIONS + [{"momentum": 0.9, "lr": torch.tensor(0.05)},
                                                   {"momentum": 0.9, "grad_scale": torch.tensor(2.0),
                                                    "found_inf": torch.tensor(0.0)}],
                         ids=lambda o: ",".join(o))
@pytest.mark.parametrize("viewed", [False, True], ids=["bases", "whole_views"])
def test_a_fused_sgd_step_is_one_recorded_op_with_the_per_op_kernels_values(options, viewed):
    import torchtpu_lab
    from torchtpu_lab.ops import optimizer_kernels
    from torchtpu_lab.runtime import fused

    kwargs = {"weight_decay": 0.0, "lr": 0.05, "dampening": 0.0, "nesterov": False, "maximize": False,
              "is_first_step": False, **options}
    lists = _tensors(3 if options["momentum"] else 2, seed=2)
    if not options["momentum"]:
        lists.append([])
    with torchtpu_lab.eager_mode("fused"):
        bases, one = _on_tpu(lists, viewed)
        per_op = [[t.to("tpu") for t in lst] for lst in lists]
        tpu_kwargs = {k: v.to("tpu") if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
        torchtpu_lab.sync()
        for _ in range(2):
            before = fused.pending_ops()
            torch._fused_sgd_(*one, **tpu_kwargs)
            assert fused.pending_ops() == before + 1
            optimizer_kernels.fused_sgd_(*per_op, **tpu_kwargs)
        _check_written(bases, one, per_op)
