"""A training step larger than the fused graph size limit is cut at the same ops every step, so steady-state
steps compile nothing, and the profile says the limit flushed and what to do (runtime/graph_cuts.py)."""

import pytest
import torch
import torch.nn as nn

import torchtpu_lab
from torchtpu_lab import config, telemetry
from torchtpu_lab.runtime import fused


def _trainer(width: int):
    torch.manual_seed(0)
    layers = [m for _ in range(5) for m in (nn.Linear(width, width), nn.Tanh())] + [nn.Linear(width, 3)]
    model = nn.Sequential(*layers).to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randn(4, width).to("tpu"), torch.randn(4, 3).to("tpu")

    def step():
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        return loss

    return step


def _ops_per_step(step) -> int:
    """The ops of a steady step (the first one also makes the optimizer's state)."""
    config.max_graph_ops.set(10**9)
    step()
    torchtpu_lab.sync()
    step()
    n = fused.pending_ops()
    torchtpu_lab.sync()
    return n


def _compiles_per_step(step, steps: int, read_loss: bool) -> list[int]:
    out = []
    for _ in range(steps):
        before = telemetry.counters["compiles"]
        loss = step()
        if read_loss:
            loss.item()
        out.append(int(telemetry.counters["compiles"] - before))
    return out


# a width per case: every case starts with nothing compiled for its shapes
@pytest.mark.parametrize("factor,width,read_loss", [
    (1.2, 11, False), (2.5, 13, False), (1.2, 15, True), (2.5, 17, True),
])
def test_step_past_the_limit_compiles_nothing_in_steady_state(limit, factor, width, read_loss):
    step = _trainer(width)
    n = _ops_per_step(step)
    config.max_graph_ops.set(int(n / factor))
    compiles = _compiles_per_step(step, 8, read_loss)
    assert sum(compiles[:4]) > 0  # the first steps compile the pieces
    assert compiles[4:] == [0, 0, 0, 0], compiles  # then every step reuses them
    assert fused.CUTS.forced >= 1  # the limit really cut the step


def test_every_user_visible_sync_flushes_all_pending_work(limit):
    step = _trainer(12)
    config.max_graph_ops.set(10**9)
    step()
    assert fused.pending_ops() > 0
    loss = step()
    loss.item()
    assert fused.pending_ops() == 0 and not fused.has_pending()


def test_profile_reports_limit_flushes_with_what_to_do(limit):
    step = _trainer(14)
    n = _ops_per_step(step)
    config.max_graph_ops.set(int(n / 2.5))
    with torchtpu_lab.profile() as prof:
        for _ in range(3):
            step()
    groups = [g for g in prof.report().syncs if g.reason == telemetry.SyncReason.GRAPH_LIMIT.text]
    assert groups and sum(g.count for g in groups) >= 6
    hint = groups[0].hint
    assert "max_graph_ops" in hint and str(config.max_graph_ops.value) in hint and "raise the limit" in hint
    assert "graph size limit" in prof.text()


def test_repetitive_ops_past_the_limit_are_not_cut_into_tiny_graphs(limit):
    """A chain of identical ops makes every position look like the cut point the limit chose: the graph must
    still be cut into a few large graphs, not synced op by op."""
    config.max_graph_ops.set(400)
    a = torch.randn(8, 8).to("tpu")
    torchtpu_lab.sync()
    with telemetry.Recorder() as events:
        x = a
        for _ in range(4000):
            x = x + a
        torch.testing.assert_close(x.cpu(), a.cpu() * 4001, rtol=1e-4, atol=1e-3)
    syncs = [e for e in events if e.kind == "sync"]
    assert fused.CUTS.forced >= 1
    assert len(syncs) <= 4000 // 400 + 2, len(syncs)  # cut at the limit, as if no anchor existed
