"""The records the numbers travel in, from where they are computed up to the renderers and the JupyterLab
comm, which read them by field name: a profile's :class:`Report` (what
:func:`~torchtpu_lab.profiling.processors.build_report` computes once) and the session's :class:`Status`.

They are plain data at the bottom of the stairs, so every layer that builds or shows them can name them.
:class:`Summary` is the one schema for a profile's headline numbers; :meth:`Summary.as_dict` is what
``Profile.summary()`` returns (plain data with the documented keys). Count fields are named after the
telemetry :class:`~torchtpu_lab.telemetry.Counter` they count (:data:`COUNTED`), so a profile, ``%tpu`` and
the metrics report say ``compiles``, ``disk_loads``, ``syncs`` and ``cpu_fallbacks`` for the same things;
``cache_hits`` is the one derived count (:func:`~torchtpu_lab.telemetry.memory_hits`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from .causes import Cause
from .telemetry import Counter, SyncReason

#: the count fields of :class:`Summary` and :class:`Status` that are telemetry counters of the same name
COUNTED = (Counter.COMPILES, Counter.DISK_LOADS, Counter.SYNCS, Counter.CPU_FALLBACKS)


@dataclass(frozen=True)
class Summary:
    """A profile's headline figures. The time split (``python_s`` + ``tracing_s`` + ``compile_s`` + ``wait_s``)
    adds up to ``wall_s``; ``device_s`` is device time: from the XProf trace when one was recorded, else the
    programs' run time (a profile waits for each run), else the wait at syncs; executables are counted three ways: ``cache_hits`` (served by an executable already in
    this process), ``disk_loads`` (loaded from the persistent cache: no XLA compile) and ``compiles``."""

    wall_s: float
    device_s: float | None
    python_s: float
    tracing_s: float
    compile_s: float
    wait_s: float
    mode: str
    ops: int
    graphs_executed: int
    compiles: int
    recompiles: int
    disk_loads: int
    cache_hits: int
    cache_misses: int
    syncs: int
    cpu_fallbacks: int
    collectives: int
    peak_bytes: int
    start_bytes: int
    end_bytes: int
    limit_bytes: int | None
    platform: str
    error: str | None
    xprof_error: str | None
    #: XLA's cost analysis summed over the programs that ran (every run counted), the device's peaks and where
    #: they come from, and ``mfu``: achieved FLOP/s over the programs' device time, over the peak (0-1; ``None``
    #: when no program with a known cost ran)
    flops: float = 0.0
    bytes_accessed: float = 0.0
    peak_flops: float | None = None
    peak_bandwidth: float | None = None
    peak_source: str = ""
    mfu: float | None = None
    #: the backend's own host work outside the recorded events (``overhead`` in the time split; the split's
    #: five parts add up to ``wall_s``)
    overhead_s: float = 0.0
    #: compiles that are not one-time warm-up (first compiles, a first step that differs from the next):
    #: what would recur in a longer run
    steady_compiles: int = 0
    #: of ``python_s``, Python's garbage collector (``gc_pauses`` collections): the process's whole heap scanned,
    #: not the block's own work
    gc_s: float = 0.0
    gc_pauses: int = 0
    #: ``device_s`` was read from an XProf trace's device lane (else it is the host's wait, and not shown as
    #: device time: XLA:CPU traces have no device lane)
    device_traced: bool = False

    @property
    def host_s(self) -> float:
        """The host's own time issuing the block's work: Python (less the garbage collector), our overhead and
        recording or dispatching ops."""
        return self.python_s - self.gc_s + self.tracing_s + self.overhead_s

    @property
    def cache_hit_rate(self) -> float | None:
        total = self.cache_hits + self.cache_misses
        return self.cache_hits / total if total else None

    def as_dict(self) -> dict:
        """Plain data, in field order, with ``cache_hit_rate`` and ``memory_hits`` (the name ``%tpu`` and the
        time split use for ``cache_hits``, kept for code that reads it) added."""
        out: dict[str, Any] = {}
        for f in fields(self):
            if f.name == "cache_hits":
                out["memory_hits"] = self.cache_hits
            out[f.name] = getattr(self, f.name)
            if f.name == "cache_misses":
                out["cache_hit_rate"] = self.cache_hit_rate
        return out


@dataclass(frozen=True)
class CompileRow:
    """One compile event, as the report lists it; ``cause`` is the record, ``line`` the user line that
    triggered the compile."""

    name: str
    kind: str | None
    n_ops: int | None
    seconds: float
    cause: Cause | None
    line: str
    code: str
    site_code: str
    unrolled: int
    unrolled_line: str
    recompile: bool
    disk: bool
    #: one-time: a first compile, or a first step that differs from the steps after it (see profiling.findings)
    warmup: bool = False
    #: how many times the sync or op that triggered it ran earlier in the block (``None``: unknown)
    visit: int | None = None
    #: how many times that trigger ran after it in the block
    repeats: int = 0
    #: the library frame (torch.optim, transformers) the compile was triggered from, if any
    library: Any = None


@dataclass(frozen=True)
class CompileGroup:
    """Compiles with one cause pattern: what varied (``pattern``), how often, how long, and the fix (``hint``).
    ``kind`` is the pattern's kind (``"first"``, ``"unrolled"``, ``"grow"`` or a cause kind's key)."""

    pattern: str
    count: int
    seconds: float
    line: str
    code: str
    hint: str
    recompile: bool
    disk: int
    kind: str
    names: tuple[str, ...]

    @property
    def is_recompile(self) -> bool:
        """Recompiles worth marking (a group of first compiles is not, even if loaded under a new signature)."""
        return self.recompile and self.kind not in ("first", "warmup")


@dataclass(frozen=True)
class Finding:
    """One plain-language finding: what cost the time (``cost_s``, ``share`` of the wall time) and the fix."""

    title: str
    cost_s: float
    detail: str
    fix: str
    share: float
    #: something the user can change (a one-time warm-up is said, but not as an issue)
    actionable: bool = True
    #: what ``share`` is a share of
    base: str = "of the cell"


@dataclass(frozen=True)
class OpRow:
    """One torch op's (or torch.compile region's) host time and calls, with the line that issued most."""

    op: str
    count: int
    total_s: float
    mean_s: float
    line: str
    code: str


@dataclass(frozen=True)
class OpTable:
    """The top ops by host time and by count; ``distinct`` ops in all; ``measures`` says what the time is."""

    by_time: tuple[OpRow, ...]
    by_count: tuple[OpRow, ...]
    distinct: int
    measures: str


@dataclass(frozen=True)
class SyncGroup:
    """Syncs with one reason at one line. ``reason`` is the text shown, ``kind`` the
    :class:`~.telemetry.SyncReason`; ``loop``: several value reads at the line (a sync inside a loop)."""

    reason: str
    kind: SyncReason | None
    line: str
    code: str
    count: int
    wait_s: float
    loop: bool
    hint: str
    #: the fix alone (``hint`` also says where and how often), for the findings
    fix: str = ""


@dataclass(frozen=True)
class FallbackGroup:
    """CPU fallbacks of one op at one line."""

    op: str
    line: str
    code: str
    count: int


@dataclass(frozen=True)
class CollectiveGroup:
    """torch.distributed collectives of one kind at one line: how many, how many bytes, how long."""

    kind: str
    line: str
    count: int
    bytes: int
    total_s: float
    participants: int | None


@dataclass(frozen=True)
class GraphBreakRow:
    """Where torch.compile cut a graph: Dynamo's first line of reason, all of it, and the user line."""

    reason: str
    detail: str
    line: str


@dataclass(frozen=True)
class MemoryReport:
    """Device memory over the block (bytes): ``timeline`` is ``(seconds, allocated)`` points, ``largest`` the
    biggest buffers alive at the end (dicts: nbytes, shape, dtype, source)."""

    start: int
    end: int
    peak: int
    limit: int | None
    allocated: int
    freed: int
    timeline: list
    largest: list


@dataclass(frozen=True)
class ProgramRow:
    """One XLA program of a profile (an executable, all its runs): XLA's cost of one run (``flops_per_run``,
    ``bytes_per_run``), the totals over the runs, the device time, and where it sits on the roofline:
    ``intensity`` (FLOPs per byte), ``bound`` (``"compute"`` or ``"memory"``: which roof is lower at that
    intensity), ``roof_fraction`` (achieved FLOP/s over that roof). ``source``: the user line that ran it.
    ``timed_runs``: how many runs the profile timed; the others' device time (their outputs were dropped or
    donated before it looked) is estimated from them."""

    name: str
    runs: int
    n_ops: int
    flops: float
    bytes_accessed: float
    flops_per_run: float
    bytes_per_run: float
    device_s: float
    intensity: float | None
    bound: str | None
    flops_per_s: float | None
    bytes_per_s: float | None
    roof_fraction: float | None
    source: str
    code: str
    timed_runs: int | None = None  # runs timed (the device time of the others is estimated from them)

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class Roofline:
    """What a roofline plot shows: the device's roofs (``peak_flops`` FLOP/s, ``peak_bandwidth`` bytes/s, their
    ``source``) and the programs as points."""

    peak_flops: float | None
    peak_bandwidth: float | None
    source: str
    programs: tuple[ProgramRow, ...]


@dataclass(frozen=True)
class GenerationStats:
    """A token loop in a profiled block (``profiling/generation.py``): ``tokens`` new positions of the token
    stream; ``tokens_per_s`` over the block's wall time; ``first_token_s`` from the block's start to the first
    token's append (the prompt's forward and its compiles included); ``decode_tokens_per_s`` from the first
    token's append to the last's (the steady decode rate, ``None`` for fewer than two tokens); ``programs``
    compiled or loaded from disk in the block, and ``programs_per_token``; ``host_s_per_token`` (the host's work:
    Python, recording, the backend's overhead; compiles and waits excluded) and ``device_s_per_token`` (the
    summary's device time), each over the block's tokens, so a token loop says which side bounds it (``None``
    without a summary, or without device time)."""

    tokens: int
    wall_s: float
    tokens_per_s: float
    first_token_s: float
    programs: int
    programs_per_token: float
    decode_tokens_per_s: float | None = None
    host_s_per_token: float | None = None
    device_s_per_token: float | None = None


@dataclass(frozen=True)
class Report:
    """Everything a renderer shows, computed once. ``time_labels`` says what each time column measures (keys
    ``python``, ``tracing``, ``compiling``, ``waiting``); ``*_hidden``: groups left out past ``top``."""

    summary: Summary
    time_labels: dict
    findings: tuple[Finding, ...]
    ops: OpTable
    compiles: tuple[CompileRow, ...]
    compile_groups: tuple[CompileGroup, ...]
    compile_groups_hidden: int
    syncs: tuple[SyncGroup, ...]
    syncs_hidden: int
    fallbacks: tuple[FallbackGroup, ...]
    graph_breaks: tuple[GraphBreakRow, ...]
    collectives: tuple[CollectiveGroup, ...]
    memory: MemoryReport
    flame: Any  # a processors.FlameTree
    xprof_dir: str | None
    xprof_error: str | None
    xprof_command: str | None
    roofline: Roofline | None = None  # the programs and the device's roofs
    memory_at_peak: tuple = ()  # dicts: bytes, kind, shape, dtype, source (see Profile.memory_at_peak)
    memory_timeline: tuple = ()  # (seconds, bytes, what changed and at which line) points
    generation: GenerationStats | None = None  # a token loop's rates, when the block generated


@dataclass(frozen=True)
class CompareRow:
    """One figure in two runs: ``delta`` (after - before) and ``ratio`` (after / before), ``None`` where they do not
    apply (text, or a zero before)."""

    name: str
    what: str
    before: Any
    after: Any
    delta: float | None
    ratio: float | None


@dataclass(frozen=True)
class CompareReport:
    """What ``torchtpu_lab.compare`` shows: headline figures, syncs by reason and line, top ops by host time and
    compile groups, each row a :class:`CompareRow`."""

    before_label: str
    after_label: str
    headline: tuple[CompareRow, ...]
    syncs: tuple[CompareRow, ...]
    ops: tuple[CompareRow, ...]
    compiles: tuple[CompareRow, ...]


@dataclass(frozen=True)
class Status:
    """The session at a glance, for the ``%load_ext`` banner, ``%tpu``, ``%tpu watch`` and the JupyterLab panel.
    ``cache_hits``: executions served by an executable already in memory; ``global_changes``: what importing the
    package changed process-wide (only the banner fills it)."""

    platform: str
    devices: int
    device_core: str  #: the native core loaded, or the pure-Python mode and what it lacks
    eager_mode: str
    memory_allocated: int
    memory_peak: int
    memory_limit: int | None
    compiles: int
    disk_loads: int
    cache_hits: int
    syncs: int
    cpu_fallbacks: int
    dynamo_graphs: int
    dynamo_recompiles: int
    graph_breaks: int
    pending_ops: int
    op_executables: int
    fused_graphs: int
    cache_dir: str
    cache_entries: int
    distributed: str | None
    global_changes: dict | None = None
    #: seconds spent compiling and loading executables, and seconds notebook cells ran (``%load_ext`` counts
    #: them): a hit rate of 98% can hide compiles taking most of the time
    compile_seconds: float = 0.0
    cell_seconds: float = 0.0

    @property
    def cache_hit_rate(self) -> float | None:
        total = self.cache_hits + self.compiles + self.disk_loads
        return self.cache_hits / total if total else None

    @property
    def compile_share(self) -> float | None:
        """The share of the cells' time spent compiling (``None`` before a cell ran under the extension)."""
        return min(1.0, self.compile_seconds / self.cell_seconds) if self.cell_seconds > 0 else None


@dataclass(frozen=True)
class Timing:
    """A distribution of durations (seconds): how many, their total, mean and percentiles."""

    count: int
    total_s: float
    mean_s: float
    p50_s: float
    p90_s: float
    p99_s: float
    max_s: float


@dataclass(frozen=True)
class Metrics:
    """The session's counters and timing distributions since it started (or the last reset), as the metrics
    report shows them. ``counters`` holds every telemetry counter by name (the :class:`~.telemetry.Counter`
    ones and any other); ``compiles``/``disk_loads``/``cache_hits`` count executables as :class:`Status` does.
    A timing is ``None`` when nothing was timed."""

    eager_mode: str
    counters: dict
    compile_time: Timing | None
    execute_time: Timing | None
    collective_time: Timing | None
    compiles: int
    disk_loads: int
    cache_hits: int
    recent_compiles: tuple[dict, ...]  # name, cause (a Cause), seconds, disk, source
    recent_graph_breaks: tuple[dict, ...]  # reason, source
    op_cache_entries: int
    graph_cache_entries: int
    caches: dict
    persistent_cache_dir: str | None
    persistent_cache_entries: int

    def as_dict(self) -> dict:
        """Plain data (``metrics.summary()``): timings as dicts (``{}`` when none), the executables together."""
        def timing(t: Timing | None) -> dict:
            return {} if t is None else {f.name: getattr(t, f.name) for f in fields(t)}

        return {
            "eager_mode": self.eager_mode, "counters": dict(self.counters),
            "compile_time": timing(self.compile_time), "execute_time": timing(self.execute_time),
            "collective_time": timing(self.collective_time),
            "executables": {Counter.COMPILES.value: self.compiles, Counter.DISK_LOADS.value: self.disk_loads,
                            "cache_hits": self.cache_hits},
            "recent_compiles": list(self.recent_compiles), "recent_graph_breaks": list(self.recent_graph_breaks),
            "op_cache_entries": self.op_cache_entries, "graph_cache_entries": self.graph_cache_entries,
            "caches": self.caches, "persistent_cache_dir": self.persistent_cache_dir,
            "persistent_cache_entries": self.persistent_cache_entries,
        }
