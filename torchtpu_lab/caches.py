"""Bounded, counted caches: every cache the package keeps is an :class:`LRUCache` registered here by name.

A notebook kernel lives for days, and every new shape, view or graph structure adds an entry; an unbounded
cache is a slow leak. So each cache has a maximum size (least recently used entries are evicted first), counts
its hits, misses and evictions (shown by ``metrics_report()`` and ``%tpu cache``), and can be cleared with all
the others (``%tpu cache clear``, :func:`clear_all`). Sizes are configurable per cache: ``resize(name, n)`` or
the environment variable ``TORCHTPU_LAB_CACHE_<NAME>`` (e.g. ``TORCHTPU_LAB_CACHE_GRAPHS=256``) at start-up.

This module sits at the bottom of the package (next to telemetry): any layer may own a cache.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

_MISSING = object()


class LRUCache:
    """A dict with a size bound, least-recently-used eviction and hit/miss/eviction counters.

    ``get`` is the hot-path call: one ``OrderedDict`` lookup and ``move_to_end`` on a hit. ``on_evict`` (if
    given) is told of each evicted value, e.g. to drop derived state.
    """

    __slots__ = ("name", "maxsize", "hits", "misses", "evictions", "_data", "_lock", "on_evict", "code")

    def __init__(self, name: str, maxsize: int, on_evict: Callable[[Hashable, Any], None] | None = None,
                 code: bool = False):
        if maxsize < 1:
            raise ValueError(f"cache {name!r}: maxsize must be at least 1, got {maxsize}")
        self.name = name
        self.maxsize = maxsize
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        self._data: OrderedDict = OrderedDict()
        self._lock = threading.Lock()
        self.on_evict = on_evict
        self.code = code  # its values hold compiled programs (runtime/code_budget.py evicts them first)

    def get(self, key: Hashable, default: Any = None) -> Any:
        """The value for ``key`` (counted as a hit, and marked most recently used), else ``default`` (a miss)."""
        data = self._data
        value = data.get(key, _MISSING)
        if value is _MISSING:
            self.misses += 1
            return default
        self.hits += 1
        try:
            data.move_to_end(key)
        except KeyError:  # evicted by another thread between the two calls
            pass
        return value

    def peek(self, key: Hashable, default: Any = None) -> Any:
        """Like :meth:`get`, but neither counted nor reordered (for analysis code, not the hot path)."""
        return self._data.get(key, default)

    def put(self, key: Hashable, value: Any) -> None:
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
        if len(self._data) > self.maxsize:
            self.shrink(self.maxsize)

    def shrink(self, keep: int) -> int:
        """Evict the least recently used entries until at most ``keep`` are left (the bound stays); returns how
        many went."""
        evicted = []
        with self._lock:
            while len(self._data) > max(keep, 0):
                evicted.append(self._data.popitem(last=False))
            self.evictions += len(evicted)
        if self.on_evict is not None:
            for k, v in evicted:
                self.on_evict(k, v)
        return len(evicted)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._data

    def __len__(self) -> int:
        return len(self._data)

    def keys(self) -> list:
        return list(self._data.keys())

    def values(self) -> list:
        return list(self._data.values())

    def clear(self) -> int:
        """Drop every entry (counters are kept: they describe the session); returns how many were dropped."""
        with self._lock:
            n = len(self._data)
            self._data.clear()
        return n

    def resize(self, maxsize: int) -> None:
        if maxsize < 1:
            raise ValueError(f"cache {self.name!r}: maxsize must be at least 1, got {maxsize}")
        self.maxsize = maxsize
        self.shrink(maxsize)

    def stats(self) -> dict:
        return {"entries": len(self._data), "maxsize": self.maxsize, "hits": self.hits, "misses": self.misses,
                "evictions": self.evictions}


_REGISTRY: dict[str, LRUCache] = {}


def _env_size(name: str, default: int) -> int:
    raw = os.environ.get(f"TORCHTPU_LAB_CACHE_{name.upper()}")
    if raw is None:
        return default
    try:
        size = int(raw)
    except ValueError:
        raise ValueError(f"TORCHTPU_LAB_CACHE_{name.upper()}={raw!r}: expected a positive integer") from None
    if size < 1:
        raise ValueError(f"TORCHTPU_LAB_CACHE_{name.upper()}={raw!r}: expected a positive integer")
    return size


def cache(name: str, maxsize: int, on_evict: Callable[[Hashable, Any], None] | None = None,
          code: bool = False) -> LRUCache:
    """The cache called ``name``, created (and registered) on first request with ``maxsize`` entries, or the
    size given by ``TORCHTPU_LAB_CACHE_<NAME>``. ``code``: its values hold compiled programs, whose code the
    process maps into memory (see :func:`code_caches`)."""
    existing = _REGISTRY.get(name)
    if existing is not None:
        existing.code = existing.code or code
        return existing
    c = _REGISTRY[name] = LRUCache(name, _env_size(name, maxsize), on_evict, code)
    return c


def code_caches() -> list[LRUCache]:
    """The caches whose values hold compiled programs: what runtime/code_budget.py evicts when the process's
    memory maps near the OS's limit."""
    return [c for c in _REGISTRY.values() if c.code]


def registry() -> dict[str, LRUCache]:
    """Every registered cache by name."""
    return dict(_REGISTRY)


def resize(name: str, maxsize: int) -> None:
    """Change the bound of one cache (evicting the least recently used entries beyond it)."""
    if name not in _REGISTRY:
        raise KeyError(f"no cache named {name!r}; caches: {', '.join(sorted(_REGISTRY))}")
    _REGISTRY[name].resize(maxsize)


_ON_CLEAR: list[Callable[[], None]] = []


def on_clear(fn: Callable[[], None]) -> None:
    """Have :func:`clear_all` also call ``fn`` (a cache kept outside this registry, e.g. in the native core)."""
    if fn not in _ON_CLEAR:
        _ON_CLEAR.append(fn)


def clear_all() -> int:
    """Empty every registered cache (and those registered with :func:`on_clear`); returns the number of
    registry entries dropped."""
    for fn in _ON_CLEAR:
        fn()
    return sum(c.clear() for c in _REGISTRY.values())


def stats() -> dict[str, dict]:
    """Per-cache entries, bound, hits, misses and evictions."""
    return {name: c.stats() for name, c in sorted(_REGISTRY.items())}


def memoize(name: str, maxsize: int, code: bool = False) -> Callable[[Callable], Callable]:
    """``functools.lru_cache`` with a registered, bounded, counted cache (positional hashable arguments);
    ``code``: as for :func:`cache`."""

    def wrap(fn: Callable) -> Callable:
        store = cache(name, maxsize, code=code)

        def cached(*args):
            value = store.get(args, _MISSING)
            if value is _MISSING:
                value = fn(*args)
                store.put(args, value)
            return value

        cached.__wrapped__ = fn
        cached.__name__ = fn.__name__
        cached.__doc__ = fn.__doc__
        cached.cache = store
        return cached

    return wrap
