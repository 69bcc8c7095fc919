"""Plain-text renderings for terminals and ``text/plain`` outputs. They take records (a profile's
:class:`~torchtpu_lab.records.Report`, the session's :class:`~torchtpu_lab.records.Status`) and read their
fields."""

from __future__ import annotations

from ..records import Finding, Metrics, Report, Status, Summary, Timing
from ..units import fmt_bytes, fmt_s  # noqa: F401  (re-exported: renderers and magics import them from here)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms"


def _dist(name: str, d: Timing | None) -> list[str]:
    if d is None:
        return [f"Metric: {name}", "  (none)"]
    return [
        f"Metric: {name}",
        f"  TotalSamples: {d.count}",
        f"  Accumulator: {_ms(d.total_s)}",
        f"  Percentiles: 50%={_ms(d.p50_s)}; 90%={_ms(d.p90_s)}; 99%={_ms(d.p99_s)}; max={_ms(d.max_s)}",
    ]


#: counters a user reads (the rest are the runtime's internals, shown by ``%tpu metrics --all``)
USER_COUNTERS = ("compiles", "compile_seconds", "executions", "syncs", "graph_ops_executed", "cpu_fallbacks",
                 "disk_loads", "op_cache_hits", "transfer_to_device_bytes", "transfer_to_host_bytes", "recompiles")


def metrics_text(s: Metrics, internals: bool = True) -> str:
    lines = [f"torchtpu_lab metrics (eager mode: {s.eager_mode})"]
    lines += _dist("CompileTime", s.compile_time)
    lines += _dist("ExecuteTime (graph dispatch)", s.execute_time)
    if s.collective_time is not None:
        lines += _dist("CollectiveTime (torch.distributed, incl. wait)", s.collective_time)
    lines.append("Counters:")
    hidden = 0
    for k, v in s.counters.items():
        if not internals and k not in USER_COUNTERS:
            hidden += 1
            continue
        lines.append(f"  {k}: {v:.4g}" if isinstance(v, float) else f"  {k}: {v}")
    if hidden:
        lines.append(f"  ({hidden} internal counters: %tpu metrics --all)")
    lines.append(f"Executables: {s.compiles} compiled by XLA, {s.disk_loads} loaded from the disk cache, "
                 f"{s.cache_hits} memory hits")
    disk = f"{s.persistent_cache_dir or 'persistent cache off'}" if internals else (
        "persistent cache on" if s.persistent_cache_dir else "persistent cache off")
    lines.append(f"Caches: {s.op_cache_entries} op executables, {s.graph_cache_entries} fused graphs in memory; "
                 f"{s.persistent_cache_entries} on disk ({disk})")
    if internals:
        for name, c in s.caches.items():
            lines.append(f"  cache {name}: {c['entries']}/{c['maxsize']} entries, {c['hits']} hits, "
                         f"{c['misses']} misses, {c['evictions']} evictions")
    elif s.caches:
        lines.append(f"  ({len(s.caches)} internal caches: %tpu metrics --all)")
    if s.recent_compiles:
        lines.append("Recent compiles:")
        for c in s.recent_compiles:
            where = f" at {c['source']}" if c["source"] else ""
            load = " [loaded from disk]" if c.get("disk") else ""
            lines.append(f"  {c['name']} ({_ms(c['seconds'])}){load}: {c['cause']}{where}")
    if s.recent_graph_breaks:
        lines.append("Recent torch.compile graph breaks:")
        for b in s.recent_graph_breaks:
            lines.append(f"  graph break at {b['source'] or 'n/a'}: {b['reason']}")
    return "\n".join(lines)


def status_rows(s: Status) -> list[tuple[str, str]]:
    """The session status as (label, formatted value) rows: bytes, percents and counts, never raw values."""
    rate = fmt_pct(s.cache_hit_rate)
    return [
        ("platform", f"{s.platform}"),
        ("devices", str(s.devices)),
        ("device core", s.device_core),
        ("eager mode", s.eager_mode),
        ("memory", f"{fmt_bytes(s.memory_allocated)} allocated, peak {fmt_bytes(s.memory_peak)}"
                   + (f", limit {fmt_bytes(s.memory_limit)}" if s.memory_limit else " (no limit reported)")),
        ("executables", f"{s.compiles} compiled, {s.disk_loads} loaded from disk, {s.cache_hits} memory hits"
                        f" (hit rate {rate})"),
        ("compile time", f"{fmt_s(s.compile_seconds)}" + (f" = {fmt_pct(s.compile_share)} of the time cells ran"
                                                          if s.compile_share is not None else "")),
        ("syncs", str(s.syncs)),
        ("CPU fallbacks", str(s.cpu_fallbacks)),
        ("pending fused ops", str(s.pending_ops)),
        ("in-memory caches", f"{s.op_executables} op executables, {s.fused_graphs} fused graphs"),
        ("compile cache", f"{s.cache_dir} ({s.cache_entries} entries)"),
    ] + ([("torch.distributed", s.distributed)] if s.distributed else []) + (
        [("torch.compile", f"{s.dynamo_graphs} graphs ({s.dynamo_recompiles} recompiles), "
                           f"{s.graph_breaks} graph breaks")] if s.dynamo_graphs else [])


def fmt_pct(fraction) -> str:
    if fraction is None:
        return "n/a"
    return f"{100 * fraction:.0f}%"


def cache_text(s: Summary) -> str:
    """Compiles, disk loads and memory hits, said separately (a disk load is not a compile)."""
    return (f"compiles {s.compiles} ({s.recompiles} re) \u00b7 disk loads {s.disk_loads} \u00b7 "
            f"memory hits {s.cache_hits}")


def python_text(s: Summary) -> str:
    """The Python share, with the garbage collector's part of it when it ran."""
    return fmt_s(s.python_s) + (f" (garbage collection {fmt_s(s.gc_s)})" if s.gc_pauses else "")


def time_text(s: Summary) -> str:
    return (f"wall {fmt_s(s.wall_s)} = Python {python_text(s)} + torchtpu_lab overhead {fmt_s(s.overhead_s)} + "
            f"tracing {fmt_s(s.tracing_s)} + compiling {fmt_s(s.compile_s)} + waiting {fmt_s(s.wait_s)}")


def summary_line(s: Summary) -> str:
    return (f"{time_text(s)} | {s.ops} ops | {s.graphs_executed} graphs | {cache_text(s)} | "
            f"{s.syncs} syncs | {s.cpu_fallbacks} CPU fallbacks | peak {fmt_bytes(s.peak_bytes)}")


def finding_text(f: Finding) -> str:
    if not f.actionable:
        return f"{f.title} took {fmt_s(f.cost_s)} ({fmt_pct(f.share)} of the cell): {f.detail}" + (
            f". {f.fix[0].upper()}{f.fix[1:]}" if f.fix else "")
    cost = f"cost {fmt_s(f.cost_s)} ({fmt_pct(f.share)} {f.base})" if f.cost_s > 0 else "(its cost is not measured)"
    return f"{f.title} {cost}: {f.detail}" + (f". Fix: {f.fix}" if f.fix else "")


def finding_lines(findings) -> list[str]:
    """The findings as numbered lines: actionable ones first, "no significant issue" when there is none, then
    the one-time warm-up (said, but not as an issue)."""
    actionable = [f for f in findings if f.actionable]
    out = [f"{i}. {finding_text(f)}" for i, f in enumerate(actionable, 1)]
    if not actionable:
        out.append(NO_ISSUE)
    out += [f"- {finding_text(f)}" for f in findings if not f.actionable]
    return out


#: what a report says when no finding reaches the noise threshold
NO_ISSUE = "no significant issue: nothing you can change costs over 5% of the steady state"

#: the time split's rows: (time label key, Summary field)
TIME_ROWS = (("python", "python_s"), ("overhead", "overhead_s"), ("tracing", "tracing_s"),
             ("compiling", "compile_s"), ("waiting", "wait_s"))


def time_rows(r: Report) -> list[tuple[float, str]]:
    """(seconds, what it measures) for the time split: the tracer's cost named where ``--xprof`` ran, the
    device time only where the trace measured it."""
    s = r.summary
    rows = []
    for key, field in TIME_ROWS:
        label = r.time_labels[key]
        if key == "python" and r.xprof_dir:
            label += "; includes the XProf tracer's own overhead"
        if key == "python" and s.gc_pauses:
            label += (f"; of it {fmt_s(s.gc_s)} in {s.gc_pauses} pause{'s' if s.gc_pauses != 1 else ''} of "
                      "Python's garbage collector")
        rows.append((getattr(s, field), label))
    if s.device_traced:
        rows.append((s.device_s, "device execution (from the XProf trace's device lane)"))
    return rows


def _code(code: str) -> str:
    return f"  `{code}`" if code else ""


def profile_text(r: Report) -> str:
    from .generation import generation_text

    s = r.summary
    mode = f" \u00b7 {s.mode} mode" if s.mode else ""
    out = [f"torchtpu_lab profile ({s.platform}){mode}", summary_line(s)]
    if s.error:
        out.append(f"the block raised {s.error} (partial report)")
    out += generation_text(r.generation)
    out.append(f"findings: (steady state compiles {s.steady_compiles})")
    out += [f"  {line}" for line in finding_lines(r.findings)]
    out.append("time:")
    for seconds, label in time_rows(r):
        out.append(f"  {fmt_s(seconds):>9}  {label}")
    if r.ops.by_time:
        out.append(f"top ops by time ({r.ops.measures}):")
        for o in r.ops.by_time:
            out.append(f"  {o.op:<40} x{o.count:<5} {fmt_s(o.total_s):>9}  {o.line}{_code(o.code)}")
    if r.compile_groups:
        out.append("compilations (grouped by cause, costliest first):")
        for g in r.compile_groups:
            mark = "RECOMPILE " if g.is_recompile else ""
            where = f" at {g.line}" if g.line else ""
            out.append(f"  {mark}{g.count} x {fmt_s(g.seconds)}: {g.pattern}{where}{_code(g.code)}")
            if g.hint:
                out.append(f"    fix: {g.hint}")
        if r.compile_groups_hidden:
            out.append(f"  ... {r.compile_groups_hidden} more groups (--top N shows more)")
    if r.graph_breaks:
        out.append("torch.compile graph breaks:")
        for b in r.graph_breaks:
            out.append(f"  graph break at {b.line}: {b.reason}")
    if r.syncs:
        out.append("syncs:")
        for g in r.syncs:
            out.append(f"  {g.count} x {g.reason} at {g.line} (waited {fmt_s(g.wait_s)}){_code(g.code)}")
            if g.hint:
                out.append(f"    hint: {g.hint}")
        if r.syncs_hidden:
            out.append(f"  ... {r.syncs_hidden} more")
    if r.collectives:
        out.append("collectives:")
        for g in r.collectives:
            out.append(f"  {g.count} x {g.kind} over {g.participants} ranks, {fmt_bytes(g.bytes)} "
                       f"in {fmt_s(g.total_s)} at {g.line}")
    if r.fallbacks:
        out.append("CPU fallbacks:")
        for f in r.fallbacks:
            out.append(f"  {f.count} x {f.op} at {f.line}{_code(f.code)}")
    out += hardware_text(r)
    m = r.memory
    out.append(f"device memory: start {fmt_bytes(m.start)}, end {fmt_bytes(m.end)}, peak {fmt_bytes(m.peak)}, "
               f"limit {fmt_bytes(m.limit)}; allocated {fmt_bytes(m.allocated)}, freed {fmt_bytes(m.freed)}")
    for t in m.largest[:5]:
        out.append(f"  {fmt_bytes(t['nbytes']):>10} {t['dtype']}{t['shape']} created at {t['source'] or 'n/a'}")
    if r.xprof_error:
        out.append(r.xprof_error)
    if r.xprof_dir:
        out.append(f"XProf trace: {r.xprof_dir}")
        out.append(f"  open it with (in a terminal):  {r.xprof_command}")
        out.append("  then browse http://localhost:8791 (the trace viewer, op profile and memory tabs)")
    return "\n".join(out)


def hardware_text(r: Report) -> list[str]:
    """How far from the hardware: FLOPs, MFU and its peaks, the programs against the roofline, memory at peak."""
    from .memory_peak import memory_at_peak_text
    from .roofline import fmt_rate, roofline_text

    s = r.summary
    out = []
    if s.flops:
        out.append(f"hardware: {fmt_rate(s.flops, 'FLOP')}, {fmt_rate(s.bytes_accessed, 'B')} accessed in "
                   f"{fmt_s(s.device_s)} of device time; MFU {fmt_pct(s.mfu)} of "
                   f"{fmt_rate(s.peak_flops, 'FLOP/s')} ({s.peak_source})")
    return out + roofline_text(r.roofline) + memory_at_peak_text(r.memory_at_peak)
