"""The pending graph's in-memory key, built as ops are recorded rather than at the sync.

A sync used to walk the recorded graph twice before it could look up its executable: a depth-first walk from
the values it must produce (to find the live nodes) and a pass building each node's wiring and the leaf inputs.
On a small model that is a good part of a step's host time (the ecosystem issue measured ~5 ms of a 36 ms GPT-2
step). :class:`Segment` does the second pass while recording — each new node's wiring is known the moment it is
recorded — and replaces the first by a check: when every node recorded since the last sync is *live* (consumed
by a later node, or one of the values the sync must produce) the graph is exactly those nodes in recording
order, and the key built so far is the key. When some nodes are dead (a temporary whose result was dropped) the
key of the live ones is renumbered from it (:meth:`Segment._live`). Otherwise (an input from before the last
sync, a failed input) :meth:`Segment.key` says so and the sync builds the key the long way; both ways give the
same key for the same graph.
"""

from __future__ import annotations

import weakref

import jax

from ..device.storage import FailedValue


def _keep_tracked(*objects) -> None:
    """Without the native core the pending graph's objects stay on the garbage collector's lists (correct; every
    collection walks them)."""


#: ``untrack(*objects)``: take pending-graph objects that cannot close a reference cycle (a node, its
#: placeholders, the weak reference to it: each refers only to older objects) off the garbage collector's
#: lists. A recorded graph keeps thousands of them alive until its sync; tracked, every collection walked them
#: and promoted them until a full collection (~250 ms in a process holding torch and JAX) came due. The native
#: core's ``untrack`` once it is configured (runtime/recording.py), else nothing.
untrack = _keep_tracked


class Segment:
    """What was recorded since the last sync, as a graph key under construction (owned by ``fused.PENDING``)."""

    __slots__ = ("token", "refs", "node_keys", "leaves", "leaf_sigs", "leaf_pos", "regular")

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.token = object()  # nodes of this segment carry it: an input from another segment is seen at once
        self.refs: list = []  # weak references to the nodes, in recording order
        self.node_keys: list = []  # (op uid, wiring) per node, as fused._build_key lays them out
        self.leaves: list = []
        self.leaf_sigs: list = []
        self.leaf_pos: dict = {}  # id(array) -> leaf position (an array read by several nodes is one input)
        self.regular = True

    def add(self, node, lazy_type) -> None:
        """Note a just-recorded node (hot path)."""
        if not self.regular:
            return
        leaves, leaf_pos, refs = self.leaves, self.leaf_pos, []
        for v in node.inputs:
            if type(v) is lazy_type:
                src = v.node
                if src.segment is not self.token:
                    self.regular = False
                    return
                src.used = True
                refs.append((src.position, v.index))
            elif isinstance(v, jax.Array):
                p = leaf_pos.get(id(v))
                if p is None:
                    p = leaf_pos[id(v)] = len(leaves)
                    leaves.append(v)
                    self.leaf_sigs.append((v.shape, v.dtype))
                refs.append((-1, p))
            elif isinstance(v, FailedValue):
                self.regular = False
                return
            else:  # a dynamic Python scalar: one input per use
                refs.append((-1, len(leaves)))
                leaves.append(v)
                self.leaf_sigs.append(type(v))
        node.segment = self.token
        node.position = len(self.refs)
        ref = weakref.ref(node)
        untrack(ref)
        self.refs.append(ref)
        self.node_keys.append((node.uid, tuple(refs)))

    def key(self, targets: list):
        """``(nodes, node keys, leaves, leaf signatures, target wiring)`` of the graph that computes ``targets``
        when all of it was recorded in this segment, else ``None`` (then the caller walks the graph)."""
        if not self.regular:
            return None
        nodes = [r() for r in self.refs]
        wanted = set()
        for t in targets:
            if t.node.segment is not self.token:
                return None
            wanted.add(t.node.position)
        for n in nodes:
            if n is None or not (n.used or n.position in wanted):
                return self._live(nodes, wanted, targets)
        return (nodes, tuple(self.node_keys), self.leaves, tuple(self.leaf_sigs),
                tuple((t.node.position, t.index) for t in targets))

    def _live(self, nodes: list, wanted: set, targets: list):
        """The key of the segment's live nodes only — those ``targets`` depend on — when some nodes are dead (a
        temporary whose result was dropped, a mask a model built and did not use): the nodes and leaves the
        sync's own walk would keep, renumbered in the same order, so both ways give the same key."""
        node_keys = self.node_keys
        live = [False] * len(nodes)
        for p in wanted:
            live[p] = True
        for i in range(len(nodes) - 1, -1, -1):
            if live[i]:
                for p, _ in node_keys[i][1]:
                    if p >= 0:
                        live[p] = True
        position: dict[int, int] = {}
        kept, keys, leaves, leaf_sigs, leaf_pos = [], [], [], [], {}
        for i, n in enumerate(nodes):
            if not live[i]:
                continue
            position[i] = len(kept)
            kept.append(n)
            uid, refs = node_keys[i]
            wiring = []
            for p, j in refs:
                if p >= 0:
                    wiring.append((position[p], j))
                    continue
                q = leaf_pos.get(j)
                if q is None:
                    q = leaf_pos[j] = len(leaves)
                    leaves.append(self.leaves[j])
                    leaf_sigs.append(self.leaf_sigs[j])
                wiring.append((-1, q))
            keys.append((uid, tuple(wiring)))
        return (kept, tuple(keys), leaves, tuple(leaf_sigs),
                tuple((position[t.node.position], t.index) for t in targets))
