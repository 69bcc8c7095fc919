"""Shared timing helpers for the benchmarks: medians of repeated runs, printed as one table per script."""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


#: ``wall`` (default) times with ``time.perf_counter``; ``cpu`` with ``time.process_time`` (CPU seconds of every
#: thread of this process: robust on a machine shared with other jobs, where wall time measures the neighbours);
#: ``host`` with the CPU seconds of the threads that do host work: the calling thread and PyTorch's autograd
#: device threads (``pt_autograd_*``: a tpu tensor's backward runs there, not in the thread that called
#: ``backward``). On XLA:CPU the device is this machine's CPU: a program runs on XLA's own worker threads, which
#: also spin after each task (on a 2-core machine they measured as much CPU as the Python thread in a loop of
#: strict ``add``s), so ``cpu`` counts the device's work and its idling as host time, where on a TPU neither is.
#: The CPU eager rows run with one intra-op thread and their backward in the calling thread, so ``host`` is their
#: whole cost, compute included. Linux only (per-thread CPU clocks of other threads). Set with ``$BENCH_CLOCK`` or
#: each script's ``--clock``.
CLOCK = os.environ.get("BENCH_CLOCK", "wall")


def _thread_cpu_clock(tid: int) -> int:
    """Linux's CPU-time clock id of thread ``tid`` (``MAKE_THREAD_CPUCLOCK(tid, CPUCLOCK_SCHED)``, what glibc's
    ``pthread_getcpuclockid`` returns), readable from any thread of the process."""
    return ((~tid) << 3) | 6


def _autograd_threads() -> list[int]:
    found = []
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError), open(f"/proc/self/task/{tid}/comm") as f:
            if f.read().startswith("pt_autograd"):
                found.append(int(tid))
    return found


def _host_clock():
    """The summed CPU time of this thread and PyTorch's autograd device threads, as a clock function. The
    engine starts its device threads at the first backward through a device's tensors: a one-element one here
    when none has run yet."""
    autograd = _autograd_threads()
    if not autograd:
        import torch

        torch.ones(1, device="tpu", requires_grad=True).sum().backward()
        autograd = _autograd_threads()
    clocks = [_thread_cpu_clock(t) for t in [threading.get_native_id(), *autograd]]
    read = time.clock_gettime

    def now() -> float:
        return sum(read(c) for c in clocks)

    return now


_CLOCKS = {"wall": lambda: time.perf_counter, "cpu": lambda: time.process_time, "host": _host_clock}


def clock():
    """The clock :data:`CLOCK` names, as a function returning seconds."""
    return _CLOCKS[CLOCK]()


def _per_call(fn, finish, iters: int) -> float:
    """Seconds per call of ``fn`` over a loop of ``iters`` calls, ``finish`` waiting for the last result."""
    now = clock()
    t0 = now()
    out = None
    for _ in range(iters):
        out = fn()
    finish(out)
    return (now() - t0) / iters


def median_time(fn, finish, iters: int, reps: int, warmup: int = 3) -> float:
    """Median over ``reps`` of the mean seconds per call of ``fn`` in a loop of ``iters`` calls (``finish``
    waits for the last result)."""
    for _ in range(warmup):
        finish(fn())
    return statistics.median(_per_call(fn, finish, iters) for _ in range(reps))


def median_pair(a, finish_a, b, finish_b, iters: int, reps: int, warmup: int = 3) -> tuple[float, float, float]:
    """:func:`median_time` of ``a`` and of ``b`` measured in alternating repetitions, and the median of their
    per-repetition ratio a/b. This project's machines change speed by up to 2x for seconds at a time (both
    devices alike): a ratio of two runs taken apart can measure that instead of the code, one of neighbours
    cannot."""
    for _ in range(warmup):
        finish_a(a())
        finish_b(b())
    pairs = [(_per_call(a, finish_a, iters), _per_call(b, finish_b, iters)) for _ in range(reps)]
    return (statistics.median(p[0] for p in pairs), statistics.median(p[1] for p in pairs),
            statistics.median(p[0] / p[1] for p in pairs))


def add_clock_option(parser, host: bool = False) -> None:
    """``--clock wall|cpu``, and ``host`` for a script whose rows are all host costs (see :data:`CLOCK`): one
    whose rows include the device's work (a step against ``jax.jit``'s) must not leave XLA:CPU's threads out,
    nor one whose subject runs threads of its own (a profile's samplers)."""
    choices = ("wall", "cpu", "host") if host else ("wall", "cpu")
    parser.add_argument("--clock", choices=choices, default=CLOCK if CLOCK in choices else "wall",
                        help="wall: elapsed time; cpu: this process's CPU time (for a busy, shared machine)"
                             + ("; host: the CPU time of the threads doing host work (this one, PyTorch's "
                                "autograd threads), not XLA:CPU's, which run the device's work" if host else ""))


def set_clock(name: str) -> None:
    global CLOCK
    CLOCK = name


def table(title: str, rows: list[tuple], headers: tuple) -> str:
    widths = [max(len(str(h)), *(len(str(r[i])) for r in rows)) for i, h in enumerate(headers)]
    line = "  ".join(f"{h:<{w}}" for h, w in zip(headers, widths))
    out = [title, line, "-" * len(line)]
    out += ["  ".join(f"{str(c):<{w}}" for c, w in zip(r, widths)) for r in rows]
    return "\n".join(out)
