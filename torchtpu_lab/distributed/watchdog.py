"""Collectives that never finish end the process with an error that names them, instead of hanging forever.

A compiled XLA collective cannot be cancelled once it runs: if another rank died, the survivors wait in it
for good. So, as PyTorch's NCCL watchdog does, a daemon thread watches the collective this process is waiting
for; past the process group's timeout it writes which collective (kind, group, user line) timed out to
stderr and ends the process (exit code 124). Under :func:`torchtpu_lab.distributed.launch` it also ends the
process as soon as the launcher reports that another rank failed (the launcher creates the file named by
``$TORCHTPU_LAB_ABORT_FILE``), saying which collective it was in.
"""

from __future__ import annotations

import os
import sys
import threading
import time

TIMEOUT_EXIT = 124
ABORT_EXIT = 125
_ABORT_ENV = "TORCHTPU_LAB_ABORT_FILE"

_inflight: list = [None]  # (what, deadline) while this process waits for a collective
_thread: list[threading.Thread | None] = [None]
_lock = threading.Lock()


def _die(message: str, code: int) -> None:
    sys.stderr.write(message + "\n")
    sys.stderr.flush()
    sys.stdout.flush()
    os._exit(code)


def _watch() -> None:
    abort_file = os.environ.get(_ABORT_ENV)
    while True:
        time.sleep(0.2)
        current = _inflight[0]
        if abort_file and os.path.exists(abort_file):
            try:
                with open(abort_file) as f:
                    why = f.read().strip()
            except OSError:
                why = "another rank failed"
            where = f"while waiting in {current[0]}" if current else "outside any collective"
            _die(f"torchtpu_lab.distributed: rank {os.environ.get('RANK', '?')} aborted {where}: {why}", ABORT_EXIT)
        if current is not None and time.monotonic() > current[1]:
            _die(f"torchtpu_lab.distributed: timeout: {current[0]} did not complete within {current[2]:.0f} s "
                 "(another rank failed, or did not call the same collective); ending this process because a "
                 "running XLA collective cannot be cancelled", TIMEOUT_EXIT)


def start() -> None:
    """Start the watcher thread (once per process)."""
    with _lock:
        if _thread[0] is None:
            t = threading.Thread(target=_watch, name="torchtpu_lab-collective-watchdog", daemon=True)
            t.start()
            _thread[0] = t


def run_and_wait(what: str, timeout_s: float, fn, *args):
    """``fn(*args)``, then block until the arrays it returns are computed; past ``timeout_s`` (counting the
    call itself: XLA:CPU may run a program inside the dispatching call) the watcher ends the process naming
    ``what``."""
    import jax

    start()
    _inflight[0] = (what, time.monotonic() + timeout_s, timeout_s)
    try:
        out = fn(*args)
        jax.block_until_ready(out)
        return out
    finally:
        _inflight[0] = None
