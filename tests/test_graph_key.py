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
        live_nodes, node_keys, leaves, leaf_sigs, target_refs, _ = built
        walked = fused._topo(targets)
        full_keys, full_leaves, full_sigs, full_targets = fused._build_key(walked, targets)
        assert [id(n) for n in live_nodes()] == [id(n) for n in walked]
        assert (node_keys, leaf_sigs, target_refs) == (full_keys, full_sigs, full_targets)
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


def test_a_repeated_step_finds_its_structure_while_recording(monkeypatch):
    """After one sync, each node a step records is compared with the key at its position in the structure that
    sync found; when all agree, the next sync takes that structure as it is (no structure built, hashed or looked
    up, no key tuples kept while recording). A step that records another op builds its structure again, from
    the op that differs, and becomes what the next steps are compared with. Values are CPU's throughout."""
    calls = []
    original = graph_key.canonical
    monkeypatch.setattr(graph_key, "canonical", lambda s: calls.append(len(s)) or original(s))
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    tx, tw = x.to("tpu"), w.to("tpu")

    def step(op, on_tpu=True):
        a, b = (tx, tw) if on_tpu else (x, w)
        h = op(a @ b) * 0.5 + a.sum()
        segment = fused.PENDING.segment
        matching = on_tpu and segment.matching
        assert not (matching and segment.node_keys)  # agreeing keys are not kept
        return h.cpu(), matching

    with torchtpu_lab.eager_mode("fused"):
        torchtpu_lab.sync()
        for op, structures in ((torch.tanh, 1), (torch.tanh, 0), (torch.tanh, 0), (torch.relu, 1), (torch.relu, 0),
                               (torch.tanh, 1), (torch.tanh, 0)):
            calls.clear()
            got, matching = step(op)
            torch.testing.assert_close(got, step(op, on_tpu=False)[0])
            assert len(calls) == structures, (op, calls)
            assert matching == (structures == 0)  # every node agreed, up to the sync


def test_a_loop_that_alternates_graphs_finds_each_structure_while_recording(monkeypatch):
    """A loop that syncs two graphs per iteration (a training step and an evaluation; a read of the loss between
    the backward and the optimizer) expects, after each sync, the graph that came after it last time: once both
    were seen, every segment matches as it is recorded and no structure is built again. Values are CPU's."""
    calls = []
    original = graph_key.canonical
    monkeypatch.setattr(graph_key, "canonical", lambda s: calls.append(len(s)) or original(s))
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    tx, tw = x.to("tpu"), w.to("tpu")
    graphs = {"train": lambda a, b: torch.tanh(a @ b) * 0.5 + a.sum(),
              "eval": lambda a, b: (a @ b).relu().sum(dim=0)}
    with torchtpu_lab.eager_mode("fused"):
        torchtpu_lab.sync()
        for i in range(6):
            for name, fn in graphs.items():
                calls.clear()
                out = fn(tx, tw)
                matching = fused.PENDING.segment.matching
                torch.testing.assert_close(out.cpu(), fn(x, w))
                if i >= 2:
                    assert matching and not calls, (i, name, calls)
