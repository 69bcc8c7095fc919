"""A fused graph's Python numbers reach its executable in one array per kind, not as one argument each.

Numbers a graph takes as inputs (``x * 0.5``, an optimizer's learning rate, betas and bias corrections, one per
parameter and update) were each an argument of the compiled graph, and JAX turns each into a device buffer of
its own: a host-to-device transfer, an allocation and its release, about 2 µs apiece on the calling thread. A tiny
transformer's AdamW step passes ~260 of them (~0.5–1 ms of a ~15 ms step); a decode token ~35.

Here the floats go in one array (float64; float32 without x64, as JAX would convert each) and the ints in one
int64 array (int32 without x64). The traced graph reads element ``i`` and makes it weak-typed, which is what a
Python number argument is, so type promotion, the program's values and every node's avals are unchanged. A
``bool`` (a strong type in JAX), NumPy scalars and arrays are passed as before.

Which leaves are numbers follows from the graph's key (a number's leaf signature is its type), so the packing is
a function of the key; the persistent cache keys an executable by whether it takes its numbers packed
(:func:`convention`), since a process without JAX's conversion, or with packing turned off, compiles the same
graph unpacked. Without JAX's weak-type conversion (an internal function; a JAX that moved it), nothing is packed
and every number is an argument.
"""

from __future__ import annotations

import inspect
import operator
from collections.abc import Callable, Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

try:
    from jax._src.lax.lax import _convert_element_type
except ImportError:  # pragma: no cover - a JAX that moved it: numbers stay one argument each
    _convert_element_type = None

_usable: list = []  # [bool] once checked: JAX's conversion takes weak_type


class Packing(NamedTuple):
    """Where a graph's leaves go: ``passed`` as arguments of their own, in order, then ``floats`` in one array and
    ``ints`` in another (each present only when not empty), of the dtypes JAX gives such numbers; ``count``: the
    graph's leaves."""

    passed: tuple
    floats: tuple
    ints: tuple
    count: int
    float_dtype: type
    int_dtype: type
    take: tuple  # per group (passed, floats, ints): its leaves as a tuple, picked in C (a step has hundreds)


def plan(leaves: Sequence) -> Packing | None:
    """The packing of a graph with these leaves, or ``None`` when it has no number to pack (or JAX cannot make a
    packed one weak-typed again)."""
    floats = tuple(i for i, v in enumerate(leaves) if type(v) is float)
    ints = tuple(i for i, v in enumerate(leaves) if type(v) is int)
    if not (floats or ints) or not _weak_types():
        return None
    numbers = set(floats) | set(ints)
    passed = tuple(i for i in range(len(leaves)) if i not in numbers)
    return Packing(passed, floats, ints, len(leaves), jax.dtypes.canonicalize_dtype(np.float64),
                   jax.dtypes.canonicalize_dtype(np.int64), tuple(_picker(p) for p in (passed, floats, ints)))


def _picker(positions: tuple) -> Callable[[Sequence], tuple]:
    """The items of a sequence at ``positions``, as a tuple (``itemgetter`` of one position gives the item)."""
    if len(positions) == 1:
        (i,) = positions
        return lambda leaves: (leaves[i],)
    return operator.itemgetter(*positions) if positions else (lambda leaves: ())


def traced(fn: Callable, packing: Packing) -> Callable:
    """``fn`` (a function of the graph's leaves) as a function of the packed arguments."""
    passed, floats, ints, count = packing.passed, packing.floats, packing.ints, packing.count

    at = {i: (g, j) for g, positions in enumerate((floats, ints)) for j, i in enumerate(positions)}
    stacks = getattr(fn, "stacks_numbers", False)

    def run(*args):
        leaves: list = [None] * count
        for i, v in zip(passed, args):
            leaves[i] = v
        k = len(passed)
        arrays: list = [None, None]
        for g, positions in enumerate((floats, ints)):
            if positions:
                packed = arrays[g] = args[k]
                k += 1
                for j, i in enumerate(positions):
                    leaves[i] = _convert_element_type(lax.index_in_dim(packed, j, keepdims=False), weak_type=True)
        if not stacks:
            return fn(*leaves)
        return fn(*leaves, column=lambda wanted: _column(arrays, at, wanted))

    return run


def _column(arrays: list, at: dict, wanted: Sequence[int]):
    """The numbers of leaves ``wanted`` as one array, read from their packed array in one op, or ``None`` when they
    are not all in the same one. For a graph traced as a loop (:mod:`.loop_rolling`): stacked from the per-leaf
    elements, ``n`` numbers were ``n`` slices, each a kernel XLA:CPU compiles on its own."""
    places = [at.get(i) for i in wanted]
    if not places or None in places or len({g for g, _ in places}) != 1:
        return None
    packed, index = arrays[places[0][0]], [j for _, j in places]
    step = index[1] - index[0] if len(index) > 1 else 1
    if step > 0 and all(b - a == step for a, b in zip(index, index[1:])):
        return lax.slice(packed, (index[0],), (index[-1] + 1,), (step,))
    return jnp.take(packed, np.asarray(index, np.int32))


def arguments(packing: Packing, leaves: Sequence) -> list:
    """The executable's arguments for these leaves. A number out of its array's range raises ``OverflowError``, as
    JAX does for such a Python number."""
    passed, floats, ints = packing.take
    args = list(passed(leaves))
    if packing.floats:
        args.append(np.array(floats(leaves), packing.float_dtype))
    if packing.ints:
        args.append(np.array(ints(leaves), packing.int_dtype))
    return args


def convention(packing: Packing | None) -> str:
    """How a graph's executable takes its arguments, for the persistent cache's key: with and without packing
    the same graph is two executables (its own calling convention each)."""
    return "" if packing is None else f"numbers packed as {packing.float_dtype}, {packing.int_dtype}"


def donated(packing: Packing | None, donate: tuple) -> tuple:
    """Donated leaf positions as positions of the executable's arguments (donated leaves are arrays: passed)."""
    if packing is None or not donate:
        return donate
    at = {i: k for k, i in enumerate(packing.passed)}
    return tuple(at[i] for i in donate)


def _weak_types() -> bool:
    """Whether JAX's conversion can make an element of a packed array the weak-typed scalar a Python number is (its
    signature, read once: tracing it here would count as a trace in a warm process that must make none)."""
    if not _usable:
        try:
            _usable.append(_convert_element_type is not None
                           and "weak_type" in inspect.signature(_convert_element_type).parameters)
        except (TypeError, ValueError):  # no signature to read
            _usable.append(False)
    return _usable[0]
