"""Ctrl-C that never half-applies a sync and never fires inside a Python callback C++ called.

Two hazards, one mechanism (a SIGINT handler that can *defer*):

* **Critical sections** (:func:`deferred`): the commit of a fused graph — running the compiled program, whose
  donated input buffers are gone the moment it starts, and storing every result in its tensor — must happen
  entirely or not at all. Inside ``with deferred():`` an interrupt is remembered, not raised; it is raised when
  the outermost block exits, after the commit.
* **Python code called from C++** (:func:`guard`): PyTorch's Python-backend device guard and hooks, a storage's
  ``__del__``, JAX's ``gc`` callback and memory listeners run from C++ frames (some ``noexcept``) where a
  ``KeyboardInterrupt`` either aborts the process (``terminate called without an active exception``) or is
  swallowed as "Exception ignored". The handler walks the interrupted stack; if a guarded function is on it, the
  interrupt is deferred and delivered again a moment later (:func:`_thread.interrupt_main`), when Python is back
  at a point where raising is safe.

The handler only replaces Python's default one (``signal.default_int_handler``), from the main thread, and
:func:`ensure_installed` re-installs it cheaply where a host (IPython's kernel sets the default handler around
each cell) put the default back. A user's own SIGINT handler is left alone.
"""

from __future__ import annotations

import _signal
import _thread
import contextlib
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator

_SIGINT = signal.SIGINT
_default = signal.default_int_handler
_main_ident = threading.main_thread().ident

#: Code objects of functions that C++ may call; an interrupt landing inside one is deferred.
_GUARDED: set = set()
_state = threading.local()
_pending = [False]
_counts = {"deferred": 0, "delivered": 0, "attempts": 0}
#: seconds between a deferral inside a C++ callback and the next delivery attempt
REDELIVERY_DELAY = 0.02
#: deliveries attempted without reaching a safe point before the handler raises wherever it runs (~0.5 s)
ESCALATE_AFTER = 25


def guard(fn: Callable) -> Callable:
    """Mark ``fn`` (a function C++ may call) so that an interrupt never raises inside it; returns ``fn``."""
    code = getattr(fn, "__code__", None) or getattr(getattr(fn, "__func__", None), "__code__", None)
    if code is not None:
        _GUARDED.add(code)
    return fn


#: Re-entrant locks that, while the main thread owns them, mean "inside a tpu kernel or a sync": an interrupt
#: then waits for the outermost kernel to finish (see :func:`hold_while_owned`).
_busy_locks: list = []


def hold_while_owned(lock) -> None:
    """Defer interrupts while this thread owns ``lock`` (an ``RLock``; the runtime registers its kernel lock)."""
    if lock not in _busy_locks:
        _busy_locks.append(lock)


def _busy() -> bool:
    return any(lock._is_owned() for lock in _busy_locks)


def _depth() -> int:
    return getattr(_state, "depth", 0)


def _in_guarded(frame) -> bool:
    guarded = _GUARDED
    while frame is not None:
        if frame.f_code in guarded:
            return True
        frame = frame.f_back
    return False


def _redeliverer() -> None:
    """A daemon thread that re-sends a deferred interrupt a moment after it was deferred."""
    while True:
        _wake.wait()
        time.sleep(REDELIVERY_DELAY)
        _wake.clear()
        if _pending[0]:
            try:  # a real signal, so a blocking call (time.sleep, a lock wait) in the main thread wakes up too
                signal.pthread_kill(_main_ident, _SIGINT)
            except (AttributeError, OSError, ValueError):
                _thread.interrupt_main(_SIGINT)


_wake = threading.Event()
_redelivery_thread: list = []


def _handler(signum, frame) -> None:
    # Python runs a signal handler at the first bytecode of whatever function C++ calls next and reports the
    # *caller's* frame, so no frame test can prove that raising here is safe. The handler therefore defers
    # (almost) always; the interrupt is raised at a safe point (:func:`checkpoint`: the start of every tpu
    # kernel, the end of a sync, a host read), and where none comes — pure Python code — the redelivery
    # thread's repeated attempts escalate to raising wherever the handler runs after ``ESCALATE_AFTER`` tries.
    if _depth() > 0 or _busy() or _in_guarded(frame):
        _defer_and_redeliver()
        return
    if _pending[0] and _counts["attempts"] >= ESCALATE_AFTER:
        _deliver()
    _counts["attempts"] += 1
    _defer_and_redeliver()


def _deliver() -> None:
    _pending[0] = False
    _counts["attempts"] = 0
    _counts["delivered"] += 1
    raise KeyboardInterrupt


guard(_handler)  # a handler running inside another call of itself (a second Ctrl-C) defers too


def _unraisable(unraisable) -> None:
    """``sys.unraisablehook``: a ``KeyboardInterrupt`` raised on entry to a ``__del__`` or a ``gc`` callback
    (where Python can only print it) is deferred and delivered again instead of being lost; an interrupted
    ``Storage.__del__`` still releases its buffer (``finish_interrupted_del``)."""
    if isinstance(unraisable.exc_value, KeyboardInterrupt):
        tb = unraisable.exc_traceback
        while tb is not None:
            owner = tb.tb_frame.f_locals.get("self")
            finish = getattr(type(owner), "finish_interrupted_del", None) if owner is not None else None
            if finish is not None:
                finish(owner)
                break
            tb = tb.tb_next
        _defer_and_redeliver()
        return
    _previous_unraisable[0](unraisable)


_previous_unraisable: list = [None]


def install_unraisable_hook() -> None:
    """Install :func:`_unraisable` (once), chaining to the hook that was there."""
    if _previous_unraisable[0] is None:
        _previous_unraisable[0] = sys.unraisablehook
        sys.unraisablehook = _unraisable


def _defer_and_redeliver() -> None:
    _pending[0] = True
    _counts["deferred"] += 1
    _wake.set()  # no thread is started here: starting one waits on a lock, where an interrupt could land


def ensure_installed() -> None:
    """Install the deferring SIGINT handler where Python's default one is active (main thread only; cheap)."""
    if threading.get_ident() != _main_ident:
        return
    try:
        if _signal.getsignal(_SIGINT) is _default:
            if not _redelivery_thread:
                t = threading.Thread(target=_redeliverer, name="torchtpu_lab-interrupts", daemon=True)
                t.start()
                _redelivery_thread.append(t)
            _signal.signal(_SIGINT, _handler)
    except (ValueError, OSError):  # not the main interpreter, or signals unavailable
        pass


def installed() -> bool:
    return _signal.getsignal(_SIGINT) is _handler


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Hold interrupts for the duration of the block (this thread); a held one is raised as the block exits."""
    ensure_installed()
    _state.depth = _depth() + 1
    try:
        yield
    finally:
        _state.depth -= 1
        if _state.depth == 0 and _pending[0] and threading.get_ident() == _main_ident and not _busy():
            _deliver()  # (inside a kernel it stays pending: the next kernel's start raises it)


def checkpoint() -> None:
    """A safe point: raise an interrupt that was deferred earlier (main thread only)."""
    if _pending[0] and _depth() == 0 and threading.get_ident() == _main_ident and not _busy():
        _deliver()


def stats() -> dict:
    """How many interrupts were deferred and how many delivered so far."""
    return {k: v for k, v in _counts.items() if k != "attempts"}


#: a one-element list read without a call on the hot path (``if pending[0]: checkpoint()``)
pending = _pending
