"""Typed records between the layers: compile causes, the profile report, the session status, counter names and
event kinds. The profile groups and suggests by reading a cause's fields; the sentence is only for people."""

from __future__ import annotations

import dataclasses
import inspect
import json
import pathlib
import re

import pytest
import torch

import torchtpu_lab
from torchtpu_lab import causes, records, telemetry
from torchtpu_lab.causes import Cause, CauseKind
from torchtpu_lab.profiling import Profile, processors
from torchtpu_lab.telemetry import Counter, Event, EventKind, Source

ROOT = pathlib.Path(__file__).resolve().parent.parent
SITE = Source("/work/train.py", 7, "step")


# ---- the cause record ----------------------------------------------------------------------------------------

def test_a_cause_renders_the_sentence_from_its_fields():
    shape = Cause(CauseKind.SHAPE, "aten.mm", "input 0", (8, 128), (7, 128))
    assert str(shape) == "input 0 of aten.mm changed shape [8, 128] -> [7, 128]"
    in_graph = shape.at(3, SITE)
    assert str(in_graph) == "op 3: input 0 of aten.mm changed shape [8, 128] -> [7, 128] (recorded at train.py:7)"
    assert (in_graph.index, in_graph.site, in_graph.old) == (3, SITE, (8, 128)) and shape.index is None
    assert str(Cause(CauseKind.SEQUENCE, "aten.add", old="aten.mul", new="aten.add", index=57)) == \
        "op sequence differs at op 57: aten.mul vs aten.add"
    assert str(Cause(CauseKind.SCALAR, "aten.leaky_relu", "input 1", 0.1, 0.2)) == (
        "a Python scalar that changes every step was baked in as a constant (aten.leaky_relu input 1: 0.1 -> 0.2)")
    assert str(Cause(CauseKind.GROW, old=12, new=24, index=12)) == (
        "graph has 24 ops where the nearest cached graph has 12 (identical for the first 12)")
    assert str(Cause(CauseKind.PRECISION, old="highest", new="medium", detail="forward of f")) == (
        "float32 matmul precision changed 'highest' -> 'medium' (torch.set_float32_matmul_precision; forward of f)")


def test_a_dimension_that_grew_by_one_adds_the_preallocation_hint():
    grew = Cause(CauseKind.SHAPE, "aten.cat", "input 0", (1, 9), (1, 10))
    jumped = Cause(CauseKind.SHAPE, "aten.cat", "input 0", (1, 9), (1, 12))
    assert str(grew).endswith(causes.GROWTH_HINT) and causes.GROWTH_HINT not in str(jumped)
    size = Cause(CauseKind.STATIC_SIZE, "aten::arange", "input 0", 7, 8)  # arange(n) of a decode loop's length
    assert str(size) == "static size/dim argument input 0 of aten::arange changed 7 -> 8" + causes.GROWTH_HINT
    assert causes.GROWTH_HINT not in str(Cause(CauseKind.STATIC_SIZE, "aten::arange", "input 0", 7, 9))


def test_every_cause_kind_renders_and_only_first_sightings_are_first():
    for kind in CauseKind:
        text = str(Cause(kind, "aten.x", "input 0", (1,), (2,), 1, SITE, "why"))
        assert text and "None" not in text, kind
    assert {k for k in CauseKind if k.first} == {CauseKind.FIRST_OP, CauseKind.FIRST_GRAPH, CauseKind.FIRST_FUNCTION,
                                                  CauseKind.FIRST_COMPILED, CauseKind.FIRST_EAGER}


def test_a_cause_is_frozen_and_serialises_as_fields_plus_text():
    cause = Cause(CauseKind.SHAPE, "aten.mm", "input 1", (4, 3), (5, 3), 2, SITE)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cause.op = "aten.add"
    data = json.loads(json.dumps(cause.to_dict()))
    assert data["kind"] == "shape" and data["old"] == [4, 3] and data["new"] == [5, 3] and data["index"] == 2
    assert data["site"]["line"] == 7 and data["site"]["where"] == "train.py:7"
    assert data["text"] == str(cause) and data["first"] is False


# ---- causes from the runtime ---------------------------------------------------------------------------------

def _graph_compiles(prof):
    return [c for c in prof.compiles if c.detail["kind"] == "graph"]


def test_a_fused_recompile_carries_a_shape_cause_with_the_op_input_and_line():
    w = torch.ones(13, 4, device="tpu")
    torchtpu_lab.session.clear()  # a cause names the nearest graph compiled before: only this test's count
    with torchtpu_lab.eager_mode("fused"), torchtpu_lab.profile() as prof:
        for n in (29, 31):
            (torch.ones(n, 13, device="tpu") @ w).sum().item()  # RECORD_LINE
    causes_ = [c.detail["cause"] for c in _graph_compiles(prof)]
    recompile = next(c for c in causes_ if c.kind is CauseKind.SHAPE)
    assert recompile.op == "aten::mm" and recompile.input == "input 0"
    assert recompile.old == (29, 13) and recompile.new == (31, 13) and recompile.index is not None
    line = next(i for i, text in enumerate(inspect.getsource(inspect.getmodule(_graph_compiles)).splitlines(), 1)
                if text.endswith("# RECORD_LINE"))
    assert recompile.site.lineno == line
    event = next(c for c in _graph_compiles(prof) if c.detail["cause"] is recompile)
    assert event.detail["site"] == recompile.site and event.detail["recompile"] is True


def test_graph_cause_returns_the_site_instead_of_leaving_it_in_a_global():
    from torchtpu_lab.runtime import compile_events

    assert not hasattr(compile_events, "_site")
    assert "tuple[Cause, Source | None]" in str(inspect.signature(compile_events.graph_cause).return_annotation)


def test_the_json_export_carries_the_cause_as_a_dict_with_its_text():
    x = torch.ones(19, 2, device="tpu")
    with torchtpu_lab.eager_mode("fused"), torchtpu_lab.profile() as prof:
        (x * 3).sum().item()
    data = json.loads(prof.to_json())
    exported = [c["detail"]["cause"] for c in data["compiles"]]
    assert exported and all(c["text"] and c["kind"] for c in exported), exported
    assert {c["text"] for c in exported} == {str(c.detail["cause"]) for c in prof.compiles}


# ---- grouping and findings read fields -----------------------------------------------------------------------

def _profile(compile_causes, wall_s=10.0, seconds=0.5) -> Profile:
    prof = Profile(wall_s=wall_s, modes=("fused",), platform="test")
    prof.events = [Event(EventKind.COMPILE, "graph[3 ops]", float(i), seconds, 0, SITE,
                         {"kind": "graph", "cause": c, "n_ops": 3, "recompile": not c.first, "disk": False})
                   for i, c in enumerate(compile_causes)]
    return prof


def test_grouping_reads_the_cause_fields_not_its_sentence(monkeypatch):
    first = Cause(CauseKind.FIRST_GRAPH)
    shapes = [Cause(CauseKind.SHAPE, "aten::mm", "input 0", (8, n), (8, n + 5)).at(2, SITE) for n in (16, 21, 26)]
    # a sentence nothing could parse: the groups must come out the same
    monkeypatch.setitem(causes._TEXT, CauseKind.SHAPE, lambda c: "something changed")
    groups = processors.compile_groups(_profile([first] + shapes))
    shape = next(g for g in groups if g.kind == "shape")
    assert shape.count == 3 and shape.is_recompile
    assert shape.pattern == "dim 1 of aten::mm input 0 took 4 values 16, 21, 26, 31 in this cell"
    assert shape.hint.startswith("pad or bucket dim 1") and shape.line == "train.py:7"
    first_group = next(g for g in groups if g.kind == "first")
    assert first_group.count == 1 and not first_group.is_recompile


def test_numbers_a_group_spans_are_ordered_as_numbers():
    scalars = [Cause(CauseKind.STATIC_SIZE, "aten::full", "input 0[0]", 9, n) for n in (10, 100, 11)]
    (group,) = [g for g in processors.compile_groups(_profile(scalars)) if g.kind == "static"]
    assert group.pattern == "size argument input 0[0] of aten::full took 4 values 9, 10, 11, 100"


def test_a_cheap_recompile_is_still_a_finding_and_a_cheap_first_compile_is_not():
    shapes = [Cause(CauseKind.SHAPE, "aten::mm", "input 0", (n,), (n + 1,)) for n in (1, 2)]
    prof = _profile([Cause(CauseKind.FIRST_GRAPH)] + shapes, wall_s=1000.0, seconds=0.001)
    found = processors.findings(prof, processors.compile_groups(prof), [], [])
    assert len(found) == 1 and found[0].title == "2 recompilations" and found[0].share < 0.02


# ---- the report, the summary and the status ------------------------------------------------------------------

def test_profile_summary_is_the_summary_record_as_a_dict_with_the_public_keys():
    with torchtpu_lab.profile() as prof:
        torch.ones(3, device="tpu").add(1).sum().item()
    record = processors.summarize(prof)
    summary = prof.summary()
    assert summary == record.as_dict()
    for key in ("ops", "graphs_executed", "compiles", "cache_hits", "cache_misses", "syncs", "cpu_fallbacks",
                "peak_bytes", "wall_s", "memory_hits", "disk_loads", "recompiles", "cache_hit_rate"):
        assert key in summary, key
    assert summary["memory_hits"] == summary["cache_hits"] == record.cache_hits
    report = prof.report()
    assert isinstance(report, records.Report) and report.summary == record
    assert all(isinstance(g, records.CompileGroup) for g in report.compile_groups)
    assert isinstance(report.ops, records.OpTable) and all(isinstance(o, records.OpRow) for o in report.ops.by_time)
    (sync,) = report.syncs
    assert isinstance(sync, records.SyncGroup) and sync.kind is telemetry.SyncReason.ITEM and sync.count == 1
    assert isinstance(report.memory, records.MemoryReport) and report.memory.peak == summary["peak_bytes"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        report.summary = None


def test_count_fields_are_named_after_the_counters_they_count():
    summary_fields = {f.name for f in dataclasses.fields(records.Summary)}
    status_fields = {f.name for f in dataclasses.fields(records.Status)}
    for counter in records.COUNTED:
        assert counter in summary_fields and counter in status_fields, counter
    from torchtpu_lab.jupyter.status import status

    before = status()
    telemetry.count(Counter.CPU_FALLBACKS)
    telemetry.count("syncs")  # a counter's name as a plain string reaches the same entry
    after = status()
    assert (after.cpu_fallbacks, after.syncs) == (before.cpu_fallbacks + 1, before.syncs + 1)
    from torchtpu_lab import metrics

    collected = metrics.collect()
    assert isinstance(collected, records.Metrics) and collected.cache_hits == after.cache_hits
    assert (collected.compiles, collected.disk_loads) == (after.compiles, after.disk_loads)
    assert metrics.summary() == collected.as_dict() and collected.counters[Counter.SYNCS] == after.syncs
    assert metrics.summary()["executables"] == {"compiles": after.compiles, "disk_loads": after.disk_loads,
                                                "cache_hits": after.cache_hits}


def test_the_status_is_a_frozen_record_and_the_comm_payload_has_every_key_the_extension_reads():
    from torchtpu_lab.jupyter import comm
    from torchtpu_lab.jupyter.status import status

    s = status()
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.syncs = 0
    payload = comm.snapshot()
    model = (ROOT / "extension" / "src" / "model.ts").read_text()
    body = model[model.index("export function parseStatus"):]
    body = body[:body.index("\n}\n")]
    read = set(re.findall(r"\bx\.(\w+)", body)) - {"compilations", "memory_history", "profile"}
    assert read and read <= set(payload), sorted(read - set(payload))
    assert set(re.findall(r"\bmem\.(\w+)", body)) <= set(payload["memory"])
    assert payload["cache_hits"] == s.cache_hits and payload["mode"] == s.eager_mode
    json.dumps(payload)


# ---- event kinds ---------------------------------------------------------------------------------------------

def test_every_emitted_event_kind_is_an_event_kind_and_documented():
    pkg = ROOT / "torchtpu_lab"
    emitted = set()
    for path in pkg.rglob("*.py"):
        text = path.read_text()
        emitted |= set(re.findall(r"\bemit\(\s*\"(\w+)\"", text))
        emitted |= {EventKind[m].value for m in re.findall(r"Event\(EventKind\.(\w+)", text)}
    assert emitted, "the scan found the emitters"
    assert emitted <= {k.value for k in EventKind}, emitted - {k.value for k in EventKind}
    doc = inspect.getsource(EventKind)
    for kind in EventKind:
        assert re.search(rf'{kind.name} = "{kind.value}"\s+#: \S', doc), f"{kind} has no description"
    assert emitted == {k.value for k in EventKind}, "an event kind nobody emits"
    assert not re.search(r"\b(transfer|alloc|free)\b", telemetry.Event.__doc__ or "")


def test_an_unknown_event_kind_is_refused_while_recording():
    with telemetry.Recorder():
        with pytest.raises(ValueError):
            telemetry.emit("transfer", "x")


def test_no_sentence_of_ours_is_read_back():
    for path in [ROOT / "torchtpu_lab" / "profiling" / "processors.py", ROOT / "torchtpu_lab" / "telemetry.py"]:
        text = path.read_text()
        assert "import re\n" not in text and 'startswith("first' not in text, path


def test_the_time_labels_read_the_modes_a_block_ran_in_not_their_text():
    assert "recording ops into fused" in processors.time_labels(("fused",))["tracing"]
    assert "one at a time" in processors.time_labels(("strict",))["tracing"]
    assert processors.time_labels(("strict", "fused"))["tracing"] == "recording / dispatching ops"
    with torchtpu_lab.eager_mode("strict"), torchtpu_lab.profile() as prof:
        torchtpu_lab.set_eager_mode("fused")
    assert prof.modes == ("strict", "fused") and prof.summary()["mode"] == "strict->fused"
