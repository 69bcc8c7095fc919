"""Dynamo's graph-break warnings during a ``%%tpu_profile`` cell: held, and shown only when the report lacks them.

Dynamo writes each graph break as one WARNING of a dozen stderr lines (its reason, a config hint, the user frame).
The report makes each break a finding with its line and its fix, so inside a profiled cell the raw lines are
noise above the report. They are held while the cell runs; afterwards they are dropped when the profile recorded
the breaks, and handed back to Dynamo's own handlers when it did not (a break we failed to see keeps Dynamo's
words: nothing is lost).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

#: the loggers whose handlers print Dynamo's warnings (torch sets ``propagate = False`` on them)
_LOGGERS = ("torch._dynamo", "torch")


def _is_graph_break(record: logging.LogRecord) -> bool:
    if record.levelno != logging.WARNING or not record.name.startswith("torch._dynamo"):
        return False
    try:
        return "Graph break" in record.getMessage().split("\n", 1)[0]
    except Exception:  # noqa: BLE001 — a record that cannot be formatted is not ours to hold
        return False


class _Hold(logging.Filter):
    """On one handler: keeps graph-break records (with the handler) instead of letting it emit them."""

    def __init__(self, handler: logging.Handler, held: list) -> None:
        super().__init__()
        self.handler, self.held = handler, held

    def filter(self, record: logging.LogRecord) -> bool:
        if _is_graph_break(record):
            self.held.append((self.handler, record))
            return False
        return True


@contextlib.contextmanager
def held() -> Iterator[list]:
    """Hold Dynamo's graph-break warnings for the block; yields the list of ``(handler, record)`` held."""
    records: list = []
    installed = [(h, _Hold(h, records)) for name in _LOGGERS for h in logging.getLogger(name).handlers]
    for handler, hold in installed:
        handler.addFilter(hold)
    try:
        yield records
    finally:
        for handler, hold in installed:
            handler.removeFilter(hold)


def release(records: list) -> None:
    """Emit held records on the handlers that would have printed them."""
    for handler, record in records:
        handler.handle(record)
