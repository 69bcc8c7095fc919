"""``with torchtpu_lab.expect(compiles=0, syncs=None, cpu_fallbacks=0):``: an assertion about what the runtime
does inside a block, for warm-up checks in tests and serving loops ("after the first step, nothing compiles").

The block's events are recorded as a profile records them (telemetry), without the profile's memory watch or
reports. Work still pending in fused mode is flushed before the block (it is not the block's) and at its end
(so a graph the block recorded is compiled, and counted, inside it); neither flush counts as a sync. When the
block raises, its exception propagates unchanged and nothing is checked.

A count is ``None`` for "any number". Compiles count every new executable, a load from the disk cache
included: a warm step makes neither.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from .. import telemetry
from ..telemetry import EventKind, code_text, describe


class ExpectationError(AssertionError):
    """A block did more than :func:`expect` allowed. ``what`` is the count that was exceeded (``"compiles"``,
    ``"syncs"``, ``"cpu_fallbacks"``), ``events`` the block's events of that kind, ``event`` the first one
    past the limit."""

    def __init__(self, message: str, what: str, events: list, event) -> None:
        super().__init__(message)
        self.what = what
        self.events = events
        self.event = event


#: what each expectation counts, and how one of its events is named in the message
_KINDS = {"compiles": EventKind.COMPILE, "syncs": EventKind.SYNC, "cpu_fallbacks": EventKind.FALLBACK}


def _describe(what: str, e) -> str:
    d = e.detail
    if what == "compiles":
        cause = d.get("cause")
        line = (cause.site if cause is not None and cause.site is not None else None) or d.get("site") or e.source
        verb = "loaded from the disk cache" if d.get("disk") else "compiled"
        code = code_text(line)
        because = f": {cause}" if cause is not None else ""
        return f"{e.name} {verb} at {describe(line)}" + (f" (`{code}`)" if code else "") + because
    code = code_text(e.source)
    if what == "syncs":
        return f"{e.name} at {describe(e.source)}" + (f" (`{code}`)" if code else "")
    return f"{e.name} ran on the CPU at {describe(e.source)}" + (f" (`{code}`)" if code else "") + \
        " (no tpu lowering)"


def check(events: list, limits: dict) -> None:
    """Raise :class:`ExpectationError` for the first count in ``limits`` that ``events`` exceed."""
    for what, limit in limits.items():
        if limit is None:
            continue
        found = [e for e in events if e.kind == _KINDS[what]]
        if len(found) > limit:
            first = found[limit]
            allowed = "none" if limit == 0 else f"at most {limit}"
            raise ExpectationError(
                f"expected {allowed} {what.replace('_', ' ')} in the block, got {len(found)}; "
                f"{'the first' if limit == 0 else 'the first one over'}: {_describe(what, first)}", what, found, first)


def _limit(name: str, value) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"expect({name}=...) takes a count >= 0 or None (any number), got {value!r}")
    return value


@contextlib.contextmanager
def expect(compiles: int | None = 0, syncs: int | None = None, cpu_fallbacks: int | None = 0) -> Iterator[list]:
    """Check at the end of the block that it compiled, synced and fell back to the CPU at most this many times
    (``None``: any number); raises :class:`ExpectationError` naming the first event over a limit, its cause and
    its source line. Yields the list the block's events are recorded into."""
    from ..runtime import fused

    limits = {"compiles": _limit("compiles", compiles), "syncs": _limit("syncs", syncs),
              "cpu_fallbacks": _limit("cpu_fallbacks", cpu_fallbacks)}
    fused.sync(telemetry.SyncReason.PROFILE_START, record=False)
    recorder = telemetry.Recorder()
    events = recorder.__enter__()
    try:
        yield events
        fused.sync(telemetry.SyncReason.PROFILE_END, record=False)
    finally:
        recorder.__exit__(None, None, None)
    check(events, limits)
