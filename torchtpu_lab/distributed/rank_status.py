"""How ranks started by :func:`~.launch.launch` report their progress to the notebook that launched them.

A rank is a separate process; the only channel it shares with the launcher is the launch's work directory.
Each rank writes a small JSON file there, ``rank<r>.status.json`` (replaced atomically, every
:data:`REPORT_INTERVAL_S` while it runs, and once more when its function returns), holding its own session's
figures: eager mode, device memory, compiles and their seconds, syncs, collectives, and the compile running now.
The launcher reads the files while it waits for the ranks (the notebook's main thread is inside ``launch()``)
and keeps the rows of the last launch here, where the JupyterLab panel's status reads them (``rows()``). Nothing
here is needed for a launch to work: a rank that cannot write its file is just not shown.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time

from .. import telemetry
from ..telemetry import Counter

REPORT_INTERVAL_S = 0.5
_FILE = "rank{}.status.json"

#: the last launch: ``{"started": wall-clock seconds, "rows": [row per rank]}`` (``None`` before any launch)
_last: dict = {"launch": None}


# ---- in the rank -----------------------------------------------------------------------------------------------

def rank_row(rank: int, state: str, started: float) -> dict:
    """This process's figures as one row (plain JSON)."""
    from ..device import memory
    from ..runtime import modes

    c = telemetry.counters
    running = telemetry.compile_in_progress()
    return {
        "rank": rank, "state": state, "seconds": round(time.monotonic() - started, 3), "mode": modes.current(),
        "allocated": int(memory.allocated(0)), "peak": int(memory.peak(0)),
        "compiles": int(c.get(Counter.COMPILES, 0)), "disk_loads": int(c.get(Counter.DISK_LOADS, 0)),
        "compile_seconds": round(float(c.get(Counter.COMPILE_SECONDS, 0) + c.get(Counter.DISK_LOAD_SECONDS, 0)), 4),
        "syncs": int(c.get(Counter.SYNCS, 0)),
        "collectives": int(sum(v for k, v in list(c.items()) if k.startswith("collective:"))),
        "compiling": None if running is None else round(running[1], 3),
    }


def write_row(workdir: str, row: dict) -> None:
    """Replace this rank's status file (atomically: the launcher never reads half a file)."""
    path = os.path.join(workdir, _FILE.format(row["rank"]))
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(row, f)
    os.replace(tmp, path)


class Reporter:
    """Writes this rank's row every :data:`REPORT_INTERVAL_S` from a daemon thread (it reads plain counters only,
    never tensors), and a final ``done``/``failed`` row when :meth:`finish` is called."""

    def __init__(self, workdir: str, rank: int) -> None:
        self.workdir, self.rank = workdir, rank
        self.started = time.monotonic()
        self._stop = threading.Event()
        self._lock = threading.Lock()  # the final row is written last, never overwritten by a "running" one
        threading.Thread(target=self._loop, name="torchtpu_lab-rank-status", daemon=True).start()

    def _write(self, state: str) -> None:
        with contextlib.suppress(Exception):  # reporting is a courtesy: it must never fail the rank
            write_row(self.workdir, rank_row(self.rank, state, self.started))

    def _loop(self) -> None:
        while True:
            with self._lock:
                if self._stop.is_set():
                    return
                self._write("running")
            self._stop.wait(REPORT_INTERVAL_S)

    def finish(self, ok: bool) -> None:
        with self._lock:
            self._stop.set()
            self._write("done" if ok else "failed")


# ---- in the launcher -------------------------------------------------------------------------------------------

def begin(nprocs: int) -> None:
    """A launch starts: every rank is ``starting`` until its first row arrives."""
    _last["launch"] = {"started": time.time(),
                       "rows": [{"rank": r, "state": "starting", "seconds": 0.0} for r in range(nprocs)]}


def poll(workdir: str, returncodes: list) -> bool:
    """Read the ranks' files into the last launch's rows; a rank whose process ended with an error is
    ``failed (exit N)`` whatever its file says. Returns whether anything changed."""
    launch = _last["launch"]
    if launch is None:
        return False
    changed = False
    for r, code in enumerate(returncodes):
        row = dict(launch["rows"][r])
        try:
            with open(os.path.join(workdir, _FILE.format(r))) as f:
                found = json.load(f)
            if isinstance(found, dict) and found.get("rank") == r:
                row = found
        except (OSError, ValueError):
            pass
        if code not in (None, 0):
            row["state"] = f"failed (exit {code})"
        elif code == 0 and row.get("state") in ("running", "starting"):
            row["state"] = "done"
        if row != launch["rows"][r]:
            launch["rows"][r] = row
            changed = True
    return changed


def rows() -> list[dict]:
    """The rows of the last launch (rank order), or ``[]`` before any."""
    launch = _last["launch"]
    return [dict(r) for r in launch["rows"]] if launch is not None else []
