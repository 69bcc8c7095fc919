"""What one XLA program costs: XLA's own cost analysis (FLOPs, bytes accessed) of an executable, computed once
when the executable is built and kept with it, so a profile can say how far each program ran from the hardware.

Kept beside the executable rather than in it: a ``jax.stages.Compiled`` has no room for our data, so
:data:`_COSTS` maps each executable (weakly: an evicted executable takes its cost with it) to its
:class:`ProgramCost`. An executable loaded from the persistent cache gets the cost stored in its entry
(:mod:`.compile_cache` writes it next to the payload), so a warm process analyses nothing.

Device time per run: while a profile records, :func:`wait_if_profiled` waits for a sample of each program's runs
right after they were launched (its first run in the profile, and its second too when the first was the
executable's first run ever, then one in :data:`SAMPLE_EVERY`), so those run events last as long as the device
took (on XLA:CPU the device is the host: this is its execution time) and say ``measured``; the profile estimates
the other runs from them. Waiting for every run serialized host and device: on a tiny transformer's training
step that was most of the profile's own cost, and each wait still costs a step the overlap of host and device,
so a program that ran before the profile is waited for once fewer. Without a profile nothing waits and dispatch
stays asynchronous.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import jax

from .. import telemetry


@dataclass(frozen=True, slots=True)
class ProgramCost:
    """XLA's static estimate for one run of a program: floating-point operations, bytes read and written
    (arguments, outputs and what its fusions touch), and transcendental operations."""

    flops: float
    bytes_accessed: float
    transcendentals: float = 0.0

    def to_dict(self) -> dict:
        return {"flops": self.flops, "bytes_accessed": self.bytes_accessed, "transcendentals": self.transcendentals}

    @classmethod
    def from_dict(cls, d: dict) -> ProgramCost:
        return cls(float(d["flops"]), float(d["bytes_accessed"]), float(d.get("transcendentals", 0.0)))


_COSTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def analyse(compiled) -> ProgramCost | None:
    """XLA's cost analysis of ``compiled``; ``None`` where the backend gives none (the profile then says the
    program's cost is unknown rather than zero)."""
    try:
        raw = compiled.cost_analysis()
    except Exception:  # noqa: BLE001 — not every backend or executable kind implements it
        return None
    if isinstance(raw, (list, tuple)):  # older JAX: one dict per partition
        raw = raw[0] if raw else None
    if not raw or "flops" not in raw:
        return None
    return ProgramCost(max(0.0, float(raw.get("flops", 0.0))), max(0.0, float(raw.get("bytes accessed", 0.0))),
                       max(0.0, float(raw.get("transcendentals", 0.0))))


def remember(executable, cost: ProgramCost | None) -> None:
    """Keep ``cost`` with ``executable`` (for as long as the executable lives)."""
    if cost is None:
        return
    try:
        _COSTS[executable] = cost
    except TypeError:  # not weak-referenceable: analysed again on demand
        pass


def of(executable) -> ProgramCost | None:
    """The cost kept with ``executable``, analysing it once if it was built elsewhere (``None``: unknown)."""
    try:
        cost = _COSTS.get(executable)
    except TypeError:
        return analyse(executable)
    if cost is None:
        cost = analyse(executable)
        remember(executable, cost)
    return cost


#: a profile waits for one run in SAMPLE_EVERY of each program, counting from its first run in the profile; an
#: executable's first run ever often pays one-time costs (XLA:CPU building its kernels: the estimate of the other
#: runs leaves it out), so its next run is waited for too
SAMPLE_EVERY = 8

#: runs of each program (by id of its executable) seen by the profile :data:`_COUNTING` names, its events list
_RUNS: dict[int, int] = {}
#: programs whose first run in that profile was their first run ever
_FRESH: set[int] = set()
_COUNTING: list = [None]


def wait_if_profiled(executable, outputs, fresh: bool) -> bool:
    """While a profile records, wait until ``outputs`` are computed if this run of ``executable`` is one the
    profile samples, so the run's duration is its device time; whether it waited (the run event's ``measured``).
    ``fresh``: the executable was just built or loaded, so this is its first run ever."""
    recorders = telemetry.recorders
    if not recorders:
        return False
    if recorders[0] is not _COUNTING[0]:  # a new outermost profile counts from zero
        _RUNS.clear()
        _FRESH.clear()
        _COUNTING[0] = recorders[0]
    key = id(executable)
    n = _RUNS.get(key, 0)
    _RUNS[key] = n + 1
    if fresh:
        _FRESH.add(key)
    if n % SAMPLE_EVERY == 0 or (n == 1 and key in _FRESH):
        jax.block_until_ready(outputs)
        return True
    return False


def run_detail(executable, measured: bool = True, fresh: bool = False) -> dict:
    """What a run event carries about its program (``telemetry.record_execute(..., **run_detail(exe, waited,
    fresh))``): the executable, its cost, whether the run was waited for and whether it was the executable's
    first run ever while a profile records, nothing otherwise (the hot path pays a list check)."""
    if not telemetry.recording():
        return {}
    return {"executable": executable, "cost": of(executable), "measured": measured, "fresh": fresh}
