"""A fused graph's long runs of one repeated block of ops traced as one loop (``lax.scan``), not op after op.

Why. A Python loop that writes into a tensor (``x[idx[i]] = src[i]``, PyTorch's ``test_index_copy_deterministic``:
40,000 of them) records one node per iteration, and each node is an in-place update XLA cannot fuse with the next.
Traced op after op, a graph of 2,000 of them (the size limit) is 2,000 kernels, and XLA:CPU compiles each as an
LLVM module of its own: ~18 ms and ~1 MB of compiler memory per op (a 2,000-op graph took ~40 s and ~2 GB to
compile, which glibc then kept), and ~3 memory maps and ~0.2 MB per op for as long as the executable is cached.
The graph's key is right (the indices are graph inputs, so every cut of the loop reuses one executable); its
*program* grew with the loop. Traced as a loop, the program is one block's ops whatever the run's length.

What is rolled. A run of at least :data:`MIN_BLOCKS` consecutive repetitions (and :data:`MIN_NODES` nodes) of a
block of up to :data:`MAX_PERIOD` nodes that writes part of an array (:data:`_PARTIAL_WRITES`: what XLA cannot
fuse), where every repetition has the same ops (node keys) and wiring:

- an input from the same block, or from the previous repetition (the loop's carry; in the first repetition
  any value of that shape and dtype from before the run, the same one wherever the block reads that carry);
- the same array leaf, or the same output of a node before the run, in every repetition (loop-invariant);
- a number leaf (an index, an offset, a scalar operand), which may differ per repetition: numbers are stacked
  into the scan's inputs, each made weak-typed again where it was, as the unrolled trace sees it.

No output of a repetition but the last may be read outside the run except by the next repetition (the last
repetition's outputs are the scan's final carry), so nothing the graph returns or later ops read is lost. Arrays
that differ per repetition (each layer of a model has its own weights) are never stacked: that would copy them
at every run, and such blocks are not the cost this addresses.

The decision reads only the graph's signature (node keys, wiring, leaf kinds, targets), so it is a function of
the key the executable is cached by: every graph with that key gets the same program. Values are those of the
unrolled trace (the same functions on the same values, in the same order); where the loop cannot be traced (a
carry whose weak type the block changes), the run is traced op after op as before.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from .packed_numbers import _convert_element_type

#: the fewest repetitions rolled into a loop (fewer compile cheaply enough op after op)
MIN_BLOCKS = 32
#: the fewest nodes rolled into a loop
MIN_NODES = 64
#: the longest block of nodes looked for
MAX_PERIOD = 8
#: the leaf types a repetition may take a value of its own of (a Python number; its leaf signature is its type)
_NUMBERS = (int, float, bool)


class Run(NamedTuple):
    """Nodes ``start`` to ``start + period * blocks - 1``: ``blocks`` repetitions of ``template`` (a
    descriptor per input of each of the block's nodes: ``("in", r, o)`` output ``o`` of the block's node ``r``;
    ``("prev", r, o)`` that output of the previous repetition; ``("leaf", l)`` / ``("ext", n, o)`` a
    loop-invariant leaf or earlier node output; ``("num", sig)`` a number leaf, per repetition).
    ``init``: per carried ``(r, o)``, the ref (``(node, output)`` or ``(-1, leaf)``) the first repetition reads
    for it; ``after``: the ``(r, o)`` of the last repetition read after the run (or returned by the graph). The
    loop carries those two sets of outputs, nothing else."""

    start: int
    period: int
    blocks: int
    template: tuple
    init: dict
    after: frozenset


def plan(nodes: list, key) -> list:
    """The graph's nodes as an ordered list of node indices and :class:`Run` s (``key``: its full
    :class:`~.signatures.GraphSignature`)."""
    n = len(nodes)
    if n < MIN_NODES:
        return list(range(n))
    uids = [node.uid for node in nodes]
    wiring = [refs for _, refs in key.nodes]
    writes = [_writes_part(sig.op) for sig, _ in key.nodes]
    last_use = _last_uses(wiring, key.targets, n)
    out: list = []
    i = 0
    while i < n:
        best = None
        for p in range(1, MAX_PERIOD + 1):
            if i + 2 * p > n or (best is not None and best.period * best.blocks >= n - i):
                break
            if uids[i:i + p] != uids[i + p:i + 2 * p] or not any(writes[i:i + p]):
                continue
            run = _run_at(i, p, nodes, uids, wiring, key.leaves, key.targets, last_use)
            if run is not None and (best is None or run.period * run.blocks > best.period * best.blocks):
                best = run
        if best is None:
            out.append(i)
            i += 1
        else:
            out.append(best)
            i += best.period * best.blocks
    return out


#: ops that write part of an array (``x[i] = v``: values.assign's program; scatters): XLA makes each a kernel of
#: its own, which a loop of them multiplies. A block without one is left unrolled: XLA fuses a chain of
#: elementwise ops, however long, into one kernel that reads and writes memory once, where a loop reads and writes
#: it every repetition, which on an accelerator's memory costs what the fusion saves. (On XLA:CPU the two run alike
#: warm, 3.7 ms for 100 repetitions of ``x = x * 0.999 + 0.001 * i`` over 10^6 elements, and the loop compiles in
#: 90 ms against 240 ms, measured after ``caches.clear_all()`` with the lowerings' traces warm.)
_PARTIAL_WRITES = frozenset({
    "assign", "index_put", "_unsafe_index_put", "_index_put_impl", "index_copy", "index_add", "index_fill",
    "index_reduce", "scatter", "scatter_add", "scatter_reduce", "slice_scatter", "select_scatter",
    "diagonal_scatter", "as_strided_scatter", "masked_scatter",
})


def _writes_part(op) -> bool:
    """Whether a node's op (an OpOverload, or a str naming an internal program) writes part of an array."""
    if isinstance(op, str):
        return op in _PARTIAL_WRITES
    schema = getattr(op, "_schema", None)
    return schema is not None and schema.name.split("::")[-1] in _PARTIAL_WRITES


def _last_uses(wiring: list, targets: tuple, n: int) -> list:
    """Per node, the last node that reads one of its outputs (``n``: the graph returns one of them)."""
    last = [-1] * n
    for j, refs in enumerate(wiring):
        for a, _ in refs:
            if a >= 0:
                last[a] = j
    for a, _ in targets:
        last[a] = n
    return last


def _describe(refs: tuple, s: int, p: int, leaves: tuple) -> tuple:
    """The descriptors (:class:`Run`) of a node's inputs in the repetition of ``p`` nodes that starts at node
    ``s``: what must be alike in every repetition. A read from two or more repetitions back is an ``"ext"`` at or
    after the run's start, which the caller refuses."""
    out = []
    for a, o in refs:
        if a == -1:
            sig = leaves[o]
            out.append(("num", sig) if sig[0] == "s" and sig[1] in _NUMBERS else ("leaf", o))
        elif a >= s:
            out.append(("in", a - s, o))
        elif a >= s - p:
            out.append(("prev", a - s + p, o))
        else:
            out.append(("ext", a, o))
    return tuple(out)


def _run_at(i: int, p: int, nodes: list, uids: list, wiring: list, leaves: tuple, targets: tuple,
            last_use: list) -> Run | None:
    """The longest rollable run of blocks of ``p`` nodes starting at node ``i``, or ``None``."""
    n = len(nodes)
    template = tuple(_describe(wiring[i + p + r], i + p, p, leaves) for r in range(p))
    if any(d[0] == "ext" and d[1] >= i for desc in template for d in desc):
        return None
    init: dict = {}
    for r in range(p):  # the first repetition reads as the template does, and its carries from before the run
        for d, ref, first in zip(template[r], wiring[i + r], _describe(wiring[i + r], i, 0, leaves)):
            if d[0] != "prev":
                if d != first:
                    return None
                continue
            if ref[0] >= i or (ref[0] == -1 and leaves[ref[1]][0] != "a") or init.setdefault(d[1:], ref) != ref:
                return None
            if not _same_aval(ref, nodes[i + d[1]].avals[d[2]], nodes, leaves):
                return None
    blocks = 1
    while i + (blocks + 1) * p <= n:
        s = i + blocks * p
        if uids[s:s + p] != uids[i:i + p]:
            break
        if any(_describe(wiring[s + r], s, p, leaves) != template[r] for r in range(p)):
            break
        # the repetition before it is no longer the last: only it and this one may read its outputs
        if any(last_use[s - p + r] >= s + p for r in range(p)):
            break
        blocks += 1
    if blocks < MIN_BLOCKS or blocks * p < MIN_NODES:
        return None
    return Run(i, p, blocks, template, init, _read_after(i + (blocks - 1) * p, p, wiring, targets))


def _read_after(last: int, p: int, wiring: list, targets: tuple) -> frozenset:
    """The ``(r, o)`` of the outputs of the repetition at node ``last`` read after it or returned by the graph."""
    end = last + p
    wanted = {(a - last, o) for refs in wiring[end:] for a, o in refs if last <= a < end}
    return frozenset(wanted | {(a - last, o) for a, o in targets if last <= a < end})


def _same_aval(ref: tuple, aval, nodes: list, leaves: tuple) -> bool:
    """Whether the value ``ref`` names has ``aval``'s shape and dtype (a carry's first value must)."""
    a, o = ref
    if a == -1:
        sig = leaves[o]
        return tuple(sig[1]) == tuple(aval.shape) and sig[2] == str(aval.dtype)
    other = nodes[a].avals[o]
    return tuple(other.shape) == tuple(aval.shape) and other.dtype == aval.dtype


def trace_run(run: Run, fns: list, treedefs: list, nodes: list, wiring: list, leaf_values: tuple,
              outputs: list, check, column=None) -> None:
    """Trace ``run`` as a ``lax.scan`` and put its last repetition's outputs into ``outputs`` (the nodes before
    it get ``None``: nothing outside the run reads them). ``check``: :func:`.fused._check_avals`; ``column``:
    the packed numbers' reader (:func:`.packed_numbers.traced`), which reads a number per repetition in one op,
    or ``None`` (numbers stacked one by one)."""
    i, p, blocks, template = run.start, run.period, run.blocks, run.template
    slots = sorted(set(run.init) | run.after)
    carry = []
    for r, o in slots:
        ref = run.init.get((r, o))
        if ref is None:
            aval = nodes[i + r].avals[o]
            carry.append(jnp.zeros(aval.shape, aval.dtype))
        else:
            carry.append(_value(ref, leaf_values, outputs))
    numbers: list = []  # per (r, input position) of a number: its values stacked, and its dtype and weak type
    where: dict = {}
    for r in range(p):
        for k, d in enumerate(template[r]):
            if d[0] == "num":
                wanted = [wiring[i + b * p + r][k][1] for b in range(blocks)]
                aval = jax.typeof(leaf_values[wanted[0]])
                where[(r, k)] = (len(numbers), aval.dtype, getattr(aval, "weak_type", False))
                stacked = column(wanted) if column is not None else None
                if stacked is None or stacked.dtype != aval.dtype:
                    stacked = jnp.stack([lax.convert_element_type(leaf_values[w], aval.dtype) for w in wanted])
                numbers.append(stacked)
    slot_of = {s: j for j, s in enumerate(slots)}

    def body(state, xs):
        local: list[list] = []
        for r in range(p):
            args = []
            for k, d in enumerate(template[r]):
                kind = d[0]
                if kind == "in":
                    args.append(local[d[1]][d[2]])
                elif kind == "prev":
                    args.append(state[slot_of[d[1:]]])
                elif kind == "num":
                    j, dtype, weak = where[(r, k)]
                    args.append(_convert_element_type(xs[j], dtype, weak_type=weak))
                else:
                    args.append(_value(wiring[i + r][k], leaf_values, outputs))
            outs = jax.tree_util.tree_leaves(fns[i + r](*args)) if treedefs[i + r].num_leaves else []
            check(nodes[i + r], outs)
            local.append(outs)
        return tuple(local[r][o] for r, o in slots), None

    final, _ = lax.scan(body, tuple(carry), tuple(numbers), length=blocks)
    last = i + (blocks - 1) * p
    for j in range(i, last):
        outputs.append(None)
    for r in range(p):  # outputs nothing reads after the run stay None
        outputs.append([final[slot_of[(r, o)]] if (r, o) in slot_of else None for o in range(len(nodes[i + r].avals))])


def _value(ref: tuple, leaf_values: tuple, outputs: list) -> Any:
    a, o = ref
    return leaf_values[o] if a == -1 else outputs[a][o]


def graph_fn(nodes: list, key, check):
    """The traceable function of a fused graph (its leaves' values -> its targets' values): node after node, and
    each rollable run (:func:`plan`) as one loop. ``check(node, outs)``: :func:`.fused._check_avals`."""
    fns = [n.fn for n in nodes]
    wiring = [refs for _, refs in key.nodes]
    treedefs = [n.treedef for n in nodes]
    steps = plan(nodes, key)

    def one(j: int, leaf_values: tuple, outputs: list) -> None:
        args = [leaf_values[i] if node == -1 else outputs[node][i] for node, i in wiring[j]]
        outs = jax.tree_util.tree_leaves(fns[j](*args)) if treedefs[j].num_leaves else []
        check(nodes[j], outs)
        outputs.append(outs)

    def run(*leaf_values, column=None):
        outputs: list[list] = []
        for step in steps:
            if type(step) is int:
                one(step, leaf_values, outputs)
                continue
            try:
                trace_run(step, fns, treedefs, nodes, wiring, leaf_values, outputs, check, column)
            except Exception:  # noqa: BLE001 — a block the loop cannot carry (a weak type it changes): unrolled
                for j in range(step.start, step.start + step.period * step.blocks):
                    one(j, leaf_values, outputs)
        return [outputs[n][i] for n, i in key.targets]

    run.stacks_numbers = any(type(step) is not int for step in steps)
    return run
