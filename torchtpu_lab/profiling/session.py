"""The :class:`Profile`: the events of one profiled block and the summary users and renderers read."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import NamedTuple

from .. import platform
from ..causes import Cause
from ..telemetry import Event, EventKind, describe
from ..records import Report


class MemorySample(NamedTuple):
    """What the device held after one allocation, free or graph launch (a named tuple: a profile holds one per
    allocation, and a frozen dataclass cost twice as much to make)."""

    t: float  # seconds since the block started
    allocated: int  # bytes held by tpu tensors after the change
    kind: str  # "alloc" | "free" | "exec"
    nbytes: int

    @classmethod
    def from_flat(cls, flat: list, t0: float) -> list[MemorySample]:
        """Samples from ``flat`` = ``[t, allocated, kind, nbytes, t, ...]`` (``t`` on ``time.perf_counter``'s
        clock, ``t0`` the block's start), as the ledger writes them into a profile's sample log."""
        fields = iter(flat)
        rows = zip(fields, fields, fields, fields)
        return [cls(t - t0, allocated, kind, nbytes) for t, allocated, kind, nbytes in rows]


@dataclass(frozen=True)
class PeakSnapshot:
    """Who held device memory at (within ``collector.SNAPSHOT_STEP`` of) the peak: ``owners`` as
    :func:`~torchtpu_lab.device.memory.owners` lists them, plus ``running`` bytes of a graph's outputs and
    temporaries when the peak was reached while it ran; ``total`` is what they add up to."""

    t: float
    total: int
    owners: list
    running: int


class _Expanded:
    """A :class:`Profile` list kept batched while the block runs (``_<name>``), expanded on its first read or
    write (:meth:`Profile._unbatch`)."""

    def __set_name__(self, owner, name: str) -> None:
        self.slot = "_" + name

    def __get__(self, prof, owner=None):
        if prof is None:
            return self
        prof._unbatch()
        return getattr(prof, self.slot)

    def __set__(self, prof, value: list) -> None:
        prof._unbatch()
        setattr(prof, self.slot, value)


@dataclass
class Profile:
    """What happened on the tpu device during one profiled block (a cell, under ``%%tpu_profile``)."""

    device_index: int = 0
    t0: float = 0.0
    wall_s: float = 0.0
    start_bytes: int = 0
    end_bytes: int = 0
    peak_bytes: int = 0
    limit_bytes: int | None = None
    live_at_end: list = field(default_factory=list)  # (nbytes, shape, dtype, source) of the largest live buffers
    error: str | None = None
    xprof_dir: str | None = None
    platform: str = ""
    modes: tuple[str, ...] = ()  # the eager mode the block started in, and the one it ended in if it switched
    xprof_error: str | None = None  # why an --xprof trace was not recorded or written
    flush_exception: BaseException | None = field(default=None, repr=False)  # the end-of-block sync failed
    peak_snapshot: PeakSnapshot | None = field(default=None, repr=False)
    #: start, end (flat) of every outermost call into the backend (kernels, syncs) while the block ran: what the
    #: backend did on the host, measured at its door (see ``interrupts.entry_spans``)
    entry_spans: list = field(default_factory=list, repr=False)
    #: start, end, generation (flat) of every garbage collection while the block ran (:mod:`.gc_pauses`)
    gc_spans: list = field(default_factory=list, repr=False)
    _spans_from: tuple = field(default=((), 0), repr=False)
    _start_ids: set = field(default_factory=set, repr=False)
    _events: list = field(default_factory=list, repr=False)
    _memory: list = field(default_factory=list, repr=False)
    #: (the recorder's list, the memory watch's flat samples) as the block left them, until first read
    _batched: tuple | None = field(default=None, repr=False)

    def start(self, allocated: int, live) -> None:
        self.t0 = time.perf_counter()
        self.start_bytes = allocated
        self._start_ids = {id(a) for a in live}
        self.platform = platform.info().description

    def finish(self, events, samples, peak, allocated, live, xprof_dir) -> None:
        from ..device import memory

        self.wall_s = time.perf_counter() - self.t0
        self._batched = (events, samples)
        self.peak_bytes = max(peak, allocated, self.start_bytes)
        self.end_bytes = allocated
        stats = platform.jax_device(self.device_index).memory_stats() or {}
        self.limit_bytes = stats.get("bytes_limit")
        self.live_at_end = memory.largest(self.device_index, 20)
        self.xprof_dir = xprof_dir

    def _unbatch(self) -> None:
        """Expand the block's batched op records and flat memory samples into :class:`Event` s and
        :class:`MemorySample` s. Done on first read, not when the block ends: a profiled loop of thousands of ops
        then pays for the objects once, when a report is built, rather than inside the block it measures."""
        from .. import telemetry

        if self._batched is not None:
            events, samples = self._batched
            self._events = telemetry.expand(list(events))
            self._memory = MemorySample.from_flat(samples, self.t0)
            self._batched = None

    #: everything the runtime reported while the block ran, in the order it was reported
    events = _Expanded()
    #: what the device held after every allocation, free and graph launch in the block
    memory = _Expanded()

    @property
    def mode(self) -> str:
        """The eager mode the block ran in, as shown: ``fused``, or ``strict->fused`` when it switched."""
        return "->".join(self.modes)

    # ---- views of the events ---------------------------------------------------------------------------------

    def of_kind(self, kind: str) -> list[Event]:
        return [e for e in self.events if e.kind == kind]

    @property
    def ops(self) -> list[Event]:
        return self.of_kind(EventKind.OP)

    @property
    def compiles(self) -> list[Event]:
        return self.of_kind(EventKind.COMPILE)

    @property
    def graph_breaks(self) -> list[Event]:
        """Where ``torch.compile`` cut a graph (Dynamo's reason, the user's line)."""
        return self.of_kind(EventKind.GRAPH_BREAK)

    @property
    def syncs(self) -> list[Event]:
        return self.of_kind(EventKind.SYNC)

    @property
    def graphs(self) -> list[Event]:
        return self.of_kind(EventKind.GRAPH)

    @property
    def fallbacks(self) -> list[Event]:
        return self.of_kind(EventKind.FALLBACK)

    def device_seconds(self) -> float:
        """Device time: device execution from the XProf trace when one was recorded, else the host's wait for
        the device at sync points (compile time excluded)."""
        from .processors import device_seconds

        return device_seconds(self)

    def summary(self) -> dict:
        """Plain-data headline figures: the public keys users, tests and the JupyterLab panel rely on (the
        :class:`~.report.Summary` record as a dict; its docstring says what each number counts)."""
        from .processors import summarize

        return summarize(self).as_dict()

    def programs(self) -> list[dict]:
        """One dict per XLA program that ran in the block (all runs of one executable together), most device time
        first: ``name``, ``runs``, ``flops`` and ``bytes_accessed`` (XLA's cost analysis, summed over the runs),
        ``device_s``, ``intensity`` (FLOPs per byte), ``bound`` (``"compute"`` or ``"memory"`` against this
        device's peaks), ``source`` (the user line that ran it), and the per-run cost, achieved rates and
        ``roof_fraction`` (achieved FLOP/s over the roof at its intensity)."""
        from .programs import profile_programs

        return [r.as_dict() for r in profile_programs(self)]

    def roofline(self):
        """A plotly roofline: the device's compute and memory roofs, one point per program (sized by its device
        time; the hover names its source line and op count)."""
        from ..render import roofline

        return roofline.roofline_figure(self.report().roofline)

    def memory_at_peak(self) -> list[dict]:
        """What held device memory at the peak, one dict per owner (largest first): ``bytes``, ``kind``
        (``tensor``, ``program outputs``, ``program temporaries``, or a released tensor a pending graph still
        reads), ``shape``, ``dtype``, ``source`` (the line that created it); they add up to ``peak_bytes``."""
        from .memory_owners import at_peak

        return at_peak(self)

    def to_perfetto(self, path: str) -> str:
        """Write the block as a Chrome/Perfetto trace (JSON: host ops, syncs, compiles, program runs, memory);
        open it at https://ui.perfetto.dev or chrome://tracing. Returns ``path``."""
        from ..render import trace_export
        from .export import trace_events

        return trace_export.write_json(path, trace_export.chrome_trace(trace_events(self)))

    def to_speedscope(self, path: str) -> str:
        """Write the flame graph as a speedscope profile (JSON; open it at https://www.speedscope.app).
        Returns ``path``."""
        from ..render import trace_export
        from .processors import flame_tree

        return trace_export.write_json(path, trace_export.speedscope(flame_tree(self), "torchtpu_lab profile"))

    def to_dict(self) -> dict:
        def ev(e: Event) -> dict:
            return {"kind": e.kind, "name": e.name, "t": e.t - self.t0, "dur": e.dur, "nbytes": e.nbytes,
                    "source": None if e.source is None else {"file": e.source.filename, "line": e.source.lineno,
                                                              "function": e.source.function,
                                                              "where": describe(e.source)},
                    "detail": _plain_detail(e.detail)}

        return {
            "summary": self.summary(),
            "compiles": [ev(e) for e in self.compiles],
            "syncs": [ev(e) for e in self.syncs],
            "ops": [ev(e) for e in self.ops],
            "graphs": [ev(e) for e in self.graphs],
            "fallbacks": [ev(e) for e in self.fallbacks],
            "memory": [{"t": m.t, "allocated": m.allocated, "kind": m.kind, "nbytes": m.nbytes} for m in self.memory],
            "largest_live": [dict(x) for x in self.live_at_end],
            "programs": self.programs(),
            "memory_at_peak": self.memory_at_peak(),
        }

    def to_json(self, **kwargs) -> str:
        return json.dumps(self.to_dict(), **kwargs)

    def flamegraph(self):
        """A plotly figure (icicle) of where the time went: user lines -> torch ops -> XLA graphs."""
        from ..render import plot
        from .processors import flame_tree

        return plot.flame_figure(flame_tree(self))

    def text(self, top: int = 10) -> str:
        from ..render.text import profile_text

        return profile_text(self.report(top))

    def report(self, top: int = 10) -> Report:
        """Everything a renderer shows, computed once (renderers never compute)."""
        from .processors import build_report

        return build_report(self, top)

    def _repr_html_(self) -> str:
        from ..render.html import profile_html

        return profile_html(self.report())

    def __repr__(self) -> str:
        from .processors import summarize

        s = summarize(self)
        return (f"<Profile {s.wall_s * 1e3:.1f} ms wall, {s.ops} ops, {s.compiles} compiles, "
                f"{s.syncs} syncs, peak {s.peak_bytes} B>")


def _plain_detail(detail: dict) -> dict:
    """An event's detail as JSON-able data: plain values as they are, a compile's :class:`~..causes.Cause` as
    its fields and text; other objects (sources, op lists) are left out."""
    out = {}
    for k, v in detail.items():
        if isinstance(v, (str, int, float, bool, type(None))):
            out[k] = v
        elif isinstance(v, Cause) or hasattr(v, "to_dict"):  # a compile's cause, a program run's cost
            out[k] = v.to_dict()
    return out
