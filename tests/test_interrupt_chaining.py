"""A SIGINT handler of the user's or a library's own runs at torchtpu_lab's safe point (issue 24): ours stays in
front and calls theirs there, also when theirs is installed after ours. The storms run in child processes with
a hard timeout (an abort must fail the test, not kill pytest)."""

from __future__ import annotations

import _thread
import pathlib
import signal
import subprocess
import sys

import pytest
import torch

from fault_cases import child_env
from torchtpu_lab import interrupts

HERE = pathlib.Path(__file__).resolve().parent


@pytest.mark.parametrize("loop", ["tanh", "sgd"])
@pytest.mark.parametrize("mode", ["fused", "strict"])
def test_sigint_storm_with_a_foreign_raising_handler(mode, loop):
    """40 SIGINTs, 50-300 ms apart, with a handler that raises KeyboardInterrupt at once: each one reaches user
    code through that handler, every tensor stays readable and equal to CPU, the process lives (before: deleted
    arrays, swallowed interrupts and ``terminate called without an active exception``)."""
    out = subprocess.run([sys.executable, str(HERE / "foreign_handler_storm.py"), mode, loop, "40"],
                         capture_output=True, text=True, timeout=120, env=child_env())
    assert out.returncode == 0, (out.returncode, out.stdout[-2000:], out.stderr[-4000:])
    assert "STORM OK sent=40 caught=40" in out.stdout and "foreign=40" in out.stdout, out.stdout[-2000:]


@pytest.fixture
def foreign_handler():
    """Installs a handler after torchtpu_lab's (as a framework would); puts Python's default back afterwards."""
    calls: list = []
    yield calls
    signal.signal(signal.SIGINT, signal.default_int_handler)
    interrupts.ensure_installed()
    assert interrupts.installed() and interrupts.chained() is signal.default_int_handler


def _interrupt_inside_deferred_block(order: list) -> list:
    with interrupts.deferred():
        _thread.interrupt_main()
        for _ in range(1000):  # bytecode runs: the handler is called here and defers
            pass
        order.append("block finished")
    order.append("after the block")
    return order


def test_a_handler_installed_later_is_chained_at_the_next_entry_point(foreign_handler):
    def mine(signum, frame):
        foreign_handler.append(signum)
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, mine)
    assert not interrupts.installed()
    torch.ones(2, device="tpu").sum().item()  # any tpu op is an entry point
    assert interrupts.installed() and interrupts.chained() is mine
    order: list = []
    with pytest.raises(KeyboardInterrupt):
        _interrupt_inside_deferred_block(order)
    assert foreign_handler == [signal.SIGINT]  # called once, when the critical section was over
    assert order == ["block finished"]


def test_a_handler_that_does_not_raise_runs_at_the_safe_point(foreign_handler):
    signal.signal(signal.SIGINT, lambda signum, frame: foreign_handler.append("graceful shutdown requested"))
    interrupts.ensure_installed()
    assert _interrupt_inside_deferred_block([]) == ["block finished", "after the block"]
    assert foreign_handler == ["graceful shutdown requested"]


def test_a_handler_that_calls_the_one_it_replaced_raises_once(foreign_handler):
    previous = signal.getsignal(signal.SIGINT)  # ours: the library saved it and calls it after its own work
    assert previous is interrupts._handler

    def library(signum, frame):
        foreign_handler.append("cleanup")
        previous(signum, frame)

    signal.signal(signal.SIGINT, library)
    interrupts.ensure_installed()
    with pytest.raises(KeyboardInterrupt):
        _interrupt_inside_deferred_block([])
    assert foreign_handler == ["cleanup"]
    assert not interrupts.pending[0]
