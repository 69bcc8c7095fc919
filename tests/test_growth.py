"""Tensors grown by ``torch.cat`` appends (runtime/growth.py): values and independence exactly as PyTorch's, and a
token loop that appends compiles a bounded number of programs, not one per step."""

import pytest
import torch

import torchtpu_lab
from torchtpu_lab import telemetry
from torchtpu_lab.runtime import growth, state


def _grow(device: str, steps: int, start: int = 6, width: int = 1, dtype=torch.long):
    x = torch.arange(start * width, dtype=dtype).reshape(width, start).to(device)
    history = []
    for i in range(steps):
        x = torch.cat([x, torch.full((width, 1), 3 * i + 1, dtype=dtype, device=device)], dim=-1)
        history.append(x)
        last = x[:, -1:].clone()  # what a decode step reads: the newest token
        assert last.shape == (width, 1)
        if device != "cpu":
            torchtpu_lab.sync()
    return x, history


@pytest.mark.parametrize("mode", ["fused", "strict"])
def test_appends_equal_cpu_and_compile_a_bounded_number_of_programs(mode):
    expected, expected_history = _grow("cpu", 90, width=2)
    with torchtpu_lab.eager_mode(mode):
        state.clear()
        before = telemetry.counters["compiles"]
        got, history = _grow("tpu", 90, width=2)
        compiles = telemetry.counters["compiles"] - before
    assert torch.equal(got.cpu(), expected)
    for i in (0, 1, 2, 40, 57, 89):
        assert torch.equal(history[i].cpu(), expected_history[i]), i
    # capacity 64 then 128 then 256: a few programs per capacity, never one per step
    assert 0 < compiles <= 20, compiles
    assert growth.grown_dim(tensor_storage(got)) == 1


def tensor_storage(t):
    from torchtpu_lab.device import tensor

    return tensor.adopt(t).tpu_storage


def test_a_result_is_independent_of_its_input_and_of_later_appends():
    x = torch.arange(8).reshape(1, 8).to("tpu")
    a = torch.cat([x, torch.tensor([[100]], device="tpu")], -1)
    b = torch.cat([a, torch.tensor([[101]], device="tpu")], -1)  # padded from here on
    c = torch.cat([b, torch.tensor([[102]], device="tpu")], -1)
    c2 = torch.cat([b, torch.tensor([[999]], device="tpu")], -1)  # a second append to the same tensor
    b.zero_()
    c[0, 0] = -5
    assert x.cpu().tolist() == [list(range(8))]
    assert a.cpu().tolist() == [list(range(8)) + [100]]
    assert b.cpu().tolist() == [[0] * 10]
    assert c.cpu().tolist() == [[-5] + list(range(1, 8)) + [100, 101, 102]]
    assert c2.cpu().tolist() == [list(range(8)) + [100, 101, 999]]
    # the result reads as an ordinary contiguous tensor of its own size
    assert c.is_contiguous() and c.shape == (1, 11) and c.view(-1).cpu()[-1].item() == 102


def test_large_tensors_and_concatenations_of_equal_parts_are_not_padded():
    big = torch.zeros(64, 4096, device="tpu")  # 1 MiB: padding it would double the memory
    grown = torch.cat([torch.cat([big, big[:1]], 0), big[:1]], 0)
    assert tensor_storage(grown).shape == (66, 4096)
    halves = torch.cat([torch.ones(2, 3, device="tpu"), torch.ones(2, 3, device="tpu")], 1)  # not an append
    assert tensor_storage(halves).shape == (2, 6)
    # a smaller piece after a tensor is an append from the first one on: the result has room to grow
    appended = torch.cat([halves, halves[:, :1] * 2], 1)
    assert tensor_storage(appended).shape[0] == 2 and tensor_storage(appended).shape[1] >= 64
    assert appended.shape == (2, 7)
    assert appended.cpu().tolist() == [[1.0] * 6 + [2.0]] * 2


def test_appends_to_an_empty_accumulator_start_padded_and_equal_cpu():
    """``DynamicCache`` starts each layer's keys as ``torch.tensor([])`` and appends the prompt's keys to it."""
    def run(device):
        acc = torch.tensor([], device=device)
        pieces = [torch.arange(6.0, device=device).reshape(1, 2, 3, 1) * (i + 1) for i in range(3)]
        history = []
        for i, p in enumerate(pieces):
            acc = torch.cat([acc, p if i == 0 else p[:, :, :1]], dim=-2)
            history.append(acc.cpu())
        return acc, history

    got, got_history = run("tpu")
    _, want_history = run("cpu")
    capacity = tensor_storage(got).shape
    assert capacity[:2] == (1, 2) and capacity[2] >= 64 and capacity[3] == 1 and got.shape == (1, 2, 5, 1)
    for g, w in zip(got_history, want_history):
        assert torch.equal(g, w)


def test_appends_under_autograd_and_out_and_mixed_dtypes_match_cpu():
    def run(device):
        w = torch.arange(4.0, device=device).reshape(1, 4).requires_grad_()
        x = w * 2
        for i in range(5):
            x = torch.cat([x, (w[:, :1] * i)], dim=1)
        x.sum().backward()
        out = torch.empty(0, dtype=torch.float32, device=device)
        torch.cat([x.detach(), x.detach()[:, :2]], dim=1, out=out)
        mixed = torch.cat([x.detach(), torch.ones(1, 1, dtype=torch.float64, device=device)], dim=1)
        return x.detach().cpu(), w.grad.cpu(), out.cpu(), mixed.cpu()

    for got, want in zip(run("tpu"), run("cpu")):
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want)


def test_full_with_a_new_fill_value_each_step_compiles_once():
    state.clear()
    before = telemetry.counters["compiles"]
    values = [torch.full((2, 3), i, device="tpu").sum().item() for i in range(6)]
    assert values == [6 * i for i in range(6)]
    assert torch.full((2,), True, device="tpu").dtype == torch.bool
    assert torch.full((2,), 2**40, device="tpu").cpu().tolist() == [2**40, 2**40]
    assert telemetry.counters["compiles"] - before <= 4, telemetry.counters["compiles"] - before
