"""Why did it compile? Every compilation becomes a telemetry event whose cause is found by comparing the new
signature with the nearest one compiled before.

Op signatures (:class:`~.signatures.OpSignature`) and graph signatures (:class:`~.signatures.GraphSignature`,
op signatures plus their wiring) are the executors' cache keys, read here by field name. The cause is a sentence a user
can act on: "first time this graph was seen", "input 0 of aten.mm changed shape [8, 128] -> [7, 128]",
"op sequence differs at op 57: aten.mul vs aten.add", "a Python scalar that changes every step was baked in as
a constant (aten.leaky_relu argument 1: 0.1 -> 0.2)".
"""

from __future__ import annotations

from collections import deque

from .. import caches, telemetry
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


def _fmt_shape(shape) -> str:
    return "[" + ", ".join(str(int(n)) for n in shape) + "]"


def _describe_arg_change(op_name: str, path: tuple, old, new) -> str:
    where = f"input {path[0]}" + ("".join(f"[{i}]" for i in path[1:]) if len(path) > 1 else "")
    if isinstance(old, Slot) and isinstance(new, Slot):
        if old.shape != new.shape:
            return (f"{where} of {op_name} changed shape {_fmt_shape(old.shape)} -> {_fmt_shape(new.shape)}"
                    + _growth_hint(old.shape, new.shape))
        if old.dtype != new.dtype:
            return f"{where} of {op_name} changed dtype {old.dtype} -> {new.dtype}"
        if old.base_shape != new.base_shape:
            return (f"{where} of {op_name} views a storage that changed shape {_fmt_shape(old.base_shape)} -> "
                    f"{_fmt_shape(new.base_shape)}" + _growth_hint(old.base_shape, new.base_shape))
        if old.view != new.view:
            return f"{where} of {op_name} is a different view of its storage (sizes/strides changed)"
        return f"{where} of {op_name} changed kind"
    if isinstance(old, Static) and isinstance(new, Static) and old.type is new.type is float:
        return (
            f"a Python scalar that changes every step was baked in as a constant "
            f"({op_name} {where}: {old.value!r} -> {new.value!r})"
        )
    if isinstance(old, Static) and isinstance(new, Static) and old.type is new.type is int:
        return f"static size/dim argument {where} of {op_name} changed {old.value} -> {new.value}"
    return f"static argument {where} of {op_name} changed: {_short(old)} -> {_short(new)}"


#: what to do about a tensor that grows every step (appended to the cause; the profile shows causes verbatim)
GROWTH_HINT = (
    "; a tensor that grows by one every step (a dynamic KV cache or a token list extended with torch.cat in a "
    "decode loop) makes every step a new graph: preallocate it — transformers: generate(..., "
    "cache_implementation=\"static\") or a StaticCache — and write each step at a moving offset "
    "(buf[:, pos] = token), which compiles once for any number of steps"
)


def _growth_hint(old: tuple, new: tuple) -> str:
    """:data:`GROWTH_HINT` when exactly one dimension grew by one (the signature of a decode loop)."""
    if len(old) != len(new):
        return ""
    changed = [(a, b) for a, b in zip(old, new) if a != b]
    return GROWTH_HINT if len(changed) == 1 and changed[0][1] == changed[0][0] + 1 else ""


def _short(v) -> str:
    if isinstance(v, Static):
        return repr(v.value)
    if isinstance(v, Slot):
        return f"tensor {_fmt_shape(v.shape)} {v.dtype}"
    text = repr(v)
    return text if len(text) < 60 else text[:57] + "..."


def _diff_signatures(old: OpSignature, new: OpSignature) -> str | None:
    """Describe the first difference between two op signatures."""
    name = op_name(new.op)
    if old.op != new.op:
        return f"{op_name(old.op)} vs {name}"
    if old.precision != new.precision:
        return (f"float32 matmul precision changed {old.precision!r} -> {new.precision!r} "
                "(torch.set_float32_matmul_precision)")
    old_items = list(_flatten(old.args)) + [(("kw", k),) + (v,) for k, v in old.kwargs]
    new_items = list(_flatten(new.args)) + [(("kw", k),) + (v,) for k, v in new.kwargs]
    for (p_old, v_old), (p_new, v_new) in zip(old_items, new_items):
        if p_old != p_new:
            return f"the arguments of {name} changed structure"
        if v_old != v_new:
            path = p_new if p_new and p_new[0] != "kw" else (p_new[0][1],)
            return _describe_arg_change(name, path, v_old, v_new)
    if len(old_items) != len(new_items):
        return f"{name} was called with {len(new_items)} arguments, previously {len(old_items)}"
    return None


def op_cause(key: OpSignature) -> str:
    history = _op_history.peek(key.op)
    if not history:
        return "first time this op signature was seen"
    best, best_score = None, -1
    for old in history:
        score = sum(1 for a, b in zip(_flatten(old.args), _flatten(key.args)) if a == b)
        if score > best_score:
            best, best_score = old, score
    return _diff_signatures(best, key) or "signature differs from every cached one"


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


#: the user line of the op a graph cause names (attached to the next compile event as ``detail["site"]``)
_site: list = [None]


def graph_cause(key: GraphSignature, nodes) -> str:
    _site[0] = None
    if not _graph_history:
        return "first time this graph was seen"
    best, best_score = None, None
    for old in reversed(_graph_history):  # the most recent wins ties
        score = _similarity(old, key)
        if best_score is None or score > best_score:
            best, best_score = old, score
    old_nodes, new_nodes = best.nodes, key.nodes
    i = next((k for k, (a, b) in enumerate(zip(old_nodes, new_nodes)) if a != b), min(len(old_nodes), len(new_nodes)))
    if i < len(old_nodes) and i < len(new_nodes):
        old_sig, new_sig = old_nodes[i].op, new_nodes[i].op
        line = f" (recorded at {telemetry.describe(nodes[i].source)})" if nodes[i].source else ""
        _site[0] = nodes[i].source
        if old_sig.op != new_sig.op:
            return f"op sequence differs at op {i}: {op_name(old_sig.op)} vs {op_name(new_sig.op)}{line}"
        if old_sig == new_sig:
            return f"same ops, different data flow into op {i} ({op_name(new_sig.op)}){line}"
        detail = _diff_signatures(old_sig, new_sig)
        return f"op {i}: {detail or op_name(new_sig.op) + ' signature changed'}{line}"
    if len(new_nodes) != len(old_nodes):
        return (
            f"graph has {len(new_nodes)} ops where the nearest cached graph has {len(old_nodes)} "
            f"(identical for the first {i})"
        )
    if best.targets != key.targets:
        return "same ops, but different tensors are still alive at the sync point"
    if best.leaves == key.leaves and best.donate != key.donate:
        return "same graph, but a different set of inputs is still referenced elsewhere (donation differs)"
    return "graph inputs changed shape or dtype"


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


def note_compile(kind: str, key, nodes, cause: str, seconds: float, reason: str = "", disk: bool = False) -> None:
    """Remember a compiled signature and emit the compile event (``disk``: loaded from the persistent cache,
    counted as a load, not a compile)."""
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
        telemetry.count("disk_loads")
        telemetry.count("disk_load_seconds", seconds)
    else:
        telemetry.count("compiles")
        telemetry.count("compile_seconds", seconds)
    event = telemetry.record_compile(kind, name, cause, seconds, n_ops, reason, disk=disk)
    if kind == "graph" and _site[0] is not None:
        event.detail["site"] = _site[0]
        _site[0] = None
    if kind == "graph" and nodes:
        times, period = _unrolled(key.nodes)
        if times >= 3:
            event.detail["unrolled"] = times
            event.detail["unrolled_site"] = nodes[0].source
