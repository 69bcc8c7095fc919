"""What held device memory at a profile's peak, owner by owner: tensors (with the line that created them),
buffers no tensor holds that a pending graph still reads, and a running graph's outputs and temporaries.

The collector snapshots the owners whenever the peak grows (see ``collector.SNAPSHOT_STEP``); this turns the
last snapshot into plain dicts. The running graph's bytes are split with XLA's ``memory_analysis()`` of it (the
``memory`` event it emitted as it started) and attributed to the user line of the sync that ran it.
"""

from __future__ import annotations

import bisect

from ..telemetry import EventKind, describe

BEFORE = "before the profile (allocation lines are tracked while a profile records)"


def _dtype(dtype) -> str:
    return str(dtype).replace("torch.", "") if dtype is not None else ""


def _running(prof, t_rel: float, nbytes: int) -> list[dict]:
    """The running graph's outputs and temporaries at ``t_rel`` seconds into the block (``nbytes`` together)."""
    t = prof.t0 + t_rel
    events = sorted(prof.of_kind(EventKind.MEMORY), key=lambda e: e.t)
    i = bisect.bisect_left([e.t for e in events], t)
    event = events[i] if i < len(events) else (events[-1] if events else None)
    syncs = [s for s in prof.syncs if s.t <= t <= s.t + s.dur]
    source = describe(syncs[-1].source) if syncs else "a graph run"
    name = event.name if event is not None else "graph"
    outputs = 0
    if event is not None:
        outputs = max(0, event.detail.get("output", 0) - event.detail.get("alias", 0))
    outputs = min(outputs, nbytes)
    out = []
    if outputs:
        out.append({"bytes": outputs, "kind": "program outputs", "shape": None, "dtype": "", "source": source,
                    "program": name})
    if nbytes - outputs:
        out.append({"bytes": nbytes - outputs, "kind": "program temporaries", "shape": None, "dtype": "",
                    "source": source, "program": name})
    return out


def at_peak(prof) -> list[dict]:
    """One dict per owner at the peak (``bytes``, ``kind``, ``shape``, ``dtype``, ``source``), largest first;
    the bytes add up to the profile's ``peak_bytes`` (within the snapshot step)."""
    snap = getattr(prof, "peak_snapshot", None)
    if snap is None:
        return []
    out = []
    for nbytes, origin, held in snap.owners:
        shape, dtype, source = origin if origin else (None, None, None)
        out.append({"bytes": int(nbytes), "kind": "tensor" if held else "released tensor (a pending graph reads it)",
                    "shape": list(shape) if shape is not None else None, "dtype": _dtype(dtype),
                    "source": describe(source) if source is not None else BEFORE})
    if snap.running:
        out += _running(prof, snap.t, snap.running)
    return sorted(out, key=lambda d: -d["bytes"])


def timeline(prof, most: int = 300) -> list[tuple[float, int, str]]:
    """Device memory over the block as ``(seconds, bytes, what)`` points, ``what`` naming the change: the torch op
    (and its line) that allocated or freed, or the graph run (and the line of its sync). At most ``most`` points:
    the largest changes are kept, and the peak."""
    ops = sorted((e for e in prof.events if e.kind in ("op", "fallback")), key=lambda e: e.t)
    starts = [e.t for e in ops]
    syncs = sorted(prof.syncs, key=lambda e: e.t)
    sync_starts = [e.t for e in syncs]

    def sync_at(t: float) -> str | None:
        i = bisect.bisect_right(sync_starts, t) - 1
        return describe(syncs[i].source) if i >= 0 and t <= syncs[i].t + syncs[i].dur + 1e-6 else None

    def what(sample) -> str:
        t = prof.t0 + sample.t
        if sample.kind == "exec":
            return f"graph run (outputs + temporaries) at {sync_at(t) or 'a sync'}"
        i = bisect.bisect_right(starts, t) - 1
        verb = "allocated" if sample.kind == "alloc" else "freed"
        if i >= 0 and t <= ops[i].t + ops[i].dur + 1e-6:
            return f"{verb} in {ops[i].name} at {describe(ops[i].source)}"
        where = sync_at(t)
        if where is not None:
            return f"{verb} as the graph of the sync at {where} ran"
        return f"{verb} between torch ops (a tensor released)" if verb == "freed" else f"{verb} outside a torch op"

    samples = prof.memory
    if len(samples) > most:
        peak = max(range(len(samples)), key=lambda i: samples[i].allocated)
        keep = sorted(range(len(samples)), key=lambda i: -samples[i].nbytes)[:most - 1]
        samples = [samples[i] for i in sorted(set(keep) | {peak})]
    points = [(0.0, prof.start_bytes, "start of the block")]
    points += [(m.t, m.allocated, f"{what(m)}: {'+' if m.kind != 'free' else '-'}{m.nbytes} B") for m in samples]
    points.append((prof.wall_s, prof.end_bytes, "end of the block"))
    return points
