"""A PyTorch/XLA-style metrics summary of the session, computed from the telemetry counters and logs.

:func:`summary` returns plain data (counts, totals, percentiles; the executables under the names of
:class:`~torchtpu_lab.telemetry.Counter`, as in a profile's summary and ``%tpu``); :func:`metrics_report` renders
it as text. A recent compile's ``cause`` is its :class:`~torchtpu_lab.causes.Cause` record.
"""

from __future__ import annotations

import statistics

from . import telemetry
from .telemetry import Counter


def _percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)

    def pct(p: float) -> float:
        return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]

    return {"count": len(ordered), "total_s": sum(ordered), "mean_s": statistics.fmean(ordered),
            "p50_s": pct(50), "p90_s": pct(90), "p99_s": pct(99), "max_s": ordered[-1]}


def summary() -> dict:
    """Counters and timing distributions since the start of the session (or the last reset)."""
    from . import caches
    from .runtime import compile_cache, executor, lazy, modes

    from .distributed import process_group

    c = telemetry.counters
    compiles = list(telemetry.compile_log)
    return {
        "eager_mode": modes.current(),
        "counters": {k: (int(v) if float(v).is_integer() else v) for k, v in sorted(c.items())},
        "compile_time": _percentiles([e.dur for e in compiles]),
        "execute_time": _percentiles([e.dur for e in telemetry.execute_log]),
        "collective_time": _percentiles([entry[3] for entry in process_group.collective_log]),
        "executables": {Counter.COMPILES.value: int(c.get(Counter.COMPILES, 0)),
                        Counter.DISK_LOADS.value: int(c.get(Counter.DISK_LOADS, 0)),
                        "cache_hits": telemetry.memory_hits()},
        "recent_compiles": [
            {"name": e.name, "cause": e.detail.get("cause"), "seconds": e.dur, "disk": bool(e.detail.get("disk")),
             "source": str(e.source) if e.source else None}
            for e in compiles[-10:]
        ],
        "recent_graph_breaks": [
            {"reason": e.name, "source": str(e.source) if e.source else None}
            for e in list(telemetry.graph_break_log)[-10:]
        ],
        "op_cache_entries": executor.cache_size(),
        "graph_cache_entries": lazy.graph_cache_size(),
        "caches": caches.stats(),
        "persistent_cache_dir": compile_cache.directory(),
        "persistent_cache_entries": compile_cache.entries(),
    }


def metrics_report() -> str:
    """The summary as text, like ``torch_xla.debug.metrics.metrics_report()``."""
    from .render.text import metrics_text

    return metrics_text(summary())
