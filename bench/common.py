"""Shared timing helpers for the benchmarks: medians of repeated runs, printed as one table per script."""

from __future__ import annotations

import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def median_time(fn, finish, iters: int, reps: int, warmup: int = 3) -> float:
    """Median over ``reps`` of the mean seconds per call of ``fn`` in a loop of ``iters`` calls (``finish``
    waits for the last result)."""
    for _ in range(warmup):
        finish(fn())
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        out = None
        for _ in range(iters):
            out = fn()
        finish(out)
        samples.append((time.perf_counter() - t0) / iters)
    return statistics.median(samples)


def table(title: str, rows: list[tuple], headers: tuple) -> str:
    widths = [max(len(str(h)), *(len(str(r[i])) for r in rows)) for i, h in enumerate(headers)]
    line = "  ".join(f"{h:<{w}}" for h, w in zip(headers, widths))
    out = [title, line, "-" * len(line)]
    out += ["  ".join(f"{str(c):<{w}}" for c, w in zip(r, widths)) for r in rows]
    return "\n".join(out)
