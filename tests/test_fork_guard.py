"""A child forked after the tpu device started refuses tpu work with PyTorch's re-initialization error instead
of hanging on JAX's runtime, which does not survive fork (backend/fork_guard.py); CPU work in it is unaffected
and the parent goes on."""

import multiprocessing
import sys

import pytest
import torch

import torchtpu_lab  # noqa: F401

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="no fork")


def _child(queue) -> None:
    seen = {"bad_fork": torch.tpu._is_in_bad_fork()}
    tries = {"init": torch.tpu.init, "op": lambda: (torch.randn(4, device="tpu") * 2).cpu(),
             "to": lambda: torch.ones(3).to("tpu"), "cpu": lambda: torch.ones(3).sum().item()}
    for name, fn in tries.items():
        try:
            seen[name] = ("ok", repr(fn()))
        except Exception as e:  # noqa: BLE001 — reported to the parent
            seen[name] = (type(e).__name__, str(e))
    queue.put(seen)


def test_a_child_forked_after_the_device_started_refuses_tpu_work_and_does_not_hang():
    assert (torch.ones(4, device="tpu") + 1).sum().item() == 8  # the device is started in this process
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    with pytest.warns(RuntimeWarning, match="fork"):  # JAX's own warning at fork
        proc = ctx.Process(target=_child, args=(queue,))
        proc.start()
    proc.join(120)
    if proc.is_alive():
        proc.kill()
        pytest.fail("the forked child hung")
    seen = queue.get(timeout=10)
    message = "Cannot re-initialize tpu in forked subprocess. To use tpu with multiprocessing, you must use the " \
              "'spawn' start method"
    assert seen["bad_fork"] is True
    assert seen["init"][0] == "RuntimeError" and seen["init"][1].startswith(message)
    assert seen["cpu"] == ("ok", "3.0")
    for name in ("op", "to"):  # the runtime lock refuses: the core's Lock, or the pure-Python mode's
        assert seen[name][0] == "RuntimeError" and seen[name][1].startswith(message), seen[name]
    assert not torch.tpu._is_in_bad_fork()
    assert (torch.ones(2, device="tpu") * 3).cpu().tolist() == [3.0, 3.0]  # the parent goes on

