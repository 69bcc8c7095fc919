"""Nothing lost, nothing silent (issue 14): Ctrl-C, out-of-range indices, threads, absurd sizes, bad arguments.

The SIGINT storm and the absurd sizes run in child processes (an abort must fail the test, not kill pytest),
each with a hard timeout. The case lists and their checks live in ``fault_cases.py``, shared with
``bench/faults_table.py``, which counts them for docs/reliability.md.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys
import threading

import pytest
import torch
import torch.nn.functional as F

import torchtpu_lab
from fault_cases import (BAD_DEVICE_CALLS, BAD_RNG_STATES, OUT_OF_RANGE, D, absurd_sizes_in_a_child,
                         check_bad_device, check_bad_rng_state, check_out_of_range, child_env)
from torchtpu_lab.runtime import fused

HERE = pathlib.Path(__file__).resolve().parent


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
                         text=True, timeout=280, env=child_env())
    assert out.returncode == 0, (out.returncode, out.stdout[-2000:], out.stderr[-4000:])
    assert "STORM OK sent=25" in out.stdout
    steps = int(out.stdout.rsplit("steps=", 1)[1].split()[0])
    assert steps >= 1, out.stdout  # completed steps were checked against CPU, not only interrupted ones


def test_interrupt_before_commit_leaves_work_pending(monkeypatch):
    """A KeyboardInterrupt while a fused graph's key is built stores nothing: the work is re-run at the next read."""
    torchtpu_lab.set_eager_mode("fused")
    try:
        x = torch.arange(6.0, device=D)
        y = x * 3 + 1
        real = fused._donate  # the last step of building the key, whichever way it is built
        calls = []

        def interrupted(*a, **k):
            if not calls:
                calls.append(1)
                raise KeyboardInterrupt
            return real(*a, **k)

        monkeypatch.setattr(fused, "_donate", interrupted)
        with pytest.raises(KeyboardInterrupt):
            torchtpu_lab.sync()
        assert fused.has_pending()
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


@pytest.mark.parametrize("case", list(OUT_OF_RANGE))
def test_out_of_range_raises_and_session_stays_usable(mode, case):
    check_out_of_range(case)


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


def test_absurd_sizes_raise_like_cpu_in_a_child():
    outcomes, alive = absurd_sizes_in_a_child()
    assert alive, "the child process did not compute after the absurd sizes"
    for (expr, mode_name), held in outcomes.items():
        assert held, (expr, mode_name)


@pytest.mark.parametrize("label", list(BAD_DEVICE_CALLS))
def test_torch_tpu_rejects_bad_devices(label):
    check_bad_device(label)


@pytest.mark.parametrize("label", list(BAD_RNG_STATES))
def test_set_rng_state_rejects_garbage(label):
    check_bad_rng_state(label)
