"""The event stream: what the runtime did, for profiles, ``%tpu`` and the metrics report to read.

Two tiers, so the hot path stays cheap:

* **counters** (always on): plain integer/float accumulators per event kind — a dict update per event;
* **events** (only while someone records, e.g. inside ``torchtpu_lab.profile()``): :class:`Event` records
  appended to the open recorders' lists, with the user's source line looked up per event.

Counter names are :class:`Counter` members (strings, so ``counters["syncs"]`` reads the same entry); event
kinds are :class:`EventKind` members. Nothing here formats or renders; :mod:`torchtpu_lab.metrics` and the
profile renderers do.
"""

from __future__ import annotations

import contextlib
import contextvars
import enum
import os
import sys
import threading
import time
from collections import defaultdict, deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

_PKG_DIR = os.path.dirname(os.path.abspath(__file__))
_SKIP_PREFIXES: tuple[str, ...] = ()


def _skip_prefixes() -> tuple[str, ...]:
    global _SKIP_PREFIXES
    if not _SKIP_PREFIXES:
        import jax
        import torch

        prefixes = [
            _PKG_DIR,
            # frames carry the path the package was imported by (``bench/../torchtpu_lab/...`` when a script put
            # ``bench/..`` on sys.path), which abspath has normalised away
            os.path.dirname(__file__),
            os.path.realpath(_PKG_DIR),
            os.path.dirname(torch.__file__),
            os.path.dirname(jax.__file__),
            os.path.dirname(os.__file__),  # the standard library (contextlib, runpy, asyncio, ...)
            "<frozen",
            "<eval_with_key>",  # code torch.fx generates for a graph (Dynamo's, AOTAutograd's)
        ]
        for name in ("IPython", "ipykernel", "traitlets", "tornado", "zmq", "jupyter_client"):
            module = sys.modules.get(name)
            if module is not None and getattr(module, "__file__", None):
                prefixes.append(os.path.dirname(module.__file__))
        _SKIP_PREFIXES = tuple(dict.fromkeys(prefixes))
    return _SKIP_PREFIXES


def is_internal_file(filename: str) -> bool:
    """Whether code in ``filename`` is torch's, JAX's, the standard library's, IPython's or ours, not the user's
    (the rule :func:`user_source` walks frames by; for stacks recorded by others, such as Dynamo's)."""
    return filename.startswith(_skip_prefixes())


def warn_at_user_line(message: str, category: type = UserWarning) -> None:
    """A warning at the user's line that called into torch (as CPU's ``TORCH_WARN`` gives it, so Python's default
    filter shows it once per calling line), not at a line of ours or torch's."""
    import warnings

    frame, level = sys._getframe(1), 2
    while frame is not None and is_internal_file(frame.f_code.co_filename):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level if frame is not None else 2)


@dataclass(frozen=True, slots=True)
class Source:
    """A line of user code: the first frame outside torch, jax, the stdlib and torchtpu_lab."""

    filename: str
    lineno: int
    function: str

    def __str__(self) -> str:
        return f"{self.filename}:{self.lineno} in {self.function}"


# Keyed by what a Source is made of, never by the code object: CPython's code equality ignores the file name
# (two cells compiled from the same text are equal code objects), and hashing a code object hashes its constants.
_internal_files: dict = {}  # co_filename -> whether it is torch's/jax's/the stdlib's/ours (cached: walks are hot)
_sources: dict = {}  # (filename, line, function) -> its Source: a per-op walk builds no new object for a known line
_MAX_SOURCES = 1 << 16
#: (ids of a stack's Sources, innermost first) -> the stack: the stacks op records keep are shared, not one new
#: tuple per op for the garbage collector to track (see :func:`record_op`)
_stacks: dict = {}
_MAX_STACKS = 1 << 12


def _internal(code) -> bool:
    """Whether ``code`` is not the user's (a file under one of :func:`_skip_prefixes`)."""
    name = code.co_filename
    skip = _internal_files.get(name)
    if skip is None:
        skip = _internal_files[name] = name.startswith(_skip_prefixes())
    return skip


def _source(code, lineno: int) -> Source:
    """The (interned) :class:`Source` of line ``lineno`` of ``code``."""
    key = (code.co_filename, lineno, code.co_name)
    src = _sources.get(key)
    if src is None:
        if len(_sources) >= _MAX_SOURCES:  # bounded: generated code (new code objects per cell) must not grow it
            _sources.clear()
        src = _sources[key] = Source(*key)
    return src


def user_source(depth: int = 2) -> Source | None:
    """Where the user's code called into us (``None`` if no such frame, e.g. in a bare interpreter)."""
    try:
        frame = sys._getframe(depth)
    except ValueError:  # a shallow stack, e.g. PyTorch's autograd thread calling back into Python
        return BACKWARD
    while frame is not None:
        code = frame.f_code
        if not _internal(code):
            return _source(code, frame.f_lineno)
        frame = frame.f_back
    return BACKWARD if threading.current_thread() is not threading.main_thread() else None


_library_files: dict = {}  # co_filename -> "library" | "internal" | "user" (by file: see _internal_files)

#: torch's own packages whose code a user calls as a library (an optimizer's step, a module's forward), as
#: opposed to torch's tensor machinery, which stands for the user's own call
_TORCH_LIBRARIES = tuple(os.sep + os.path.join("torch", sub) + os.sep for sub in ("optim", "nn", os.path.join("utils", "data")))


def _frame_kind(code) -> str:
    name = code.co_filename
    kind = _library_files.get(name)
    if kind is None:
        if any(lib in name for lib in _TORCH_LIBRARIES):
            kind = "library"
        elif name.startswith(_skip_prefixes()):
            kind = "internal"
        elif f"{os.sep}site-packages{os.sep}" in name or f"{os.sep}dist-packages{os.sep}" in name:
            kind = "library"
        else:
            kind = "user"
        _library_files[name] = kind
    return kind


def library_frame(depth: int = 2) -> Source | None:
    """The innermost frame of library code (torch.optim, torch.nn, an installed package such as transformers)
    between us and the user's own code, or ``None`` when the user's code called us directly: advice aimed at
    a line inside a library cannot be followed, so findings name this frame and the fix the caller can apply.
    Only taken while a profile records (it walks the stack)."""
    try:
        frame = sys._getframe(depth)
    except ValueError:
        return None
    while frame is not None:
        kind = _frame_kind(frame.f_code)
        if kind == "library":
            return Source(frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name)
        if kind == "user":
            return None
        frame = frame.f_back
    return None


def user_stack(depth: int = 2, limit: int = 24) -> tuple[Source, ...] | None:
    """The user's frames on the stack, outermost first (the notebook cell, then the functions it called), for
    the flame graph; only taken while a profile records, as it walks the whole stack."""
    try:
        frame = sys._getframe(depth)
    except ValueError:
        return None
    out: list[Source] = []
    while frame is not None:
        code = frame.f_code
        if not _internal(code):
            out.append(_source(code, frame.f_lineno))
            # the outermost frame that matters: a notebook cell's or a script's module level (not the driver
            # that runs it, e.g. pytest calling IPython)
            if code.co_name == "<module>" or len(out) == limit:
                break
        frame = frame.f_back
    if not out:
        return None
    key = tuple(map(id, out))  # the interned Sources' ids: the stack kept as the value holds them alive
    stack = _stacks.get(key)
    if stack is None:
        if len(_stacks) >= _MAX_STACKS:
            _stacks.clear()
        stack = _stacks[key] = tuple(reversed(out))
    return stack


def code_text(source: Source | None, width: int = 60) -> str:
    """The text of a source line (stripped, shortened to ``width`` characters), or ``""`` when unknown.
    Notebook cells are in :mod:`linecache` (IPython puts them there), so this works for cells too."""
    if source is None or source.lineno <= 0:
        return ""
    import linecache

    text = " ".join(linecache.getline(source.filename, source.lineno).split())
    return text if len(text) <= width else text[: width - 1] + "\u2026"


#: Callables ``filename -> label or None``; the IPython extension adds one that names notebook cells.
labelers: list = []


def describe(source: Source | None) -> str:
    """A short human name for a source line: ``cell [3], line 2`` in a notebook, ``train.py:41`` elsewhere."""
    if source is None:
        return "<unknown>"
    if source.filename == "<autograd backward>":
        return "backward (autograd)"
    if source.filename == "<end of cell>":
        return "end of cell"
    for labeler in labelers:
        label = labeler(source.filename)
        if label:
            return f"{label}, line {source.lineno}"
    return f"{os.path.basename(source.filename)}:{source.lineno}"


#: The implicit sync when a notebook cell finishes (no user line asked for it).
END_OF_CELL = Source("<end of cell>", 0, "")

#: Ops run by PyTorch's autograd engine on its own thread have no user frame: they belong to ``.backward()``.
BACKWARD = Source("<autograd backward>", 0, "backward")


class EventKind(enum.StrEnum):
    """What an :class:`Event` records (a string, so ``event.kind == "op"`` holds). Every kind here is emitted
    and every emitted kind is here (``tests/test_records.py`` checks both); :func:`emit` refuses others."""

    OP = "op"  #: a torch op ran (strict/debug) or was recorded into the fused graph (``cache_hit``)
    GRAPH = "graph"  #: a compiled program ran: a fused graph at a sync, a torch.compile graph (``n_ops``)
    COMPILE = "compile"  #: an executable was compiled or loaded from disk (``cause``: a :class:`~.causes.Cause`)
    SYNC = "sync"  #: the host waited for the device (``reason``: a :class:`SyncReason`)
    FALLBACK = "fallback"  #: an op without a tpu lowering ran on the CPU
    MEMORY = "memory"  #: a fused graph's outputs and temporaries were counted while it ran
    COLLECTIVE = "collective"  #: a torch.distributed collective (``participants``, ``nbytes``)
    GRAPH_BREAK = "graph_break"  #: torch.compile cut a graph (Dynamo's ``reason``)


#: the kinds' values, for a check per event that costs a set lookup (an enum conversion costs ten times more)
_EVENT_KINDS = frozenset(k.value for k in EventKind)


class Counter(enum.StrEnum):
    """Names of the always-on :data:`counters` that more than one reader shares (status, profile summary,
    metrics). A counter of another name (``collective:all_reduce``, JAX's ``xla_compiles``) is still counted;
    these are the ones read back by name."""

    COMPILES = "compiles"  #: executables XLA compiled (a disk load is not one)
    COMPILE_SECONDS = "compile_seconds"
    DISK_LOADS = "disk_loads"  #: executables loaded from the persistent cache
    DISK_LOAD_SECONDS = "disk_load_seconds"
    GRAPH_CACHE_HITS = "graph_cache_hits"  #: fused graphs served by an executable in memory
    OP_CACHE_HITS = "op_cache_hits"  #: ops (strict/debug) served by an executable in memory
    EXECUTIONS = "executions"
    SYNCS = "syncs"
    CPU_FALLBACKS = "cpu_fallbacks"
    DYNAMO_GRAPHS = "dynamo_graphs"  #: graphs Dynamo handed to torch.compile(backend="tpu")
    DYNAMO_RECOMPILES = "dynamo_recompiles"
    GRAPH_BREAKS = "graph_breaks"
    COMPILED_GRAPHS_EAGER = "compiled_graphs_eager"  #: torch.compile graphs that run op by op


def memory_hits() -> int:
    """Executions served by an executable already in this process: fused graphs at syncs and ops run one at a
    time (strict/debug)."""
    return int(counters.get(Counter.GRAPH_CACHE_HITS, 0) + counters.get(Counter.OP_CACHE_HITS, 0))


@dataclass(slots=True)
class Event:
    """One thing that happened; ``kind`` is an :class:`EventKind`."""

    kind: str
    name: str
    t: float
    dur: float = 0.0
    nbytes: int = 0
    source: Source | None = None
    detail: dict = field(default_factory=dict)
    #: the user's call stack (outermost first) when a profile recorded the event (see :func:`user_stack`)
    stack: tuple | None = None


counters: dict[str, float] = defaultdict(float)
#: The event lists of the open :class:`Recorder` s (profiles), innermost last.
recorders: list[list[Event]] = []
#: The most recent compiles, syncs and graph executions, kept whether or not anyone records (for ``%tpu``
#: and the metrics report); bounded so a long session does not grow without limit.
compile_log: deque[Event] = deque(maxlen=2000)
sync_log: deque[Event] = deque(maxlen=2000)
execute_log: deque[Event] = deque(maxlen=2000)
graph_break_log: deque[Event] = deque(maxlen=2000)


def recording() -> bool:
    return bool(recorders)


#: Callables ``fn()`` told after every compile and sync (rare events, never per op): the JupyterLab panel's live
#: updates while a cell runs. Each must be cheap (throttle inside) and must never raise.
live_hooks: list = []


def _live() -> None:
    for fn in live_hooks:
        try:
            fn()
        except Exception:  # noqa: BLE001 — a display hook must never break the runtime
            pass


#: The XLA compiles running now: thread id -> (kind, start on the ``time.monotonic`` clock). A compile can take
#: many seconds in which nothing else is reported; the JupyterLab status bar shows "compiling… N s" from this.
compiling_now: dict[int, tuple[str, float]] = {}
#: Callables ``fn(state, kind, seconds)`` told when an XLA compile starts (``"start"``, 0.0) and ends (``"end"``,
#: its duration), on the compiling thread; each must be cheap and must never raise.
compile_hooks: list = []


def _tell_compile(state: str, kind: str, seconds: float) -> None:
    for fn in compile_hooks:
        with contextlib.suppress(Exception):  # a display hook must never break a compile
            fn(state, kind, seconds)


@contextlib.contextmanager
def compiling(kind: str) -> Iterator[None]:
    """Mark the block as an XLA compile of ``kind`` (``op``, ``graph``, ``compiled``) while it runs."""
    key = threading.get_ident()
    t0 = time.monotonic()
    compiling_now[key] = (kind, t0)
    if compile_hooks:
        _tell_compile("start", kind, 0.0)
    try:
        yield
    finally:
        compiling_now.pop(key, None)
        if compile_hooks:
            _tell_compile("end", kind, time.monotonic() - t0)


def compile_in_progress() -> tuple[str, float] | None:
    """``(kind, seconds so far)`` of the longest-running compile now, or ``None`` when nothing compiles."""
    running = list(compiling_now.values())
    if not running:
        return None
    kind, t0 = min(running, key=lambda r: r[1])
    return kind, time.monotonic() - t0


def live_update() -> None:
    """Tell the live hooks that something worth showing changed outside a compile or sync (the progress of
    ranks a notebook launched, read while ``launch()`` waits)."""
    if live_hooks:
        _live()


def count(key: str, amount: float = 1) -> None:
    counters[key] += amount


def emit(kind: str, name: str, t: float | None = None, dur: float = 0.0, nbytes: int = 0,
         source: Source | None = None, with_source: bool = True, stack: tuple | None = None,
         **detail) -> Event | None:
    """Record an event for every open recorder (and nothing else); returns it, or ``None`` if nobody records.
    ``kind`` must be an :class:`EventKind` (a ``ValueError`` otherwise: readers find events by kind).
    ``source`` and ``stack``: the user's line and stack when the caller has them (C++ read them: the frames
    above this call are not the op's caller's), else looked up here."""
    if not recorders:
        return None
    if source is None and with_source:
        source = user_source(3)
    if kind not in _EVENT_KINDS:
        raise ValueError(f"{kind!r} is not an EventKind")
    if stack is None and with_source:
        stack = user_stack(3)
    event = Event(kind, name, time.perf_counter() if t is None else t, dur, nbytes, source, detail, stack)
    for sink in recorders:
        sink.append(event)
    return event


class _OpMark:
    """The marker of a batched op record (see :func:`record_op`); one instance, :data:`OP_MARK`."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "telemetry.OP_MARK"


#: Starts a batched op record in a recorder's list: the marker, then the op's :data:`OP_FIELDS` fields, flat.
OP_MARK = _OpMark()
#: name, t, dur, cache_hit, source, stack
OP_FIELDS = 6
#: the native core's ``OpLog`` type, once it is loaded: a run of op records the recording kernel noted in a
#: recorder's list as one object (``csrc/op_log.h``), whose ``fields()`` are what :func:`record_op` appends flat
OP_LOGS: list = []


def record_op(name: str, t: float, dur: float, cache_hit: bool | None, source: Source | None,
              stack: tuple | None) -> None:
    """Record one op event for every open recorder, batched: :data:`OP_MARK` and the six fields are appended
    flat to each recorder's list, and the recorder expands them into the same :class:`Event` when it closes
    (:meth:`Recorder.__exit__`), so readers never see them. Flat because a profile records thousands of ops a
    step: an Event (or any tuple) per op is a container the garbage collector tracks, and a profile that kept
    one per op made the collector run twice as often as the step alone, promoting it all towards the full
    collections (hundreds of milliseconds each in a process holding torch and JAX). Floats, strings and the
    shared ``source``/``stack`` objects are nothing new for it to track. The caller checked :data:`recorders`
    and took ``source``/``stack`` (:func:`op_sources`) once for everything the op notes."""
    for sink in recorders:
        sink += (OP_MARK, name, t, dur, cache_hit, source, stack)


def op_sources(depth: int) -> tuple[Source | None, tuple | None]:
    """``(source, stack)`` of an op while a profile records: one walk of the stack serves both (the user line is
    the innermost frame of the user's stack)."""
    stack = user_stack(depth + 1)
    return (stack[-1] if stack else user_source(depth + 1)), stack


def expand(events: list) -> list:
    """``events`` with every batched op record (:func:`record_op`, and the native core's op logs) expanded into
    its :class:`Event`, in place (also returned)."""
    out: list = []
    add = out.append
    i, n = 0, len(events)
    op, mark, logs = EventKind.OP, OP_MARK, tuple(OP_LOGS)

    def add_ops(fields: list) -> None:
        for j in range(0, len(fields) - OP_FIELDS + 1, OP_FIELDS):
            name, t, dur, hit, source, stack = fields[j:j + OP_FIELDS]
            add(Event(op, name, t, dur, 0, source, {"cache_hit": hit}, stack))

    expanded = False
    while i < n:
        e = events[i]
        if e is mark:
            record = events[i + 1:i + 1 + OP_FIELDS]
            if len(record) < OP_FIELDS:  # cut short (an append failed): nothing after it was recorded
                break
            add_ops(record)
            i += 1 + OP_FIELDS
        elif type(e) in logs:
            add_ops(e.fields())
            expanded = True
            i += 1
        else:
            add(e)
            i += 1
    if expanded or len(out) != n:
        events[:] = out
    return events


def _log(log: deque, event: Event) -> Event:
    log.append(event)
    if recorders and event.stack is None:
        event.stack = user_stack(3)
    if recorders and event.kind in (EventKind.SYNC, EventKind.COMPILE):
        event.detail.setdefault("library", library_frame(3))
    for sink in recorders:
        sink.append(event)
    return event


def record_compile(kind: str, name: str, cause: Any, seconds: float, n_ops: int, reason: str = "",
                   disk: bool = False) -> Event:
    """A compilation happened (always logged): what, why (a :class:`~.causes.Cause`), how long, and the user
    line that triggered it. ``recompile`` marks a signature that replaced an earlier one (any cause but a first
    sighting); ``disk`` marks an executable loaded from the persistent cache rather than compiled by XLA (a
    load, not a compile)."""
    now = time.perf_counter()
    event = _log(compile_log, Event(EventKind.COMPILE, name, now - seconds, seconds, 0, user_source(3),
                                    {"kind": kind, "cause": cause, "n_ops": n_ops, "reason": reason,
                                     "recompile": not cause.first, "disk": bool(disk)}))
    if live_hooks:
        _live()
    return event


def record_graph_break(reason: str, source: Source | None, **detail) -> Event:
    """``torch.compile`` cut a graph here (always logged): Dynamo's reason and the user line that caused it."""
    counters[Counter.GRAPH_BREAKS] += 1
    first = reason.strip().splitlines()[0] if reason.strip() else "graph break"
    return _log(graph_break_log, Event(EventKind.GRAPH_BREAK, first, time.perf_counter(), 0.0, 0, source,
                                       {"reason": reason.strip(), **detail}))


class SyncReason(enum.Enum):
    """Why the host waited for the device. ``reads_value``: the sync reads a value back (a ``.item()`` in a loop
    is worth a hint); the others are step boundaries or bookkeeping the user asked for."""

    TO_HOST = ("copy to host (.cpu() / .to('cpu'))", True)
    NON_BLOCKING_COPY = ("non-blocking copy to host (launched; the host does not wait)", False)
    COPY_LANDS = ("a non-blocking copy to host lands (Event.synchronize, or a wait for the device)", False)
    ITEM = ("item() / bool() / int() of a tensor", True)
    PRINT = ("print / repr of a tensor", True)
    READ = ("read of a tensor's value", True)
    CONCRETE_INPUTS = ("needs concrete inputs", True)  # a data-dependent op (nonzero, boolean mask) ran
    USER_SYNC = ("torchtpu_lab.sync()", False)
    SYNCHRONIZE = ("torch.tpu.synchronize()", False)
    GRAPH_LIMIT = ("graph size limit", False)
    LOOP_ITERATION = ("end of a loop iteration that appends (no sync in the loop)", False)
    MEMORY_QUERY = ("memory query", False)
    COLLECTIVE = ("collective (torch.distributed)", False)
    MODE_SWITCH = ("eager mode switch", False)
    DEVICE_SWITCH = ("work recorded for another tpu device", False)  # a fused graph runs on one device
    PROFILE_START = ("profile start", False)
    PROFILE_END = ("end of profiled block", False)
    END_OF_CELL = ("end of cell", False)
    UNLOAD = ("extension unloaded", False)

    def __init__(self, text: str, reads_value: bool) -> None:
        self.text = text
        self.reads_value = reads_value

    def label(self, detail: str | None = None) -> str:
        """The human text of this reason; ``detail`` names the op for :attr:`CONCRETE_INPUTS`."""
        return f"{detail} {self.text}" if detail else self.text


#: Callers that know better (printing a tensor) name the reason of the sync their host read causes.
sync_reason: contextvars.ContextVar[SyncReason | None] = contextvars.ContextVar("sync_reason", default=None)


def record_sync(reason: SyncReason, n_ops: int = 0, source: Source | None = None, detail: str | None = None) -> Event:
    """The host waited for the device (always logged), with the reason and the user line. The event's name is
    the reason's text; ``detail["reason"]`` is the :class:`SyncReason` itself."""
    counters[Counter.SYNCS] += 1
    if live_hooks:
        _live()
    return _log(sync_log, Event(EventKind.SYNC, reason.label(detail), time.perf_counter(), 0.0, 0,
                                source or user_source(3), {"pending_ops": n_ops, "reason": reason}))


@contextlib.contextmanager
def sync_event(reason: SyncReason, n_ops: int = 0, source: Source | None = None,
               detail: str | None = None) -> Iterator[Event]:
    """Record a sync and time the block that performs it: ``with telemetry.sync_event(SyncReason.ITEM): ...``."""
    event = record_sync(reason, n_ops, source or user_source(4), detail)
    try:
        yield event
    finally:
        event.dur = time.perf_counter() - event.t


def record_execute(name: str, t0: float, n_ops: int, cache_hit: bool, ops: list | None = None,
                   executable: Any = None, cost: Any = None, measured: bool = True, fresh: bool = False) -> Event:
    """A compiled program ran (a fused graph, a torch.compile graph). ``ops``: the ATen op names inside it, when
    the program stands for ops the profile saw no event of (a torch.compile graph); kept by reference.
    ``executable`` identifies the program (runs of one executable are one program in a profile) and ``cost`` is
    its XLA cost analysis (a :class:`~.runtime.program_cost.ProgramCost`), both only when a profile records;
    ``measured``: the run's device time is known (``detail["device_s"]``; a profile times its runs without
    waiting for them, :mod:`~torchtpu_lab.runtime.program_cost`, and sets it once it has);
    ``fresh``: the executable's first run ever (it may pay one-time costs)."""
    counters[Counter.EXECUTIONS] += 1
    detail = {"n_ops": n_ops, "cache_hit": cache_hit}
    if ops is not None:
        detail["ops"] = ops
    if executable is not None:
        detail["program"] = id(executable)
        detail["cost"] = cost
        detail["measured"] = measured
        detail["fresh"] = fresh
    return _log(execute_log, Event(EventKind.GRAPH, name, t0, time.perf_counter() - t0, 0, None, detail))


class Recorder:
    """Collect every event emitted while open: ``with Recorder() as events: ...``. Read the list after the
    block: while open it may hold batched op records (:func:`record_op`), which closing expands."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    def __enter__(self) -> list[Event]:
        recorders.append(self.events)
        return self.events

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self, expand_records: bool = True) -> None:
        """Stop recording; ``expand_records=False`` leaves the batched op records for the reader to
        :func:`expand`."""
        # by identity: two recorders with equal (say, both empty) lists must not remove each other's
        for i in range(len(recorders) - 1, -1, -1):
            if recorders[i] is self.events:
                del recorders[i]
                break
        if expand_records:
            expand(self.events)


def reset() -> None:
    """Forget all counters and logs (``%tpu metrics --reset``, tests)."""
    counters.clear()
    compile_log.clear()
    sync_log.clear()
    execute_log.clear()
    graph_break_log.clear()
