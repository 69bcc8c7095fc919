"""Plain-text renderings for terminals and ``text/plain`` outputs."""

from __future__ import annotations


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms"


def _dist(name: str, d: dict) -> list[str]:
    if not d:
        return [f"Metric: {name}", "  (none)"]
    return [
        f"Metric: {name}",
        f"  TotalSamples: {d['count']}",
        f"  Accumulator: {_ms(d['total_s'])}",
        f"  Percentiles: 50%={_ms(d['p50_s'])}; 90%={_ms(d['p90_s'])}; 99%={_ms(d['p99_s'])}; "
        f"max={_ms(d['max_s'])}",
    ]


def metrics_text(s: dict) -> str:
    lines = [f"torchtpu_lab metrics (eager mode: {s['eager_mode']})"]
    lines += _dist("CompileTime", s["compile_time"])
    lines += _dist("ExecuteTime (graph dispatch)", s["execute_time"])
    lines.append("Counters:")
    for k, v in s["counters"].items():
        lines.append(f"  {k}: {v:.4g}" if isinstance(v, float) else f"  {k}: {v}")
    lines.append(f"Caches: {s['op_cache_entries']} op executables, {s['graph_cache_entries']} fused graphs in memory; "
                 f"{s['persistent_cache_entries']} on disk ({s['persistent_cache_dir'] or 'persistent cache off'})")
    if s["recent_compiles"]:
        lines.append("Recent compiles:")
        for c in s["recent_compiles"]:
            where = f" at {c['source']}" if c["source"] else ""
            lines.append(f"  {c['name']} ({_ms(c['seconds'])}): {c['cause']}{where}")
    return "\n".join(lines)
