"""A profile's events as timeline lanes for trace viewers (Perfetto, chrome://tracing): host ops, syncs,
compiles and program runs as spans on their own lanes, device memory as a counter. Plain data; the JSON format
is :mod:`torchtpu_lab.render.trace_export`'s job."""

from __future__ import annotations

from dataclasses import dataclass

from ..telemetry import describe

#: lane of each event kind, in the order the viewer shows them
LANES = {"op": "host: torch ops", "fallback": "host: torch ops", "sync": "host: syncs", "compile": "compiles",
         "graph": "device: XLA programs", "collective": "collectives"}


@dataclass(frozen=True)
class Span:
    lane: str
    name: str
    start_s: float  # since the block started
    dur_s: float
    args: dict


def _args(e) -> dict:
    out = {"line": describe(e.source)} if e.source is not None else {}
    d = e.detail
    if e.kind == "compile":
        out.update(cause=str(d.get("cause", "")), n_ops=d.get("n_ops"), from_disk=bool(d.get("disk")))
    elif e.kind == "graph":
        cost = d.get("cost")
        out.update(n_ops=d.get("n_ops"), cache_hit=d.get("cache_hit"))
        if cost is not None:
            out.update(flops=cost.flops, bytes_accessed=cost.bytes_accessed)
    elif e.kind == "sync":
        out.update(pending_ops=d.get("pending_ops"))
    return out


def trace_events(prof) -> dict:
    """``{"spans": [Span], "memory": [(seconds, bytes)], "lanes": [lane names]}`` for one profile."""
    spans = [Span(LANES[e.kind], e.name, e.t - prof.t0, max(e.dur, 0.0), _args(e))
             for e in prof.events if e.kind in LANES]
    memory = [(0.0, prof.start_bytes)] + [(m.t, m.allocated) for m in prof.memory] + [(prof.wall_s, prof.end_bytes)]
    return {"spans": spans, "memory": memory, "lanes": list(dict.fromkeys(LANES.values())),
            "title": f"torchtpu_lab profile ({prof.platform})"}
