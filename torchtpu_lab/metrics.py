"""A PyTorch/XLA-style metrics summary of the session, computed from the telemetry counters and logs.

:func:`collect` returns a :class:`~torchtpu_lab.records.Metrics` record (executables counted under the names of
:class:`~torchtpu_lab.telemetry.Counter`, as in a profile's summary and ``%tpu``), :func:`summary` the same as
plain data, and :func:`metrics_report` renders it as text. A recent compile's ``cause`` is its
:class:`~torchtpu_lab.causes.Cause` record.
"""

from __future__ import annotations

import statistics

from . import telemetry
from .records import Metrics, Timing
from .telemetry import Counter


def _timing(values: list[float]) -> Timing | None:
    if not values:
        return None
    ordered = sorted(values)

    def pct(p: float) -> float:
        return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]

    return Timing(len(ordered), sum(ordered), statistics.fmean(ordered), pct(50), pct(90), pct(99), ordered[-1])


def collect() -> Metrics:
    """Counters and timing distributions since the start of the session (or the last reset), as a record."""
    from . import caches
    from .runtime import compile_cache, executor, fused, modes

    from .distributed import process_group

    c = telemetry.counters
    compiles = list(telemetry.compile_log)
    return Metrics(
        eager_mode=modes.current(),
        counters={str(k): (int(v) if float(v).is_integer() else v) for k, v in sorted(c.items())},
        compile_time=_timing([e.dur for e in compiles]),
        execute_time=_timing([e.dur for e in telemetry.execute_log]),
        collective_time=_timing([entry[3] for entry in process_group.collective_log]),
        compiles=int(c.get(Counter.COMPILES, 0)),
        disk_loads=int(c.get(Counter.DISK_LOADS, 0)),
        cache_hits=telemetry.memory_hits(),
        recent_compiles=tuple(
            {"name": e.name, "cause": e.detail.get("cause"), "seconds": e.dur, "disk": bool(e.detail.get("disk")),
             "source": str(e.source) if e.source else None}
            for e in compiles[-10:]),
        recent_graph_breaks=tuple(
            {"reason": e.name, "source": str(e.source) if e.source else None}
            for e in list(telemetry.graph_break_log)[-10:]),
        op_cache_entries=executor.cache_size(),
        graph_cache_entries=fused.graph_cache_size(),
        caches=caches.stats(),
        persistent_cache_dir=compile_cache.directory(),
        persistent_cache_entries=compile_cache.entries(),
    )


def summary() -> dict:
    """:func:`collect` as plain data (counts, totals, percentiles)."""
    return collect().as_dict()


def metrics_report(internals: bool = True) -> str:
    """The summary as text, like ``torch_xla.debug.metrics.metrics_report()``; ``internals=False`` folds the
    runtime's internal caches and counters into one line each (what ``%tpu metrics`` shows)."""
    from .render.text import metrics_text

    return metrics_text(collect(), internals)
