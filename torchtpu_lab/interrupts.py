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

**Foreign handlers.** A SIGINT handler of the user's or a library's own (frameworks install one for graceful
shutdown, often raising ``KeyboardInterrupt`` at once, as ``signal.default_int_handler`` does) would raise
inside a sync or a C++ callback just the same. So ours sits in front of any Python handler and *chains* it: ours
decides when (at the safe point), then calls theirs there with the frame of that point — raising, or whatever
else it does. :func:`ensure_installed` (run at every runtime entry point; one ``getsignal`` and an identity test
when nothing changed) puts ours back in front of a handler installed after it, from the main thread.
``SIG_IGN``/``SIG_DFL`` are left as set: there is no Python code to run. :func:`chained` names the handler
called behind ours.
"""

from __future__ import annotations

import _signal
import _thread
import contextlib
import functools
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator

_SIGINT = signal.SIGINT
_default = signal.default_int_handler
#: the Python handler ours calls at the safe point (``default_int_handler``: raise ``KeyboardInterrupt``)
_chained: list = [_default]
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
    """Mark ``fn`` (a function C++ may call, or an object whose ``__call__`` is Python) so that an interrupt never
    raises inside it; returns ``fn``."""
    code = getattr(fn, "__code__", None) or getattr(getattr(fn, "__func__", None), "__code__", None)
    if code is None and not isinstance(fn, type):
        code = getattr(getattr(type(fn), "__call__", None), "__code__", None)
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


#: ``[list]`` while a profile records the spans of the outermost entry-point calls (our kernels, syncs:
#: everything the backend does on the host, measured at the door), ``[None]`` otherwise; the profile's time
#: split shows what these spans hold beyond its recorded events as "torchtpu_lab host overhead". Flat (start,
#: end, start, end, ...): a pair per call would be one more object per op for the garbage collector to track
entry_spans: list = [None]


#: Callables run (never raising) after every outermost entry-point call while a profile times them, and after
#: every op a profile records (the recording kernel calls them from C++): how a profile times program runs
#: without waiting for them (``runtime.program_cost.poll``; here only while a run is being timed).
after_entry: list = []


def owning(lock) -> Callable[[Callable], Callable]:
    """A decorator for an entry point of the code ``lock`` protects: the call first passes a safe point (a
    deferred interrupt raises here, before anything was done; a no-op inside another such call) and then holds
    ``lock`` (re-entrant) for its whole length, during which an interrupt is deferred. Putting both in one
    decorator is what lets no entry point take the lock without the checkpoint, or the other way round."""
    hold_while_owned(lock)

    def decorate(fn: Callable) -> Callable:
        getsignal, sigint, ensure = _signal.getsignal, _SIGINT, ensure_installed
        pending, safe_point, spans, clock = _pending, checkpoint, entry_spans, time.perf_counter
        after = after_entry

        @functools.wraps(fn)
        def entry(*args, **kwargs):
            if getsignal(sigint) is not _handler:  # (one C call on the hot path when ours is in place)
                ensure()
            if pending[0]:
                safe_point()
            sink = spans[0]
            if sink is None or lock._is_owned():  # not profiling, or a call inside another (timed by it)
                with lock:
                    return fn(*args, **kwargs)
            t0 = clock()
            try:
                with lock:
                    return fn(*args, **kwargs)
            finally:
                sink += (t0, clock())
                if after:
                    for hook in tuple(after):
                        hook()

        entry.owns = lock  # marks it (see ``backend.dispatch.tpu_kernel``): wrapping it again adds nothing
        return entry

    return decorate


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
_REDELIVERY_THREAD = "torchtpu_lab-interrupts"


def _handler(signum, frame) -> None:
    # Python runs a signal handler at the first bytecode of whatever function C++ calls next and reports the
    # *caller's* frame, so no frame test can prove that raising here is safe. The handler therefore defers
    # (almost) always; the interrupt is raised at a safe point (:func:`checkpoint`: the start of every tpu
    # kernel, the end of a sync, a host read), and where none comes — pure Python code — the redelivery
    # thread's repeated attempts escalate to raising wherever the handler runs after ``ESCALATE_AFTER`` tries.
    if getattr(_state, "delivering", False):  # the chained handler called the one it replaced (ours): raise
        raise KeyboardInterrupt
    if _depth() > 0 or _busy() or _in_guarded(frame):
        _defer_and_redeliver()
        return
    if _pending[0] and _counts["attempts"] >= ESCALATE_AFTER:
        _deliver(frame)
    _counts["attempts"] += 1
    _defer_and_redeliver()


def _deliver(frame=None) -> None:
    """Hand the deferred interrupt to the chained handler, here, at a safe point (it usually raises)."""
    _pending[0] = False
    _counts["attempts"] = 0
    _counts["delivered"] += 1
    _state.delivering = True
    try:
        _chained[0](_SIGINT, frame if frame is not None else sys._getframe(2))
    finally:
        _state.delivering = False


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
    """Put the deferring SIGINT handler in front of the Python handler in place, Python's default one or a
    foreign one (main thread only; cheap when it is there already)."""
    if threading.get_ident() != _main_ident:
        return
    try:
        current = _signal.getsignal(_SIGINT)
        if current is _handler or not callable(current):  # ours, or SIG_IGN/SIG_DFL/None: nothing to chain
            return
        if not _redelivery_thread:
            t = threading.Thread(target=_redeliverer, name=_REDELIVERY_THREAD, daemon=True)
            t.start()
            _redelivery_thread.append(t)
        _chained[0] = current
        _signal.signal(_SIGINT, _handler)
    except (ValueError, OSError):  # not the main interpreter, or signals unavailable
        pass


def installed() -> bool:
    return _signal.getsignal(_SIGINT) is _handler


def chained() -> Callable:
    """The Python SIGINT handler ours calls at the safe point (``signal.default_int_handler`` unless a foreign
    one was installed)."""
    return _chained[0]


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


def changes() -> dict:
    """The process-wide changes made here (for ``torchtpu_lab.global_changes``)."""
    chained_to = _chained[0]
    name = "Python's default (raise KeyboardInterrupt)" if chained_to is _default else \
        f"{getattr(chained_to, '__module__', '?')}.{getattr(chained_to, '__qualname__', chained_to)}"
    return {
        "SIGINT handler (torchtpu_lab's, deferring Ctrl-C to a safe point, then calling the handler it replaced)":
            f"installed, calling {name}; redelivery thread {_REDELIVERY_THREAD!r}" if installed()
            else "not installed (another handler is in place)",
        "sys.unraisablehook (a Ctrl-C cut short in __del__ or a gc callback is delivered again)":
            sys.unraisablehook is _unraisable,
    }


def stats() -> dict:
    """How many interrupts were deferred and how many delivered so far."""
    return {k: v for k, v in _counts.items() if k != "attempts"}


#: a one-element list read without a call on the hot path (``if pending[0]: checkpoint()``)
pending = _pending
