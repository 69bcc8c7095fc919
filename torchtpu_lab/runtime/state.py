"""The runtime's memory of the session, in one place: every executable and plan cache (bounded LRUs from
:mod:`torchtpu_lab.caches`), the compile history behind the cause analysis, and the pending fused work.

``%tpu cache clear`` and :func:`clear` empty all of it (pending work is run first, so nothing is lost); cache
sizes are set per cache with :func:`torchtpu_lab.caches.resize` or ``TORCHTPU_LAB_CACHE_<NAME>``, and
``metrics_report()`` shows each cache's entries, hits, misses and evictions.
"""

from __future__ import annotations

from .. import caches
from ..telemetry import SyncReason
from . import compile_events, executor, lazy


class RuntimeState:
    """A view over the runtime's state objects (they live in the modules that use them on the hot path)."""

    @property
    def op_executables(self) -> caches.LRUCache:
        return executor._OPS

    @property
    def graph_executables(self) -> caches.LRUCache:
        return lazy._GRAPHS

    def caches(self) -> dict[str, dict]:
        """Entries, bound, hits, misses and evictions of every cache."""
        return caches.stats()

    def clear(self) -> int:
        """Run pending work, then forget every compiled executable, plan and compile history; returns the number
        of cache entries dropped. The next run of each signature compiles (or loads from disk) again."""
        lazy.sync(SyncReason.USER_SYNC)
        dropped = caches.clear_all()
        compile_events.clear()
        lazy.CUTS.clear()  # cut points name op executables by identity: they go with the executables
        return dropped


STATE = RuntimeState()


def clear() -> int:
    """See :meth:`RuntimeState.clear`."""
    return STATE.clear()


def clear_everything() -> str:
    """``%tpu cache clear`` and the panel's button: every in-memory cache and the persistent cache's entries;
    returns what was done, as a sentence."""
    from . import compile_cache

    dropped = STATE.clear()
    removed = compile_cache.clear()
    return (f"removed {removed} entries from {compile_cache.directory() or '(no persistent cache)'} and cleared "
            f"{dropped} in-memory cache entries (executables, plans, compile history)")
