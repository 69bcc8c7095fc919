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
import threading
from collections.abc import Callable, Iterator

_SIGINT = signal.SIGINT
_default = signal.default_int_handler
_main_ident = threading.main_thread().ident

#: Code objects of functions that C++ may call; an interrupt landing inside one is deferred.
_GUARDED: set = set()
_state = threading.local()
_pending = [False]
_redelivery = [False]
_counts = {"deferred": 0, "delivered": 0}
#: seconds between a deferral inside a C++ callback and the next delivery attempt
REDELIVERY_DELAY = 0.02


def guard(fn: Callable) -> Callable:
    """Mark ``fn`` (a function C++ may call) so that an interrupt never raises inside it; returns ``fn``."""
    code = getattr(fn, "__code__", None) or getattr(getattr(fn, "__func__", None), "__code__", None)
    if code is not None:
        _GUARDED.add(code)
    return fn


def _depth() -> int:
    return getattr(_state, "depth", 0)


def _in_guarded(frame) -> bool:
    guarded = _GUARDED
    while frame is not None:
        if frame.f_code in guarded:
            return True
        frame = frame.f_back
    return False


def _redeliver() -> None:
    _redelivery[0] = False
    if _pending[0]:
        _thread.interrupt_main(_SIGINT)


def _handler(signum, frame) -> None:
    if _depth() > 0:  # inside deferred(): raised when the outermost block exits
        _pending[0] = True
        _counts["deferred"] += 1
        return
    if _in_guarded(frame):
        _pending[0] = True
        _counts["deferred"] += 1
        if not _redelivery[0]:
            _redelivery[0] = True
            t = threading.Timer(REDELIVERY_DELAY, _redeliver)
            t.daemon = True
            t.start()
        return
    _pending[0] = False
    _counts["delivered"] += 1
    raise KeyboardInterrupt


guard(_handler)  # a handler running inside another call of itself (a second Ctrl-C) defers too


def ensure_installed() -> None:
    """Install the deferring SIGINT handler where Python's default one is active (main thread only; cheap)."""
    if threading.get_ident() != _main_ident:
        return
    try:
        if _signal.getsignal(_SIGINT) is _default:
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
        if _state.depth == 0 and _pending[0] and threading.get_ident() == _main_ident:
            _pending[0] = False
            _counts["delivered"] += 1
            raise KeyboardInterrupt


def checkpoint() -> None:
    """A safe point: raise an interrupt that was deferred earlier (main thread only)."""
    if _pending[0] and _depth() == 0 and threading.get_ident() == _main_ident:
        _pending[0] = False
        _counts["delivered"] += 1
        raise KeyboardInterrupt


def stats() -> dict:
    """How many interrupts were deferred and how many delivered so far."""
    return dict(_counts)
