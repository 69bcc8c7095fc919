"""The fused graph's key is built while recording (runtime/graph_key.py): wherever that path answers, its key is
the one the sync's own graph walk builds, and it answers for a training step, so the walk is skipped."""

import pytest
import torch

import torchtpu_lab
from torchtpu_lab.runtime import graph_key, fused


@pytest.fixture
def checked(monkeypatch):
    """Every sync's incremental key, compared with the graph walk's; returns the tally of both paths."""
    tally = {"incremental": 0, "walked": 0}
    original = graph_key.Segment.key

    def key(self, targets):
        built = original(self, targets)
        if built is None:
            tally["walked"] += 1
            return None
        tally["incremental"] += 1
        nodes, node_keys, leaves, leaf_sigs, target_refs = built
        walked = fused._topo(targets)
        full, full_leaves = fused._build_key(walked, targets)
        assert [id(n) for n in nodes] == [id(n) for n in walked]
        assert (node_keys, leaf_sigs, target_refs) == (full.nodes, full.leaves, full.targets)
        assert [id(v) if isinstance(v, torch.Tensor) else v for v in leaves] == \
               [id(v) if isinstance(v, torch.Tensor) else v for v in full_leaves]
        return built

    monkeypatch.setattr(graph_key.Segment, "key", key)
    return tally


def _train(device: str, steps: int = 3):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16),
                                torch.nn.Linear(16, 1)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x, y = torch.randn(4, 8).to(device), torch.randn(4, 1).to(device)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x) * 1.5, y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_a_training_step_takes_the_incremental_key_and_matches_cpu(checked):
    assert _train("tpu") == pytest.approx(_train("cpu"), rel=1e-5, abs=1e-6)
    assert checked["incremental"] >= 3, checked


def test_dropped_temporaries_keep_the_incremental_key_of_the_live_nodes(checked):
    """A dead node (a temporary whose result was dropped, with an input of its own only it read) is left out
    of the key the segment built, exactly as the graph walk leaves it out (the fixture compares the two)."""
    a = torch.arange(6.0, device="tpu")
    only_dead_reads_this = torch.full((6,), 3.0, device="tpu")
    b = a * 2
    _ = torch.sin(b) * only_dead_reads_this  # recorded, then dropped: two dead nodes and a leaf only they read
    del _
    c = b + 1
    assert c.cpu().tolist() == [1.0, 3.0, 5.0, 7.0, 9.0, 11.0]
    assert checked == {"incremental": 1, "walked": 0}, checked
    d = c * 3  # c is concrete now: a leaf, not a node
    e = d - c
    assert e.cpu().tolist() == [2.0, 6.0, 10.0, 14.0, 18.0, 22.0]
    assert checked["incremental"] >= 1, checked


def test_the_same_graph_hits_whichever_path_built_its_key():
    from torchtpu_lab import telemetry

    def step(drop: bool):
        x = torch.ones(5, device="tpu") * 4
        y = x.exp()
        if drop:
            z = y.cos()  # a dead temporary: left out of this sync's key
            del z
        return (y + x).sum().item()

    step(False)  # compiles the two-path graph
    hits = telemetry.counters["graph_cache_hits"]
    assert step(True) == step(False)
    assert telemetry.counters["graph_cache_hits"] >= hits + 2
