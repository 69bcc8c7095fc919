"""The session: one object, :data:`SESSION` (``torchtpu_lab.session``), through which all of the process's
mutable torchtpu_lab state is reached, saved, restored and cleared.

**Shape.** Configuration values are :class:`torchtpu_lab.config.State` s, which live in the bottom-layer
:mod:`torchtpu_lab.config` because the device and ops layers read them (a lower layer never imports a higher
one). Everything else is owned by the layer that uses it on its hot path and referenced here: the pending fused
graph and its lock (:data:`.fused.PENDING`, :data:`.fused.LOCK`), the bounded executable and plan caches
(:data:`.executor.OPS`, :data:`.fused.GRAPHS` and the rest of the registry of :mod:`torchtpu_lab.caches`), the
compile history behind the cause analysis (:mod:`.compile_events`, cleared with the caches), the profile
recorders (:data:`torchtpu_lab.telemetry.recorders`), the memory listeners
(:data:`torchtpu_lab.device.memory.listeners`) and the persistent cache's directory. So per-op code keeps one
module-global and one slot read per value (the old ``modes.current()``, a call and a dict lookup, measured about
3x the cost of ``config.eager_mode.value``), while users and tests have one place to look and one call to put
everything back:

* ``with torchtpu_lab.session.patch(eager_mode="strict", cpu_fallback=False): ...`` (any
  :data:`torchtpu_lab.config.STATES` name; the previous values return on exit, even on error);
* ``saved = session.snapshot(); ...; session.restore(saved)`` (configuration, recorders, listeners and the
  persistent cache directory: what ``tests/conftest.py`` puts back after every test);
* ``session.clear()`` and ``%tpu cache clear`` (:func:`clear_everything`): run pending work, then forget every
  compiled executable, plan and the compile history. Cache sizes are set per cache with
  :func:`torchtpu_lab.caches.resize` or ``TORCHTPU_LAB_CACHE_<NAME>``, and ``metrics_report()`` shows each
  cache's entries, hits, misses and evictions.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass
from typing import Any

from .. import caches, config, telemetry
from ..device import memory
from ..telemetry import SyncReason
from . import compile_cache, compile_events, executor, fused


@dataclass(frozen=True)
class Snapshot:
    """What :meth:`Session.restore` puts back (taken by :meth:`Session.snapshot`)."""

    config: dict[str, Any]
    recorders: tuple
    memory_listeners: tuple
    memory_sample_logs: tuple
    persistent_cache: tuple[str | None, bool]


class Session:
    """The process's torchtpu_lab state (see the module docstring for what lives where, and why)."""

    #: the configuration states, by name (``session.config.eager_mode.value``)
    config = config

    @property
    def pending(self) -> fused.PendingWork:
        """Fused work recorded and not yet run."""
        return fused.PENDING

    @property
    def lock(self) -> threading.RLock:
        """Owns the pending graph and every storage (see :mod:`.fused`, "Threads")."""
        return fused.LOCK

    @property
    def op_executables(self) -> caches.LRUCache:
        return executor.OPS

    @property
    def graph_executables(self) -> caches.LRUCache:
        return fused.GRAPHS

    def caches(self) -> dict[str, dict]:
        """Entries, bound, hits, misses and evictions of every cache."""
        return caches.stats()

    @property
    def recorders(self) -> list:
        """The event lists of the open profiles (:class:`torchtpu_lab.telemetry.Recorder`)."""
        return telemetry.recorders

    @property
    def memory_listeners(self) -> list:
        return memory.listeners

    @property
    def memory_sample_logs(self) -> list:
        """The open profiles' memory sample logs (:class:`torchtpu_lab.device.memory.SampleLog`)."""
        return memory.sample_logs

    def patch(self, **values) -> contextlib.AbstractContextManager:
        """Set configuration states for a block (see :func:`torchtpu_lab.config.patch`)."""
        return config.patch(**values)

    def snapshot(self) -> Snapshot:
        return Snapshot(config.snapshot(), tuple(telemetry.recorders), tuple(memory.listeners),
                        tuple(memory.sample_logs), compile_cache.settings())

    def restore(self, saved: Snapshot) -> None:
        """Put back everything :meth:`snapshot` saved. Every part is restored even when leaving fused mode has to
        run pending work that fails; that failure is raised afterwards."""
        # the persistent cache first: a test that turned it on must not make the flush below load from disk
        compile_cache.use_settings(saved.persistent_cache)
        telemetry.recorders[:] = saved.recorders
        memory.listeners[:] = saved.memory_listeners
        memory.sample_logs[:] = saved.memory_sample_logs
        config.restore(saved.config)

    def clear(self) -> int:
        """Run pending work, then forget every compiled executable, plan and compile history; returns the number
        of cache entries dropped. The next run of each signature compiles (or loads from disk) again."""
        fused.sync(SyncReason.USER_SYNC)
        dropped = caches.clear_all()
        compile_events.clear()
        fused.CUTS.clear()  # cut points name op executables by identity: they go with the executables
        return dropped

    def clear_everything(self) -> str:
        """``%tpu cache clear`` and the panel's button: every in-memory cache and the persistent cache's entries;
        returns what was done, as a sentence."""
        dropped = self.clear()
        removed = compile_cache.clear()
        return (f"removed {removed} entries from {compile_cache.directory() or '(no persistent cache)'} and "
                f"cleared {dropped} in-memory cache entries (executables, plans, compile history)")


SESSION = Session()


def clear() -> int:
    """See :meth:`Session.clear`."""
    return SESSION.clear()


def clear_everything() -> str:
    """See :meth:`Session.clear_everything`."""
    return SESSION.clear_everything()
