"""A read of a pending value built from factory ops and numbers only (no tensor's data) runs its small cone alone
and leaves the rest pending (``fused.read_cone``): the values are CPU's, the rest runs later as one graph, and the
sync event says so. A read of anything that depends on a tensor's values (a loss, a decode step's stop check), a
cone with a pending index check, and a tiny pending graph sync everything, as before."""

import pytest
import torch

import torchtpu_lab
from torchtpu_lab import telemetry
from torchtpu_lab.runtime import fused


def _optimizer_tail(params):
    """Pending work that does not feed the read: an in-place update per parameter, as an optimizer step is."""
    for p in params:
        p.mul_(0.5).add_(1.0)


def _packed_check(n: int, device: str) -> tuple:
    """transformers' packed-sequence check: a diff and cumsum of position ids, read by ``bool()``."""
    position_ids = torch.arange(n, device=device).unsqueeze(0)
    first = position_ids[:, :1] - 1
    mask = (torch.diff(position_ids, prepend=first, dim=-1) != 1).cumsum(-1)
    return position_ids, bool((mask[:, -1] == 0).all())


def _params(device: str) -> list:
    torch.manual_seed(0)
    return [torch.randn(4, 4).to(device) for _ in range(48)]  # a tail of 96 ops: the cone is under an eighth


def test_a_small_read_runs_its_cone_and_leaves_the_rest_pending():
    with torchtpu_lab.eager_mode("fused"):
        params = _params("tpu")
        torchtpu_lab.sync()
        _optimizer_tail(params)
        pending = fused.pending_ops()
        runs = telemetry.counters["executions"]
        position_ids, unpacked = _packed_check(12, "tpu")
        recorded = fused.pending_ops()
        assert unpacked is True
        # the read ran one small program; everything it recorded and the optimizer's updates are still pending
        assert telemetry.counters["executions"] == runs + 1
        assert fused.pending_ops() == recorded > pending
        event = telemetry.sync_log[-1]
        assert event.detail["left_pending"] == recorded - event.detail["pending_ops"]
        assert 0 < event.detail["pending_ops"] <= fused.CONE_MAX_OPS
        embedded = position_ids * 2 + 1  # the rest reads the cone's position ids
        torchtpu_lab.sync()
        assert telemetry.counters["executions"] == runs + 2  # the rest ran as one graph
        got = [p.cpu() for p in params] + [embedded.cpu()]
    want = _params("cpu")
    _optimizer_tail(want)
    cpu_ids, cpu_unpacked = _packed_check(12, "cpu")
    assert cpu_unpacked is True
    for g, w in zip(got, want + [cpu_ids * 2 + 1]):
        torch.testing.assert_close(g, w)


def test_a_repeated_cone_read_builds_its_program_once():
    with torchtpu_lab.eager_mode("fused"):
        params = _params("tpu")
        torchtpu_lab.sync()
        for step in range(4):
            _optimizer_tail(params)
            if step == 1:
                compiles = telemetry.counters["compiles"]
            assert _packed_check(12, "tpu")[1] is True
            assert "left_pending" in telemetry.sync_log[-1].detail
            torchtpu_lab.sync()
        assert telemetry.counters["compiles"] == compiles
        got = [p.cpu() for p in params]
    want = _params("cpu")
    for _ in range(4):
        _optimizer_tail(want)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)


def test_a_loss_read_after_the_step_syncs_everything():
    """The backward and the optimizer read the forward: a cone-only read would run the forward twice."""
    with torchtpu_lab.eager_mode("fused"):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)).to("tpu")
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x, y = torch.randn(4, 8).to("tpu"), torch.randn(4, 1).to("tpu")
        for _ in range(2):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            loss.item()
            assert fused.pending_ops() == 0
            assert "left_pending" not in telemetry.sync_log[-1].detail


def test_a_cone_with_a_pending_index_check_syncs_everything_and_raises_at_the_read():
    with torchtpu_lab.eager_mode("fused"):
        params = _params("tpu")
        torchtpu_lab.sync()
        _optimizer_tail(params)
        out_of_range = torch.arange(10, device="tpu")[torch.arange(3, device="tpu") + 8]
        with pytest.raises(IndexError, match="out of bounds|out of range"):
            out_of_range.sum().item()
        assert fused.pending_ops() == 0
        torch.testing.assert_close(params[0].cpu(), _params("cpu")[0] * 0.5 + 1.0)  # the rest ran


def test_a_read_of_a_tensors_values_syncs_everything_however_small():
    """A decode step's stop check reads a small value of the step's own state: where the loop's step ends."""
    with torchtpu_lab.eager_mode("fused"):
        params = _params("tpu")
        unfinished = torch.ones(2, dtype=torch.long).to("tpu")
        torchtpu_lab.sync()
        _optimizer_tail(params)
        assert bool(unfinished.mul(1).max() == 0) is False
        assert fused.pending_ops() == 0


def test_a_read_of_a_tiny_pending_graph_syncs_it():
    with torchtpu_lab.eager_mode("fused"):
        x = torch.ones(3, device="tpu")
        torchtpu_lab.sync()
        assert (x + 1).sum().item() == 6.0
        assert fused.pending_ops() == 0


def test_a_cone_read_of_a_view_gathers_from_the_cone_value():
    with torchtpu_lab.eager_mode("fused"):
        params = _params("tpu")
        torchtpu_lab.sync()
        _optimizer_tail(params)
        ids = torch.arange(10, device="tpu").reshape(2, 5).cumsum(-1)
        assert ids[1, 2:].tolist() == [5 + 6 + 7, 5 + 6 + 7 + 8, 5 + 6 + 7 + 8 + 9]
        assert "left_pending" in telemetry.sync_log[-1].detail
        assert fused.pending_ops() > 0
