"""Tell the JupyterLab frontends that an XLA compile is running, so the status bar can say "compiling… N s".

A compile blocks the cell for as long as it takes (15 s is common on a TPU), and the kernel reports nothing in
between: no op runs, no sync happens. The runtime marks every compile (``telemetry.compiling``); this module
turns a compile that is still running after :data:`ANNOUNCE_AFTER_S` into a ``compile`` message (short ones,
most of them, stay silent), and its end into another. The frontend counts the seconds itself.

Threads: the compile runs on the cell's thread (or autograd's), which is busy inside XLA, so the ``start``
message is sent by a small watcher thread, and the ``end`` message by the compiling thread. Both are safe
because these messages are built from plain values only (no runtime state is read) and ipykernel's iopub socket
is a ``BackgroundSocket``: ``comm.send`` from any thread only schedules the zmq send on the IOPub thread (the
path ``print`` from a thread takes). The status snapshots, which read the runtime, are still sent from the main
thread only (see ``comm.py``). The lock orders ``start`` before ``end`` and makes each compile announced once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from .. import telemetry

#: a compile shorter than this is not announced (op compiles take milliseconds; a status bar flicker helps nobody)
ANNOUNCE_AFTER_S = 0.3

_lock = threading.Lock()
_state: dict = {"send": None, "thread": None, "wake": None, "stop": False, "announced": None}


def _announce_if_due() -> float:
    """Announce the compile running now if it has run for :data:`ANNOUNCE_AFTER_S`; returns how much longer to
    wait before it would be due (``0.0`` when it was announced, or nothing runs)."""
    with _lock:
        send = _state["send"]
        running = telemetry.compile_in_progress()
        if send is None or running is None or _state["announced"] is not None:
            return 0.0
        kind, seconds = running
        if seconds < ANNOUNCE_AFTER_S:  # a compile that started while we slept for an earlier one
            return ANNOUNCE_AFTER_S - seconds
        _state["announced"] = kind
        send({"type": "compile", "phase": "start", "kind": kind, "seconds": round(seconds, 3)})
        return 0.0


def _watch(wake: threading.Event) -> None:
    while True:
        wake.wait()
        wake.clear()
        delay = ANNOUNCE_AFTER_S
        while delay > 0 and not _state["stop"]:
            time.sleep(delay)
            try:
                delay = _announce_if_due()
            except Exception:  # noqa: BLE001 — a frontend that went away must not stop the watcher
                delay = 0.0
        if _state["stop"]:
            return


def _on_compile(state: str, kind: str, seconds: float) -> None:
    """The runtime's compile hook (on the compiling thread)."""
    if state == "start":
        wake = _state["wake"]
        if wake is not None:
            wake.set()
        return
    with _lock:
        send = _state["send"]
        if _state["announced"] is None or telemetry.compiling_now or send is None:
            return
        _state["announced"] = None
        send({"type": "compile", "phase": "end", "kind": kind, "seconds": round(seconds, 3)})


def start(send: Callable[[dict], None]) -> None:
    """Announce long compiles with ``send(message)`` (the comm's broadcast; it adds the protocol version)."""
    with _lock:
        _state["send"] = send
        _state["stop"] = False
        if _state["thread"] is None or not _state["thread"].is_alive():
            wake = threading.Event()
            thread = threading.Thread(target=_watch, args=(wake,), name="torchtpu_lab-compile-watch", daemon=True)
            _state.update(wake=wake, thread=thread)
            thread.start()
    if _on_compile not in telemetry.compile_hooks:
        telemetry.compile_hooks.append(_on_compile)


def stop() -> None:
    """Stop announcing (``%unload_ext``); the watcher thread ends."""
    if _on_compile in telemetry.compile_hooks:
        telemetry.compile_hooks.remove(_on_compile)
    with _lock:
        _state.update(send=None, stop=True, announced=None)
        wake, _state["wake"], _state["thread"] = _state["wake"], None, None
    if wake is not None:
        wake.set()


def announced() -> str | None:
    """The kind of the compile announced as running (``None`` when none is)."""
    return _state["announced"]
