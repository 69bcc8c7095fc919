"""Profiles as files other tools open: Chrome/Perfetto trace JSON (https://ui.perfetto.dev, chrome://tracing)
and speedscope JSON (https://www.speedscope.app) for the flame graph."""

from __future__ import annotations

import json
import os


def chrome_trace(data: dict) -> dict:
    """The Chrome trace event format: one thread per lane (``ph: "X"`` spans in microseconds) and a ``"C"``
    counter for device memory."""
    tids = {lane: i + 1 for i, lane in enumerate(data["lanes"])}
    events = [{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": data["title"]}}]
    events += [{"ph": "M", "name": "thread_name", "pid": 1, "tid": tid, "args": {"name": lane}}
               for lane, tid in tids.items()]
    events += [{"ph": "M", "name": "thread_sort_index", "pid": 1, "tid": tid, "args": {"sort_index": tid}}
               for tid in tids.values()]
    for s in data["spans"]:
        events.append({"ph": "X", "name": s.name, "cat": s.lane, "pid": 1, "tid": tids[s.lane],
                       "ts": s.start_s * 1e6, "dur": s.dur_s * 1e6, "args": s.args})
    events += [{"ph": "C", "name": "device memory", "pid": 1, "ts": t * 1e6, "args": {"bytes": b}}
               for t, b in data["memory"]]
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def speedscope(tree, name: str) -> dict:
    """A speedscope "sampled" profile of a flame tree: one sample per node that has time of its own (its value
    less its children's), the stack from the root to it, weighted in seconds."""
    parent = dict(zip(tree.ids, tree.parents))
    label = dict(zip(tree.ids, tree.labels))
    value = dict(zip(tree.ids, tree.values))
    children_total: dict = {}
    for node, p in parent.items():
        if p:
            children_total[p] = children_total.get(p, 0.0) + value[node]
    frames: list[dict] = []
    frame_index: dict = {}
    samples, weights = [], []
    for node in tree.ids:
        own = value[node] - children_total.get(node, 0.0)
        if own <= 0:
            continue
        stack, n = [], node
        while n:
            stack.append(n)
            n = parent[n]
        path = []
        for n in reversed(stack):
            if n not in frame_index:
                frame_index[n] = len(frames)
                frames.append({"name": label[n]})
            path.append(frame_index[n])
        samples.append(path)
        weights.append(own)
    total = sum(weights)
    return {"$schema": "https://www.speedscope.app/file-format-schema.json",
            "shared": {"frames": frames},
            "profiles": [{"type": "sampled", "name": name, "unit": "seconds", "startValue": 0,
                          "endValue": total, "samples": samples, "weights": weights}],
            "name": name, "exporter": "torchtpu_lab"}


def write_json(path: str, data: dict) -> str:
    """Write ``data`` to ``path`` (its folder created); returns ``path``."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    with open(path, "w") as f:
        json.dump(data, f, default=str)
    return path
