"""Where a fused graph that grows past the size limit is cut, so that a repeating training step cuts the same way
every time and steady-state steps compile nothing.

The naive rule — flush once ``config.max_graph_ops`` ops are pending — cuts at a position that depends on how many
ops were pending when the step began. A step of 2,300 ops under a limit of 2,000 with no sync in between leaves
300 ops pending for the next step, which then cuts 300 ops earlier, and so on: the cut drifts through the step
and every step compiles new graphs (23 distinct graphs before the pattern repeats).

The rule here is *content-defined*. When the limit forces a cut, the identities of the last :data:`CONTEXT`
recorded op signatures become an **anchor**. From then on, the graph is also cut whenever the most recent ops
match an anchor, however many ops are pending. In a repeating step the forced cuts therefore land on anchors
that recur at the same op of every step; once the anchors cover the step at intervals no longer than the
limit, no forced cut happens any more and every step is cut at the same ops into the same graphs (for a step of
2.5x the limit: three cuts, the same three graphs each step). Anchors are op *signatures* (shapes, dtypes,
op), never values, and a bounded, least-recently-matched set, so a different program just adds its own.

An anchor must name *one* place in the program. In repetitive code — a chain of identical ops, a loop unrolled
into the graph, identical layers — the context of a cut recurs a few ops later, and cutting at every
recurrence would run a graph per loop iteration (a 10,000-op chain once synced 8,000 times). So an anchor that
matches again within :data:`MIN_GAP_FRACTION` of the size limit of where it last cut is ambiguous and is
forgotten (no cut there); a training step's anchors recur once per step, far apart.

User-visible syncs (``.item()``, ``print``, ``torchtpu_lab.sync()``) always flush *everything* pending; they
are the other stable boundary.
"""

from __future__ import annotations

from collections import OrderedDict, deque

#: how many of the most recent op signatures identify a cut point
CONTEXT = 8
#: how many cut points are remembered (least recently matched forgotten first)
MAX_ANCHORS = 64
#: an anchor matching again within this fraction of the size limit (in recorded ops) is ambiguous
MIN_GAP_FRACTION = 1 / 8


class CutPoints:
    """The recent op identities and the remembered anchors (one per process, owned by :mod:`.fused`)."""

    __slots__ = ("tail", "anchors", "last_ids", "forced", "anchored")

    def __init__(self) -> None:
        self.tail: deque = deque(maxlen=CONTEXT)  # ids of the last recorded ops' traceable functions
        self.anchors: OrderedDict = OrderedDict()  # tuple of CONTEXT ids -> op count when it last cut
        self.last_ids: set = set()  # last id of every anchor: a cheap pre-check per recorded op
        self.forced = 0  # cuts forced by the size limit (each made a new anchor)
        self.anchored = 0  # cuts made at an anchor

    def note(self, op_id: int) -> None:
        """An op was recorded (hot path: one deque append)."""
        self.tail.append(op_id)

    def at_anchor(self, seq: int, limit: int) -> bool:
        """Whether the ops just recorded (``seq``: ops recorded ever) end at a remembered, unambiguous cut point
        (``limit``: the graph size limit)."""
        tail = self.tail
        if not tail or tail[-1] not in self.last_ids:
            return False
        key = tuple(tail)
        last = self.anchors.get(key)
        if last is None:
            return False
        if seq - last < limit * MIN_GAP_FRACTION:  # recurs within a short period: names no one place
            del self.anchors[key]
            self.last_ids = {k[-1] for k in self.anchors}
            return False
        self.anchors[key] = seq
        self.anchors.move_to_end(key)
        self.anchored += 1
        return True

    def force(self, seq: int) -> None:
        """The size limit cut the graph here (after op ``seq``): remember this point as an anchor."""
        self.forced += 1
        key = tuple(self.tail)
        if not key:
            return
        self.anchors[key] = seq
        self.anchors.move_to_end(key)
        if len(self.anchors) > MAX_ANCHORS:
            self.anchors.popitem(last=False)
            self.last_ids = {k[-1] for k in self.anchors}
        else:
            self.last_ids.add(key[-1])

    def clear(self) -> None:
        self.tail.clear()
        self.anchors.clear()
        self.last_ids.clear()
        self.forced = self.anchored = 0
