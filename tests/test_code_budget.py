"""Compiled programs stay within the OS's limit on a process's memory maps (runtime/code_budget.py): near it the
least recently used programs are dropped, values stay right, what was dropped compiles again, and the user is
told once. A process at the limit aborts inside LLVM, killing the notebook's kernel."""

import warnings

import pytest
import torch

import torchtpu_lab
from torchtpu_lab import caches, telemetry
from torchtpu_lab.runtime import code_budget, fused


def _graph(n: int) -> float:
    """One fused graph of its own for each ``n`` (a new program), read back."""
    x = torch.arange(n, dtype=torch.float32, device="tpu")
    return float(((x * 3 + 1).tanh() * x).sum())


def _want(n: int) -> float:
    x = torch.arange(n, dtype=torch.float32)
    return float(((x * 3 + 1).tanh() * x).sum())


def test_shrink_evicts_the_least_recently_used_and_counts_them():
    c = caches.LRUCache("test_shrink", 10)
    for i in range(6):
        c.put(i, str(i))
    c.get(0)  # most recently used now
    assert c.shrink(3) == 3 and c.evictions == 3
    assert c.keys() == [4, 5, 0] and c.maxsize == 10
    assert c.shrink(5) == 0


def test_caches_holding_programs_are_marked():
    names = {c.name for c in caches.code_caches()}
    assert {"graphs", "ops", "op_fast_keys", "append_programs", "attention_programs"} <= names
    assert "op_schemas" not in names and "view_op_plans" not in names


def test_near_the_limit_old_programs_are_dropped_values_stay_right_and_they_compile_again(monkeypatch):
    if code_budget.limit() is None:
        pytest.skip("the limit on memory maps cannot be read here")
    with torchtpu_lab.eager_mode("fused"):
        for n in range(3, 9):  # what a program adds here
            assert _graph(n) == pytest.approx(_want(n))
        before = code_budget.maps()
        for n in range(9, 15):
            assert _graph(n) == pytest.approx(_want(n))
        per_program = max((code_budget.maps() - before) / 6, 1)
        # a limit whose high-water mark is four programs away: counted after every program from here
        now = code_budget.maps()
        monkeypatch.setitem(code_budget._state, "limit", int((now + 4 * per_program) / code_budget.HIGH))
        monkeypatch.setitem(code_budget._state, "maps", now)
        monkeypatch.setitem(code_budget._state, "made", 0)
        monkeypatch.setitem(code_budget._state, "per", 1)
        monkeypatch.setitem(code_budget._state, "warned", False)
        monkeypatch.setattr(code_budget, "MAPS_PER_PROGRAM", 1)
        monkeypatch.setattr(code_budget, "LOW", 10.0)  # the first stage alone (the second drops every program)
        seen = []
        evict = code_budget._evict

        def watched(now: int, cap: int) -> None:
            graphs = len(fused.GRAPHS)
            evict(now, cap)
            seen.append((now, code_budget._state["maps"], graphs, len(fused.GRAPHS)))

        monkeypatch.setattr(code_budget, "_evict", watched)
        evictions = telemetry.counters["code_evictions"]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for n in range(15, 30):
                assert _graph(n) == pytest.approx(_want(n)), n
        assert seen, "no eviction at the high-water mark"
        assert telemetry.counters["code_evictions"] > evictions
        for maps_before, maps_after, graphs_before, graphs_after in seen:
            assert graphs_after == graphs_before // 2  # the least recently used half went
        assert any(after < before for before, after, _, _ in seen)  # and their code with them
        told = [w for w in caught if "vm.max_map_count" in str(w.message)]
        assert len(told) == 1 and told[0].category is RuntimeWarning  # once
        for n in range(3, 30):  # whether dropped or not (the test's first ones may be, earlier tests' are first)
            assert _graph(n) == pytest.approx(_want(n)), n


@pytest.mark.parametrize("per_program", [10, 400, 1300, 3000])
def test_maps_are_counted_before_programs_of_any_size_pass_the_mark(monkeypatch, per_program):
    """Whatever a program adds (a decode step ~280 maps, a small model's training step ~600–1,300), the maps are
    counted and evicted before they pass the high-water mark by more than one program: a fixed guess from a count
    of zero let thirty small models trained in one process reach the limit and abort uncounted."""
    cap = 65530
    process = {"maps": 5000, "counts": 0}

    def counted() -> int:
        process["counts"] += 1
        return process["maps"]

    def evict(now: int, _cap: int) -> None:
        process["maps"] = int(0.3 * cap)  # the older half's code unmapped
        code_budget._state["maps"] = process["maps"]

    monkeypatch.setattr(code_budget, "maps", counted)
    monkeypatch.setattr(code_budget, "_evict", evict)
    for key, value in {"limit": cap, "maps": None, "made": 0, "per": code_budget.MAPS_PER_PROGRAM}.items():
        monkeypatch.setitem(code_budget._state, key, value)
    highest = 0
    for _ in range(400):
        process["maps"] += per_program
        code_budget.note_new_program()
        highest = max(highest, process["maps"])
    assert highest < code_budget.HIGH * cap + per_program, highest
    assert process["counts"] <= 400 // 2 or per_program > 1000  # small programs are not counted one by one


def test_when_half_is_not_enough_every_program_goes(monkeypatch):
    if code_budget.limit() is None:
        pytest.skip("the limit on memory maps cannot be read here")
    with torchtpu_lab.eager_mode("fused"):
        for n in range(40, 44):
            assert _graph(n) == pytest.approx(_want(n))
    assert len(fused.GRAPHS) > 0
    monkeypatch.setattr(code_budget, "LOW", 0.0)  # never below it: the second stage runs
    monkeypatch.setitem(code_budget._state, "warned", True)
    evictions = telemetry.counters["code_evictions"]
    code_budget._evict(code_budget.maps(), code_budget.limit())
    assert telemetry.counters["code_evictions"] == evictions + 1
    assert all(len(c) == 0 for c in caches.code_caches())
    assert len(caches.registry()["op_schemas"]) > 0  # caches without programs are kept
    compiles = telemetry.counters["compiles"] + telemetry.counters["disk_loads"]
    with torchtpu_lab.eager_mode("fused"):
        assert _graph(40) == pytest.approx(_want(40))  # dropped: it compiles again (or loads from disk)
    assert telemetry.counters["compiles"] + telemetry.counters["disk_loads"] > compiles


def test_without_a_readable_limit_nothing_is_counted(monkeypatch):
    monkeypatch.setitem(code_budget._state, "limit", None)
    monkeypatch.setitem(code_budget._state, "made", 0)
    monkeypatch.setattr(code_budget, "maps", lambda: pytest.fail("counted the maps without a limit"))
    code_budget.note_new_program()
    assert code_budget._state["made"] == 0
