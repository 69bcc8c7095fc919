"""What tracing an op with checks tells fused mode, kept in the persistent cache so a warm process need not trace.

Fused mode records an op without running it, so it must know the op's outputs. PyTorch's meta kernels say that
for most ops, but an op that reports bad input (``nll_loss``'s target bounds, ``embedding``'s indices) also
returns error flags, and how many — and which checks they belong to — only a trace of its lowering knows. In a
fresh process that trace is the first of its ``jnp`` functions (``nll_loss``: 22 nested jits, ~17 ms here: a
seventh of a small model's warm first training step, whose graph itself comes from disk untraced). So the trace's
answer — the abstract outputs, their pytree structure and the checks — is stored next to the executables, under
the same kind of key (the op signature, the package source, the versions), and read back instead.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ..ops.error_flags import Check
from . import compile_cache

_KIND = "op-avals"


def known(signature, device) -> tuple[list, object, list] | None:
    """``(avals, treedef, checks)`` stored for this op signature on ``device`` (a ``jax.Device``), or ``None``."""
    facts = compile_cache.load_facts(_KIND, signature, device)
    if facts is None:
        return None
    try:
        avals = [jax.ShapeDtypeStruct(tuple(shape), jnp.dtype(dtype), weak_type=bool(weak))
                 for shape, dtype, weak in facts["avals"]]
        treedef = compile_cache.tree_from_skeleton(facts["tree"])
        checks = [Check.decode(c) for c in facts["checks"]]
    except Exception:  # noqa: BLE001 — facts that do not decode mean "trace instead"
        return None
    if treedef.num_leaves != len(avals):
        return None
    return avals, treedef, checks


def remember(signature, device, avals: list, treedef, checks: list) -> None:
    """Store what a trace found (nothing when a check's error class cannot be named again, or the cache is off)."""
    encoded = [c.encode() for c in checks]
    if None in encoded or compile_cache.directory() is None:
        return
    try:
        facts = {"avals": [[list(a.shape), jnp.dtype(a.dtype).name, bool(getattr(a, "weak_type", False))]
                           for a in avals],
                 "tree": compile_cache.tree_skeleton(treedef), "checks": encoded}
    except TypeError:  # a pytree node the skeleton cannot describe
        return
    compile_cache.store_facts(_KIND, signature, device, facts)
