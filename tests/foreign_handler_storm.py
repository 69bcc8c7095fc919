"""SIGINTs into a loop while a foreign SIGINT handler that raises ``KeyboardInterrupt`` at once is installed
(run as a child process by tests/test_interrupt_chaining.py: an abort must fail the test, not kill pytest).

    python tests/foreign_handler_storm.py MODE LOOP N_SIGNALS

``MODE``: fused or strict. ``LOOP``: ``tanh`` (``x = tanh(x @ w)`` then ``x.sum().item()`` each step) or
``sgd`` (a Linear+SGD step, its loss read each step). The foreign handler is installed after
``import torchtpu_lab``, as a framework does for graceful shutdown. A thread sends ``N_SIGNALS`` SIGINTs, each
50-300 ms after the previous one reached user code. Checked: every signal reaches user code as one
``KeyboardInterrupt`` (none lost, none swallowed) through the foreign handler; after each, every tensor is
readable, finite and equals its CPU value before or after the interrupted step (each op ran whole or not at
all); every completed step equals the CPU step. Prints ``STORM OK sent=.. caught=.. steps=..`` and exits 0, or exits
non-zero naming what broke.
"""

from __future__ import annotations

import random
import signal
import sys
import threading
import time

import torch

import torchtpu_lab

MODE, LOOP, N = sys.argv[1], sys.argv[2], int(sys.argv[3])
torchtpu_lab.set_eager_mode(MODE)
D = "tpu"
foreign_calls = [0]


def foreign_handler(signum, frame):
    foreign_calls[0] += 1
    raise KeyboardInterrupt


signal.signal(signal.SIGINT, foreign_handler)


def fail(code: int, what: str) -> None:
    print(f"STORM FAIL {what}", flush=True)
    sys.exit(code)


class TanhLoop:
    def __init__(self) -> None:
        g = torch.Generator().manual_seed(0)
        self.w_cpu = torch.randn(32, 32, generator=g) * 0.3
        self.x_cpu = torch.randn(16, 32, generator=g)
        self.w, self.x = self.w_cpu.to(D), self.x_cpu.to(D)

    def cpu_step(self) -> list:
        return [torch.tanh(self.x_cpu @ self.w_cpu)]

    def step(self) -> None:
        x = torch.tanh(self.x @ self.w)
        x.sum().item()
        self.x = x

    def state(self) -> list:
        return [self.x]

    def commit_cpu(self, values: list) -> None:
        self.x_cpu = values[0]


class SgdLoop:
    def __init__(self) -> None:
        torch.manual_seed(0)
        self.cpu_model = torch.nn.Linear(16, 4)
        self.model = torch.nn.Linear(16, 4).to(D)
        self.model.load_state_dict({k: v.to(D) for k, v in self.cpu_model.state_dict().items()})
        g = torch.Generator().manual_seed(1)
        self.a_cpu, self.b_cpu = torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)
        self.a, self.b = self.a_cpu.to(D), self.b_cpu.to(D)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.cpu_opt = torch.optim.SGD(self.cpu_model.parameters(), lr=0.1)

    @staticmethod
    def _step(model, opt, a, b) -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        loss = ((model(a) - b) ** 2).mean()
        loss.backward()
        opt.step()
        return loss

    def cpu_step(self) -> list:
        saved = [p.detach().clone() for p in self.cpu_model.parameters()]
        self._step(self.cpu_model, self.cpu_opt, self.a_cpu, self.b_cpu)
        after = [p.detach().clone() for p in self.cpu_model.parameters()]
        with torch.no_grad():
            for p, v in zip(self.cpu_model.parameters(), saved):
                p.copy_(v)
        return after

    def step(self) -> None:
        self._step(self.model, self.opt, self.a, self.b).item()

    def state(self) -> list:
        return list(self.model.parameters())

    def commit_cpu(self, values: list) -> None:
        with torch.no_grad():
            for p, v in zip(self.cpu_model.parameters(), values):
                p.copy_(v)


def close(got: list, want: list) -> bool:
    return all(torch.allclose(g, w, rtol=1e-4, atol=1e-5) for g, w in zip(got, want))


def read(tensors: list) -> list:
    """The tensors' values on the host; a late interrupt landing here is retried (it is counted as caught)."""
    while True:
        try:
            return [t.detach().to("cpu") for t in tensors]
        except KeyboardInterrupt:
            reached()


loop = TanhLoop() if LOOP == "tanh" else SgdLoop()
sent = [0]
caught = [0]
arrived = threading.Event()
lost: list = []


def reached() -> None:
    caught[0] += 1
    arrived.set()


def storm() -> None:
    rnd = random.Random(7)
    while sent[0] < N:
        time.sleep(rnd.uniform(0.05, 0.3))
        arrived.clear()
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
        sent[0] += 1
        if not arrived.wait(20):
            lost.append(sent[0])
            return


def counted(fn):
    """Run the harness's own bookkeeping to the end even if an interrupt lands in it (it is counted)."""
    while True:
        try:
            return fn()
        except KeyboardInterrupt:
            reached()


def check(done: bool, got: list, before: list, want: list) -> None:
    if done and not close(got, want):
        fail(3, f"completed step {steps} differs from the CPU step")
    for i, (g, b, w) in enumerate(zip(got, before, want)):  # an interrupted step ran each op whole or not at all
        if not torch.isfinite(g).all() or not (close([g], [b]) or close([g], [w])):
            fail(5, f"tensor {i} is neither its value before nor after the interrupted step")
    loop.commit_cpu(got)


threading.Thread(target=storm, daemon=True).start()
steps = 0
deadline = time.monotonic() + 50
while (sent[0] < N or not arrived.is_set()) and not lost and time.monotonic() < deadline:
    try:
        before = read(loop.state())
        want = loop.cpu_step()
    except KeyboardInterrupt:
        reached()
        continue
    try:
        loop.step()
        done = True
    except KeyboardInterrupt:
        done = False
        reached()
    got = read(loop.state())
    counted(lambda: check(done, got, before, want))
    steps += done
if lost:
    fail(6, f"interrupt {lost[0]} of {sent[0]} never reached user code")
if caught[0] != sent[0] or foreign_calls[0] != sent[0]:
    fail(7, f"sent {sent[0]} interrupts, user code caught {caught[0]}, the foreign handler ran {foreign_calls[0]}")
if sent[0] < N:
    fail(8, f"only {sent[0]} of {N} interrupts sent before the deadline")
time.sleep(0.1)
want = loop.cpu_step()
try:
    loop.step()  # the session is usable: one more clean step equals the CPU step
except KeyboardInterrupt:
    fail(9, "an interrupt arrived with none sent")
if not close(read(loop.state()), want):
    fail(10, "the final step differs from the CPU step")
print(f"STORM OK sent={sent[0]} caught={caught[0]} steps={steps} foreign={foreign_calls[0]}", flush=True)
