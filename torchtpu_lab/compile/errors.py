"""The one error of the compile layer's lowering (its own module, so :mod:`.lowering` and :mod:`.spmd` both raise
it without importing each other)."""

from __future__ import annotations


class NotLowerable(NotImplementedError):
    """A graph node that has no JAX form; the graph then runs eagerly (op by op) instead."""
