"""What libraries (transformers, timm, accelerate, Lightning) probe on a device: ``torch.accelerator``, the
``torch.backends`` autoload entry point, ``torch.tpu`` parity with ``torch.cuda``, the eager-mode environment
switch."""

import gc
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import torchtpu_lab
from torchtpu_lab.runtime import fused

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _python(code: str, env_extra: dict, extra_path: str = "") -> subprocess.CompletedProcess:
    env = dict(os.environ, TORCHTPU_LAB_PLATFORM="cpu", **env_extra)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, extra_path, env.get("PYTHONPATH", "")) if p)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                          timeout=240)


def test_torch_accelerator_is_tpu_and_synchronize_runs_pending_work():
    assert torch.accelerator.current_accelerator() == torch.device("tpu")
    assert torch.accelerator.is_available() and torch.accelerator.device_count() == torch.tpu.device_count()
    with torchtpu_lab.eager_mode("fused"):  # so there is pending work for synchronize to run
        x = torch.ones(256, device="tpu") * 2
        assert fused.pending_ops() > 0
        torch.accelerator.synchronize()
        assert fused.pending_ops() == 0 and not fused.has_pending()
    assert torch.accelerator.memory_allocated() >= x.numel() * 4
    assert torch.accelerator.max_memory_allocated() >= torch.accelerator.memory_allocated()
    torch.accelerator.empty_cache()
    assert x.sum().item() == 512


def test_rng_state_all_round_trips_and_fork_rng_restores():
    states = torch.tpu.get_rng_state_all()
    assert len(states) == torch.tpu.device_count() and all(s.dtype == torch.uint8 for s in states)
    a = torch.randn(8, device="tpu").cpu()
    torch.tpu.set_rng_state_all(states)
    assert torch.equal(torch.randn(8, device="tpu").cpu(), a)
    with torch.random.fork_rng(device_type="tpu"):
        torch.randn(8, device="tpu")
    after_fork = torch.randn(8, device="tpu").cpu()
    torch.tpu.set_rng_state_all(states)
    torch.randn(8, device="tpu")
    assert torch.equal(torch.randn(8, device="tpu").cpu(), after_fork)
    with pytest.raises(RuntimeError, match="states for"):
        torch.tpu.set_rng_state_all(states + states)


def test_device_properties_memory_and_capabilities():
    props = torch.tpu.get_device_properties()
    assert props.name == torch.tpu.get_device_name() and props["name"] == props.name
    # The tests run on XLA:CPU, which reports no memory limit (jax.Device.memory_stats() is None): no total, no
    # (free, total), and memory numbers from our own accounting of live device buffers, exact to the byte.
    assert torch.tpu.platform_name().startswith("XLA:CPU")
    assert props.total_memory is None and props.platform == "cpu"
    assert torch.tpu.mem_get_info() is None
    assert "device limit  : n/a" in torch.tpu.memory_summary()
    stats = torch.tpu.memory_stats()
    assert stats["source"] == "torchtpu_lab accounting" and "bytes_limit" not in stats
    gc.collect()  # buffers of earlier tests' garbage go now, not between the two readings
    torch.tpu.synchronize()
    before = torch.tpu.memory_allocated()
    x = torch.ones(1000, device="tpu", dtype=torch.float32)
    x.cpu()  # computed, so its buffer is live
    assert torch.tpu.memory_allocated() == before + 4000
    del x
    assert torch.tpu.is_bf16_supported()
    assert torch.tpu.get_device_capability() == (0, 0)
    torch.tpu.empty_cache()


def test_streams_and_events_are_ordering_no_ops_that_still_wait():
    s = torch.tpu.Stream()
    assert s == torch.tpu.current_stream() == torch.tpu.default_stream()
    start, end = torch.tpu.Event(enable_timing=True), torch.tpu.Event(enable_timing=True)
    start.record()
    with torch.tpu.stream(s):
        y = torch.ones(64, device="tpu").cumsum(0)
    end.record(s)  # recording runs the pending work, so the mark is real
    assert not fused.has_pending()
    assert end.query() and start.elapsed_time(end) >= 0
    s.wait_event(end)
    s.synchronize()
    assert y[-1].item() == 64
    with pytest.raises(RuntimeError, match="enable_timing"):
        torch.tpu.Event().elapsed_time(end)


def test_amp_helpers():
    a = torch.randn(4, 4, device="tpu")
    with torch.tpu.amp.autocast():
        assert (a @ a).dtype == torch.bfloat16
    assert torch.tpu.amp.is_autocast_available()
    scaler = torch.tpu.amp.GradScaler(init_scale=4.0)
    assert scaler.get_scale() == 4.0


def test_generator_on_tpu_is_made_by_the_native_core_and_refused_without_it():
    """``torch.Generator(device="tpu")`` asks PrivateUse1HooksInterface::getNewGenerator, a C++ hook: the native
    core provides it (tests/test_native_core.py covers the streams); PyTorch's Python backend hooks cannot, so in
    pure-Python mode PyTorch's own error stands."""
    from torchtpu_lab import native

    if native.module() is None:
        with pytest.raises(NotImplementedError, match="getNewGenerator"):
            torch.Generator(device="tpu")
    else:
        g = torch.Generator(device="tpu")
        assert g.device == torch.device("tpu", torch.tpu.current_device())
        assert torch.Generator(device="tpu:0").manual_seed(5).initial_seed() == 5


def test_import_torch_alone_makes_the_tpu_device_usable(tmp_path):
    """The ``torch.backends`` entry point of pyproject.toml, installed as pip would install it."""
    import tomllib

    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        eps = tomllib.load(f)["project"]["entry-points"]["torch.backends"]
    dist = tmp_path / "torchtpu_lab_probe-0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: torchtpu-lab-probe\nVersion: 0\n")
    (dist / "entry_points.txt").write_text(
        "[torch.backends]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()))
    code = """
        import sys, torch
        assert "torchtpu_lab" in sys.modules
        assert torch.ones(3, device="tpu").sum().item() == 3
        assert torch.accelerator.current_accelerator().type == "tpu"
        import torchtpu_lab  # still works, and registers nothing twice
        assert torch.tpu is torchtpu_lab.tpu
        print("ok")
    """
    out = _python(code, {}, str(tmp_path))
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr[-2000:]
    off = _python("import sys, torch; print('torchtpu_lab' in sys.modules)",
                  {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}, str(tmp_path))
    assert off.stdout.strip() == "False", off.stderr[-2000:]


def test_eager_mode_environment_switch_is_read_at_start_up():
    out = _python("import torchtpu_lab; print(torchtpu_lab.eager_mode_name())", {"TORCHTPU_LAB_EAGER_MODE": "strict"})
    assert out.stdout.strip() == "strict", out.stderr[-2000:]
    bad = _python("import torchtpu_lab", {"TORCHTPU_LAB_EAGER_MODE": "fast"})
    assert bad.returncode != 0 and "TORCHTPU_LAB_EAGER_MODE='fast'" in bad.stderr and "fused" in bad.stderr
