"""The public names other layers read instead of reaching into privates (issue 24 item 5)."""

import os

import torch

import torchtpu_lab
from torchtpu_lab import telemetry
from torchtpu_lab.device import storage as storage_mod
from torchtpu_lab.device import tensor
from torchtpu_lab.runtime import fused


def test_a_tensor_exposes_its_storage_and_view():
    x = torch.arange(6.0).to("tpu")
    row = x.view(2, 3)[1]
    assert isinstance(x.tpu_storage, storage_mod.Storage) and x.tpu_view is None
    assert row.tpu_storage is x.tpu_storage and row.tpu_view is not None


def test_a_deep_copy_gets_its_own_storage():
    import copy

    x = torch.ones(3, device="tpu")
    y = copy.deepcopy(x)
    assert y.tpu_storage is not x.tpu_storage
    y.add_(1)
    assert x.cpu().tolist() == [1.0, 1.0, 1.0] and y.cpu().tolist() == [2.0, 2.0, 2.0]


def test_a_deep_copy_keeps_views_sharing_as_on_cpu():
    """``copy.deepcopy([a, a.view(25), a[1:3].t()])``: the copies share one new storage, as CPU's do (each had
    been a separate clone, so a write through one copy did not show in the others)."""
    import copy

    for device in ("cpu", "tpu"):
        a = torch.arange(25.0, device=device).view(5, 5)
        a_copy, flat, part = copy.deepcopy([a, a.view(25), a[1:3].t()])
        a_copy.add_(100)
        assert flat.cpu().tolist() == list(range(100, 125)), device
        assert part.cpu().tolist() == (torch.arange(25.0).view(5, 5)[1:3].t() + 100).tolist(), device
        assert part.shape == (5, 2) and part.stride() == (1, 5), device
        assert a.cpu()[0, 0].item() == 0.0, device


def test_a_shallow_copy_shares_values_as_on_cpu():
    """``copy.copy(t)`` is a new tensor over the same values on CPU; the inherited path pickled a tpu tensor
    through a CPU copy, so a write to the copy was lost."""
    import copy

    for device in ("cpu", "tpu"):
        x = torch.tensor([1.0, 2.0, 3.0], device=device, requires_grad=True)
        y = copy.copy(x)
        assert y is not x and y.requires_grad and y.is_leaf
        with torch.no_grad():
            y.fill_(7.0)
        assert x.detach().cpu().tolist() == [7.0, 7.0, 7.0], device


def test_held_reads_a_storage_without_allocating_or_raising():
    s = storage_mod.Storage((4,), torch.float32, 0)
    assert s.held is None and not s.allocated  # `array` would have allocated zeros here
    s.array  # noqa: B018 — allocates
    assert s.held is not None and s.allocated
    with torchtpu_lab.eager_mode("fused"):
        y = torch.ones(2, device="tpu") + 1
        assert isinstance(y.tpu_storage.held, fused.LazyValue)
        torchtpu_lab.sync()
    assert not isinstance(y.tpu_storage.held, fused.LazyValue)


def test_has_data_tells_device_tensors_from_fake_ones():
    from torch._subclasses.fake_tensor import FakeTensorMode

    x = torch.ones(2, device="tpu")
    assert tensor.has_data(x)
    with FakeTensorMode():
        fake = torch.empty(2, device="tpu")
    assert not tensor.has_data(fake)


def test_internal_files_are_torch_jax_stdlib_and_ours_not_the_users():
    assert telemetry.is_internal_file(torch.__file__)
    assert telemetry.is_internal_file(os.__file__)
    assert telemetry.is_internal_file(fused.__file__)
    assert not telemetry.is_internal_file(__file__)
