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
