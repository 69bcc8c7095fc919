"""One session object: configuration states with overrides (torchtpu_lab/config.py) and the Session that saves,
restores and clears all mutable state (torchtpu_lab/runtime/state.py)."""

import os
import subprocess
import sys

import pytest
import torch

import torchtpu_lab
from torchtpu_lab import config, telemetry
from torchtpu_lab.device import memory
from torchtpu_lab.runtime import cpu_fallback, fused, modes


def test_a_state_override_restores_on_exit_even_on_error():
    assert config.max_graph_ops.value == 2000
    with pytest.raises(KeyError):
        with config.max_graph_ops(7):
            assert config.max_graph_ops.value == 7
            raise KeyError("boom")
    assert config.max_graph_ops.value == 2000


def test_a_state_validates_and_cannot_be_assigned_around_its_validator():
    with pytest.raises(ValueError, match="positive integer"):
        config.max_graph_ops.set(0)
    with pytest.raises(ValueError, match="unknown eager mode"):
        config.eager_mode.set("fast")
    with pytest.raises(AttributeError, match="set"):
        config.max_graph_ops.value = 5
    assert config.max_graph_ops.value == 2000 and config.eager_mode.value == "fused"


def test_patch_sets_several_states_and_the_public_api_reads_them():
    with torchtpu_lab.session.patch(eager_mode="strict", cpu_fallback=False, check_finite=True,
                                    matmul_precision="high"):
        assert torchtpu_lab.eager_mode_name() == "strict" and modes.current() == "strict"
        assert not cpu_fallback.enabled() and modes.checking_finite()
        assert torch.get_float32_matmul_precision() == "high"
    assert torchtpu_lab.eager_mode_name() == "fused" and cpu_fallback.enabled() and not modes.checking_finite()
    assert torch.get_float32_matmul_precision() == "highest"


def test_patch_rejects_unknown_names_before_changing_anything():
    with pytest.raises(TypeError, match="no such setting: eager"):
        with config.patch(cpu_fallback=False, eager="strict"):
            pass
    assert config.cpu_fallback.value is True


def test_the_public_setters_and_the_states_are_one_value():
    torchtpu_lab.set_cpu_fallback(False)
    assert config.cpu_fallback.value is False
    torchtpu_lab.debug.check_finite(True)
    assert config.check_finite.value is True
    torch.set_float32_matmul_precision("medium")  # PyTorch owns it; the state reads it there
    assert config.matmul_precision.value == "medium"


def test_leaving_fused_mode_through_patch_flushes_pending_work():
    x = torch.ones(3, device="tpu") * 2
    assert fused.has_pending()
    with config.patch(eager_mode="strict"):
        assert not fused.has_pending()
        assert x.cpu().tolist() == [2.0, 2.0, 2.0]


def test_the_graph_limit_state_cuts_the_fused_graph():
    fused.CUTS.clear()
    try:
        with config.patch(max_graph_ops=3):
            x = torch.ones(4, device="tpu")
            counts = []
            for _ in range(6):
                x = x + 1
                counts.append(fused.pending_ops())
            assert max(counts) < 3 and 0 in counts  # flushed on reaching 3 recorded ops
        assert x.cpu().tolist() == [7.0] * 4
    finally:
        torchtpu_lab.sync()
        fused.CUTS.clear()  # cut points remembered at this limit must not cut later tests' graphs


def test_allocation_source_tracking_is_read_by_the_device_layer():
    with config.patch(track_allocation_sources=True):
        t = torch.ones(5, device="tpu") + 1
        t.cpu()
        assert t.tpu_storage.source is not None
    u = torch.ones(5, device="tpu") + 1
    u.cpu()
    assert u.tpu_storage.source is None


def test_snapshot_and_restore_put_back_config_recorders_listeners_and_the_disk_cache(tmp_path):
    session = torchtpu_lab.session
    saved = session.snapshot()
    from torchtpu_lab.runtime import compile_cache

    config.eager_mode.set("debug")
    config.track_sources.set(False)
    telemetry.recorders.append([])
    memory.listeners.append(lambda *a: None)
    memory.sample_logs.append(memory.SampleLog(0, 0, lambda *a: None))
    compile_cache.enable(str(tmp_path / "cache"))
    session.restore(saved)
    assert session.snapshot() == saved
    assert config.eager_mode.value == "fused" and config.track_sources.value is True


def test_restore_puts_everything_back_even_when_the_flush_fails():
    saved = torchtpu_lab.session.snapshot()
    config.cpu_fallback.set(False)
    config.eager_mode.set("strict")

    def failing(old, new):
        raise RuntimeError("flush failed")

    remove = config.eager_mode.before_change(failing)
    try:
        with pytest.raises(RuntimeError, match="flush failed"):
            torchtpu_lab.session.restore(saved)
    finally:
        remove()
    assert config.eager_mode.value == "fused" and config.cpu_fallback.value is True


def test_the_session_reaches_the_runtime_state_and_clears_it():
    session = torchtpu_lab.session
    assert session.pending is fused.PENDING and session.lock is fused.LOCK
    with config.patch(eager_mode="strict"):
        (torch.ones(3, device="tpu") * 3).cpu()
    assert len(session.op_executables) > 0
    x = torch.ones(2, device="tpu") + 1  # pending: clear runs it first, so nothing is lost
    dropped = session.clear()
    assert dropped > 0 and len(session.op_executables) == 0 and len(session.graph_executables) == 0
    assert x.cpu().tolist() == [2.0, 2.0]


def _python(code: str, env: dict) -> subprocess.CompletedProcess:
    child_env = {**os.environ, **env, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=child_env, timeout=600)


def test_environment_variables_set_the_defaults():
    out = _python("from torchtpu_lab import config; print(config.eager_mode.default, config.data_checks.value)",
                  {"TORCHTPU_LAB_EAGER_MODE": "debug", "TORCHTPU_LAB_CHECKS": "0"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["debug", "False"]
