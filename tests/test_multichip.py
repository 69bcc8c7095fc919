"""Several chips in one process (4 XLA:CPU devices, in a child process): training on ``tpu:k``, a model split
over chips, copies between chips, ``torch.tpu.device``, cross-device errors, memory per chip."""

import os
import subprocess
import sys
import textwrap

import pytest

from torchtpu_lab import native

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
needs_core = pytest.mark.skipif(native.module() is None,
                                reason=f"training on tpu:k needs the native core: {native.status().describe()}")

_PRELUDE = """
import torch, torch.nn as nn, torchtpu_lab

def train(model, devices, steps=3):
    '''Losses of ``steps`` SGD steps; ``devices``: where each layer of the 2-layer model and the data live.'''
    torch.manual_seed(0)
    x, y = torch.randn(8, 6), torch.randn(8, 4)
    layers = [m.to(d) for m, d in zip(model, devices)]
    opt = torch.optim.SGD([p for m in layers for p in m.parameters()], lr=0.1)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        h = torch.relu(layers[0](x.to(devices[0])))
        out = layers[1](h.to(devices[1]))
        loss = ((out - y.to(devices[1])) ** 2).mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, [p.detach().cpu() for m in layers for p in m.parameters()]

def model():
    torch.manual_seed(1)
    return [nn.Linear(6, 5), nn.Linear(5, 4)]
"""


def _run(body: str, mode: str = "fused") -> str:
    env = dict(os.environ, TORCHTPU_LAB_PLATFORM="cpu", TORCHTPU_LAB_EAGER_MODE=mode,
               XLA_FLAGS=f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=4".strip())
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH", "")) if p)
    out = subprocess.run([sys.executable, "-c", _PRELUDE + textwrap.dedent(body)], env=env, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]
    return out.stdout


@needs_core
@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_training_on_tpu1_tpu3_and_split_over_two_chips_matches_cpu_step_for_step(mode):
    out = _run("""
        assert torch.tpu.device_count() == 4 and torch.accelerator.device_count() == 4
        ref_losses, ref_params = train(model(), ["cpu", "cpu"])
        for devices in (["tpu:1", "tpu:1"], ["tpu:3", "tpu:3"], ["tpu:0", "tpu:1"]):
            losses, params = train(model(), devices)
            assert all(abs(a - b) <= 1e-5 * max(1, abs(a)) for a, b in zip(losses, ref_losses)), (devices, losses)
            assert all(torch.allclose(p, q, atol=1e-5) for p, q in zip(params, ref_params)), devices
        print("ok")
    """, mode)
    assert "ok" in out


def test_copies_between_chips_device_context_and_cross_device_errors():
    out = _run("""
        a = torch.arange(6.0).reshape(2, 3).to("tpu:2")
        b = a.to("tpu:1") * 2
        assert b.device == torch.device("tpu:1") and torch.equal(b.cpu(), torch.arange(6.0).reshape(2, 3) * 2)
        with torch.tpu.device(3):
            c = torch.ones(2, device="tpu")
            assert c.device == torch.device("tpu:3") and torch.tpu.current_device() == 3
            if torchtpu_lab.native.module() is not None:  # PyTorch's guard is the core's: one current device
                assert torch.accelerator.current_device_index() == 3
        assert torch.tpu.current_device() == 0
        try:
            a + b
        except RuntimeError as e:
            assert "Expected all tensors to be on the same device" in str(e) and "tpu:2" in str(e), e
        else:
            raise AssertionError("a tpu:2 + tpu:1 op ran")
        print("ok")
    """)
    assert "ok" in out


def test_memory_is_counted_per_chip():
    out = _run("""
        before = [torch.tpu.memory_allocated(i) for i in range(4)]
        x = torch.zeros(1024, device="tpu:2")
        torchtpu_lab.sync()
        after = [torch.tpu.memory_allocated(i) for i in range(4)]
        assert after[2] - before[2] == 4096, (before, after)
        assert [after[i] - before[i] for i in (0, 1, 3)] == [0, 0, 0], (before, after)
        for i in range(4):  # torch.accelerator and memory_stats read the same per-chip accounting
            stats = torch.accelerator.memory_stats(i)
            assert torch.accelerator.memory_allocated(i) == after[i] == stats["allocated_bytes.all.current"]
            assert torch.accelerator.max_memory_allocated(i) == torch.tpu.max_memory_allocated(i)
            assert stats["allocated_bytes.all.peak"] == torch.tpu.max_memory_allocated(i) >= after[i]
        del x
        assert torch.tpu.memory_allocated(2) == before[2]
        print("ok")
    """)
    assert "ok" in out


@needs_core
@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_foreach_lists_over_two_chips_run_each_element_where_it_is(mode):
    """A foreach call's node runs on one chip; a list over two runs element by element, as PyTorch's fallback
    does, each result on its element's chip (runtime/foreach_kernels.py)."""
    out = _run("""
        cpu = [torch.arange(3.0), torch.arange(2.0) + 5]
        tpu = [cpu[0].to("tpu:0"), cpu[1].to("tpu:1")]
        for _ in range(3):  # repeated: the recording kernel's lesson would apply
            sums = torch._foreach_add(tpu, tpu, alpha=2)
            torch._foreach_mul_(tpu, [0.5, 3.0])
            want = torch._foreach_add(cpu, cpu, alpha=2)
            torch._foreach_mul_(cpu, [0.5, 3.0])
        assert [str(t.device) for t in [*sums, *tpu]] == ["tpu:0", "tpu:1"] * 2
        for got, expected in zip([*sums, *tpu], [*want, *cpu]):
            torch.testing.assert_close(got.cpu(), expected)
        print("ok")
    """, mode)
    assert out.strip().endswith("ok")
