"""Non-blocking copies to the host (runtime/host_copies.py): ``host.copy_(x, non_blocking=True)`` launches the work
``x`` waits for and returns without waiting; the copy lands when the host waits for it (an event recorded after
it, a device-wide wait, a blocking read, the end of a cell), with the values ``x`` had when the copy was issued.
transformers' deferred stop check, which reads its flag that way a token late, gives CPU's tokens."""

import time
import warnings

import pytest
import torch

import torchtpu_lab
from torchtpu_lab import native
from torchtpu_lab.runtime import fused, host_copies

EVENTS = ["torch.Event", "torch.tpu.Event"]


def _event(kind: str):
    if kind == "torch.Event":
        if native.module() is None:
            pytest.skip("torch.Event on tpu comes with the native core")
        return torch.Event("tpu")
    return torch.tpu.Event()


@pytest.mark.parametrize("kind", EVENTS)
@pytest.mark.parametrize("mode", ["fused", "strict", "debug"])
def test_a_copy_launches_without_waiting_and_lands_at_an_event_recorded_after_it(kind, mode):
    with torchtpu_lab.eager_mode(mode):
        x = torch.arange(6.0, device="tpu").reshape(2, 3)
        y = x * 2 + 1
        host = torch.zeros(2, 3)
        host.copy_(y, non_blocking=True)
        assert fused.pending_ops() == 0  # the work it reads was launched
        assert host_copies.pending() and torch.equal(host, torch.zeros(2, 3))  # nothing written yet
        event = _event(kind)
        event.record()
        event.synchronize()
    assert not host_copies.pending()
    assert torch.equal(host, torch.arange(6.0).reshape(2, 3) * 2 + 1)


@pytest.mark.parametrize("kind", EVENTS)
def test_an_event_lands_the_copies_issued_before_it_and_not_those_after(kind):
    a, b = torch.full((4,), 3.0, device="tpu"), torch.full((4,), 5.0, device="tpu")
    first, second = torch.zeros(4), torch.zeros(4)
    first.copy_(a + 1, non_blocking=True)
    early = _event(kind)
    early.record()
    second.copy_(b + 1, non_blocking=True)
    early.synchronize()
    assert torch.equal(first, torch.full((4,), 4.0))
    assert torch.equal(second, torch.zeros(4)) and host_copies.pending()
    late = _event(kind)
    late.record()
    late.synchronize()
    assert torch.equal(second, torch.full((4,), 6.0)) and not host_copies.pending()


@pytest.mark.parametrize("kind", EVENTS)
def test_query_lands_a_copy_once_the_device_has_computed_it(kind):
    host = torch.zeros(64, 64)
    x = torch.randn(64, 64, device="tpu")
    expected = (x @ x).cpu()
    host.copy_(x @ x, non_blocking=True)
    event = _event(kind)
    event.record()
    deadline = time.monotonic() + 60
    while not event.query():
        assert time.monotonic() < deadline, "the copy never landed"
        time.sleep(0.001)
    torch.testing.assert_close(host, expected)


@pytest.mark.parametrize("wait", ["item", "cpu", "synchronize"])
def test_any_wait_for_the_device_lands_every_copy(wait):
    host = torch.zeros(3, dtype=torch.int64)
    x = torch.tensor([7, 8, 9], device="tpu")
    host.copy_(x * 10, non_blocking=True)
    if wait == "item":
        assert x.sum().item() == 24
    elif wait == "cpu":
        x.cpu()
    else:
        torch.tpu.synchronize()
    assert torch.equal(host, torch.tensor([70, 80, 90]))


def test_the_copy_has_the_values_at_issue_after_in_place_changes_and_a_donating_graph():
    x = torch.ones(256, device="tpu") * 3
    torchtpu_lab.sync()
    host = torch.zeros(256)
    host.copy_(x, non_blocking=True)
    for _ in range(3):  # each step overwrites x: its old buffer, no longer held by x, may be donated
        x.mul_(2).add_(1)
        torchtpu_lab.sync()
    torch.tpu.synchronize()
    assert torch.equal(host, torch.full((256,), 3.0))
    assert torch.equal(x.cpu(), torch.full((256,), 31.0))


def test_views_casts_and_broadcasting_as_a_blocking_copy_does():
    x = torch.arange(12, device="tpu").reshape(3, 4)
    big = torch.zeros(5, 4, dtype=torch.float64)
    big[1:4].copy_(x.t().t()[:, :], non_blocking=True)  # an int64 source into a float64 view
    row = torch.zeros(2, 3)
    row.copy_(x.t()[1, :3], non_blocking=True)  # a strided source broadcast to (2, 3)
    torch.tpu.synchronize()
    expected = torch.zeros(5, 4, dtype=torch.float64)
    expected[1:4] = torch.arange(12.0).reshape(3, 4)
    assert torch.equal(big, expected)
    assert torch.equal(row, torch.tensor([[1.0, 5.0, 9.0]] * 2))


def test_shapes_that_do_not_broadcast_raise_pytorchs_error_and_issue_nothing():
    issued = host_copies.issued()
    with pytest.raises(RuntimeError, match="must match the size of tensor b"):
        torch.zeros(4).copy_(torch.ones(3, device="tpu"), non_blocking=True)
    assert host_copies.issued() == issued and not host_copies.pending()


def test_to_cpu_with_non_blocking_still_returns_the_values():
    """``.to("cpu", non_blocking=True)`` makes its own host tensor: it stays a blocking copy, since code that
    reads that tensor at once would otherwise read garbage."""
    x = torch.arange(5.0, device="tpu") * 3
    assert torch.equal(x.to("cpu", non_blocking=True), torch.arange(5.0) * 3)


def test_a_copy_issued_in_a_cell_has_landed_when_the_next_cell_runs(ip):
    ip.run_cell("host = torch.zeros(3)\nhost.copy_(torch.arange(3.0, device='tpu') + 5, non_blocking=True)")
    assert torch.equal(ip.user_ns["host"], torch.tensor([5.0, 6.0, 7.0]))


transformers = pytest.importorskip("transformers")


class _Collect(transformers.generation.streamers.BaseStreamer):
    def __init__(self) -> None:
        self.tokens: list[torch.Tensor] = []

    def put(self, value) -> None:
        self.tokens.append(value.detach().cpu().reshape(-1))

    def end(self) -> None:
        pass


def _gpt2():
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=97, n_positions=64, bos_token_id=0,
                                  eos_token_id=0, pad_token_id=0)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    prompt = torch.randint(1, 97, (1, 5), generator=torch.Generator().manual_seed(1))
    return model, prompt


@pytest.mark.parametrize("eos", [False, True])
def test_generate_with_the_deferred_stop_check_gives_cpus_tokens_and_stream(eos):
    """With ``eos`` the run stops at the model's own end token (found on CPU first), so the one-token-late read
    must stop and undo exactly there."""
    from transformers.generation.utils import DeferredStopCheck

    if native.module() is None:
        with torchtpu_lab.config.deferred_stop_check(True):  # its torch.Event needs the native core
            assert not DeferredStopCheck.is_supported(torch.device("tpu"), None, False, False)
        pytest.skip("the deferred stop check needs the native core")
    model, prompt = _gpt2()
    kwargs = dict(max_new_tokens=12, do_sample=False)
    if eos:
        free = model.generate(prompt, **kwargs, eos_token_id=None)
        kwargs["eos_token_id"] = int(free[0, 8])  # the fourth new token ends the run
    cpu_stream = _Collect()
    expected = model.generate(prompt, **kwargs, streamer=cpu_stream)
    model = model.to("tpu")
    with torchtpu_lab.config.deferred_stop_check(True):
        assert DeferredStopCheck.is_supported(torch.device("tpu"), None, False, False)
        issued = host_copies.issued()
        stream = _Collect()
        out = model.generate(prompt.to("tpu"), **kwargs, streamer=stream)
        assert host_copies.issued() - issued >= 2 * (expected.shape[1] - prompt.shape[1])  # flag and tokens
    assert torch.equal(out.cpu(), expected)
    assert torch.equal(torch.cat(stream.tokens), torch.cat(cpu_stream.tokens))
    assert "transformers.generation.utils.DeferredStopCheck.is_supported" in \
        torchtpu_lab.global_changes()["transformers generation (wrapped)"]


def test_auto_defers_on_an_accelerator_and_not_on_xla_cpu():
    from transformers.generation.utils import DeferredStopCheck

    from torchtpu_lab import platform

    expected = platform.info().platform != "cpu" and native.module() is not None
    assert torchtpu_lab.config.deferred_stop_check.value == "auto"
    assert DeferredStopCheck.is_supported(torch.device("tpu"), None, False, False) is expected
    assert DeferredStopCheck.is_supported(torch.device("tpu"), None, False, True) is False  # an assistant
    assert DeferredStopCheck.is_supported(torch.device("cpu"), None, False, False) is False  # transformers' own


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool, torch.complex64])
def test_host_tensors_on_either_side_of_a_transfer_stay_resizable(dtype):
    """PyTorch marks a storage handed to numpy (``Tensor.numpy()``) as never resizable again: a transfer must
    neither do that to the user's tensor nor return a tensor that refuses ``resize_``, as CUDA's do not."""
    x = torch.arange(6).reshape(2, 3).to(dtype)
    on_tpu = x.t().to("tpu")
    back = on_tpu.cpu()
    assert torch.equal(back, x.t())
    x.resize_(10)
    back.resize_(2, 5)
    assert x.shape == (10,) and back.shape == (2, 5)


def test_out_arguments_the_cpu_fallback_resizes():
    """Ops without a lowering run on the CPU; an ``out=`` they resize is a copy of the tpu tensor, which must
    take the new size (it failed with "Trying to resize storage that is not resizable")."""
    out, r = torch.empty(0, device="tpu"), torch.empty(2, device="tpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fallback's own warning (once per op), torch.range's deprecation
        torch.eye(3, out=out)
        torch.range(0, 4, out=r)
        expected = torch.range(0, 4)
    assert torch.equal(out.cpu(), torch.eye(3))
    assert torch.equal(r.cpu(), expected)
