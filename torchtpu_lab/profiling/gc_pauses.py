"""Python's garbage-collector pauses while a profiled block runs.

A full (generation 2) collection scans every object the process holds: after a session has built models, run
``torch.compile`` or loaded data, one can stop the notebook for a second in the middle of a cell that issues a
few milliseconds of ops. That second is the process's heap, not the cell's work, so the profile says it apart
from "your code": otherwise a pause would read as a host-bound step and drown the cell's real findings.
"""

from __future__ import annotations

import gc
import time


class GcWatch:
    """Times every collection between :meth:`start` and :meth:`stop` (``gc.callbacks``).

    The callback runs wherever a collection starts, inside C++ too: it only reads the clock and appends to a
    list, so it cannot raise into the code that allocated.
    """

    def __init__(self) -> None:
        #: start, end, generation (flat) of every finished collection
        self.spans: list = []
        self._began = 0.0

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._began = time.perf_counter()
        elif self._began:
            self.spans += (self._began, time.perf_counter(), info.get("generation", 2))
            self._began = 0.0

    def start(self) -> None:
        gc.callbacks.append(self._on_gc)

    def stop(self) -> list:
        """Detach; the pauses timed, flat (start, end, generation)."""
        try:
            gc.callbacks.remove(self._on_gc)
        except ValueError:
            pass
        return self.spans


def pauses(spans: list) -> list[tuple[float, float, int]]:
    """The flat spans as (start, end, generation)."""
    return list(zip(spans[0::3], spans[1::3], spans[2::3]))
