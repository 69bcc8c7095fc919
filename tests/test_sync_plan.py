"""A fused sync's plan in C (csrc/sync_plan.cpp) gives what runtime/fused.py's Python gives: the leaves donated
to the graph's executable, the order of its outputs that pairs each donated buffer with its replacement, and the
results committed into their placeholders. A wrong order would not change a value, only which buffers alias which
outputs (a copy per parameter), so the two are compared directly, on random plans and on a real training step."""

from __future__ import annotations

import contextlib
import random

import numpy as np
import pytest
import torch

import torchtpu_lab
from torchtpu_lab.device import memory
from torchtpu_lab.runtime import fused

pytestmark = pytest.mark.skipif(fused._NATIVE_PLAN[0] is None, reason="needs the native core")


@contextlib.contextmanager
def python_plan():
    native = fused._NATIVE_PLAN[0]
    fused._NATIVE_PLAN[0] = None
    try:
        yield
    finally:
        fused._NATIVE_PLAN[0] = native


def both(fn, *args):
    got = fn(*args)
    with python_plan():
        want = fn(*args)
    return got, want


SHAPES = [((4,), np.dtype("float32")), ((2, 3), np.dtype("float32")), ((4,), np.dtype("int64"))]


def random_plan(rnd: random.Random):
    """Targets, leaves and storages as a sync sees them: some storages replace a leaf (their prior array) with a
    placeholder of the same or another signature; numbers among the leaves; some leaves held elsewhere."""
    targets = [fused.LazyValue(None, j, *rnd.choice(SHAPES)) for j in range(rnd.randint(1, 12))]
    leaves, leaf_sigs = [], []
    for _ in range(rnd.randint(1, 10)):
        if rnd.random() < 0.2:
            leaves.append(float(rnd.random()))
            leaf_sigs.append(float)
        else:
            shape, dtype = rnd.choice(SHAPES)
            leaves.append(np.zeros(shape, dtype))
            leaf_sigs.append((shape, dtype))
    storages = [object() for _ in range(rnd.randint(0, len(targets)))]
    held = [rnd.choice(targets) for _ in storages]
    arrays = [i for i, v in enumerate(leaves) if type(v) is not float]
    prior = {id(s): id(leaves[rnd.choice(arrays)]) for s in storages if arrays and rnd.random() < 0.8}
    live = {id(leaves[i]): [leaves[i], 1, 0, 0, None] for i in arrays if rnd.random() < 0.2}
    return targets, leaves, tuple(leaf_sigs), storages, held, prior, live


@pytest.mark.parametrize("seed", range(6))
def test_native_donation_and_output_order_equal_pythons_on_random_plans(seed):
    rnd = random.Random(seed)
    ordered = spared = 0
    for _ in range(300):
        targets, leaves, leaf_sigs, storages, held, prior, live = random_plan(rnd)
        candidates, reusable = fused._reusable(leaf_sigs, (), targets, None)
        memory._live.update(live)  # the ledger's own dict (memory.is_held's): these leaves are held elsewhere
        try:
            got, want = both(fused._donate, leaves, candidates, reusable)
        finally:
            for key in live:
                del memory._live[key]
        assert got == want and type(got) is tuple
        donate = want
        got, want = both(fused._alias_order, targets, leaves, leaf_sigs, donate, storages, held, prior)
        assert got == want
        if want is not None:
            ordered += 1
            replaced = set(prior.values())
            spared += any(id(leaves[i]) not in replaced for i in donate)
    assert ordered > 50 and spared > 20  # the plans exercised pairing, by replacement and by signature


def test_commit_sets_each_placeholder_and_stops_at_the_shorter():
    targets = [fused.LazyValue(None, j, (1,), np.dtype("float32")) for j in range(3)]
    fused._commit(targets, ["a", "b"])
    assert [v.value for v in targets] == ["a", "b", None]


def test_a_training_steps_sync_plans_the_same_in_c_and_python(monkeypatch):
    """The plan of a real AdamW step (parameters and optimizer state donated and updated in place) is the same
    either way, and the step's values equal CPU's with the C plan."""
    seen = []
    real = fused._alias_order

    def compare(*args):
        got, want = both(real, *args)
        seen.append((got, want))
        return got

    monkeypatch.setattr(fused, "_alias_order", compare)
    torch.manual_seed(0)
    cpu = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    tpu = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    tpu.load_state_dict(cpu.state_dict())
    tpu.to("tpu")
    x = torch.randn(4, 8)
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (cpu, tpu)]
    with torchtpu_lab.eager_mode("fused"):
        for _ in range(3):
            for model, opt, inp in ((cpu, opts[0], x), (tpu, opts[1], x.to("tpu"))):
                opt.zero_grad()
                model(inp).square().mean().backward()
                opt.step()
            torchtpu_lab.sync()
    assert seen and all(got == want for got, want in seen)
    assert any(got is not None for got, _ in seen)  # the step's outputs were reordered for its donations
    for p, q in zip(cpu.parameters(), tpu.parameters()):
        torch.testing.assert_close(q.detach().cpu(), p.detach(), rtol=1e-5, atol=1e-6)
