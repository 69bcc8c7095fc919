"""The pending graph's in-memory key, built as ops are recorded rather than at the sync.

A sync used to walk the recorded graph twice before it could look up its executable: a depth-first walk from
the values it must produce (to find the live nodes) and a pass building each node's wiring and the leaf inputs.
On a small model that is a good part of a step's host time (the ecosystem issue measured ~5 ms of a 36 ms GPT-2
step). :class:`Segment` does the second pass while recording — each new node's wiring is known the moment it is
recorded — and the first is replaced by a plan worked out once per graph structure (:class:`_Plan`): which nodes
the wanted values depend on (all of them, in a training step: the key built so far is the key), and when some
are dead (a temporary whose result was dropped), the renumbered key of the live ones. A step that records the
same ops at every iteration finds its structure and its plan without a Python pass over every node: its nodes'
keys were compared with the last sync's structure as they were recorded (:class:`Segment`), or, when they
differed, its structure is hashed and compared once (:func:`canonical`). Otherwise (an input from before the last
sync, a failed input) :meth:`Segment.key` says so and the sync builds the key the long way; both ways give the
same key for the same graph.
"""

from __future__ import annotations

import operator
import weakref

import jax

from .. import caches
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
#: the native core's ``segment_add(segment, node) -> bool`` (``None``: pure-Python mode): :meth:`Segment.add` in C
#: for a node the Python path recorded (its inputs placeholders, arrays and numbers: ``False`` leaves the rest to
#: Python); a one-op optimizer step's node has a few hundred inputs
NATIVE_ADD: list = [None]


class Segment:
    """What was recorded since the last sync, as a graph key under construction (owned by ``fused.PENDING``).

    A loop records the same graph at every step, so each new node's key is compared, as it is recorded, with the
    key at the same position of the structure the last sync found (``expect``). While they agree nothing is
    stored (``matching``: ``node_keys`` stays empty; the native core makes no key tuples either), and a sync whose
    every node agreed takes ``expect`` and its plans as they are: no structure to build, hash or compare with the
    stored one, which a step's other work has pushed out of the CPU caches. The first node that differs copies the
    agreeing prefix (``expect``'s own tuples) into ``node_keys`` and recording goes on as without ``expect``.

    A loop may sync more than one graph per iteration (a step and an evaluation, a read of the loss between the
    backward and the optimizer, a decode step and its stop check), so ``expect`` is the structure that came after
    the last sync's the last time it ran (``after``), or the last sync's own when none has yet: the same graph
    again, for a loop of one. Where that guess is wrong from the first node on that differs, the last sync's own
    structure (``fallback``) takes over when it agrees up to there (a loop that went back to its old graph)."""

    __slots__ = ("token", "refs", "node_keys", "leaves", "leaf_sigs", "leaf_pos", "regular", "expect", "plans",
                 "matching", "last", "after", "fallback")

    def __init__(self) -> None:
        self.expect: Structure | None = None  # the canonical structure this segment is expected to repeat
        self.plans: dict | None = None  # its plans (canonical's)
        self.last: tuple | None = None  # (structure, plans) of the last sync built from a segment
        self.after: dict = {}  # structure -> (structure, plans) of the sync that came after it last time
        self.reset()

    def reset(self) -> None:
        last = self.last
        self.fallback = None
        if last is not None:
            self.expect, self.plans = self.after.get(last[0], last)
            if self.expect is not last[0]:
                self.fallback = last
        self.token = object()  # nodes of this segment carry it: an input from another segment is seen at once
        self.refs: list = []  # weak references to the nodes, in recording order
        self.node_keys: list = []  # (op uid, wiring) per node, as fused._build_key lays them out (not matching)
        self.leaves: list = []
        self.leaf_sigs: list = []
        self.leaf_pos: dict = {}  # id(array) -> leaf position (an array read by several nodes is one input)
        self.regular = True
        self.matching = self.expect is not None  # every node key so far is expect's at its position

    def add(self, node, lazy_type) -> None:
        """Note a just-recorded node (hot path)."""
        if not self.regular:
            return
        native = NATIVE_ADD[0]
        if native is not None and native(self, node):
            return
        leaves, leaf_pos, refs = self.leaves, self.leaf_pos, []
        for v in node.inputs:
            if type(v) is lazy_type:
                src = v.node
                if src.segment is not self.token:
                    self.regular = False
                    return
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
        position = len(self.refs)
        node.segment = self.token
        node.position = position
        ref = weakref.ref(node)
        untrack(ref)
        self.refs.append(ref)
        key = (node.uid, tuple(refs))
        if self.matching:
            expect = self.expect
            if position < len(expect) and expect[position] == key:
                return
            fallback = self.fallback
            if fallback is not None:
                self.fallback = None
                alt = fallback[0]
                if position < len(alt) and alt[position] == key and alt[:position] == expect[:position]:
                    self.expect, self.plans = fallback
                    return
            self.matching = False
            self.node_keys = list(expect[:position])
        self.node_keys.append(key)

    def key(self, targets: list):
        """``(live nodes, node keys, leaves, leaf signatures, target wiring, memo)`` of the graph that computes
        ``targets`` when all of it was recorded in this segment, else ``None`` (then the caller walks the graph).
        The node keys are a canonical :class:`Structure`: the same object for the same graph at every sync.
        ``live nodes`` is a function giving the graph's nodes, called only when a sync needs them (a compile or a
        failure: a hit needs none). ``memo``: a dict kept with this graph's plan for what a sync derives from it
        (see ``fused._same``)."""
        if not self.regular:
            return None
        token = self.token
        nodes_of = list(map(_NODE, targets))
        for n in nodes_of:
            if n.segment is not token:
                return None
        positions = list(map(_POSITION, nodes_of))
        n = len(self.refs)
        if self.matching and n == len(self.expect):
            structure, plans = self.expect, self.plans
        else:
            structure, plans = canonical(Structure(self.expect[:n] if self.matching else self.node_keys))
        if self.last is not None:
            if len(self.after) >= MAX_SUCCESSORS and self.last[0] not in self.after:
                self.after.clear()
            self.after[self.last[0]] = (structure, plans)
        self.last = (structure, plans)
        wanted = tuple(sorted(set(positions)))
        plan = plans.get(wanted)
        if plan is None:
            if len(plans) >= MAX_PLANS:  # a graph whose values are read in ever new subsets: bounded
                plans.clear()
            plan = plans[wanted] = _Plan(structure, wanted)
        refs, kept = self.refs, plan.kept  # this segment's (a reset makes new ones)
        target_refs = tuple(zip(map(plan.position.__getitem__, positions), map(_INDEX, targets)))
        if kept is None:  # every node is live
            return (lambda: [r() for r in refs]), structure, self.leaves, tuple(self.leaf_sigs), target_refs, plan.memo
        leaves, leaf_sigs = self.leaves, self.leaf_sigs
        return ((lambda: [refs[i]() for i in kept]), plan.structure, [leaves[j] for j in plan.leaf_order],
                tuple(leaf_sigs[j] for j in plan.leaf_order), target_refs, plan.memo)


_NODE = operator.attrgetter("node")
_POSITION = operator.attrgetter("position")
_INDEX = operator.attrgetter("index")


class Hashed(tuple):
    """A tuple that hashes once. A sync looks its graph up by a key made of a few long tuples; when they are the
    very objects the last lookup used, the lookup neither rehashes them nor compares them element by element."""

    def __new__(cls, items):
        self = tuple.__new__(cls, items)
        self.hash = tuple.__hash__(self)
        return self

    def __hash__(self) -> int:
        return self.hash


class Structure(Hashed):
    """A graph's node keys — ``(uid, wiring)`` per node — hashed once: a sync looks its graph up several times
    (its canonical structure, its live part, the compiled graph), and hashing a few hundred nested tuples each
    time cost more than the lookups did (GPT-2's step: ~0.4 ms)."""


#: canonical Structure -> (itself, {wanted positions: _Plan}); about as many as the compiled graphs they key
_STRUCTURES = caches.cache("graph_structures", 256)
#: plans kept per structure (one per set of values its syncs want: usually one)
MAX_PLANS = 16
#: structures whose successor a segment remembers (the graphs a loop alternates between: a handful)
MAX_SUCCESSORS = 64


def canonical(structure: Structure) -> tuple:
    """``(the canonical object equal to structure, its plans)``: later lookups of the same graph (the compiled
    graph's, keyed by it) compare their keys element by element by identity."""
    entry = _STRUCTURES.peek(structure)  # the one element-by-element comparison with the stored key
    if entry is None:
        _STRUCTURES.get(structure)  # counted as a miss
        entry = (structure, {})
        _STRUCTURES.put(structure, entry)
        return entry
    return _STRUCTURES.get(entry[0])  # the stored key itself: found by identity, counted, kept recent


class _Plan:
    """Which nodes of a segment's structure the values at ``wanted`` depend on, and the key of those alone —
    a function of the structure and ``wanted`` only, so it is worked out once per graph, not at every sync.

    A node is dead when nothing wanted depends on it (a temporary whose result was dropped, a mask a model
    built and did not use): the sync's own walk would leave it out, so the key leaves it out too and its live
    nodes and leaves are renumbered in the same order, so both ways give the same key. ``kept`` is ``None``
    when every node is live."""

    __slots__ = ("kept", "structure", "leaf_order", "position", "memo")

    def __init__(self, structure: Structure, wanted: tuple):
        self.memo: dict = {}
        live = [False] * len(structure)
        for p in wanted:
            live[p] = True
        for i in range(len(structure) - 1, -1, -1):
            if live[i]:
                for p, _ in structure[i][1]:
                    if p >= 0:
                        live[p] = True
        if all(live):
            self.kept, self.structure, self.leaf_order = None, structure, ()
            self.position = range(len(structure))
            return
        position: dict[int, int] = {}
        kept, keys, leaf_order, leaf_pos = [], [], [], {}
        for i, (uid, refs) in enumerate(structure):
            if not live[i]:
                continue
            position[i] = len(kept)
            kept.append(i)
            wiring = []
            for p, j in refs:
                if p >= 0:
                    wiring.append((position[p], j))
                    continue
                q = leaf_pos.get(j)
                if q is None:
                    q = leaf_pos[j] = len(leaf_order)
                    leaf_order.append(j)
                wiring.append((-1, q))
            keys.append((uid, tuple(wiring)))
        self.kept, self.leaf_order, self.position = tuple(kept), tuple(leaf_order), position
        self.structure = canonical(Structure(keys))[0]
