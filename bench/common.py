"""Shared timing helpers for the benchmarks: medians of repeated runs, printed as one table per script."""

from __future__ import annotations

import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


#: ``wall`` (default) times with ``time.perf_counter``; ``cpu`` with ``time.process_time`` (CPU seconds of every
#: thread of this process: robust on a machine shared with other jobs, where wall time measures the neighbours);
#: ``thread`` with ``time.thread_time``, the CPU seconds of the calling thread alone: the *host* cost of a step.
#: On XLA:CPU the device is this machine's CPU: a program runs on XLA's own worker threads, which also spin
#: after each task (on a 2-core machine they measured as much CPU as the Python thread in a loop of strict
#: ``add``s), so ``cpu`` counts the device's work and its idling as host time, where on a TPU neither is. The
#: CPU eager rows run with one intra-op thread, so ``thread`` is their whole cost, compute included.
#: Set with ``$BENCH_CLOCK`` or each script's ``--clock``.
CLOCK = os.environ.get("BENCH_CLOCK", "wall")

_CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time, "thread": time.thread_time}


def clock():
    return _CLOCKS[CLOCK]


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


def add_clock_option(parser) -> None:
    """``--clock wall|cpu`` (see :data:`CLOCK`)."""
    parser.add_argument("--clock", choices=tuple(_CLOCKS), default=CLOCK,
                        help="wall: elapsed time; cpu: this process's CPU time (for a busy, shared machine); "
                             "thread: the calling thread's CPU time (host work only: XLA:CPU's threads run the "
                             "device's)")


def set_clock(name: str) -> None:
    global CLOCK
    CLOCK = name


def table(title: str, rows: list[tuple], headers: tuple) -> str:
    widths = [max(len(str(h)), *(len(str(r[i])) for r in rows)) for i, h in enumerate(headers)]
    line = "  ".join(f"{h:<{w}}" for h, w in zip(headers, widths))
    out = [title, line, "-" * len(line)]
    out += ["  ".join(f"{str(c):<{w}}" for c, w in zip(r, widths)) for r in rows]
    return "\n".join(out)
