"""Nothing lost, nothing silent (issue 14): Ctrl-C, out-of-range indices, threads, absurd sizes, bad arguments.

The SIGINT storm and the absurd sizes run in child processes (an abort must fail the test, not kill pytest),
each with a hard timeout.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import threading

import pytest
import torch
import torch.nn.functional as F

import torchtpu_lab
from torchtpu_lab.runtime import lazy

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
D = "tpu"


def _child_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env.setdefault("TORCHTPU_LAB_PLATFORM", "cpu")
    return env


@pytest.fixture(params=["strict", "fused"])
def mode(request):
    previous = torchtpu_lab.eager_mode_name()
    torchtpu_lab.set_eager_mode(request.param)
    yield request.param
    torchtpu_lab.set_eager_mode(previous)


# ---- 1 and 2: Ctrl-C ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("storm_mode", ["fused", "strict"])
def test_sigint_storm_keeps_process_and_parameters(storm_mode):
    """25 SIGINTs at random moments into a training loop: the process lives, the parameters stay readable and
    each equals its value before or after the interrupted step (checked against CPU inside the child)."""
    out = subprocess.run([sys.executable, str(HERE / "faults_storm.py"), storm_mode, "25"], capture_output=True,
                         text=True, timeout=280, env=_child_env())
    assert out.returncode == 0, (out.returncode, out.stdout[-2000:], out.stderr[-4000:])
    assert "STORM OK sent=25" in out.stdout


def test_interrupt_before_commit_leaves_work_pending(monkeypatch):
    """A KeyboardInterrupt while a fused graph's key is built stores nothing: the work is re-run at the next read."""
    torchtpu_lab.set_eager_mode("fused")
    try:
        x = torch.arange(6.0, device=D)
        y = x * 3 + 1
        real = lazy._donate  # the last step of building the key, whichever way it is built
        calls = []

        def interrupted(*a, **k):
            if not calls:
                calls.append(1)
                raise KeyboardInterrupt
            return real(*a, **k)

        monkeypatch.setattr(lazy, "_donate", interrupted)
        with pytest.raises(KeyboardInterrupt):
            torchtpu_lab.sync()
        assert lazy.has_pending()
        assert torch.equal(y.cpu(), torch.arange(6.0) * 3 + 1)
    finally:
        torchtpu_lab.set_eager_mode("strict")


def test_deferred_interrupt_is_raised_after_the_block():
    from torchtpu_lab import interrupts
    import _thread

    order = []
    with pytest.raises(KeyboardInterrupt):
        with interrupts.deferred():
            _thread.interrupt_main()
            for _ in range(1000):  # bytecode runs: the handler is called here and defers
                pass
            order.append("block finished")
    assert order == ["block finished"]


# ---- 3: out-of-range indices and other data-dependent errors ---------------------------------------------------


def _x():
    return torch.arange(5.0, device=D)


def _i(*v):
    return torch.tensor(list(v), device=D)


OUT_OF_RANGE = {
    "index": (IndexError, lambda: _x()[_i(100)]),
    "index negative": (IndexError, lambda: _x()[_i(-6)]),
    "index cpu indices": (IndexError, lambda: _x()[torch.tensor([100])]),
    "index_put_": (IndexError, lambda: _x().index_put_((_i(7),), torch.tensor(1.0, device=D))),
    "setitem": (IndexError, lambda: _x().__setitem__(_i(7), 1.0)),
    "bool mask wrong length": (IndexError, lambda: _x()[torch.tensor([True, False], device=D)]),
    "index_select": (IndexError, lambda: _x().index_select(0, _i(5))),
    "embedding": (IndexError, lambda: F.embedding(_i(9), torch.randn(3, 2, device=D))),
    "gather": (RuntimeError, lambda: _x().gather(0, _i(5))),
    "scatter_": (RuntimeError, lambda: _x().scatter_(0, _i(5), 1.0)),
    "scatter_add_": (RuntimeError, lambda: _x().scatter_add_(0, _i(5), torch.ones(1, device=D))),
    "index_add_": (IndexError, lambda: _x().index_add_(0, _i(5), torch.ones(1, device=D))),
    "take": (IndexError, lambda: _x().take(_i(5))),
    "cross_entropy target": (IndexError, lambda: F.cross_entropy(torch.randn(2, 3, device=D), _i(0, 5))),
    "multinomial negative": (RuntimeError, lambda: torch.multinomial(torch.tensor([0.5, -0.1, 0.6], device=D), 1)),
    "integer floor division by zero": (RuntimeError, lambda: _i(1, 2) // _i(1, 0)),
    "integer remainder by zero": (RuntimeError, lambda: _i(1, 2) % _i(1, 0)),
    "integer division by scalar zero": (RuntimeError, lambda: _i(1, 2) // 0),
}


@pytest.mark.parametrize("case", list(OUT_OF_RANGE))
def test_out_of_range_raises_and_session_stays_usable(mode, case):
    error, fn = OUT_OF_RANGE[case]
    with pytest.raises(error) as info:
        r = fn()
        torch.tpu.synchronize()  # in-place cases return nothing to read: a sync surfaces what they reported
        if isinstance(r, torch.Tensor):
            r.cpu()
    message = str(info.value)
    if case != "bool mask wrong length":
        assert "aten::" in message and "test_faults.py" in message, message  # names the op and the user line
    # nothing left pending, earlier tensors fine, new work fine
    y = _x() * 2
    assert torch.equal(y.cpu(), torch.arange(5.0) * 2)
    assert torch.equal(_x()[_i(1, -1)].cpu(), torch.tensor([1.0, 4.0]))


def test_in_range_indices_still_agree_with_cpu(mode):
    w = torch.randn(7, 3)
    idx = torch.tensor([0, 6, -1, 3])
    assert torch.allclose(w.to(D)[idx.to(D)].cpu(), w[idx])
    assert torch.allclose(F.embedding(idx.abs().to(D), w.to(D)).cpu(), F.embedding(idx.abs(), w))
    t = torch.tensor([2, 0, 1])
    logits = torch.randn(3, 5)
    assert torch.allclose(F.cross_entropy(logits.to(D), t.to(D)).cpu(), F.cross_entropy(logits, t), atol=1e-6)
    assert torch.equal((torch.tensor([7, -7]).to(D) // torch.tensor([2, 2]).to(D)).cpu(), torch.tensor([3, -4]))


# ---- 4: threads ----------------------------------------------------------------------------------------------


def test_threads_fused_equal_cpu():
    """3 threads x 4 trials computing independent results in fused mode (the main thread syncing meanwhile)
    give exactly what the same computations give on CPU."""
    torchtpu_lab.set_eager_mode("fused")
    try:
        for trial in range(4):
            inputs = [torch.randn(16, 16, generator=torch.Generator().manual_seed(10 * trial + k)) for k in range(3)]
            want = [torch.tanh(a @ a.T + 1).sum(0) * 2 for a in inputs]
            got: list = [None] * 3
            errors: list = []

            def work(k):
                try:
                    a = inputs[k].to(D)
                    for _ in range(5):
                        r = torch.tanh(a @ a.T + 1).sum(0) * 2
                    got[k] = r.cpu()
                except BaseException as e:  # noqa: BLE001 — reported below
                    errors.append(e)

            threads = [threading.Thread(target=work, args=(k,)) for k in range(3)]
            for t in threads:
                t.start()
            for _ in range(5):
                torchtpu_lab.sync()
            for t in threads:
                t.join(timeout=120)
            assert not errors, errors
            for g, w in zip(got, want):
                assert torch.allclose(g, w, rtol=1e-5, atol=1e-5)
    finally:
        torchtpu_lab.set_eager_mode("strict")


# ---- 5 and 6: absurd sizes and bad arguments -------------------------------------------------------------------


ABSURD = {
    "torch.randn(2**62, device='tpu')": "Storage size calculation overflowed",
    "torch.empty(2**40, 2**40, device='tpu')": "Storage size calculation overflowed",
    "torch.zeros(2**31, 2**31, 4, device='tpu')": "Storage size calculation overflowed",
    "torch.full((2**62,), 1.0, device='tpu')": "Storage size calculation overflowed",
    "torch.ones(2, device='tpu').new_empty((2**62,))": "Storage size calculation overflowed",
    "torch.randint(0, 5, (2**62,), device='tpu')": "Storage size calculation overflowed",
    "torch.ones(2, device='tpu').resize_(2**62)": "Storage size calculation overflowed",
    "torch.ones(-1, device='tpu')": "Trying to create tensor with negative dimension -1: [-1]",
    "torch.empty(-2, 3, device='tpu')": "Trying to create tensor with negative dimension -2: [-2, 3]",
}


def test_absurd_sizes_raise_like_cpu_in_a_child():
    lines = ["import torch, torchtpu_lab"]
    for i, (expr, _) in enumerate(ABSURD.items()):
        for mode_name in ("strict", "fused"):
            lines += [f"torchtpu_lab.set_eager_mode({mode_name!r})",
                      "try:", f"    {expr}", f"    print('NO ERROR {i}')",
                      "except RuntimeError as e:", f"    print('{i}', e)"]
    lines.append("print('ALIVE', (torch.ones(3, device='tpu') * 2).sum().item())")
    out = subprocess.run([sys.executable, "-c", "\n".join(lines)], capture_output=True, text=True, timeout=240,
                         env=_child_env())
    assert out.returncode == 0, out.stderr[-3000:]
    for i, (expr, message) in enumerate(ABSURD.items()):
        found = [ln for ln in out.stdout.splitlines() if ln.startswith(f"{i} ")]
        assert len(found) == 2 and all(message in ln for ln in found), (expr, out.stdout)
    assert "ALIVE 6.0" in out.stdout


@pytest.mark.parametrize("call", [
    lambda: torch.tpu.set_device("cuda:0"),
    lambda: torch.tpu.memory_allocated("tpu:7"),
    lambda: torch.tpu.synchronize(9),
    lambda: torch.tpu.get_rng_state("cpu"),
    lambda: torch.tpu.set_device(object()),
])
def test_torch_tpu_rejects_bad_devices(call):
    with pytest.raises(ValueError, match="tpu"):
        call()
    torch.tpu.synchronize(0)
    assert torch.tpu.current_device() == 0


@pytest.mark.parametrize("state", ["junk", torch.zeros(3), torch.zeros(16, dtype=torch.int64)])
def test_set_rng_state_rejects_garbage(state):
    before = torch.tpu.get_rng_state()
    with pytest.raises(RuntimeError, match="set_rng_state: expected a torch.uint8 tensor of 16 bytes"):
        torch.tpu.set_rng_state(state)
    assert torch.equal(torch.tpu.get_rng_state(), before)
