"""SIGINTs into the main thread while three more threads run the kernel-lock workload in fused mode (run as a
child process by tests/test_kernel_lock.py: an abort must fail the test, not kill pytest).

    python tests/threads_storm.py N_SIGNALS

Every thread runs chains of ``thread_work.Ops.step`` (a ``jax_op`` op, built-in ops, a compiled module),
syncing every 7 steps. The main thread takes ``N_SIGNALS`` SIGINTs, 50-300 ms apart: after each, the tensor of
its last completed step is readable and equals the CPU one, and its next steps go on from there. Every chain a
worker finishes equals CPU. Prints ``STORM OK sent=.. caught=.. chains=..`` and exits 0, or exits non-zero.
"""

from __future__ import annotations

import os
import random
import signal
import sys
import threading
import time

import torch

import torchtpu_lab
from thread_work import SYNC_EVERY, Ops, chain, inputs

N = int(sys.argv[1])
torchtpu_lab.set_eager_mode("fused")
ops = Ops()
chain(ops, 0, 2)  # compiled once here, not by four threads at once
stop = threading.Event()
errors: list = []
chains = [0]


def fail(code: int, what: str) -> None:
    print(f"STORM FAIL {what}", flush=True)
    sys.stdout.flush()
    os._exit(code)


def worker(k: int) -> None:
    try:
        seed = 100 * k
        while not stop.is_set():
            seed += 1
            got, want = chain(ops, seed, 15)
            if not torch.allclose(got, want, rtol=1e-4, atol=1e-5):
                errors.append(f"thread {k} chain {seed}: differs from CPU by {(got - want).abs().max().item()}")
                return
            chains[0] += 1
    except BaseException as e:  # noqa: BLE001 — reported by the main thread
        errors.append(f"thread {k}: {type(e).__name__}: {e}")


sent = [0]


def storm() -> None:
    rnd = random.Random(3)
    while sent[0] < N:
        time.sleep(rnd.uniform(0.05, 0.3))
        os.kill(os.getpid(), signal.SIGINT)
        sent[0] += 1


def retrying(fn):
    while True:
        try:
            return fn()
        except KeyboardInterrupt:
            caught[0] += 1


workers = [threading.Thread(target=worker, args=(k,), daemon=True) for k in range(1, 4)]
for t in workers:
    t.start()
caught = [0]
a, w = inputs(0)
at, wt = a.to("tpu"), w.to("tpu")
i = 0
deadline = time.monotonic() + 50
# the storm starts only now: an interrupt before the loop's try would end the script, not test anything
threading.Thread(target=storm, daemon=True).start()
while sent[0] < N and not errors and time.monotonic() < deadline:
    try:
        nt = ops.step(at, wt, True)
        if i % SYNC_EVERY == SYNC_EVERY - 1:
            torchtpu_lab.sync()
        at, a = nt, retrying(lambda: ops.step(a, w, False))
        i += 1
    except KeyboardInterrupt:
        caught[0] += 1
        got = retrying(lambda: at.cpu())
        if not retrying(lambda: torch.allclose(got, a, rtol=1e-4, atol=1e-5)):
            fail(5, f"after an interrupt at step {i}, the last completed step's tensor differs from CPU")
stop.set()
for t in workers:
    retrying(lambda: t.join(120))
if errors:
    fail(3, errors[0])
if sent[0] < N:
    fail(8, f"only {sent[0]} of {N} interrupts sent before the deadline")
retrying(lambda: time.sleep(0.5))  # the last interrupts arrive
if not torch.allclose(retrying(lambda: at.cpu()), a, rtol=1e-4, atol=1e-5):
    fail(10, "the main thread's final tensor differs from CPU")
print(f"STORM OK sent={sent[0]} caught={caught[0]} chains={chains[0]} steps={i}", flush=True)
