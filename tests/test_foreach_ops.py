"""``_foreach_*`` ops as one node each (runtime/foreach_kernels.py, ops/foreach.py): PyTorch's foreach OpInfos
against the CPU, a foreach call as one node of the pending graph, the recording kernel's list kinds, the in-place
form only where the elements' updates are independent, and autograd's version counters."""

import pytest
import torch
from torch.testing._internal.common_methods_invocations import (
    foreach_binary_op_db,
    foreach_other_op_db,
    foreach_pointwise_op_db,
    foreach_reduce_op_db,
    foreach_unary_op_db,
)

import torchtpu_lab
from compare import to_device, twins
from torchtpu_lab import native
from torchtpu_lab.runtime import fused, recording

needs_kernel = pytest.mark.skipif(not recording.available(native.module()),
                                  reason=f"no recording kernel: {native.status().describe()}")
# (the reductions keep PyTorch's per-tensor loop: checked that they still do)
_OPINFOS = (foreach_unary_op_db + foreach_binary_op_db + foreach_pointwise_op_db + foreach_other_op_db
            + foreach_reduce_op_db)


def _outcome(fn, args, kwargs, device):
    """``fn``'s results on ``device`` (an in-place variant's: its first argument after the call), or the error it
    raised."""
    args = [to_device(a, device) for a in args]  # (a CPU copy: an in-place variant must not change the sample)
    try:
        with torchtpu_lab.eager_mode("fused"):
            out = fn(*args, **kwargs)
            out = args[0] if out is None else out
            return [t.cpu() for t in out]
    except Exception as e:  # noqa: BLE001 — compared with the CPU's
        return e


@pytest.mark.parametrize("info", _OPINFOS, ids=lambda info: info.name)
def test_foreach_opinfos_match_cpu(info):
    """Every sample of PyTorch's foreach OpInfos (float32; functional and in-place) gives the CPU's values, or an
    error where the CPU raises one."""
    if torch.float32 not in info.supported_dtypes("cpu"):
        pytest.skip("no float32 samples")
    checked = 0
    for sample in list(info.sample_inputs("cpu", torch.float32, num_input_tensors=[3]))[:6]:
        args = [sample.input, *sample.args]
        for fn in (info.op, info.inplace_variant):
            if fn is None:
                continue
            want, got = _outcome(fn, args, sample.kwargs, "cpu"), _outcome(fn, args, sample.kwargs, "tpu")
            if isinstance(want, Exception):
                assert isinstance(got, Exception), (fn, sample.kwargs, want)
                continue
            assert not isinstance(got, Exception), (fn, sample.kwargs, got)
            for g, w in zip(got, want, strict=True):
                torch.testing.assert_close(g, w, atol=1e-4, rtol=1e-4, equal_nan=True)
            checked += 1
    assert checked > 0


def _lists(n=4, seed=0):
    torch.manual_seed(seed)
    shapes = [(3, 4), (5,), (2, 2), (1,)][:n]
    return [torch.randn(s) for s in shapes], [torch.randn(s) for s in shapes]


def test_a_foreach_call_is_one_node_and_numbers_are_graph_inputs():
    """A functional and an in-place foreach call each add one node to the pending graph, whatever the list's
    length; a new number per element (an optimizer's step sizes) compiles nothing new."""
    cpu, other = _lists()
    tpu, tpu_other = to_device(cpu, "tpu"), to_device(other, "tpu")
    with torchtpu_lab.eager_mode("fused"):
        for step in range(4):
            torchtpu_lab.sync()
            before = fused.PENDING.recorded
            roots = torch._foreach_sqrt(torch._foreach_abs(tpu))
            torch._foreach_addcdiv_(tpu, tpu_other, roots, [0.1 * step, 0.2, -0.3, 0.5 + step])
            assert fused.PENDING.recorded - before == 3
            if step == 2:
                graphs = len(fused.GRAPHS)
            roots_c = torch._foreach_sqrt(torch._foreach_abs(cpu))
            torch._foreach_addcdiv_(cpu, other, roots_c, [0.1 * step, 0.2, -0.3, 0.5 + step])
            for t, c in zip(tpu, cpu):
                torch.testing.assert_close(t.cpu(), c)
        torchtpu_lab.sync()
    assert len(fused.GRAPHS) == graphs  # the last steps' graphs: the third one's, with new numbers


@needs_kernel
def test_repeated_foreach_calls_are_recorded_by_the_kernel():
    cpu, other = _lists()
    tpu, tpu_other = to_device(cpu, "tpu"), to_device(other, "tpu")
    with torchtpu_lab.eager_mode("fused"):
        for step in range(5):
            before = recording.stats()
            torch._foreach_lerp_(tpu, tpu_other, 0.25 + step)
            torch._foreach_mul_(tpu, [1.0, 0.5, 2.0, -1.0])
            out = torch._foreach_add(tpu, tpu_other, alpha=step + 1)
            after = recording.stats()
            torch._foreach_lerp_(cpu, other, 0.25 + step)
            torch._foreach_mul_(cpu, [1.0, 0.5, 2.0, -1.0])
            want = torch._foreach_add(cpu, other, alpha=step + 1)
            for t, c in zip([*tpu, *out], [*cpu, *want]):
                torch.testing.assert_close(t.cpu(), c)
    assert after["recorded"] - before["recorded"] == 3 and after["python"] == before["python"]


def test_updates_that_read_each_other_run_element_by_element():
    """The in-place form writes every element from the values before the call; where one element's update reads
    another's storage (a tensor twice in ``self``, another list's element at another index, a shared operand) the
    elements run in order, as PyTorch's fallback runs them."""
    def run(device):
        a, b, c = (torch.arange(3.0) + k for k in (1, 4, 7))
        a, b, c = to_device([a, b, c], device)
        with torchtpu_lab.eager_mode("fused"):
            for _ in range(3):  # a repeated call, which the kernel would record
                torch._foreach_add_([a, a], [b, c])
                torch._foreach_mul_([a, b], [b, a])
                torch._foreach_add_([b, c], b[0])  # a 0-dim operand over b's storage
                torch._foreach_add_([c, b], [c, b])  # each element its own operand: independent
        return [t.cpu() for t in (a, b, c)]

    for got, want in zip(run("tpu"), run("cpu")):
        torch.testing.assert_close(got, want)


def test_in_place_foreach_moves_version_counters_and_autograd_sees_it():
    w = torch.randn(3, requires_grad=True)
    for device in ("cpu", "tpu"):
        x = torch.ones(3).to(device)
        y = torch.ones(2).to(device)
        versions = (x._version, y._version)
        with torchtpu_lab.eager_mode("fused"):
            for _ in range(3):
                torch._foreach_mul_([x, y], 2.0)
        assert (x._version - versions[0], y._version - versions[1]) == (3, 3), device
        saved = x.clone().requires_grad_(False)
        out = (w.to(device) * saved).sigmoid()  # sigmoid saves its result for backward
        torch._foreach_mul_([out.detach(), saved], 0.5)  # the detached result shares its version counter
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            out.sum().backward()


def test_adamw_foreach_step_is_a_node_per_update_and_matches_cpu():
    cpu, tpu = twins(lambda: torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)))
    x, y = torch.randn(5, 6), torch.randn(5, 1)
    opts = {m: torch.optim.AdamW(m.parameters(), lr=0.01, foreach=True) for m in (cpu, tpu)}
    with torchtpu_lab.eager_mode("fused"):
        for _ in range(4):
            losses = []
            for model, device in ((cpu, "cpu"), (tpu, "tpu")):
                opts[model].zero_grad()
                loss = torch.nn.functional.mse_loss(model(x.to(device)), y.to(device))
                loss.backward()
                before = fused.PENDING.recorded
                opts[model].step()
                nodes = fused.PENDING.recorded - before
                losses.append(loss.detach().cpu())
            torch.testing.assert_close(losses[1], losses[0], rtol=1e-5, atol=1e-6)
    assert nodes <= 10, nodes  # AdamW's foreach updates (8), not one per parameter and update (4 x 8)
    for p_c, p_t in zip(cpu.parameters(), tpu.parameters()):
        torch.testing.assert_close(p_t.detach().cpu(), p_c.detach(), rtol=1e-5, atol=1e-6)


def test_bad_calls_raise_pytorchs_errors_and_change_nothing():
    tpu = to_device(_lists()[0], "tpu")
    kept = [t.cpu() for t in tpu]
    with torchtpu_lab.eager_mode("fused"):
        with pytest.raises(RuntimeError, match="same number of tensors"):
            torch._foreach_add_(tpu, tpu[:2])
        ints = [torch.ones(2, dtype=torch.int64).to("tpu"), torch.ones(3, dtype=torch.int64).to("tpu")]
        with pytest.raises(RuntimeError, match="can't be cast"):
            torch._foreach_add_(ints, 0.5)
        with pytest.raises(RuntimeError, match="doesn't match the broadcast shape"):  # the second element's
            torch._foreach_add_(tpu[:2], [torch.ones(3, 4).to("tpu"), torch.ones(2, 5).to("tpu")])
    for t, k in zip(tpu, kept):
        torch.testing.assert_close(t.cpu(), k)
    for t in ints:
        assert t.cpu().tolist() == [1] * t.numel()


def _bias_gradients(device):
    """Gradients as ``sum_to_size`` hands a bias its gradient (``[1, n]`` seen as ``[n]``) next to base tensors,
    scaled in place as gradient clipping's ``_foreach_mul_`` scales them."""
    bases = [torch.arange(6.0).reshape(1, 6).to(device), torch.arange(4.0).reshape(1, 1, 4).to(device)]
    grads = [bases[0].view(6), torch.ones(3, 2).to(device), bases[1].view(4)]
    coef = torch.tensor(0.5).to(device)
    for step in range(4):
        torch._foreach_mul_(grads, coef)
        torch._foreach_add_(grads, [torch.ones(6).to(device), torch.ones(2).to(device), torch.ones(1).to(device)],
                            alpha=step)
    return bases, grads


def test_whole_views_without_leading_ones_are_updated_on_their_storages():
    with torchtpu_lab.eager_mode("fused"):
        for _ in range(2):  # the lessons (a call is learned the second time its program is recorded)
            _bias_gradients("tpu")
        before = recording.stats() if recording.available(native.module()) else None
        bases, grads = _bias_gradients("tpu")
        after = recording.stats() if before is not None else None
        want_bases, want_grads = _bias_gradients("cpu")
        for got, want in zip([*bases, *grads], [*want_bases, *want_grads]):
            torch.testing.assert_close(got.cpu(), want)
        assert [g._version for g in grads] == [g._version for g in want_grads]
        assert grads[0].data_ptr() == bases[0].data_ptr() and grads[0].shape == (6,)
        if before is not None:  # every foreach update recorded by the kernel
            handed = {op: n - before["python_ops"].get(op, 0) for op, n in after["python_ops"].items()
                      if "foreach" in op and n != before["python_ops"].get(op, 0)}
            assert not handed, handed
        view = torch.zeros(1, 3).to("tpu").view(3)
        with pytest.raises(RuntimeError, match="doesn't match the broadcast shape"):
            torch._foreach_add_([view, torch.zeros(2).to("tpu")], [torch.ones(1, 3).to("tpu"), torch.ones(2).to("tpu")])
