"""What one XLA program costs: XLA's own cost analysis (FLOPs, bytes accessed) of an executable, computed once
when the executable is built and kept with it, so a profile can say how far each program ran from the hardware.

Kept beside the executable rather than in it: a ``jax.stages.Compiled`` has no room for our data, so
:data:`_COSTS` maps each executable (weakly: an evicted executable takes its cost with it) to its
:class:`ProgramCost`. An executable loaded from the persistent cache gets the cost stored in its entry
(:mod:`.compile_cache` writes it next to the payload), so a warm process analyses nothing.

Device time per run, without waiting: while a profile is open, every program run is timed by :func:`time_run`
without blocking the host. Its smallest output is watched (found once per program), and :func:`poll` looks at it
after the ops the profile records and the calls into the backend (``interrupts.after_entry``; the recording kernel
calls it from C++; at most one look every ``LOOK_EVERY_S``), right before and after each launch (XLA:CPU runs a
small program inside the launch call), around host reads (:func:`host_values`), and at the end of the profile,
which waits for what is still running. A run ends between the last look that found it running and the first that
found it done (their middle is taken), or at the end of a wait for it; it starts at its launch, or when the run
before it on its device ended, if later. A run whose end the looks do not bracket tightly (the host compiled, or
ran its own Python, in between) is not timed but estimated from the timed runs of its program. Waiting for runs serialized host and device: each wait cost a step the
overlap of the two, which is what a profile of a host-bound step is there to show, and on a tiny transformer's
training step that was most of the profile's own cost. Without a profile nothing is watched."""

from __future__ import annotations

import contextlib
import math
import threading
import time
import weakref
from dataclasses import dataclass

import jax
import numpy as np

from .. import interrupts, telemetry
from ..device.storage import is_array


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


class _Run:
    """A run being timed: its event, the output it is watched by, its device and where it starts."""

    __slots__ = ("event", "outputs", "device", "start")

    def __init__(self, event, outputs: list, device: int, start: float):
        self.event, self.outputs, self.device, self.start = event, outputs, device, start


#: how many profiles are open (runs are timed while one is: :func:`begin`, :func:`finish`)
_PROFILES = [0]
#: runs launched while a profile records and not yet seen done, in launch order
_UNTIMED: list[_Run] = []
#: device -> when its last run ended, as the looks tell (a run launched before that started then)
_DEVICE_FREE: dict[int, float] = {}
#: when poll last looked (a run it finds done ended after that look)
_LAST_LOOK = [0.0]
#: a run's end is the middle of the looks that bracket it (the last that found it running, the first that found
#: it done), or the end of a wait for it; it is timed only where half that bracket is at most this share of the
#: time measured (or LOOK_SLACK_S), and where no other run was found done at the same look: a run first seen
#: done after a long gap (the host compiled, or ran its own Python) is estimated from the timed runs of its
#: program instead
LOOK_GAP_SHARE = 0.25
LOOK_SLACK_S = 100e-6
#: a look this soon after the last one is skipped: ops a few µs apart each looked (a few µs of Python per look,
#: twenty looks per run of a tiny transformer's step), where a bracket half this wide is well inside LOOK_SLACK_S
LOOK_EVERY_S = 50e-6
_POLLING = threading.Lock()


def _each_array(outputs):
    """The device arrays among a run's outputs, in order (a step's program has a hundred: ``is_array``
    remembers the answer per type, where ``isinstance`` of ``jax.Array`` goes through its metaclass each time)."""
    return (a for a in (outputs if isinstance(outputs, (list, tuple)) else (outputs,)) if is_array(a))


def _arrays(outputs) -> list:
    return list(_each_array(outputs))


def _bytes(a) -> int:
    return math.prod(a.shape) * a.dtype.itemsize  # jax's own `nbytes` is a Python property at 1 µs a call


#: program -> the position among its outputs of the one its timed runs are watched by (the smallest array): a
#: step's program has a hundred outputs, whose sizes do not change from run to run
_WATCHED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _watched(outputs, program) -> object | None:
    """The output a run of ``program`` is watched by: its smallest device array (``None``: it has none), found
    once per program where ``program`` is given and can be weakly referenced."""
    many = isinstance(outputs, (list, tuple))
    if program is not None and many:
        try:
            at = _WATCHED.get(program)
        except TypeError:
            at = None
        if at is not None and at < len(outputs) and is_array(outputs[at]):
            return outputs[at]
    arrays = _arrays(outputs)
    if not arrays:
        return None
    smallest = min(arrays, key=_bytes)
    if program is not None and many:
        at = next(i for i, a in enumerate(outputs) if a is smallest)
        with contextlib.suppress(TypeError):
            _WATCHED[program] = at
    return smallest


def begin() -> None:
    """A profile starts: time the runs launched until its :func:`finish`."""
    _PROFILES[0] += 1


def before_launch() -> None:
    """A look just before a launch, while runs are being timed: a run that ends while the launch queues behind it
    is then bracketed by the launch call."""
    if _UNTIMED:
        poll()


def look_at_launch(outputs) -> tuple[float, bool] | None:
    """Right after a launch returned, while a profile is open: ``(now, whether its outputs are computed)``.
    XLA:CPU runs a small program inside the launch call: such a run ended between the launch's start and now."""
    if not _PROFILES[0]:
        return None
    now = time.perf_counter()
    first = next(_each_array(outputs), None)
    try:
        return now, first is not None and first.is_ready()
    except Exception:  # noqa: BLE001 — as not looked at
        return None


def time_run(event, outputs, device: int, launch_look: tuple[float, bool] | None = None, program=None) -> None:
    """While a profile records, time the run ``event`` records (its ``device_s``, ``measured`` once known) from
    ``outputs``, without waiting for them; ``launch_look``: :func:`look_at_launch`'s answer; ``program``: the
    executable that ran (its watched output is then found once)."""
    if not _PROFILES[0] or not telemetry.recorders:
        return
    watched = _watched(outputs, program)
    if watched is None:
        return
    if launch_look is not None:
        returned, ready = launch_look
        if ready:  # ended within the launch call (or its queueing behind the run before it)
            free = _DEVICE_FREE.get(device, event.t)
            start = free if event.t < free < returned else event.t
            event.detail["device_s"] = max(0.0, returned - start)
            event.detail["measured"] = True
            _DEVICE_FREE[device] = returned
            return
        if not _UNTIMED:
            _LAST_LOOK[0] = returned  # it was running then: a later look that finds it done brackets its end
    # The smallest output is held (all outputs of a run are computed together) until the run is seen done, so a
    # run whose results the user drops at once (a loss overwritten each step) is still seen to end. Its bytes
    # stay counted until then, which is also when the device could free them.
    _UNTIMED.append(_Run(event, [watched], device, event.t))
    if poll not in interrupts.after_entry:
        interrupts.after_entry.append(poll)


def timing() -> bool:
    """Whether runs are being timed now (a profile launched one that has not been seen done)."""
    return bool(_UNTIMED)


def _done(run: _Run) -> bool | None:
    """Whether ``run``'s outputs are computed (``None``: none left to look at: donated to a later program)."""
    for a in run.outputs:
        if not a.is_deleted():
            return a.is_ready()
    return None


@interrupts.guard
def poll(waited: bool = False) -> None:
    """Time the watched run that is done now: its end is between the last look and this one (the middle, if
    that bracket is tight), or now where the host has just waited for it (``waited``). Runs are looked at
    oldest first (a later run of a device ends after an earlier one). Never raises: the recording kernel calls
    it from C++."""
    now = time.perf_counter()
    if not waited and now - _LAST_LOOK[0] < LOOK_EVERY_S:
        return
    if not _POLLING.acquire(blocking=False):  # another thread is looking: its look serves this one
        return
    try:
        last, _LAST_LOOK[0] = _LAST_LOOK[0], now
        done_now = []
        while _UNTIMED:
            try:
                done = _done(_UNTIMED[0])
            except Exception:  # noqa: BLE001 — deleted between the checks: as not looked at
                done = None
            if done is False:
                break
            run = _UNTIMED.pop(0)
            run.outputs.clear()
            if done:
                done_now.append(run)
        if len(done_now) == 1:  # several found done at one look: their ends are not told apart (estimated)
            run = done_now[0]
            free = _DEVICE_FREE.get(run.device, run.start)
            start = free if run.start < free < now else run.start
            low = max(last, start)
            end, slack = (now, 0.0) if waited else ((low + now) / 2, (now - low) / 2)
            if slack <= max(LOOK_SLACK_S, LOOK_GAP_SHARE * (end - start)):
                run.event.detail["device_s"] = max(0.0, end - start)
                run.event.detail["measured"] = True
            _DEVICE_FREE[run.device] = end
        elif done_now:
            for run in done_now:
                _DEVICE_FREE[run.device] = now
        if not _UNTIMED:
            with contextlib.suppress(ValueError):
                interrupts.after_entry.remove(poll)
    except Exception:  # noqa: BLE001,S110 — a profile's bookkeeping must never break the op that called it
        pass
    finally:
        _POLLING.release()


def host_values(array) -> np.ndarray:
    """``np.asarray(array)``: the host's wait for ``array``, with a look at the runs being timed just before and
    just after it, so the run it waited for is timed to its end."""
    if not timing():
        return np.asarray(array)
    poll()
    out = np.asarray(array)
    poll(waited=True)
    return out


def finish() -> None:
    """A profile ends: wait for every watched run, oldest first, and time it (nothing it recorded is left
    unwatched)."""
    _PROFILES[0] = max(0, _PROFILES[0] - 1)
    while _UNTIMED:
        run = _UNTIMED[0]
        alive = [a for a in run.outputs if not a.is_deleted()]
        poll()  # what ended already is timed from the looks so far
        if _UNTIMED and _UNTIMED[0] is run:
            with contextlib.suppress(Exception):  # donated meanwhile: nothing left to wait for
                jax.block_until_ready(alive)
            before = len(_UNTIMED)
            poll(waited=True)
            if len(_UNTIMED) == before:  # another thread is polling: let it
                time.sleep(0.001)


def run_detail(executable, fresh: bool = False) -> dict:
    """What a run event carries about its program (``telemetry.record_execute(..., **run_detail(exe, fresh))``)
    while a profile records, nothing otherwise (the hot path pays a list check): the executable, its cost,
    whether it was its first run ever, and ``measured`` false until :func:`time_run` has timed it."""
    if not telemetry.recording():
        return {}
    return {"executable": executable, "cost": of(executable), "measured": False, "fresh": fresh}
