"""Compiled programs' code kept within the operating system's limit on a process's memory maps.

Why. XLA:CPU maps each compiled program's code into the process as memory regions of its own: a tiny decode
step's program takes ~280 of them, a small op's ~10. Linux allows a process ``vm.max_map_count`` of them (65,530
by default), and a process that reaches it aborts inside LLVM ("Unable to allocate section memory"), taking the
notebook's kernel and every tensor in it down. The caches that keep executables are bounded by entry counts
(graphs: 256), which at ~280 maps a program is past the limit already: a session that compiles a program per
token (beam search; any shape that keeps changing) crashed after about 230 of them.

So each new executable (compiled, or loaded from the persistent cache) is counted. When the maps could be near a
high-water mark (:data:`HIGH` of the limit) they are counted for real (``/proc/self/maps``). Between counts each
program is assumed to add what the programs since the previous count added, at least :data:`MAPS_PER_PROGRAM`: a
training step's program of a small model takes ~600–1,300 maps, and a fixed guess of 400 from a count of zero let
a session that trained thirty small models one after another reach the limit before its first count. Above the
mark, the least
recently used half of every cache holding programs (:func:`.caches.code_caches`) is evicted — they compile again,
or load from the persistent cache, when next needed — and if that is not enough, the rest of them. (The native
core's learned strict calls keep their executables; ``%tpu cache clear`` drops those.) Each eviction is counted
(``telemetry.counters["code_evictions"]``) and the first one warns, naming the limit and the fixes. Where the
limit cannot be read (not Linux), nothing is counted.
"""

from __future__ import annotations

import warnings

from .. import caches, telemetry

#: evict when the process's maps reach this share of the limit ...
HIGH = 0.6
#: ... down to this share (else every program in those caches goes)
LOW = 0.45
#: the fewest maps a new program is assumed to add between counts (counting is ~10 ms at 60k maps)
MAPS_PER_PROGRAM = 400
#: programs made between two counts, at most, however far the high-water mark seems (a count costs well under a
#: compile; eight programs of a few thousand maps each stay within the headroom above the mark)
MAX_UNCOUNTED = 8

#: ``limit`` (``None``: unknown, no budget; read once), ``maps`` at the last count (``None``: not counted yet),
#: ``made`` since it, ``per``: maps a program is assumed to add until the next count
_state: dict = {"limit": -1, "maps": None, "made": 0, "per": MAPS_PER_PROGRAM, "warned": False}


def limit() -> int | None:
    """The process's limit on memory maps (``vm.max_map_count``), or ``None`` where it cannot be read."""
    if _state["limit"] == -1:
        try:
            with open("/proc/sys/vm/max_map_count") as f:
                _state["limit"] = int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            _state["limit"] = None
    return _state["limit"]


def maps() -> int:
    """How many memory maps the process has now (``0`` where that cannot be read)."""
    try:
        with open("/proc/self/maps", "rb") as f:
            return f.read().count(b"\n")
    except OSError:
        return 0


def note_new_program() -> None:
    """One more executable exists: count the maps when they could be past :data:`HIGH`, and evict above it."""
    cap = limit()
    if cap is None:
        return
    _state["made"] += 1
    last, made = _state["maps"], _state["made"]
    if last is not None and made < MAX_UNCOUNTED and last + made * _state["per"] < HIGH * cap:
        return
    now = maps()
    if last is not None:  # what the programs since the last count added, each (other growth counted with them)
        _state["per"] = max(MAPS_PER_PROGRAM, (now - last) / made)
    _state["maps"], _state["made"] = now, 0
    if now >= HIGH * cap:
        _evict(now, cap)


def _evict(now: int, cap: int) -> None:
    evicted = sum(c.shrink(len(c) // 2) for c in caches.code_caches())
    after = maps()
    if after >= LOW * cap:  # the newer half holds most of them: every program goes
        evicted += sum(c.shrink(0) for c in caches.code_caches())
        after = maps()
    _state["maps"] = after
    telemetry.count("code_evictions")
    telemetry.count("code_evicted_entries", evicted)
    if not _state["warned"]:
        _state["warned"] = True
        warnings.warn(
            f"torchtpu_lab: this process's compiled programs neared the OS's limit on memory maps ({now} of "
            f"vm.max_map_count={cap}; at the limit the process aborts), so the least recently used ones were "
            f"dropped ({evicted} cache entries; {after} maps now): they compile again, or load from the persistent "
            "cache, when next needed. Programs this many usually mean recompiles: %%tpu_profile names their "
            "cause. A higher limit (sudo sysctl -w vm.max_map_count=262144) keeps more of them.",
            RuntimeWarning, stacklevel=2)
