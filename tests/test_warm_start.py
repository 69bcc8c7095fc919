"""Warm start: a fresh process whose persistent cache is warm finds the executables its previous run used already
loaded by a background thread (runtime/prefetch.py), and records ops with checks without tracing them
(runtime/op_facts.py), so its first training step traces, lowers and compiles nothing."""

import json
import os
import threading

import pytest

from fresh_process import run_with_cache
from torchtpu_lab.runtime import compile_cache
from torchtpu_lab.runtime.prefetch import Prefetcher

STEP = """
import torch, torch.nn as nn, torch.nn.functional as F
import torchtpu_lab
from torchtpu_lab import telemetry
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(12, 16), nn.GELU(), nn.Linear(16, 5)).to("tpu")
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
x, y = torch.randn(6, 12).to("tpu"), torch.tensor(TARGETS).to("tpu")
before = telemetry.counters.get("jax_traces", 0)
extra = {}
try:
    opt.zero_grad(); loss = F.cross_entropy(model(x), y); loss.backward(); opt.step()
    extra["loss"] = loss.item()
except IndexError as e:
    extra["error"] = str(e)
extra["step_traces"] = telemetry.counters.get("jax_traces", 0) - before
extra["prefetched"] = telemetry.counters.get("persistent_cache_prefetched", 0)
"""
GOOD = [0, 4, 1, 3, 2, 2]


def _step(cache, targets=GOOD, **env):
    return run_with_cache(STEP.replace("TARGETS", repr(targets)), cache, env=env)


def test_a_warm_first_step_takes_prefetched_executables_and_traces_nothing(tmp_path):
    cold = _step(tmp_path)
    assert cold["step_traces"] > 0 and cold["prefetched"] == 0, cold
    lists = [n for n in os.listdir(tmp_path) if Prefetcher.is_list(n)]
    assert len(lists) == 1, os.listdir(tmp_path)
    listed = json.loads((tmp_path / lists[0]).read_text())
    assert listed and all((tmp_path / f"{k}.tpx").is_file() for k in listed), listed
    warm = _step(tmp_path)
    assert warm["loss"] == cold["loss"], (cold, warm)
    assert warm["prefetched"] >= 1, warm  # the step's graph (at least) came from the thread
    assert warm["step_traces"] == 0 and warm["persistent_cache_misses"] == 0, warm  # nll_loss's avals from disk
    assert warm["xla_compiles"] == 0, warm


def test_prefetch_can_be_turned_off(tmp_path):
    cold = _step(tmp_path)
    warm = _step(tmp_path, TORCHTPU_LAB_PREFETCH="0")
    assert warm["loss"] == cold["loss"] and warm["prefetched"] == 0, warm
    assert warm["persistent_cache_hits"] > 0 and warm["xla_compiles"] == 0, warm


def test_checks_whose_avals_came_from_disk_still_raise(tmp_path):
    """The op's checks are part of what is stored: a warm process that never traces nll_loss still names the
    bad target, as a cold one does."""
    _step(tmp_path)
    bad = _step(tmp_path, targets=[0, 4, 9, 3, 2, 2])
    assert "Target 9 is out of bounds" in bad.get("error", ""), bad
    assert bad["step_traces"] == 0, bad


@pytest.mark.parametrize("content", ["{not json", '["../../etc/passwd", 3]', '{"a": 1}'])
def test_a_damaged_list_only_means_no_prefetch(tmp_path, content):
    cold = _step(tmp_path)
    for name in os.listdir(tmp_path):
        if Prefetcher.is_list(name):
            (tmp_path / name).write_text(content)
    warm = _step(tmp_path)
    assert warm["loss"] == cold["loss"] and warm["prefetched"] == 0, warm
    assert warm["persistent_cache_hits"] > 0 and warm["xla_compiles"] == 0, warm


def _listed(tmp_path, keys):
    p = Prefetcher()
    for k in keys:
        (tmp_path / f"{k}.tpx").write_bytes(b"x")
    for k in keys:
        p.used(str(tmp_path), True, k)
    p.write()
    return p


def test_a_request_waits_for_the_entry_being_loaded_and_claims_one_not_reached(tmp_path):
    keys = [f"{i:064x}" for i in (1, 2, 3)]
    _listed(tmp_path, keys)
    loading, release, loaded = threading.Event(), threading.Event(), []

    def load(key, device):
        loaded.append(key)
        if key == keys[0]:
            loading.set()
            assert release.wait(10)
        return (f"exe-{key[-1]}", [])

    p = Prefetcher()
    assert p.start(str(tmp_path), ".tpx", None, load, run_on_zeros=False)
    assert loading.wait(10)
    assert p.take(keys[2]) is None  # not reached: the caller loads it, and the thread skips it
    threading.Timer(0.2, release.set).start()
    assert p.take(keys[0]) == ("exe-1", [])  # being loaded: waited for
    p.close()
    assert loaded == keys[:2], loaded
    assert p.take(keys[1]) == ("exe-2", []) and p.take(keys[1]) is None  # each entry is taken once


def test_the_list_keeps_first_use_order_then_older_entries_and_clear_removes_it(tmp_path):
    older = [f"{i:064x}" for i in (7, 8)]
    _listed(tmp_path, older)
    p = _listed(tmp_path, [f"{9:064x}", older[1]])  # a new entry, then one the older list has too
    (name,) = [n for n in os.listdir(tmp_path) if Prefetcher.is_list(n)]
    assert json.loads((tmp_path / name).read_text()) == [f"{9:064x}", older[1], older[0]]
    previous = compile_cache.settings()
    try:
        compile_cache.enable(str(tmp_path))
        assert compile_cache.clear() == 3
        assert not [n for n in os.listdir(tmp_path) if Prefetcher.is_list(n)]
    finally:
        compile_cache.use_settings(previous)
    p.close()


def test_a_forked_child_does_not_wait_for_loads_its_parent_thread_was_doing(tmp_path):
    keys = [f"{i:064x}" for i in (4, 5)]
    _listed(tmp_path, keys)
    started, release = threading.Event(), threading.Event()

    def load(key, device):
        started.set()
        assert release.wait(10)
        return ("exe", [])

    p = Prefetcher()
    assert p.start(str(tmp_path), ".tpx", None, load, run_on_zeros=False)
    assert started.wait(10)
    p._forget()  # what os.register_at_fork runs in a child: no thread there, so no slot to wait on
    assert p.take(keys[0]) is None and p.take(keys[1]) is None
    release.set()
