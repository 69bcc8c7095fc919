"""Writes whose memory overlaps: refused where CPU refuses them, with CPU's error, and left alone otherwise
(runtime/overlap.py). PyTorch's test_tensor_creation_ops found the first ones (test_cat_mem_overlap,
test_linlogspace_mem_overlap)."""

import warnings

import pytest
import torch

import torchtpu_lab


def _expanded(d):
    return torch.arange(3.0, device=d).reshape(1, 3).expand(6, 3)


def _square(d):
    return torch.arange(9.0, device=d).reshape(3, 3)


CASES = {
    # a written tensor with a stride-0 dim: CPU refuses most writes, not fill_/zero_/index_put_/sum(out=)
    "add_": lambda d: _expanded(d).add_(1),
    "mul_tensor": lambda d: _expanded(d).mul_(torch.ones(6, 3, device=d)),
    "copy_": lambda d: _expanded(d).copy_(torch.ones(6, 3, device=d)),
    "relu_": lambda d: torch.relu_(_expanded(d)),
    "clamp_": lambda d: _expanded(d).clamp_(0, 1),
    "normal_": lambda d: _expanded(d).normal_(),
    "add_out": lambda d: torch.add(torch.ones(6, 3, device=d), 1, out=_expanded(d)),
    "exp_out": lambda d: torch.exp(torch.ones(6, 3, device=d), out=_expanded(d)),
    "cat_out": lambda d: torch.cat([torch.ones(3, 3, device=d)] * 2, out=_expanded(d)),
    "stack_out": lambda d: torch.stack([torch.ones(3, device=d)] * 6, out=_expanded(d)),
    "mm_out": lambda d: torch.mm(torch.ones(6, 3, device=d), torch.ones(3, 3, device=d), out=_expanded(d)),
    "linspace_out": lambda d: torch.linspace(1, 10, 10, out=torch.zeros(1, device=d).expand(10)),
    "fill_": lambda d: _expanded(d).fill_(2),
    "zero_": lambda d: _expanded(d).zero_(),
    "sum_out": lambda d: torch.sum(torch.ones(6, 3, device=d), 0, out=torch.zeros(1, device=d).expand(3)),
    "setitem_row": lambda d: _expanded(d).__setitem__(0, 5.0),
    # an operand over the written tensor's storage in another geometry
    "add_row_of_self": lambda d: (lambda x: x.add_(x[0]))(_square(d)),
    "add_transpose_of_self": lambda d: (lambda x: x.add_(x.t()))(_square(d)),
    "copy_shifted": lambda d: (lambda x: x[:2].copy_(x[1:]))(_square(d)),
    "index_select_out_into_input": lambda d: (lambda x: torch.index_select(
        x, 0, torch.tensor([0], device=d), out=x[1:2]))(_square(d)),
    "add_self": lambda d: (lambda x: x.add_(x))(_square(d)),
    # the same tensor as an operand: allowed for pointwise ops, refused for an index (test_torch's
    # test_index_add_mem_overlap / test_index_copy_mem_overlap)
    "index_add_own_index": lambda d: (lambda i: i.index_add_(0, i, i.clone()))(torch.tensor([2, 1, 0], device=d)),
    "index_add_own_source": lambda d: (lambda i: i.index_add_(0, i.clone(), i))(torch.tensor([2, 1, 0], device=d)),
    "index_copy_own_index": lambda d: (lambda i: i.index_copy_(0, i, i.clone()))(torch.tensor([2, 1, 0], device=d)),
    "mul_detached_self": lambda d: (lambda x: x.mul_(x.detach()))(_square(d)),
    "cat_out_disjoint": lambda d: (lambda x: torch.cat([x[:1], x[:1]], out=x[1:]))(_square(d)),
    # an empty tensor overlaps only itself (test_tensor_creation_ops' test_cat_out)
    "cat_out_empty_self": lambda d: (lambda x: torch.cat([x, torch.ones(4, 6, device=d)], out=x))(
        torch.zeros(0, device=d)),
    "cat_out_other_empty": lambda d: (lambda x, y: torch.cat([x, torch.ones(4, 6, device=d)], out=y))(
        torch.zeros(0, device=d), torch.zeros(0, device=d)),
}


def _outcome(fn, device):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the CPU fallback's first-call warning (linspace out=)
        try:
            fn(device)
        except RuntimeError as e:
            return type(e), str(e)
    return "ok"


@pytest.mark.parametrize("mode", ["fused", "strict"])
@pytest.mark.parametrize("name", list(CASES))
def test_overlapping_writes_are_refused_as_on_cpu(name, mode):
    with torchtpu_lab.eager_mode(mode):
        assert _outcome(CASES[name], "tpu") == _outcome(CASES[name], "cpu")


@pytest.mark.parametrize("mode", ["fused", "strict"])
def test_a_refused_write_leaves_the_tensor_and_the_call_learned_from_other_tensors(mode):
    """The native core records ``x.add_(y.t())`` once taught; with ``y`` being ``x`` itself it must still hand the
    call to the check, and a refused call changes nothing."""
    with torchtpu_lab.eager_mode(mode):
        for _ in range(3):  # taught on tensors of other storages
            x, y = _square("tpu"), _square("tpu")
            x.add_(y.t())
            x.mul_(y[0])
        x = _square("tpu")
        for fn in (lambda: x.add_(x.t()), lambda: x.mul_(x[0])):
            with pytest.raises(RuntimeError, match="some elements of the input tensor and the written-to tensor"):
                fn()
        assert torch.equal(x.cpu(), _square("cpu"))
        x.add_(1)
        assert torch.equal(x.cpu(), _square("cpu") + 1)


@pytest.mark.parametrize("mode", ["fused", "strict"])
def test_an_index_that_is_the_written_tensor_is_refused_after_the_call_was_learned(mode):
    """Taught ``i.index_add_(0, j, v)`` on other tensors, the native core must still hand ``i.index_add_(0, i, v)``
    (an operand over self's storage in the same geometry) to the check."""
    with torchtpu_lab.eager_mode(mode):
        for _ in range(3):
            i, j = torch.tensor([2, 1, 0], device="tpu"), torch.tensor([2, 1, 0], device="tpu")
            i.index_add_(0, j, j.clone())
        with pytest.raises(RuntimeError, match="some elements of the input tensor and the written-to tensor"):
            i.index_add_(0, i, j.clone())
        assert i.cpu().tolist() == [2, 2, 2]  # the last lesson's result ([2, 1, 0] + [0, 1, 2]), unchanged
        x = torch.arange(3, device="tpu")
        x.add_(x)  # the same tensor as an operand of a pointwise op: allowed, as on CPU
        assert x.cpu().tolist() == [0, 2, 4]
