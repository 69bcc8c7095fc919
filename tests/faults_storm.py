"""A SIGINT storm into a training loop (run as a child process by tests/test_faults.py and bench/faults_table.py).

    python tests/faults_storm.py MODE N_SIGNALS

A thread sends ``N_SIGNALS`` SIGINTs at random moments while the main thread trains a small MLP on the tpu
device (``MODE``: fused or strict). After every ``KeyboardInterrupt`` the parameters must be readable and each
must equal either its value before the interrupted step or the value a CPU copy of the model reaches by taking
that step whole; every completed step must equal the CPU step. Prints ``STORM OK sent=.. caught=.. steps=..``
and exits 0, or exits non-zero naming what broke (an abort kills the process: the parent sees a signal).
"""

from __future__ import annotations

import copy
import os
import random
import signal
import sys
import threading
import time

import torch
import torch.nn as nn

import torchtpu_lab

MODE, N = sys.argv[1], int(sys.argv[2])
torchtpu_lab.set_eager_mode(MODE)
torch.manual_seed(0)
cpu_model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
tpu_model = copy.deepcopy(cpu_model).to("tpu")
x_cpu, y_cpu = torch.randn(8, 16), torch.randn(8, 4)
x, y = x_cpu.to("tpu"), y_cpu.to("tpu")
opt = torch.optim.SGD(tpu_model.parameters(), lr=0.05, momentum=0.0)
cpu_opt = torch.optim.SGD(cpu_model.parameters(), lr=0.05, momentum=0.0)


def step(model, optimizer, a, b, sync: bool) -> None:
    optimizer.zero_grad(set_to_none=True)
    loss = ((model(a) - b) ** 2).mean()
    loss.backward()
    optimizer.step()
    if sync:
        torchtpu_lab.sync()


def read_params() -> list[torch.Tensor]:
    while True:  # a signal already in flight may land here too: reading again must still work
        try:
            return [p.detach().to("cpu") for p in tpu_model.parameters()]
        except KeyboardInterrupt:
            continue


armed = threading.Event()
sent = [0]
arming = [0]  # steps armed so far: every third step is left alone, so completed steps are checked too, however
#              slow the machine (on a loaded one a strict step outlasts every random delay)
step_s = [0.08]  # a completed step's recent duration: the storm's delays span it, so a signal lands inside a
#                  step as often on a fast machine (a fused step of ~1 ms) as on a slow one


def storm() -> None:
    rnd = random.Random(1)
    handled = 0
    while sent[0] < N:
        armed.wait()
        if arming[0] == handled:  # this step was handled already: wait for the next one
            time.sleep(0.001)
            continue
        handled = arming[0]
        if handled % 3 == 0:
            continue
        time.sleep(rnd.uniform(0.0, min(0.12, 1.5 * step_s[0])))
        if armed.is_set() and arming[0] == handled:
            os.kill(os.getpid(), signal.SIGINT)
            sent[0] += 1


def check_close(name: str, got: list, want: list, before: list | None = None, history: str = "") -> None:
    """Every parameter equals CPU's; a failure says by how much, and (given the values ``before`` the step)
    how that compares with the step itself — none taken, taken twice, something else — and what came before."""
    for i, (g, w) in enumerate(zip(got, want)):
        if not torch.allclose(g, w, rtol=1e-4, atol=1e-5):
            where = ""
            if before is not None:
                delta = w - before[i]
                at = int((g - w).abs().argmax())
                where = (f"; at element {at}: got {g.flatten()[at].item():.9g}, CPU step {w.flatten()[at].item():.9g},"
                         f" before {before[i].flatten()[at].item():.9g} (the step's own size there "
                         f"{delta.flatten()[at].item():.3g}; max |got - before - 2 step| "
                         f"{(g - before[i] - 2 * delta).abs().max().item():.3g}); {history}")
            print(f"STORM FAIL {name}: parameter {i} differs by {(g - w).abs().max().item()}{where}", flush=True)
            sys.exit(3)


def retrying(fn):
    """Run the harness's own bookkeeping to the end even if a late interrupt lands in it."""
    while True:
        try:
            return fn()
        except KeyboardInterrupt:
            continue


def cpu_step_from(values: list) -> list:
    for p, v in zip(cpu_model.parameters(), values):  # the CPU copy starts where the tpu model is
        p.data.copy_(v)
    step(cpu_model, cpu_opt, x_cpu, y_cpu, False)
    return [p.detach().clone() for p in cpu_model.parameters()]


def after_interrupt(before: list, after: list) -> None:
    got = read_params()
    for i, (g, b, a) in enumerate(zip(got, before, after)):
        if not torch.isfinite(g).all():
            print(f"STORM FAIL parameter {i} is not finite after an interrupt", flush=True)
            sys.exit(4)
        if not (torch.allclose(g, b, rtol=1e-4, atol=1e-5) or torch.allclose(g, a, rtol=1e-4, atol=1e-5)):
            print(f"STORM FAIL parameter {i} is neither before nor after the interrupted step", flush=True)
            sys.exit(5)


threading.Thread(target=storm, daemon=True).start()
caught = steps = 0
last = -1  # completed steps since the last interrupted one (-1: none interrupted yet)
deadline = time.monotonic() + 240
while sent[0] < N and time.monotonic() < deadline:
    before = read_params()
    after = retrying(lambda: cpu_step_from(before))
    try:
        arming[0] += 1
        armed.set()
        t_step = time.perf_counter()
        step(tpu_model, opt, x, y, MODE == "fused")
        armed.clear()
        step_s[0] = 0.8 * step_s[0] + 0.2 * (time.perf_counter() - t_step)
        steps += 1
        done = True
    except KeyboardInterrupt:
        done = False
    if done:
        retrying(lambda: check_close("completed step", read_params(), after, before,
                                     f"step {steps}, {caught} interrupted so far, the last {last} steps before"))
        last = last + 1 if last >= 0 else last
    else:
        retrying(armed.clear)
        caught += 1
        last = 0
        retrying(lambda: after_interrupt(before, after))
retrying(armed.clear)
retrying(lambda: time.sleep(0.2))


def final_step() -> None:  # the session is usable: one more clean step equals the CPU step
    before = read_params()
    after = cpu_step_from(before)
    step(tpu_model, opt, x, y, MODE == "fused")
    check_close("final step", read_params(), after)


retrying(final_step)
print(f"STORM OK sent={sent[0]} caught={caught} steps={steps}", flush=True)
