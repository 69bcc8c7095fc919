"""Why did it compile? Every compilation becomes a telemetry event whose cause is found by comparing the new
signature with the nearest one compiled before.

Op signatures (:class:`~.signatures.OpSignature`) and graph signatures (:class:`~.signatures.GraphSignature`,
op signatures plus their wiring) are the executors' cache keys, read here by field name. The cause is a
:class:`~torchtpu_lab.causes.Cause` record (what changed, in which op and input, from what to what, at which
user line) that renders as a sentence a user can act on: "first time this graph was seen", "op 3: input 0 of
aten.mm changed shape [8, 128] -> [7, 128] (recorded at cell [4], line 2)", "op sequence differs at op 57:
aten.mul vs aten.add", "a Python scalar that changes every step was baked in as a constant (aten.leaky_relu
input 1: 0.1 -> 0.2)".
"""

from __future__ import annotations

from collections import deque

from .. import caches, telemetry
from ..causes import Cause, CauseKind, fmt_shape
from ..telemetry import Counter, Source
from ..ops.registry import op_name
from .signatures import GraphSignature, OpSignature, Slot, Static

_HISTORY = 512
#: op -> deque of its recent signatures (bounded in ops and per op)
_op_history = caches.cache("op_history", 4096)
_graph_history: deque = deque(maxlen=_HISTORY)


def clear() -> None:
    """Forget the signatures compiled so far (the next compile of each is a first sighting again)."""
    _op_history.clear()
    _graph_history.clear()


def _flatten(template, path=()):
    """(path, leaf) pairs of an argument template, in order."""
    if isinstance(template, (Slot, Static)) or not isinstance(template, tuple):
        yield path, template
        return
    for i, item in enumerate(template):
        yield from _flatten(item, path + (i,))


def _input_label(path: tuple) -> str:
    """``input 0``, ``input 1[2]`` (an item of a list argument), ``input alpha`` (a keyword)."""
    return f"input {path[0]}" + ("".join(f"[{i}]" for i in path[1:]) if len(path) > 1 else "")


def _describe_arg_change(name: str, path: tuple, old, new) -> Cause:
    where = _input_label(path)
    if isinstance(old, Slot) and isinstance(new, Slot):
        if old.shape != new.shape:
            return Cause(CauseKind.SHAPE, name, where, tuple(map(int, old.shape)), tuple(map(int, new.shape)))
        if old.dtype != new.dtype:
            return Cause(CauseKind.DTYPE, name, where, str(old.dtype), str(new.dtype))
        if old.base_shape != new.base_shape:
            return Cause(CauseKind.BASE_SHAPE, name, where, tuple(map(int, old.base_shape)),
                         tuple(map(int, new.base_shape)))
        if old.view != new.view:
            return Cause(CauseKind.VIEW, name, where)
        return Cause(CauseKind.INPUT_KIND, name, where)
    if isinstance(old, Static) and isinstance(new, Static) and old.type is new.type is float:
        return Cause(CauseKind.SCALAR, name, where, old.value, new.value)
    if isinstance(old, Static) and isinstance(new, Static) and old.type is new.type is int:
        return Cause(CauseKind.STATIC_SIZE, name, where, old.value, new.value)
    return Cause(CauseKind.STATIC, name, where, _short(old), _short(new))


def _short(v) -> str:
    if isinstance(v, Static):
        return repr(v.value)
    if isinstance(v, Slot):
        return f"tensor {fmt_shape(v.shape)} {v.dtype}"
    text = repr(v)
    return text if len(text) < 60 else text[:57] + "..."


def _diff_signatures(old: OpSignature, new: OpSignature) -> Cause | None:
    """The first difference between two op signatures."""
    name = op_name(new.op)
    if old.op != new.op:
        return Cause(CauseKind.SEQUENCE, name, old=op_name(old.op), new=name)
    if old.precision != new.precision:
        return Cause(CauseKind.PRECISION, name, old=old.precision, new=new.precision)
    if old.default_dtype != new.default_dtype:
        return Cause(CauseKind.DEFAULT_DTYPE, name, old=old.default_dtype, new=new.default_dtype)
    old_items = list(_flatten(old.args)) + [(("kw", k),) + (v,) for k, v in old.kwargs]
    new_items = list(_flatten(new.args)) + [(("kw", k),) + (v,) for k, v in new.kwargs]
    for (p_old, v_old), (p_new, v_new) in zip(old_items, new_items):
        if p_old != p_new:
            return Cause(CauseKind.STRUCTURE, name)
        if v_old != v_new:
            path = p_new if p_new and p_new[0] != "kw" else (p_new[0][1],)
            return _describe_arg_change(name, path, v_old, v_new)
    if len(old_items) != len(new_items):
        return Cause(CauseKind.ARG_COUNT, name, old=len(old_items), new=len(new_items))
    return None


def op_cause(key: OpSignature) -> Cause:
    """Why this op signature compiles: its difference from the most alike signature of the same op."""
    history = _op_history.peek(key.op)
    if not history:
        return Cause(CauseKind.FIRST_OP, op_name(key.op))
    best, best_score = None, -1
    for old in history:
        score = sum(1 for a, b in zip(_flatten(old.args), _flatten(key.args)) if a == b)
        if score > best_score:
            best, best_score = old, score
    return _diff_signatures(best, key) or Cause(CauseKind.UNKNOWN, op_name(key.op))


def _similarity(old: GraphSignature, key: GraphSignature) -> tuple:
    """How alike two graphs are: same op sequence first, then the longest common prefix of op names, then the
    number of identical node signatures."""
    old_ops = [n.op.op for n in old.nodes]
    new_ops = [n.op.op for n in key.nodes]
    lcp = 0
    for a, b in zip(old_ops, new_ops):
        if a != b:
            break
        lcp += 1
    exact = sum(1 for a, b in zip(old.nodes, key.nodes) if a == b)
    return (old_ops == new_ops, lcp, exact)


def graph_cause(key: GraphSignature, nodes) -> tuple[Cause, Source | None]:
    """Why this graph compiles, and the user line of the op the cause names (``None`` when it names none): the
    first difference from the most alike graph compiled before (the most recent wins ties)."""
    if not _graph_history:
        return Cause(CauseKind.FIRST_GRAPH), None
    best, best_score = None, None
    for old in reversed(_graph_history):
        score = _similarity(old, key)
        if best_score is None or score > best_score:
            best, best_score = old, score
    old_nodes, new_nodes = best.nodes, key.nodes
    i = next((k for k, (a, b) in enumerate(zip(old_nodes, new_nodes)) if a != b), min(len(old_nodes), len(new_nodes)))
    if i < len(old_nodes) and i < len(new_nodes):
        old_sig, new_sig = old_nodes[i].op, new_nodes[i].op
        site = nodes[i].source
        if old_sig.op != new_sig.op:
            cause = Cause(CauseKind.SEQUENCE, op_name(new_sig.op), old=op_name(old_sig.op), new=op_name(new_sig.op))
        elif old_sig == new_sig:
            cause = Cause(CauseKind.DATA_FLOW, op_name(new_sig.op))
        else:
            cause = _diff_signatures(old_sig, new_sig) or Cause(CauseKind.SIGNATURE, op_name(new_sig.op))
        return cause.at(i, site), site
    if len(new_nodes) != len(old_nodes):
        return Cause(CauseKind.GROW, old=len(old_nodes), new=len(new_nodes), index=i), None
    if best.targets != key.targets:
        return Cause(CauseKind.TARGETS), None
    if best.leaves == key.leaves and best.donate != key.donate:
        return Cause(CauseKind.DONATION), None
    return Cause(CauseKind.GRAPH_INPUTS), None


def _unrolled(node_sigs) -> tuple[int, int]:
    """``(repetitions, period)`` when a graph is (at least 80%) one block of ops repeated 3 or more times from its
    start: the steps of a loop that nothing synced between, unrolled into one graph whose size (and compile time)
    grows with the number of steps. ``(0, 0)`` otherwise. A loop over layers inside one step is not flagged: the
    rest of the step (loss, backward, optimizer) breaks the period."""
    ops = [n.op for n in node_sigs]
    n = len(ops)
    for p in range(1, n // 3 + 1):
        if ops[p] != ops[0]:
            continue
        run = 0
        while run + p < n and ops[run] == ops[run + p]:
            run += 1
        reps = (run + p) // p
        if reps >= 3 and reps * p >= 0.8 * n:
            return reps, p
    return 0, 0


def note_compile(kind: str, key, nodes, cause: Cause, seconds: float, reason: str = "", disk: bool = False,
                 site: Source | None = None) -> None:
    """Remember a compiled signature and emit the compile event (``disk``: loaded from the persistent cache,
    counted as a load, not a compile; ``site``: the user line of the op a graph's cause names, from
    :func:`graph_cause`)."""
    if kind == "graph":
        _graph_history.append(key)
        name = f"graph[{len(key.nodes)} ops]"
        n_ops = len(key.nodes)
    else:
        history = _op_history.peek(key.op)
        if history is None:
            history = deque(maxlen=64)
            _op_history.put(key.op, history)
        history.append(key)
        name = op_name(key.op)
        n_ops = 1
    if disk:
        telemetry.count(Counter.DISK_LOADS)
        telemetry.count(Counter.DISK_LOAD_SECONDS, seconds)
    else:
        telemetry.count(Counter.COMPILES)
        telemetry.count(Counter.COMPILE_SECONDS, seconds)
    event = telemetry.record_compile(kind, name, cause, seconds, n_ops, reason, disk=disk)
    if site is not None:
        event.detail["site"] = site
    if kind == "graph":
        event.detail["ops"] = [n.op.op for n in key.nodes]  # what the graph does, for labels (by reference)
    if kind == "graph" and nodes:
        times, period = _unrolled(key.nodes)
        if times >= 3:
            event.detail["unrolled"] = times
            event.detail["unrolled_site"] = nodes[0].source
