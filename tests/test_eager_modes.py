"""Eager modes, the fused graph's compile cache, compile causes, sync events and the persistent cache."""

import pytest
import torch
import torch.nn.functional as F

import torchtpu_lab
from fresh_process import run_with_cache
from torchtpu_lab import telemetry


def _mlp_step(model, opt, batch):
    x, y = batch
    opt.zero_grad()
    loss = F.mse_loss(model(x), y)  # MODEL_LINE
    loss.backward()
    opt.step()
    return loss


def _setup(batch_size=16):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)).to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    return model, opt


def _batch(n):
    return torch.randn(n, 32).to("tpu"), torch.randn(n, 1).to("tpu")


def _line_of(marker: str) -> int:
    with open(__file__) as f:
        for i, line in enumerate(f, 1):
            if marker in line and "_line_of" not in line:
                return i
    raise AssertionError(marker)


def test_default_mode_is_fused_and_switching_flushes():
    assert torchtpu_lab.eager_mode_name() == "fused"
    x = torch.ones(3, device="tpu") * 2
    assert x.tpu_storage.held.__class__.__name__ == "LazyValue"
    with torchtpu_lab.eager_mode("strict"):
        assert x.tpu_storage.held.__class__.__name__ != "LazyValue"  # flushed on the switch
        y = x + 1
        assert y.tpu_storage.held.__class__.__name__ != "LazyValue"
    assert torchtpu_lab.eager_mode_name() == "fused"
    with pytest.raises(ValueError, match="debug, strict, fused"):
        torchtpu_lab.set_eager_mode("turbo")


def test_unchanged_step_compiles_once_then_hits_the_cache():
    model, opt = _setup()
    batches = [_batch(16) for _ in range(6)]
    for b in batches[:3]:  # step 1 creates momentum buffers, step 2 is the steady state
        _mlp_step(model, opt, b).item()
    hits = telemetry.counters["graph_cache_hits"]
    with telemetry.Recorder() as events:
        for b in batches[3:]:
            _mlp_step(model, opt, b).item()
    assert [e for e in events if e.kind == "compile"] == []
    assert telemetry.counters["graph_cache_hits"] == hits + 3


def test_new_batch_size_recompiles_naming_the_dimension_and_line():
    model, opt = _setup()
    for _ in range(3):
        _mlp_step(model, opt, _batch(16)).item()
    with telemetry.Recorder() as events:
        _mlp_step(model, opt, _batch(7)).item()
    new = [e for e in events if e.kind == "compile"]
    assert len(new) == 1
    cause = str(new[0].detail["cause"])
    assert "[16, 32] -> [7, 32]" in cause, cause
    assert f"test_eager_modes.py:{_line_of('MODEL_LINE')}" in cause, cause


def test_item_in_a_loop_is_one_sync_per_iteration_naming_the_line():
    x = torch.randn(8, device="tpu")
    total = 0.0
    with telemetry.Recorder() as events:
        for _ in range(5):
            x = x * 0.5
            total += x.sum().item()  # ITEM_LINE
    syncs = [e for e in events if e.kind == "sync"]
    assert len(syncs) == 5
    line = _line_of("ITEM_LINE")
    assert all(e.source is not None and e.source.lineno == line for e in syncs), [str(e.source) for e in syncs]
    assert all("item()" in e.name for e in syncs)


def test_print_and_explicit_sync_are_sync_points():
    with telemetry.Recorder() as events:
        x = torch.ones(2, device="tpu") + 1
        repr(x)
        y = x * 3
        torchtpu_lab.sync()
    assert y.tpu_storage.held.__class__.__name__ != "LazyValue"
    reasons = [e.name for e in events if e.kind == "sync"]
    assert any("print" in r for r in reasons) and "torchtpu_lab.sync()" in reasons


def test_fused_matches_strict_on_a_training_run():
    def run(mode):
        with torchtpu_lab.eager_mode(mode):
            model, opt = _setup()
            torch.manual_seed(1)
            data = [(torch.randn(16, 32), torch.randn(16, 1)) for _ in range(8)]
            return [_mlp_step(model, opt, (x.to("tpu"), y.to("tpu"))).item() for x, y in data]

    strict, fused, debug = run("strict"), run("fused"), run("debug")
    assert fused == pytest.approx(strict, rel=1e-5)
    assert debug == pytest.approx(strict, rel=1e-6)


def test_error_in_fused_graph_names_op_and_keeps_earlier_tensors():
    a = torch.arange(6.0, device="tpu")
    torchtpu_lab.sync()
    with pytest.raises(RuntimeError):
        bad = a.view(4, 4)  # shape errors are raised when the op is recorded, like on CPU
    b = a * 2
    assert b.sum().item() == 30.0
    assert a.cpu().tolist() == [0, 1, 2, 3, 4, 5]


def test_debug_mode_check_finite_stops_at_the_op():
    x = torch.tensor([1.0, 0.0], device="tpu")
    with torchtpu_lab.eager_mode("debug"):
        torchtpu_lab.debug.check_finite(True)
        try:
            with pytest.raises(FloatingPointError, match="aten::div"):
                torch.div(x, torch.zeros(2, device="tpu"))
        finally:
            torchtpu_lab.debug.check_finite(False)
        assert (x + 1).cpu().tolist() == [2.0, 1.0]


def test_metrics_report_summarises_the_session():
    model, opt = _setup()
    _mlp_step(model, opt, _batch(4)).item()
    report = torchtpu_lab.metrics_report()
    assert "CompileTime" in report and "ExecuteTime" in report
    assert "compiles:" in report and "syncs:" in report
    assert "Recent compiles:" in report
    assert any(word in report for word in ("first time", "differs", "changed"))


def test_warm_start_fresh_process_compiles_nothing_seen_before(tmp_path):
    script = """
        import torch, torchtpu_lab
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)).to("tpu")
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        for _ in range(3):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(torch.ones(4, 8, device="tpu")), torch.zeros(4, 1, device="tpu"))
            loss.backward()
            opt.step()
            loss.item()
    """
    import shutil

    cold = run_with_cache(script, tmp_path / "cache")
    # the warm process reads a *copy* at another path: keys never depend on where the cache lives
    shutil.copytree(tmp_path / "cache", tmp_path / "elsewhere" / "copied")
    warm = run_with_cache(script, tmp_path / "elsewhere" / "copied")
    assert cold["persistent_cache_misses"] > 0
    assert cold["jax_traces"] > 0 and cold["xla_compiles"] > 0
    # every executable the warm process needed came from disk: XLA compiled nothing
    assert warm["persistent_cache_misses"] == 0, warm
    assert warm["persistent_cache_hits"] == warm["xla_compile_requests"] > 0, warm
    # ... and nothing was even traced or lowered: the executables are keyed by our own signatures
    assert warm["jax_traces"] == warm["jax_lowerings"] == warm["xla_compiles"] == 0, warm


def test_unwritable_cache_dir_warns_and_carries_on(tmp_path):
    from torchtpu_lab.runtime import compile_cache

    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.warns(RuntimeWarning, match="not writable"):
        assert compile_cache.enable(str(blocker / "cache")) is None
    assert compile_cache.directory() is None or compile_cache.directory() != str(blocker / "cache")
    assert (torch.ones(2, device="tpu") + 1).cpu().tolist() == [2.0, 2.0]


def test_fused_step_donates_the_old_parameter_buffers():
    model, opt = _setup()
    for _ in range(3):
        _mlp_step(model, opt, _batch(16)).item()
    weight = model[0].weight
    old = weight.tpu_storage.array  # the buffer holding the weight before this step
    _mlp_step(model, opt, _batch(16)).item()
    assert weight.tpu_storage.array is not old
    assert old.is_deleted()  # donated to the step's graph: the model is not held twice
    assert torch.isfinite(weight).all().item()
