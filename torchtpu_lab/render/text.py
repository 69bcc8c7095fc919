"""Plain-text renderings for terminals and ``text/plain`` outputs."""

from __future__ import annotations

from ..units import fmt_bytes, fmt_s  # noqa: F401  (re-exported: renderers and magics import them from here)


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
    if s.get("collective_time"):
        lines += _dist("CollectiveTime (torch.distributed, incl. wait)", s["collective_time"])
    lines.append("Counters:")
    for k, v in s["counters"].items():
        lines.append(f"  {k}: {v:.4g}" if isinstance(v, float) else f"  {k}: {v}")
    lines.append(f"Caches: {s['op_cache_entries']} op executables, {s['graph_cache_entries']} fused graphs in memory; "
                 f"{s['persistent_cache_entries']} on disk ({s['persistent_cache_dir'] or 'persistent cache off'})")
    for name, c in s.get("caches", {}).items():
        lines.append(f"  cache {name}: {c['entries']}/{c['maxsize']} entries, {c['hits']} hits, {c['misses']} misses, "
                     f"{c['evictions']} evictions")
    if s["recent_compiles"]:
        lines.append("Recent compiles:")
        for c in s["recent_compiles"]:
            where = f" at {c['source']}" if c["source"] else ""
            lines.append(f"  {c['name']} ({_ms(c['seconds'])}): {c['cause']}{where}")
    if s.get("recent_graph_breaks"):
        lines.append("Recent torch.compile graph breaks:")
        for b in s["recent_graph_breaks"]:
            lines.append(f"  graph break at {b['source'] or 'n/a'}: {b['reason']}")
    return "\n".join(lines)


def summary_line(s: dict) -> str:
    rate = "n/a" if s["cache_hit_rate"] is None else f"{100 * s['cache_hit_rate']:.0f}%"
    return (f"wall {fmt_s(s['wall_s'])} | device {fmt_s(s['device_s'])} | {s['ops']} ops | "
            f"{s['graphs_executed']} graphs | {s['compiles']} compiles ({s['recompiles']} recompiles) | "
            f"cache hit rate {rate} | {s['syncs']} syncs | {s['cpu_fallbacks']} CPU fallbacks | "
            f"peak {fmt_bytes(s['peak_bytes'])}")


def profile_text(r: dict) -> str:
    s = r["summary"]
    out = [f"torchtpu_lab profile ({s['platform']})", summary_line(s)]
    if s["error"]:
        out.append(f"the block raised {s['error']} (partial report)")
    if r["ops"]["by_time"]:
        out.append("top ops by time:")
        for o in r["ops"]["by_time"]:
            out.append(f"  {o['op']:<40} x{o['count']:<5} {fmt_s(o['total_s']):>9}  {o['line']}")
    if r["compiles"]:
        out.append("compilations:")
        for c in r["compiles"]:
            mark = "RECOMPILE " if c["recompile"] else ""
            out.append(f"  {mark}{c['name']} {fmt_s(c['seconds'])} at {c['line']}: {c['cause']}")
    if r.get("graph_breaks"):
        out.append("torch.compile graph breaks:")
        for b in r["graph_breaks"]:
            out.append(f"  graph break at {b['line']}: {b['reason']}")
    if r["syncs"]:
        out.append("syncs:")
        for g in r["syncs"]:
            out.append(f"  {g['count']} x {g['reason']} at {g['line']} (waited {fmt_s(g['wait_s'])})")
            if g["hint"]:
                out.append(f"    hint: {g['hint']}")
    if r.get("collectives"):
        out.append("collectives:")
        for g in r["collectives"]:
            out.append(f"  {g['count']} x {g['kind']} over {g['participants']} ranks, {fmt_bytes(g['bytes'])} "
                       f"in {fmt_s(g['total_s'])} at {g['line']}")
    if r["fallbacks"]:
        out.append("CPU fallbacks:")
        for f in r["fallbacks"]:
            out.append(f"  {f['count']} x {f['op']} at {f['line']}")
    m = r["memory"]
    out.append(f"device memory: start {fmt_bytes(m['start'])}, end {fmt_bytes(m['end'])}, peak {fmt_bytes(m['peak'])}, "
               f"limit {fmt_bytes(m['limit'])}; allocated {fmt_bytes(m['allocated'])}, freed {fmt_bytes(m['freed'])}")
    for t in m["largest"][:5]:
        out.append(f"  {fmt_bytes(t['nbytes']):>10} {t['dtype']}{t['shape']} created at {t['source'] or 'n/a'}")
    if r["xprof_dir"]:
        out.append(f"XProf trace: {r['xprof_dir']}")
        out.append(f"  open it with:  tensorboard --logdir {r['xprof_dir']}   (then the Profile tab)")
    return "\n".join(out)
