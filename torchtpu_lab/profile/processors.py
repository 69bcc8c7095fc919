"""Turn a :class:`~.session.Profile`'s events into what a report shows: tables, groups, a flame tree.

Everything here is computation on plain data; rendering lives in :mod:`torchtpu_lab.render`.
"""

from __future__ import annotations

import glob
import gzip
import json
import os
from collections import Counter, defaultdict
from dataclasses import dataclass, field


from ..runtime import lazy
from ..telemetry import SyncReason
from ..telemetry import describe as _where

#: what a profile suggests when the graph size limit cut the work (see runtime/graph_cuts.py)
LIMIT_HINT = (
    "{count} flushes at the graph size limit (torchtpu_lab.runtime.lazy.max_graph_ops = {limit} ops): the step "
    "records more ops than one graph may hold, so it runs as several graphs, cut at the same ops every step "
    "(steady steps compile nothing). To run it as one graph, raise the limit (longer compiles, more memory); "
    "a torchtpu_lab.sync() at the end of each step makes the step boundary explicit"
)


def device_seconds(prof) -> float:
    """Device time: XProf trace device events when recorded, else the host's time waiting at sync points."""
    if prof.xprof_dir:
        traced = _xprof_device_seconds(prof.xprof_dir)
        if traced is not None:
            return traced
    return sum(e.dur for e in prof.syncs)


def _xprof_device_seconds(directory: str) -> float | None:
    files = sorted(glob.glob(os.path.join(directory, "**", "*.trace.json.gz"), recursive=True))
    if not files:
        return None
    with gzip.open(files[-1], "rt") as f:
        trace = json.load(f)
    pids = {e["pid"]: e["args"]["name"] for e in trace.get("traceEvents", [])
            if e.get("ph") == "M" and e.get("name") == "process_name" and "args" in e}
    device = {pid for pid, name in pids.items() if "/device:" in name}
    total_us = sum(e.get("dur", 0) for e in trace.get("traceEvents", [])
                   if e.get("ph") == "X" and e.get("pid") in device)
    return total_us / 1e6 if device else None


def op_table(prof, top: int) -> dict:
    """Top ``top`` torch ops by total host time and by count, each with the user line that issued most of them."""
    total, count, lines = defaultdict(float), Counter(), defaultdict(Counter)
    for e in prof.ops:
        total[e.name] += e.dur
        count[e.name] += 1
        lines[e.name][_where(e.source)] += 1
    rows = [{"op": name, "count": count[name], "total_s": total[name], "mean_s": total[name] / count[name],
             "line": lines[name].most_common(1)[0][0]} for name in count]
    return {
        "by_time": sorted(rows, key=lambda r: -r["total_s"])[:top],
        "by_count": sorted(rows, key=lambda r: -r["count"])[:top],
        "distinct": len(rows),
    }


def compile_rows(prof) -> list[dict]:
    return [{"name": e.name, "kind": e.detail.get("kind"), "n_ops": e.detail.get("n_ops"), "seconds": e.dur,
             "cause": e.detail.get("cause", ""), "line": _where(e.source), "recompile": e.detail.get("recompile")}
            for e in prof.compiles]


def sync_groups(prof) -> list[dict]:
    """Syncs grouped by reason and line; several at one line in one block means a sync inside a loop."""
    groups: dict[tuple, dict] = {}
    for e in prof.syncs:
        key = (e.name, _where(e.source))
        reason = e.detail.get("reason")
        g = groups.setdefault(key, {"reason": e.name, "line": key[1], "count": 0, "wait_s": 0.0,
                                    "reads_value": reason is None or reason.reads_value,
                                    "limit": reason is SyncReason.GRAPH_LIMIT})
        g["count"] += 1
        g["wait_s"] += e.dur
    out = sorted(groups.values(), key=lambda g: -g["count"])
    for g in out:
        # a sync that reads no value back (a per-step torchtpu_lab.sync()) is a step boundary, not a mistake
        reads_value = g.pop("reads_value")
        if g.pop("limit"):
            g["hint"] = LIMIT_HINT.format(count=g["count"], limit=lazy.max_graph_ops)
            continue
        g["hint"] = (
            f"{g['count']} value reads at {g['line']}: a line that runs repeatedly and stops the device each "
            "time; keep the value on the device (accumulate in a tensor) and read it once at the end"
            if g["count"] > 1 and reads_value else ""
        )
    return out


def fallback_groups(prof) -> list[dict]:
    c = Counter((e.name, _where(e.source)) for e in prof.fallbacks)
    return [{"op": op, "line": line, "count": n} for (op, line), n in c.most_common()]


def memory_report(prof) -> dict:
    freed = sum(m.nbytes for m in prof.memory if m.kind == "free")
    allocated = sum(m.nbytes for m in prof.memory if m.kind == "alloc")
    timeline = [(0.0, prof.start_bytes)] + [(m.t, m.allocated) for m in prof.memory] + [(prof.wall_s, prof.end_bytes)]
    return {"start": prof.start_bytes, "end": prof.end_bytes, "peak": prof.peak_bytes, "limit": prof.limit_bytes,
            "allocated": allocated, "freed": freed, "timeline": _thin(timeline, 500),
            "largest": prof.live_at_end}


def _thin(points: list, n: int) -> list:
    if len(points) <= n:
        return points
    step = len(points) / n
    kept = [points[int(i * step)] for i in range(n)]
    peak = max(points, key=lambda p: p[1])
    return sorted(set(kept + [peak, points[-1]]))


@dataclass
class FlameTree:
    """Nodes of an icicle/flame chart: parallel lists, values in seconds, parents' values >= their children's."""

    ids: list = field(default_factory=list)
    labels: list = field(default_factory=list)
    parents: list = field(default_factory=list)
    values: list = field(default_factory=list)

    def total(self) -> float:
        return self.values[0] if self.values else 0.0


def flame_tree(prof) -> FlameTree:
    """User lines -> torch ops / syncs -> compiles and XLA graph executions, sized by host time."""
    nodes: dict[str, list] = {}  # id -> [label, parent, own value]
    children: dict[str, list[str]] = defaultdict(list)

    def add(node_id: str, label: str, parent: str, value: float) -> str:
        if node_id not in nodes:
            nodes[node_id] = [label, parent, 0.0]
            children[parent].append(node_id)
        nodes[node_id][2] += value
        return node_id

    root = "cell"
    nodes[root] = ["cell", "", 0.0]
    top = [e for e in prof.events if e.kind in ("op", "sync", "fallback")]
    nested = [e for e in prof.events if e.kind in ("compile", "graph")]
    spans = []
    for e in top:
        line = _where(e.source)
        line_id = add(f"line:{line}", line, root, 0.0)
        label = e.name if e.kind == "op" else f"{e.kind}: {e.name}"
        node = add(f"{line_id}/{e.kind}:{e.name}", label, line_id, e.dur)
        spans.append((e.t, e.t + e.dur, node))
    for e in nested:
        parent = next((n for a, b, n in spans if a <= e.t <= b), None)
        label = f"compile {e.name}" if e.kind == "compile" else f"XLA {e.name}"
        if parent is None:
            line = _where(e.source)
            parent = add(f"line:{line}", line, root, 0.0)
        add(f"{parent}/{e.kind}:{e.name}", label, parent, e.dur)

    def settle(node_id: str) -> float:
        kids = sum(settle(c) for c in children[node_id])
        nodes[node_id][2] = max(nodes[node_id][2], kids)
        return nodes[node_id][2]

    covered = settle(root)
    wall = max(prof.wall_s, covered)
    if wall - covered > 0:
        add("python", "Python (not in torch ops)", root, wall - covered)
    nodes[root][2] = wall
    tree = FlameTree()
    for node_id, (label, parent, value) in nodes.items():
        tree.ids.append(node_id)
        tree.labels.append(label)
        tree.parents.append(parent)
        tree.values.append(value)
    return tree


def build_report(prof, top: int = 10) -> dict:
    """Everything the renderers show, computed once."""
    summary = prof.summary()
    return {
        "summary": summary,
        "ops": op_table(prof, top),
        "compiles": compile_rows(prof),
        "syncs": sync_groups(prof),
        "fallbacks": fallback_groups(prof),
        "memory": memory_report(prof),
        "flame": flame_tree(prof),
        "xprof_dir": prof.xprof_dir,
    }
