"""The lazy graph behind fused eager mode: record ops now, compile and run them together at a sync point.

In fused mode an op does not run. Its traceable function (the same function strict mode would ``jax.jit`` on
its own) is recorded as a :class:`Node` whose inputs are concrete JAX arrays, dynamic Python scalars or
:class:`LazyValue` outputs of earlier nodes, and the op's output storages hold :class:`LazyValue` placeholders.

At a sync point (:func:`sync`) every storage still holding a placeholder is materialized in **one** XLA
computation: the recorded nodes reachable from those placeholders are replayed inside a single ``jax.jit``.
The compiled computation is cached by the graph's *structure* — each node's signature (op, static arguments,
input shapes and dtypes) and the wiring between nodes — never by input values, so a training step that records
the same ops every iteration compiles once. Scalars and RNG seeds are graph inputs, not constants.

A graph that fails to compile or run is replayed node by node so the error names the op and the user line
that recorded it; the placeholders that depended on it are poisoned (reading them re-raises that error) and
everything else — all tensors computed before — stays usable.

**Interrupts.** A sync is atomic with respect to Ctrl-C: until the compiled graph starts, an interrupt leaves
every placeholder and node where it was (the pending work simply runs at the next sync); from the start of the
run — the moment donated input buffers are consumed — until every result is stored in its tensor, SIGINT is
deferred (:func:`torchtpu_lab.interrupts.deferred`) and raised right after the commit. A ``KeyboardInterrupt``
is never stored as a tensor's failure.

**Threads.** One process-wide re-entrant lock, :data:`LOCK`, owns the pending graph and every storage. The
runtime's public entry points (:func:`sync` here; ``execute``, ``launch``, ``assign``, ``store``, ``value`` and
``materialize`` in :mod:`.executor`; the CPU fallback) are :data:`entry_point` functions: each takes the lock and passes
the interrupt checkpoint itself, so no caller can skip the rule; a tpu kernel (``backend.dispatch.tpu_kernel``,
the one way kernels are made) holds it for its whole call, and a sync holds it from the snapshot of the pending
work to the commit of the results. So threads may record and sync freely:
their ops interleave whole, a sync by one thread materializes what every thread recorded so far, and the
results equal running the same ops one thread after the other. The lock is never held while waiting for
anything but the device.
"""

from __future__ import annotations

import operator
import time
import weakref
from collections import Counter, deque
from typing import Any, NamedTuple

import jax

from .. import caches, config, interrupts, native, telemetry
from ..device.storage import FailedValue, holding, store_all
from ..telemetry import SyncReason
from ..device import memory
from ..ops.registry import NoKernel
from . import graph_key, loop_rolling, packed_numbers, program_cost
from .graph_cuts import CutPoints
from .graph_key import Segment
from .signatures import GraphSignature, NodeSignature


class LazyValue:
    """Placeholder for one output of a recorded node; stands in for a JAX array inside a storage."""

    __slots__ = ("node", "index", "shape", "dtype", "value", "__weakref__")

    def __init__(self, node: "Node", index: int, shape: tuple, dtype):
        self.node = node
        self.index = index
        self.shape = tuple(shape)
        self.dtype = dtype
        self.value = None  # the concrete array, once a sync computed it


class Poisoned(FailedValue):
    """What a storage holds when the fused computation of its value failed: reading it re-raises the failure."""

    __slots__ = ()


class Node:
    __slots__ = ("key", "uid", "fn", "inputs", "treedef", "avals", "name", "source", "seq", "segment", "position",
                 "__weakref__")

    def __init__(self, key, fn, inputs: list, treedef, avals: list, name: str, source, seq: int, uid=None):
        self.key = key
        self.uid = key if uid is None else uid  # a small int standing for ``key`` in the in-memory graph key
        self.fn = fn
        self.inputs = inputs
        self.treedef = treedef
        self.avals = avals
        self.name = name
        self.source = source
        self.seq = seq  # recording order: graphs are laid out in it, so the same program gives the same key
        self.segment = None  # the graph_key.Segment token it was recorded in, and its position there
        self.position = -1


class GraphExecutable(NamedTuple):
    fn: Any  # the compiled XLA executable (called with the graph's leaf values, numbers packed as `packing` says)
    n_nodes: int
    memory: dict  # XLA's memory_analysis() of it: bytes of arguments, outputs, temporaries, aliased outputs
    packing: Any = None  # packed_numbers.Packing of its leaves, or None (every leaf an argument)


class PendingWork:
    """The recorded-but-not-run state of fused mode: storages holding placeholders and how many ops wait."""

    __slots__ = ("storages", "prior", "recorded", "seq", "extra", "segment", "device")

    def __init__(self) -> None:
        self.storages: dict = {}  # id(storage) -> weakref to a storage whose array is (or was) a LazyValue
        self.prior: dict = {}  # id(storage) -> id of the concrete array it held when first tracked (see _alias_order)
        self.recorded = 0  # nodes recorded since the last sync
        self.seq = 0  # nodes recorded ever (recording order)
        self.extra: list = []  # (placeholders, callback): values no storage holds that a sync must compute
        self.segment = Segment()  # the graph key of what was recorded since the last sync, built as it is
        self.device = 0  # the tpu index the pending graph runs on (a graph runs on one device)


PENDING = PendingWork()
#: Owns :data:`PENDING` and every storage (see "Threads" above); re-entrant, since kernels nest.
LOCK = native.reentrant_lock()
#: Decorates the runtime's public entry points: the safe point for a deferred Ctrl-C, then :data:`LOCK` held for
#: the whole call (a Ctrl-C inside it waits for its end).
entry_point = interrupts.owning(LOCK)
#: Compiled fused graphs by structure, bounded (a long-lived kernel sees many shapes).
GRAPHS = caches.cache("graphs", 256, code=True)

#: a graph is flushed once it has ``MAX_GRAPH_OPS.value`` recorded ops (``torchtpu_lab.config.max_graph_ops``), or
#: earlier, at a cut point a flush made before: see :mod:`.graph_cuts`
MAX_GRAPH_OPS = config.max_graph_ops
#: where graphs past the size limit are cut
CUTS = CutPoints()
#: ``[True]`` when a loop that appends without syncing ended an iteration: the pending graph is cut there
#: (runtime/growth.py ``_loop_step``)
LOOP_CUT = [False]


def record(key, fn, inputs: list, out_leaves: list, treedef, name: str, source=None, uid=None):
    """Record ``fn(*inputs)`` (traceable; ``out_leaves``/``treedef``: its flattened output ShapeDtypeStructs) and
    return the pytree of :class:`LazyValue` placeholders for its outputs. ``uid``: an int that identifies
    ``key`` in this process (cheap to hash; the full signature is only built when a graph is compiled)."""
    pending = PENDING
    pending.seq += 1
    node = Node(key, fn, inputs, treedef, out_leaves, name, source, pending.seq, uid)
    outs = [LazyValue(node, i, a.shape, a.dtype) for i, a in enumerate(out_leaves)]
    graph_key.untrack(node, *outs)
    pending.recorded += 1
    pending.segment.add(node, LazyValue)
    CUTS.note(id(fn))
    return outs[0] if treedef.num_leaves == 1 and treedef.num_nodes == 1 else jax.tree_util.tree_unflatten(
        treedef, outs)


def record_one(key, fn, inputs: list, out_leaves: list, treedef, name: str, source=None, uid=None) -> LazyValue:
    """:func:`record` for an op with exactly one output (the per-op short path): its one placeholder."""
    pending = PENDING
    pending.seq += 1
    node = Node(key, fn, inputs, treedef, out_leaves, name, source, pending.seq, uid)
    aval = out_leaves[0]
    out = LazyValue(node, 0, aval.shape, aval.dtype)
    graph_key.untrack(node, out)
    pending.recorded += 1
    pending.segment.add(node, LazyValue)
    CUTS.note(id(fn))
    return out


def on_device(device_index: int) -> None:
    """About to record work for ``tpu:device_index``: a graph runs on one device, so what is pending for another
    runs first (a sync point)."""
    pending = PENDING
    if pending.device != device_index:
        if pending.recorded or pending.storages or pending.extra:
            sync(SyncReason.DEVICE_SWITCH)
        pending.device = device_index


def track(storage) -> None:
    """Note that ``storage`` now holds (or is about to hold) a placeholder that a sync must materialize.

    Called before an in-place write replaces the storage's array, so the array it held then — the old value of
    a parameter the optimizer updates — is noted for :func:`_alias_order` (by id only: nothing is kept alive)."""
    pending, key = PENDING, id(storage)
    ref = pending.storages.get(key)
    if ref is not None and ref() is storage:  # tracked already since the last sync: its prior array is noted
        return
    pending.storages[key] = ref = weakref.ref(storage)
    graph_key.untrack(ref)
    old = storage.held
    if old is not None and type(old) is not LazyValue and isinstance(old, jax.Array):
        pending.prior[key] = id(old)
    else:
        pending.prior.pop(key, None)


def track_new(storage) -> None:
    """:func:`track` for a storage made just now around a placeholder (an op's output): nothing to look up."""
    pending, key = PENDING, id(storage)
    pending.storages[key] = ref = weakref.ref(storage)
    graph_key.untrack(ref)
    pending.prior.pop(key, None)


def also_compute(values: list, callback) -> None:
    """Have the next sync compute ``values`` (placeholders no storage holds, e.g. an op's error flags) and call
    ``callback(concrete_values)`` once it has committed them."""
    PENDING.extra.append((values, callback))


def has_pending() -> bool:
    return bool(PENDING.storages) or bool(PENDING.extra)


def pending_ops() -> int:
    return PENDING.recorded


def over_limit() -> bool:
    """Whether the pending graph should be flushed now: at the size limit (which remembers this point), or at a
    point where the limit cut before, so a repeating step is cut at the same ops every time."""
    recorded = PENDING.recorded
    if not recorded:
        return False
    limit = MAX_GRAPH_OPS.value
    if CUTS.last_ids and CUTS.at_anchor(PENDING.seq, limit):  # no anchors until the limit first cut
        return True
    if recorded >= limit:
        CUTS.force(PENDING.seq)
        return True
    return False


@entry_point
def flush_if_over_limit() -> None:
    """Sync if :func:`over_limit` says so (the recording kernel's check after each op it records), or where a loop
    that appends without syncing ended an iteration (:data:`LOOP_CUT`)."""
    if LOOP_CUT[0]:
        LOOP_CUT[0] = False
        sync(SyncReason.LOOP_ITERATION)
    elif over_limit():
        sync(SyncReason.GRAPH_LIMIT)


def _topo(targets: list[LazyValue]) -> list[Node]:
    order: list[Node] = []
    seen: set[int] = set()
    stack: list[tuple[Node, bool]] = [(t.node, False) for t in reversed(targets)]
    while stack:
        node, expanded = stack.pop()
        if id(node) in seen:
            continue
        if expanded:
            seen.add(id(node))
            order.append(node)
            continue
        stack.append((node, True))
        for v in reversed(node.inputs):
            if isinstance(v, LazyValue) and id(v.node) not in seen:
                stack.append((v.node, False))
    order.sort(key=lambda n: n.seq)  # recording order is a valid topological order, and a stable one
    return order


def _leaf_sig(v) -> tuple:
    if isinstance(v, jax.Array):
        return ("a", v.shape, str(v.dtype))
    return ("s", type(v))


def _build_key(nodes: list[Node], targets: list[LazyValue]) -> tuple:
    """``(node keys, leaves, leaf signatures, target wiring)``: the graph's in-memory key but for donation — flat
    tuples of ints, shapes and dtypes, cheap to hash (each node stands as its op's ``uid``) — and its leaf
    inputs. :func:`_signature` expands it into the full :class:`GraphSignature` (with every op signature) on a
    cache miss only."""
    position = {id(n): i for i, n in enumerate(nodes)}
    leaves: list = []
    leaf_pos: dict[int, int] = {}
    node_keys = []
    for n in nodes:
        refs = []
        for v in n.inputs:
            if isinstance(v, LazyValue):
                refs.append((position[id(v.node)], v.index))
            elif isinstance(v, FailedValue):
                raise v.error
            else:
                k = id(v) if isinstance(v, jax.Array) else None
                if k is not None and k in leaf_pos:
                    refs.append((-1, leaf_pos[k]))
                    continue
                if k is not None:
                    leaf_pos[k] = len(leaves)
                refs.append((-1, len(leaves)))
                leaves.append(v)
        node_keys.append((n.uid, tuple(refs)))
    target_refs = tuple((position[id(t.node)], t.index) for t in targets)
    leaf_sigs = tuple(_fast_leaf_sig(v) for v in leaves)
    return graph_key.canonical(graph_key.Structure(node_keys))[0], leaves, leaf_sigs, target_refs


def _donate(leaves: list, candidates: tuple, reusable: tuple) -> tuple:
    """Leaf positions whose buffers the graph may reuse for its outputs.

    A leaf buffer no live storage holds any more (the old value of a parameter the optimizer just updated, a
    temporary) is donated, so a training step does not keep two copies of the model. Only buffers an output can
    reuse (same shape and dtype) are worth donating (XLA warns about the rest): ``candidates`` and
    ``reusable`` (:func:`_reusable`) say which leaves could be, and how many of each signature."""
    native = _NATIVE_PLAN[0]
    if native is not None:
        return native.donate(leaves, candidates, reusable)
    left = list(reusable)
    donate = []
    is_held = memory.is_held
    for i, k in candidates:
        n = left[k]
        if n and not is_held(leaves[i]):
            left[k] = n - 1
            donate.append(i)
    return tuple(donate)


def _reusable(leaf_sigs: tuple, target_refs: tuple, targets: list[LazyValue], memo: dict | None) -> tuple:
    """``(candidates, reusable)``: ``(position, k)`` of each array leaf with the shape and dtype of some target,
    where ``reusable[k]`` counts the targets of that signature. An array's leaf signature is its
    ``(shape, dtype)`` (a number's is its type), which is what an output must match. A function of the leaf
    signatures and of the targets' shapes and dtypes, which their wiring into the graph's structure fixes: so
    worked out once per graph when ``memo`` (its plan's) holds the very objects of its last sync."""
    known = memo.get("reusable") if memo is not None else None
    if known is not None and known[0] is leaf_sigs and known[1] is target_refs:
        return known[2], known[3]
    counts = Counter(map(_SHAPE_DTYPE, targets))  # numpy dtypes: str() of one is slow
    slot = {sig: k for k, sig in enumerate(counts)}
    candidates = tuple((i, slot[sig]) for i, sig in enumerate(leaf_sigs) if type(sig) is tuple and sig in slot)
    reusable = tuple(counts.values())
    if memo is not None:
        memo["reusable"] = (leaf_sigs, target_refs, candidates, reusable)
    return candidates, reusable


_SHAPE_DTYPE = operator.attrgetter("shape", "dtype")


def _alias_order(targets: list[LazyValue], leaves: list, leaf_sigs: tuple, donate: tuple, storages: list,
                 held: list, prior: dict) -> list | None:
    """A permutation of ``targets`` that makes each donated buffer the output it is the old value of.

    JAX pairs each output, in order, with the first donated input of the same shape and dtype not paired yet.
    Laid out in recording order, a training step's gradients come before the updated parameters, so an old
    weight was paired with its *gradient* and XLA had to copy every donated parameter on entry (it is still read
    after the gradient is written). So the outputs that replace a donated leaf in its storage (an in-place
    update) come first, in leaf order; a donated leaf with no such output gets the first other output of its
    shape and dtype, so the pairs after it do not shift. ``None``: recording order already does (nothing to
    pair). The order only decides which buffers alias which outputs — never a value — and is part of the
    graph's key, so a step that records the same ops gets the same order and the same executable.
    ``held[i]``: the placeholder ``storages[i]`` holds."""
    if not donate or not prior:
        return None
    native = _NATIVE_PLAN[0]
    if native is not None:
        return native.alias_order(targets, leaves, leaf_sigs, donate, storages, held, prior)
    donated = {id(leaves[i]): i for i in donate}
    position = {id(v): j for j, v in enumerate(targets)}
    update: dict[int, int] = {}  # donated leaf position -> position of the target that replaces it
    for s, v in zip(storages, held):
        leaf = donated.get(prior.get(id(s)))
        if leaf is None or leaf in update:
            continue
        if leaf_sigs[leaf] == (v.shape, v.dtype):
            update[leaf] = position[id(v)]
    if not update:
        return None
    spare: dict | None = None  # (shape, dtype) -> the other targets, in recording order (made when first needed)
    first: list[int] = []
    for i in donate:
        j = update.get(i)
        if j is None:
            if spare is None:
                spare = _spare(targets, set(update.values()))
            others = spare.get(leaf_sigs[i])
            j = others.popleft() if others else None
        if j is not None:
            first.append(j)
    taken = set(first)
    return first + [j for j in range(len(targets)) if j not in taken]


def _spare(targets: list[LazyValue], paired: set) -> dict:
    """``(shape, dtype) -> positions`` of the targets not in ``paired``, in recording order."""
    spare: dict = {}
    for j, v in enumerate(targets):
        if j not in paired:
            sig = (v.shape, v.dtype)
            others = spare.get(sig)
            if others is None:
                others = spare[sig] = deque()
            others.append(j)
    return spare


def _same(memo: dict | None, part: str, value: tuple) -> tuple:
    """``value``, as the equal object the last sync of this graph used when there is one (``memo``: the graph's
    plan's; ``None``, for a graph whose key was built by walking it: ``value`` as it is): the graph cache then
    hashes the key's parts once and compares them by identity, where each lookup hashed and compared a few
    hundred tuples (~30 us of a training step's sync)."""
    if memo is None:
        return value
    last = memo.get(part)
    if last is not None and last == value:
        return last
    memo[part] = value = graph_key.Hashed(value)
    return value


def _fast_leaf_sig(v) -> tuple:
    if isinstance(v, jax.Array):
        return (v.shape, v.dtype)
    return type(v)


def _signature(nodes: list[Node], fast: GraphSignature, leaves: list) -> GraphSignature:
    """The full signature of a graph from its in-memory key (every node's op signature spelled out)."""
    return GraphSignature(tuple(NodeSignature(n.key, refs) for n, (_, refs) in zip(nodes, fast.nodes)),
                          tuple(_leaf_sig(v) for v in leaves), tuple(fast.targets), tuple(fast.donate))


def _leaf_device(leaves: list, leaf_sigs: tuple):
    """The device a graph runs on (its array inputs'), or ``None`` when it has none (then not cached on disk)."""
    for v, sig in zip(leaves, leaf_sigs):
        if type(sig) is tuple:  # an array's (a number's signature is its type)
            return next(iter(v.devices()))
    return None


def _check_avals(node: Node, outs: list) -> None:
    """At trace time only: a node's outputs are what it was recorded as (its avals come from PyTorch's metadata,
    not from a trace), so a lowering that disagrees is a clear error, never a silently mis-wired graph."""
    if len(outs) != len(node.avals) or any(
            tuple(o.shape) != tuple(a.shape) or o.dtype != a.dtype for o, a in zip(outs, node.avals)):
        raise RuntimeError(f"torchtpu_lab bug: {node.name} traced to "
                           f"{[(tuple(o.shape), str(o.dtype)) for o in outs]} but was recorded as "
                           f"{[(tuple(a.shape), str(a.dtype)) for a in node.avals]}")


def _graph_fn(nodes: list[Node], key: GraphSignature):
    """The graph's traceable function, long runs of a repeated block as one loop (:mod:`.loop_rolling`)."""
    return loop_rolling.graph_fn(nodes, key, _check_avals)


@entry_point
def sync(reason: SyncReason = SyncReason.USER_SYNC, record: bool = True, source=None, detail: str | None = None) -> None:
    """Materialize every pending placeholder in one compiled computation (a sync event when there was work).

    ``record=False``: the caller records the sync event itself (it syncs even when nothing is pending)."""
    # Nothing in PENDING changes until the commit: an interrupt (or an error) before it leaves the work pending.
    _sync(reason, record, source, detail)


def _sync(reason: SyncReason, record: bool, source, detail) -> None:
    pending = PENDING
    extra = list(pending.extra)
    snapshot = SNAPSHOT[0]
    if snapshot is not None:
        storages, held, targets = snapshot()
    else:
        storages, held = holding(pending.storages.values(), LazyValue)
    n_recorded = pending.recorded
    if not storages and not extra:
        _clear(pending)
        return
    sync_event = telemetry.record_sync(reason, n_recorded, source, detail) if record else None
    if snapshot is None:
        targets = _targets(held, extra)
    built = pending.segment.key(targets)
    if built is not None:  # the key was built while recording (graph_key.py)
        live_nodes, node_keys, leaves, leaf_sigs, target_refs, memo = built
    else:
        nodes, memo = _topo(targets), None
        live_nodes = lambda: nodes  # noqa: E731
        try:
            node_keys, leaves, leaf_sigs, target_refs = _build_key(nodes, targets)
        except Exception as e:  # noqa: BLE001 — an input was poisoned by an earlier failure
            for s in storages:
                s.array = Poisoned(e, s.shape, None)
            _clear(pending)
            raise
    leaf_sigs, target_refs = _same(memo, "leaves", leaf_sigs), _same(memo, "targets", target_refs)
    donate = _donate(leaves, *_reusable(leaf_sigs, target_refs, targets, memo))
    order = _alias_order(targets, leaves, leaf_sigs, donate, storages, held, pending.prior)
    if order is not None:
        targets = [targets[j] for j in order]
        target_refs = _same(memo, "ordered", tuple(map(target_refs.__getitem__, order)))
    key = GraphSignature(node_keys, leaf_sigs, target_refs, _same(memo, "donate", donate))
    n_nodes = len(node_keys)
    device = _leaf_device(leaves, leaf_sigs)  # the same graph on another device is another executable
    compiled = GRAPHS.get((key, device))
    hit = compiled is not None
    t0 = time.perf_counter()
    if compiled is None:
        from . import compile_cache, compile_events

        nodes = live_nodes()
        fast, key = key, _signature(nodes, key, leaves)
        cause, site = compile_events.graph_cause(key, nodes)
        packing = packed_numbers.plan(leaves)
        try:
            fn, args = _graph_fn(nodes, key), leaves
            if packing is not None:
                fn, args = packed_numbers.traced(fn, packing), packed_numbers.arguments(packing, leaves)
            executable, from_disk = compile_cache.executable(fn, args, "graph", key, device,
                                                             packed_numbers.donated(packing, key.donate),
                                                             convention=packed_numbers.convention(packing))
        except Exception as e:  # noqa: BLE001 — replayed below to name the op
            with interrupts.deferred():
                _clear(pending)
                _fail(nodes, storages, e, extra)
        compiled = GraphExecutable(executable, n_nodes, memory.analysis(executable), packing)
        GRAPHS.put((fast, device), compiled)
        compile_events.note_compile("graph", key, nodes, cause, time.perf_counter() - t0, reason, disk=from_disk,
                                    site=site)
        t0 = time.perf_counter()
    else:
        telemetry.count("graph_cache_hits")
    device_index = storages[0].device_index if storages else 0
    memory.executing(compiled.memory, device_index, f"graph[{n_nodes} ops]")
    # From here to the commit, donated buffers are consumed and results exist only in locals: no interrupt.
    with interrupts.deferred():
        _clear(pending)
        try:
            program_cost.before_launch()
            packing = compiled.packing
            results = compiled.fn(*(leaves if packing is None else packed_numbers.arguments(packing, leaves)))
            launch_look = program_cost.look_at_launch(results)
        except Exception as e:  # noqa: BLE001
            _fail(live_nodes(), storages, e, extra)
        _commit(targets, results)
        store_all(storages, [v.value for v in held])
        _finish(extra)
    memory.settle()  # buffers only the graph still read are gone now (donated or dropped with the nodes)
    telemetry.count("graph_ops_executed", n_nodes)
    run = telemetry.record_execute(f"graph[{n_nodes} ops]", t0, n_nodes, hit,
                                   **program_cost.run_detail(compiled.fn, not hit))
    # its device time, without waiting (profiled)
    program_cost.time_run(run, results, device_index, launch_look, compiled.fn)
    if sync_event is not None:
        sync_event.dur = time.perf_counter() - sync_event.t


def _targets(held: list, extra: list) -> list[LazyValue]:
    """The placeholders a sync computes: those live storages hold and the extra values, each once, in recording
    order."""
    wanted = {id(v): v for v in held}
    for values, _ in extra:
        for v in values:
            wanted[id(v)] = v
    return sorted(wanted.values(), key=_RECORDING_ORDER)


def _commit(targets: list, results) -> None:
    """Each target placeholder gets its computed array."""
    native = _NATIVE_PLAN[0]
    if native is not None:
        native.commit(targets, results)
        return
    for v, r in zip(targets, results):
        v.value = r


#: the native core (``None``: pure-Python mode), whose ``donate``, ``alias_order`` and ``commit`` are
#: :func:`_donate`, :func:`_alias_order` and :func:`_commit` in C (csrc/sync_plan.cpp): a training step's sync
#: walks each of its leaves, outputs and storages in them
_NATIVE_PLAN: list = [None]
#: a sync lays its targets out in recording order
_RECORDING_ORDER = operator.attrgetter("node.seq", "index")
#: the native core's ``sync_targets`` (``None``: pure-Python mode): ``(storages, held, targets)`` in one C pass,
#: as :func:`.storage.holding` and :func:`_targets` give them (a training step's sync walks a few hundred)
SNAPSHOT: list = [None]


def _clear(pending: PendingWork) -> None:
    pending.storages.clear()
    pending.prior.clear()
    pending.extra.clear()
    pending.recorded = 0
    pending.segment.reset()


def _finish(extra: list) -> None:
    """Hand the extra values a sync computed to their callbacks (each sees only values that exist)."""
    for values, callback in extra:
        if all(v.value is not None for v in values):
            callback([v.value for v in values])


def _fail(nodes, storages, error, extra=()):
    """Replay node by node to find the op that fails; poison what depends on it; raise naming the op."""
    values: dict[int, list] = {}
    culprit, culprit_error = None, error
    for n in nodes:
        try:
            args = []
            for v in n.inputs:
                if isinstance(v, LazyValue):
                    if id(v.node) not in values:
                        raise _Skipped()
                    args.append(values[id(v.node)][v.index])
                else:
                    args.append(v)
            values[id(n)] = jax.tree_util.tree_leaves(jax.jit(n.fn)(*args))
        except _Skipped:
            continue
        except Exception as e:  # noqa: BLE001
            if culprit is None:
                culprit, culprit_error = n, e
    where = f" (recorded at {culprit.source})" if culprit is not None and culprit.source else ""
    what = culprit.name if culprit is not None else "the fused graph"
    # PyTorch's own error for arguments it has no kernel for keeps its type (NotImplementedError), as on CPU
    if isinstance(culprit_error, NoKernel):
        failure = NotImplementedError(f"{what} failed{where}: {culprit_error}")
    else:
        failure = RuntimeError(f"{what} failed{where}: {type(culprit_error).__name__}: {culprit_error}")
    for s in storages:
        v = s.held
        done = values.get(id(v.node))
        if done is not None:
            v.value = done[v.index]
            s.array = v.value
        else:
            s.array = Poisoned(failure, s.shape, s.dtype)
    for wanted, _ in extra:
        for v in wanted:
            done = values.get(id(v.node))
            if done is not None:
                v.value = done[v.index]
    _finish(extra)  # the flags of ops that did run still count (an index error reported before the failure)
    raise failure from culprit_error


class _Skipped(Exception):
    pass


def graph_cache_size() -> int:
    return len(GRAPHS)
