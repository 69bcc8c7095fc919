"""Warm start: a fresh process loads the executables its previous run used, in the background, before it asks.

Why: with a warm persistent cache, the first step of a new process still waited ~25 ms to deserialize its graph's
executable and ~25 ms more for that executable's first run — XLA:CPU builds a loaded program's kernels (its YNN
dot fusions) lazily, on the first call — both on the step's critical path, after its recording. Neither needs the
step: so each process keeps a short list of the cache entries it used, in the order it first used them
(``recent-<origin>.json`` beside the entries: one list per notebook, script or working directory), and the next
process of the same origin loads them on a daemon thread as soon as its device exists. On the cpu platform each is
also run once on zeros (programs without loops, callbacks or host transfers only: zeros must not make a program
spin, and nothing else sees these runs). The first request for an entry takes it; a request for one the thread is
loading waits for it rather than loading it twice; one it has not reached is loaded by the caller as before.

What it costs: the thread's loads and runs (the deserialization and the runs release the GIL), and memory for
loaded executables a changed notebook no longer asks for (at most :data:`MAX_ENTRIES` entries and
:data:`MAX_BYTES` of them). ``config.prefetch_executables`` (``TORCHTPU_LAB_PREFETCH=0``) turns it off.

Counters: ``persistent_cache_prefetched`` (requests served by the thread's work).
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import re
import sys
import tempfile
import threading
import time
from typing import Callable

import numpy as np

from .. import config, telemetry

#: how many entries a list keeps, and how many bytes of entries one process loads ahead
MAX_ENTRIES = 128
MAX_BYTES = 256 << 20
#: a warm-up run only for programs whose inputs fit in this many bytes
_WARM_INPUT_BYTES = 64 << 20
#: what a program that runs on zeros must not contain (loops that zeros could make endless, host round trips)
_NOT_ON_ZEROS = re.compile(r"\bwhile\(|callback|\binfeed\(|\boutfeed\(|\brecv\(|\bsend\(")
_WRITE_EVERY_S = 1.0
#: the longest a request waits for the entry the thread is loading before loading it itself
_WAIT_S = 120.0


def origin() -> str:
    """Who this process is, for its list: the notebook (``$JPY_SESSION_NAME``, which Jupyter sets for a
    kernel), else the script, else the working directory; a digest, since a list's name must not leak paths."""
    who = os.environ.get("JPY_SESSION_NAME")
    if not who:
        main = getattr(sys.modules.get("__main__"), "__file__", None)
        who = os.path.abspath(main) if main else f"<interactive>:{os.getcwd()}"
    return hashlib.sha256(who.encode()).hexdigest()[:16]


class _Slot:
    """One entry the thread may load: claimed by whoever gets to it first."""

    __slots__ = ("state", "done", "result")

    def __init__(self) -> None:
        self.state = "waiting"  # -> "loading" (the thread) or "claimed" (a caller got there first)
        self.done = threading.Event()
        self.result = None


class Prefetcher:
    """The used-entries list of this process and the background loads of the previous one's (see module doc)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._slots: dict[str, _Slot] = {}
        self._used: list[str] = []
        self._seen: set[str] = set()
        self._dir: str | None = None
        self._writable = False
        self._dirty = False
        self._last_write = 0.0
        self._thread: threading.Thread | None = None
        self._stop = False
        atexit.register(self.close)
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._forget)

    def _forget(self) -> None:
        """In a forked child: the thread did not come along, so nothing it was loading will ever arrive."""
        self._lock = threading.Lock()
        self._slots, self._thread = {}, None

    # ---- the list -------------------------------------------------------------------------------------

    def _path(self, directory: str) -> str:
        return os.path.join(directory, f"recent-{origin()}.json")

    @staticmethod
    def is_list(name: str) -> bool:
        """Whether a file name in the cache directory is one of these lists."""
        return name.startswith("recent-") and name.endswith(".json")

    def used(self, directory: str, writable: bool, key: str) -> None:
        """Note that this process used cache entry ``key`` (loaded or stored it); the list is written at most
        once a second and at exit."""
        if key in self._seen:
            return
        self._seen.add(key)
        self._used.append(key)
        self._dir, self._writable, self._dirty = directory, writable, True
        if time.monotonic() - self._last_write >= _WRITE_EVERY_S:
            self.write()

    def _read(self, directory: str) -> list[str]:
        try:
            with open(self._path(directory), encoding="utf-8") as f:
                keys = json.load(f)
        except (OSError, ValueError):
            return []
        return [k for k in keys if isinstance(k, str) and re.fullmatch(r"[0-9a-f]{16,128}", k)] \
            if isinstance(keys, list) else []

    def write(self) -> None:
        """Write this process's list: its entries in first-use order, then the earlier list's others."""
        directory = self._dir
        if not (self._dirty and directory and self._writable):
            return
        self._dirty, self._last_write = False, time.monotonic()
        keys = list(self._used)
        keys += [k for k in self._read(directory) if k not in self._seen]
        try:
            fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-recent-", suffix=".json")
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(keys[:MAX_ENTRIES], f)
            os.replace(tmp, self._path(directory))
        except OSError:
            pass  # a full or read-only disk: the next process simply starts cold

    # ---- the loads --------------------------------------------------------------------------------------

    def start(self, directory: str, suffix: str, device, load: Callable, run_on_zeros: bool,
              prepare: Callable[[], object] | None = None) -> bool:
        """Load the entries the previous process of this origin used on a daemon thread (at most once per
        process), after calling ``prepare()`` there (the cache's key context: a digest of the package's source);
        ``load(key, device)`` is the cache's own loader. Returns whether a thread started."""
        if self._thread is not None or not config.prefetch_executables.value:
            return False
        budget, order = MAX_BYTES, []
        for key in self._read(directory):
            try:
                size = os.stat(os.path.join(directory, key + suffix)).st_size
            except OSError:
                continue
            if size > budget:
                break
            budget -= size
            order.append(key)
        if not order:
            return False
        with self._lock:
            for key in order:
                self._slots.setdefault(key, _Slot())
        self._thread = threading.Thread(target=self._run, args=(order, device, load, run_on_zeros, prepare),
                                        name="torchtpu_lab-prefetch", daemon=True)
        self._thread.start()
        return True

    def _run(self, order: list[str], device, load: Callable, run_on_zeros: bool, prepare) -> None:
        if prepare is not None:
            try:
                prepare()
            except Exception:  # noqa: BLE001 — the main thread meets the same error when it needs the context
                pass
        for key in order:
            with self._lock:
                slot = self._slots.get(key)
                if self._stop or slot is None or slot.state != "waiting":
                    continue
                slot.state = "loading"
            try:
                slot.result = load(key, device)
                if slot.result is not None and run_on_zeros:
                    _run_once(slot.result[0])
            except Exception:  # noqa: BLE001 — a failed load or warm-up leaves the request to load it itself
                slot.result = None
            finally:
                slot.done.set()

    def take(self, key: str):
        """What the thread loaded for ``key`` (waiting if it is loading it now), or ``None``: not on the
        list, not reached yet (then the thread skips it), or its load failed."""
        with self._lock:
            slot = self._slots.pop(key, None)
            if slot is None:
                return None
            if slot.state == "waiting":
                slot.state = "claimed"
                return None
        if not slot.done.wait(_WAIT_S):  # a load stuck in XLA: the caller loads its own copy
            return None
        if slot.result is not None:
            telemetry.count("persistent_cache_prefetched")
        return slot.result

    def close(self) -> None:
        """Stop the thread after the entry it is on (it must not be inside XLA while the process exits) and
        write the list."""
        self._stop = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.write()


def _run_once(compiled) -> None:
    """Run ``compiled`` once on zeros of its input shapes, so its first real call finds its kernels built."""
    import jax

    if _NOT_ON_ZEROS.search(compiled.as_text() or "while("):
        return
    avals = jax.tree_util.tree_leaves(compiled.in_avals)
    if sum(a.size * np.dtype(a.dtype).itemsize for a in avals) > _WARM_INPUT_BYTES:
        return
    shardings = jax.tree_util.tree_leaves(compiled.input_shardings)
    leaves = [jax.device_put(np.zeros(a.shape, a.dtype), s) for a, s in zip(avals, shardings)]
    args, kwargs = jax.tree_util.tree_unflatten(compiled.in_tree, leaves)
    jax.block_until_ready(compiled(*args, **kwargs))


PREFETCHER = Prefetcher()
