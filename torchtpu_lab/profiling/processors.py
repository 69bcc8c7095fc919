"""Turn a :class:`~.session.Profile`'s events into what a report shows: tables, groups, a flame tree.

Everything here is computation on plain data; rendering lives in :mod:`torchtpu_lab.render`.
"""

from __future__ import annotations

import glob
import gzip
import json
import os
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from ..causes import CauseKind
from ..runtime import fused
from . import findings as advice
from ..telemetry import EventKind, SyncReason, code_text, describe
from ..records import (CollectiveGroup, CompileGroup, CompileRow, FallbackGroup, Finding, GraphBreakRow, MemoryReport,
                       OpRow, OpTable, Report, Summary, SyncGroup)
from . import gc_pauses, memory_owners, programs
from .generation import generation_stats, growth_hint


#: labels of the source lines seen while building one report (a 10,000-op profile names the same few lines
#: 10,000 times); emptied at the start of each :func:`build_report`, since a label may change between reports
#: (``%load_ext`` adds the notebook-cell labeler)
_labels: dict = {}


def _where(source) -> str:
    label = _labels.get(source)
    if label is None:
        label = _labels[source] = describe(source)
    return label

#: what a profile suggests when the graph size limit cut the work (see runtime/graph_cuts.py)
LIMIT_HINT = (
    "{count} flushes at the graph size limit (torchtpu_lab.config.max_graph_ops = {limit} ops): the step "
    "records more ops than one graph may hold, so it runs as several graphs, cut at the same ops every step "
    "(steady steps compile nothing). To run it as one graph, raise the limit (longer compiles, more memory); "
    "a torchtpu_lab.sync() at the end of each step makes the step boundary explicit"
)
#: a loop that appends without syncing, cut at each iteration's end (runtime/growth.py ``_loop_step``)
LOOP_HINT = (
    "{count} iterations of a loop that appends to a sequence without reading a value back: each ran as a graph "
    "of its own, cut after its append, so its shapes (bounded by the sequence's capacity) compile once per "
    "bucket instead of one graph of every iteration so far compiling again for each length"
)


def device_seconds(prof) -> float:
    """Device time: XProf trace device events when recorded, else the host's time waiting at sync points
    (compiles excluded)."""
    if prof.xprof_dir:
        traced = _xprof_device_seconds(prof.xprof_dir)
        if traced is not None:
            return traced
    return time_split(prof)["waiting"]


def _xprof_device_seconds(directory: str) -> float | None:
    files = sorted(glob.glob(os.path.join(directory, "**", "*.trace.json.gz"), recursive=True))
    if not files:
        return None
    with gzip.open(files[-1], "rt") as f:
        trace = json.load(f)
    pids = {e["pid"]: e["args"]["name"] for e in trace.get("traceEvents", [])
            if e.get("ph") == "M" and e.get("name") == "process_name" and "args" in e}
    device = {pid for pid, name in pids.items() if "/device:" in name}
    total_us = sum(e.get("dur", 0) for e in trace.get("traceEvents", [])
                   if e.get("ph") == "X" and e.get("pid") in device)
    return total_us / 1e6 if device else None


#: Priority of what the host was doing when intervals overlap: a compile inside a sync is compiling, a sync
#: inside an op (a data-dependent op needing concrete inputs) is waiting.
_CATEGORY = {"compile": "compiling", "sync": "waiting", "graph": "waiting", "op": "tracing", "fallback": "tracing"}
_PRIORITY = ("gc", "compiling", "waiting", "tracing", "overhead")


def time_split(prof) -> dict:
    """:func:`split_wall_time`, computed once per state of the profile (the summary and the report both ask)."""
    key = (len(prof.events), prof.wall_s)
    memo = getattr(prof, "_time_split", None)
    if memo is None or memo[0] != key:
        memo = (key, split_wall_time(prof))
        prof._time_split = memo
    return dict(memo[1])


def split_wall_time(prof) -> dict:
    """Wall time split into what the host was doing, adding up to the wall time exactly:

    * ``tracing``: inside torch ops (fused mode: recording them into the graph; strict/debug: dispatching them);
    * ``compiling``: XLA compiling (or loading from the persistent cache) an executable;
    * ``waiting``: at a sync point, waiting for the device to run the graph and send values back;
    * ``overhead``: the rest of the backend's own host work (inside our kernels but outside the recorded
      events: encoding arguments, creating result tensors, views, the lock), measured at the kernels' door;
    * ``python``: everything else: the user's Python between torch ops (with PyTorch's dispatcher and autograd
      bookkeeping, which run before our kernels are entered), and Python's garbage collector;
    * ``gc``: of ``python``, the garbage collector's pauses wherever they fell (inside a kernel or a compile
      too: a collection stops whatever allocated), not a part of its own in the sum.
    """
    t0, t1 = prof.t0, prof.t0 + prof.wall_s
    edges: list[tuple[float, int, str]] = []
    spans = [(e.t, e.t + e.dur, _CATEGORY.get(e.kind)) for e in prof.events if e.dur > 0]
    ends = iter(getattr(prof, "entry_spans", ()))  # flat: start, end, start, end, ...
    spans += [(a, b, "overhead") for a, b in zip(ends, ends)]
    spans += [(a, b, "gc") for a, b, _ in gc_pauses.pauses(getattr(prof, "gc_spans", ()))]
    for start, end, cat in spans:
        if cat is None:
            continue
        a, b = max(start, t0), min(end, t1)
        if b > a:
            edges.append((a, 1, cat))
            edges.append((b, -1, cat))
    edges.sort(key=lambda x: x[0])
    out = dict.fromkeys(_PRIORITY, 0.0)
    active = dict.fromkeys(_PRIORITY, 0)
    covered, prev = 0.0, t0
    for t, delta, cat in edges:
        if t > prev:
            top = next((c for c in _PRIORITY if active[c] > 0), None)
            if top is not None:
                out[top] += t - prev
                covered += t - prev
            prev = t
        active[cat] += delta
    out["python"] = max(0.0, prof.wall_s - covered) + out["gc"]
    return out


def time_labels(modes: tuple[str, ...]) -> dict:
    """What each time column measures in the eager modes a block ran in (shown next to the figures)."""
    if len(modes) > 1:
        tracing = "recording / dispatching ops"
    elif "fused" in modes:
        tracing = "recording ops into fused graphs (they run later, at syncs)"
    else:
        tracing = "dispatching ops one at a time (asynchronous: the device runs them meanwhile)"
    return {
        "python": "Python: your code between torch ops (with PyTorch's dispatcher and autograd)",
        "overhead": "torchtpu_lab host overhead: entering our kernels, encoding arguments, creating result tensors",
        "tracing": tracing,
        "compiling": "compiling XLA executables (or loading them from the disk cache)",
        "waiting": "waiting for the device at syncs (running graphs, copying values back)",
    }


def _exclusive(events, nested) -> dict[int, float]:
    """Each event's duration less the compiles and syncs that ran inside it (by id of the event)."""
    inner = sorted((e.t, e.t + e.dur) for e in nested if e.dur > 0)
    starts = [a for a, _ in inner]
    out = {}
    import bisect

    for e in events:
        a, b = e.t, e.t + e.dur
        i = bisect.bisect_left(starts, a)
        own = e.dur
        while i < len(inner) and inner[i][0] < b:
            own -= max(0.0, min(b, inner[i][1]) - inner[i][0])
            i += 1
        out[id(e)] = max(0.0, own)
    return out


def op_table(prof, top: int) -> OpTable:
    """Top ``top`` torch ops by host time (compiles and syncs inside them excluded) and by count, each with the
    user line that issued most of them and its text."""
    total, count, lines = defaultdict(float), Counter(), defaultdict(Counter)
    ops = prof.ops
    own = _exclusive(ops, [e for e in prof.events if e.kind in ("compile", "sync")])
    sources = {}
    for e in ops:
        total[e.name] += own[id(e)]
        count[e.name] += 1
        where = _where(e.source)
        lines[e.name][where] += 1
        sources.setdefault((e.name, where), e.source)
    compiled = False
    for e in prof.events:  # a torch.compile region is one row: the host time of its call, its program included
        if e.kind == "graph" and "ops" in e.detail:
            compiled = True
            total[e.name] += e.dur
            count[e.name] += 1
            src = e.source or (e.stack[-1] if e.stack else None)  # a graph run has no source, only its stack
            where = _where(src)
            lines[e.name][where] += 1
            sources.setdefault((e.name, where), src)
    rows = []
    for name in count:
        line = lines[name].most_common(1)[0][0]
        rows.append(OpRow(name, count[name], total[name], total[name] / count[name], line,
                          code_text(sources.get((name, line)))))
    return OpTable(
        by_time=tuple(sorted(rows, key=lambda r: -r.total_s)[:top]),
        by_count=tuple(sorted(rows, key=lambda r: -r.count)[:top]),
        distinct=len(rows),
        measures=time_labels(prof.modes)["tracing"] + ", compile and sync time excluded"
        + ("; a torch.compile region: its whole call, program included" if compiled else ""),
    )


def compile_rows(prof) -> tuple[CompileRow, ...]:
    rows = []
    visits = advice.compile_visits(prof)
    warm = advice.warmup_compiles(prof, visits)
    for e in prof.compiles:
        d = e.detail
        rows.append(CompileRow(
            name=e.name, kind=d.get("kind"), n_ops=d.get("n_ops"), seconds=e.dur, cause=d.get("cause"),
            line=_where(e.source), code=code_text(e.source),
            site_code=code_text(d.get("site") or d.get("unrolled_site")), unrolled=d.get("unrolled", 0),
            unrolled_line=_where(d.get("unrolled_site")) if d.get("unrolled") else "",
            recompile=bool(d.get("recompile")), disk=bool(d.get("disk")), warmup=id(e) in warm,
            visit=visits.get(id(e), (None,))[0], repeats=visits.get(id(e), (None, False, 0))[2],
            library=d.get("library")))
    return tuple(rows)


#: cause kinds grouped by the values an argument took, and the group kind each becomes
_VALUE_KINDS = {CauseKind.SCALAR: "scalar", CauseKind.STATIC_SIZE: "static"}


def _pattern(c: CompileRow) -> tuple[tuple, dict]:
    """A compile's cause as a group key and the values it varies over, read from the cause's fields."""
    cause = c.cause
    line = _where(cause.site) if cause is not None and cause.site is not None else c.line
    if c.unrolled:
        return ("unrolled", c.unrolled_line), {"line": c.unrolled_line, "times": c.unrolled, "n_ops": c.n_ops}
    if cause is None or cause.first:
        return ("first", c.kind, c.disk), {"line": line}
    if c.warmup:  # a first step that differs from the next: one-time, whatever changed
        when = "once" if c.visit == 0 and not c.repeats else "second" if c.visit == 1 else "settled"
        return ("warmup", cause.kind, when, line), {"line": line, "cause": cause}
    if cause.kind is CauseKind.SHAPE:
        old, new = list(cause.old), list(cause.new)
        dims = tuple(i for i, (a, b) in enumerate(zip(old, new)) if a != b) if len(old) == len(new) else ("rank",)
        return ("shape", cause.op, cause.input, dims, line), {"old": old, "new": new, "line": line}
    if cause.kind in _VALUE_KINDS:
        return ((_VALUE_KINDS[cause.kind], cause.op, cause.input, line),
                {"old": cause.old, "new": cause.new, "line": line})
    if cause.kind is CauseKind.GROW:
        return ("grow", c.kind), {"old": cause.old, "new": cause.new, "line": line}
    if cause.kind is CauseKind.SEQUENCE:
        return ("sequence", cause.old, cause.new, line), {"line": line}
    return ("other", cause.kind, cause.op, cause.input, line), {"line": line}


def _span(values: list) -> str:
    nums = sorted(set(values))
    if len(nums) <= 4:
        return ", ".join(str(v) for v in nums)
    return f"{nums[0]}\u2026{nums[-1]}"


def compile_groups(prof) -> list[CompileGroup]:
    """Compilations grouped by cause pattern, costliest first, each with the fix where one is known:
    "dim 1 of aten::addmm input 1 took 14 values 17…93 at cell [8], line 2" + pad/bucket that dim."""
    groups: dict[tuple, dict] = {}
    for c in compile_rows(prof):
        key, info = _pattern(c)
        g = groups.get(key)
        if g is None:
            g = groups[key] = {"key": key, "rows": [], "infos": []}
        g["rows"].append(c)
        g["infos"].append(info)
    out = []
    for g in groups.values():
        rows, infos, key = g["rows"], g["infos"], g["key"]
        kind = key[0]
        n = len(rows)
        line = infos[0]["line"]
        first = rows[0]
        code = next((r.site_code for r in rows if r.site_code), "") or next(
            (r.code for r in rows if r.line == line and r.code), "")
        hint = ""
        if kind == "shape":
            op, arg, dims = key[1], key[2], key[3]
            if dims == ("rank",):
                what = f"the rank of {op} {arg} changed ({n}x)"
            else:
                d = dims[0]
                # this cell's own sizes: each recompile's new size, and the old one only where this cell ran it
                # (the first recompile's old size may be a previous cell's)
                ran_here = first.visit != 0  # its trigger ran before in this block: the old size ran here
                values = ([infos[0]["old"][d]] if ran_here else []) + [i["new"][d] for i in infos]
                what = f"dim {d} of {op} {arg} took {len(set(values))} values {_span(values)} in this cell"
                steps = [b - a for a, b in zip(values, values[1:])]
                if len(values) > 2 and all(s == 1 for s in steps):
                    hint = growth_hint(op, arg, d)
                else:
                    hint = advice.bucket_hint(values, d)
        elif kind in ("scalar", "static"):
            values = [infos[0]["old"]] + [i["new"] for i in infos]
            what = (f"a Python number passed to {key[1]} ({key[2]}) took {len(set(values))} values "
                    f"{_span(values)}" if kind == "scalar" else
                    f"size argument {key[2]} of {key[1]} took {len(set(values))} values {_span(values)}")
            hint = (advice.scalar_advice(next((r.library for r in rows if r.library is not None), None))
                    if kind == "scalar" else "pad or bucket the size so it takes a few values")
        elif kind == "grow":
            sizes = [infos[0]["old"]] + [i["new"] for i in infos]
            what = f"the graph kept growing ({_span(sizes)} ops): ops of several steps piled up without a sync"
            hint = ("call torchtpu_lab.sync() at the end of each step (like xm.mark_step()), so every step is "
                    "the same graph")
        elif kind == "unrolled":
            times = max(i["times"] for i in infos)
            size = max(i["n_ops"] or 0 for i in infos)
            what = (f"a loop was unrolled into one graph of {size} ops ({times} steps from {line} on, "
                    "no sync in between)")
            hint = ("call torchtpu_lab.sync() at the end of each step (like xm.mark_step()), so each step is one "
                    "small graph compiled once")
        elif kind == "warmup":
            cause = infos[0]["cause"]
            state = advice.is_state_creation(cause)
            when = key[2]
            if when == "once":
                what = f"compiled for code that ran once in this cell ({cause})"
                hint = "one-time: a re-run of the cell finds it cached"
            else:
                if state:
                    what = f"the first step created state ({cause.old} where later steps run {cause.new})"
                elif when == "second":
                    what = f"the first step differed from the next ({cause})"
                else:
                    what = f"the first run of this step compiled a new program ({cause})"
                what += (", so the second step compiled again; later steps reuse that program" if when == "second"
                         else "; later steps reuse this program")
                hint = ("one-time (an optimizer creating its moments, a buffer built lazily): nothing to fix"
                        if state else "one-time: nothing to fix unless it recurs in a longer run")
        elif kind == "sequence":
            what = f"a different op sequence ({key[1]} vs {key[2]})"
            lib = next((r.library for r in rows if r.library is not None), None)
            hint = (f"the graphs are cut where {advice.library_where(lib)} reads a value back, so each piece "
                    f"compiles on its own; {advice.sync_advice(lib, line, n)[1]}" if lib is not None else
                    "Python control flow took another path (a data-dependent if, a varying loop count); keep the "
                    "step the same each time, or sync before the branch")
        elif kind == "first":
            names = Counter(r.name for r in rows)
            shown = ", ".join(list(names)[:4]) + ("\u2026" if len(names) > 4 else "")
            noun = "graph" if key[1] == "graph" else "op"
            what = (f"{n} {noun}{'s' if n != 1 else ''} loaded from the disk cache ({shown})" if key[2] else
                    f"first compile of {n} {noun}{'s' if n != 1 else ''} ({shown})")
            line = rows[0].line if n == 1 else ""
            code = rows[0].code if n == 1 else ""
        else:
            what = str(first.cause)
        disk = sum(1 for r in rows if r.disk)
        if disk and kind != "first":
            what += f" ({disk} of them loaded from the disk cache)"
        out.append(CompileGroup(pattern=what, count=n, seconds=sum(r.seconds for r in rows), line=line, code=code,
                                hint=hint, recompile=any(r.recompile for r in rows), disk=disk, kind=kind,
                                names=tuple(sorted({r.name for r in rows}))))
    return sorted(out, key=lambda g: -g.seconds)


def sync_groups(prof) -> list[SyncGroup]:
    """Syncs grouped by reason and line; several at one line in one block means a sync inside a loop."""
    groups: dict[tuple, list] = {}
    own = _exclusive(prof.syncs, prof.compiles)  # waiting, not compiling
    for e in prof.syncs:
        groups.setdefault((e.name, _where(e.source)), []).append(e)
    out = []
    for (name, line), events in groups.items():
        kind = events[0].detail.get("reason")
        count = len(events)
        # a sync that reads no value back (a per-step torchtpu_lab.sync()) is a step boundary, not a mistake
        loop = count > 1 and (kind is None or kind.reads_value)
        fix = ""
        if kind is SyncReason.GRAPH_LIMIT:
            hint = LIMIT_HINT.format(count=count, limit=fused.MAX_GRAPH_OPS.value)
        elif kind is SyncReason.LOOP_ITERATION:
            hint = LOOP_HINT.format(count=count)
        elif loop:
            hint, fix = advice.sync_advice(events[0].detail.get("library"), line, count)
        else:
            hint = ""
        out.append(SyncGroup(name, kind, line, code_text(events[0].source), count,
                             sum(own[id(e)] for e in events), loop, hint, fix))
    return sorted(out, key=lambda g: -g.count)


def findings(prof, groups: list[CompileGroup], syncs: list[SyncGroup], fallbacks: list[FallbackGroup],
             breaks: tuple[GraphBreakRow, ...] = ()) -> list[Finding]:
    """Actionable findings first, then one-time warm-up (the rules are in :mod:`.findings`)."""
    summary = summarize(prof)
    return advice.findings(prof, summary, groups, syncs, fallbacks, list(breaks), generation_stats(prof, summary))


def graph_break_rows(prof) -> list[GraphBreakRow]:
    return [GraphBreakRow(e.name, e.detail.get("reason", ""), _where(e.source)) for e in prof.graph_breaks]


def collective_groups(prof) -> list[CollectiveGroup]:
    """torch.distributed collectives grouped by kind and line: how many, how many bytes, how long."""
    groups: dict[tuple, list] = {}
    for e in prof.of_kind(EventKind.COLLECTIVE):
        groups.setdefault((e.name, _where(e.source)), []).append(e)
    out = [CollectiveGroup(kind, line, len(events), sum(e.nbytes for e in events), sum(e.dur for e in events),
                           events[0].detail.get("participants")) for (kind, line), events in groups.items()]
    return sorted(out, key=lambda g: -g.total_s)


def fallback_groups(prof) -> list[FallbackGroup]:
    c = Counter((e.name, _where(e.source)) for e in prof.fallbacks)
    code = {(e.name, _where(e.source)): code_text(e.source) for e in prof.fallbacks}
    return [FallbackGroup(op, line, code[(op, line)], n) for (op, line), n in c.most_common()]


def memory_report(prof) -> MemoryReport:
    freed = sum(m.nbytes for m in prof.memory if m.kind == "free")
    allocated = sum(m.nbytes for m in prof.memory if m.kind == "alloc")
    timeline = [(0.0, prof.start_bytes)] + [(m.t, m.allocated) for m in prof.memory] + [(prof.wall_s, prof.end_bytes)]
    return MemoryReport(prof.start_bytes, prof.end_bytes, prof.peak_bytes, prof.limit_bytes, allocated, freed,
                        _thin(timeline, 500), prof.live_at_end)


def _thin(points: list, n: int) -> list:
    if len(points) <= n:
        return points
    step = len(points) / n
    kept = [points[int(i * step)] for i in range(n)]
    peak = max(points, key=lambda p: p[1])
    return sorted(set(kept + [peak, points[-1]]))


@dataclass
class FlameTree:
    """Nodes of an icicle/flame chart: parallel lists, values in seconds, parents' values >= their children's.
    ``hover`` is the source text of a line node (or what a box measures)."""

    ids: list = field(default_factory=list)
    labels: list = field(default_factory=list)
    parents: list = field(default_factory=list)
    values: list = field(default_factory=list)
    hover: list = field(default_factory=list)
    #: what each box is, for its colour: "cell", "frame", "python", "op", "sync", "wait", "run", "compile" or
    #: "compiles" (the root of every compile, so a compile never sits under the sync that triggered it)
    kinds: list = field(default_factory=list)

    def total(self) -> float:
        return self.values[0] if self.values else 0.0


def _frame_label(src) -> str:
    where = _where(src)
    if src.function in ("<module>", "") or src.filename in ("<autograd backward>", "<end of cell>"):
        return where
    return f"{src.function}() \u00b7 {where}"


def _nest(events) -> list[tuple]:
    """``(event, children)`` for the outermost events, nesting by time (a compile inside a sync, a sync inside
    an op)."""
    ordered = sorted(events, key=lambda e: (e.t, -e.dur))
    roots: list[tuple] = []
    stack: list[tuple] = []
    for e in ordered:
        while stack and e.t >= stack[-1][0].t + stack[-1][0].dur - 1e-9:
            stack.pop()
        item = (e, [])
        (stack[-1][1] if stack else roots).append(item)
        stack.append(item)
    return roots


def ops_inside(ops: list, most: int = 12) -> str:
    """``aten::mm x3, aten::add.Tensor x2, ...``: the ATen ops a compiled region runs, most frequent first."""
    counts = Counter(ops).most_common()
    text = ", ".join(f"{name} x{n}" for name, n in counts[:most])
    more = len(counts) - most
    return f"{len(ops)} ATen ops inside: {text}" + (f", and {more} more kinds" if more > 0 else "")


def flame_tree(prof) -> FlameTree:
    """cell line -> user function -> ... -> torch op / sync -> compile and XLA graph run, sized by host time.

    The Python layer comes from the user call stack captured at each op: the host time between two ops is the
    Python that ran at the frames of the op that follows it (a "Python" box under that line)."""
    nodes: dict[str, list] = {}  # id -> [label, parent, own value, hover, kind]
    children: dict[str, list[str]] = defaultdict(list)

    def add(node_id: str, label: str, parent: str, value: float, hover: str = "", kind: str = "frame") -> str:
        if node_id not in nodes:
            nodes[node_id] = [label, parent, 0.0, hover, kind]
            children[parent].append(node_id)
        nodes[node_id][2] += value
        return node_id

    root = "cell"
    nodes[root] = ["cell", "", 0.0, "the whole cell", "cell"]
    compiles_root = f"{root}|compiles"
    kinds = ("op", "sync", "fallback", "compile", "graph")
    top = _nest([e for e in prof.events if e.kind in kinds])

    def frames_of(e) -> str:
        stack = e.stack or ((e.source,) if e.source is not None else ())
        parent = root
        for src in stack:
            parent = add(f"{parent}|{src.filename}:{src.lineno}:{src.function}", _frame_label(src), parent, 0.0,
                         code_text(src, 120))
        return parent

    def leaf_label(e) -> str:
        if e.kind == "op":
            return e.name
        if e.kind == "compile":
            what = "load from disk cache" if e.detail.get("disk") else "compile"
            n = e.detail.get("n_ops")
            return f"{what}: {n} ops" if e.detail.get("kind") == "graph" and n else f"{what}: {e.name}"
        if e.kind == "graph":
            if "ops" in e.detail:  # a torch.compile region: one program standing for the ATen ops inside
                return f"XLA run: {e.name}"
            return f"XLA run: {e.detail.get('n_ops', '?')} ops"
        return f"{e.kind}: {e.name}"

    def compiled_inside(kids) -> float:
        return sum(k.dur if k.kind == "compile" else compiled_inside(g) for k, g in kids)

    def place(e, kids, parent: str, trigger: str) -> None:
        if e.kind == "compile":  # under the compiles root, labelled with the line that triggered it
            add(compiles_root, "XLA compiles", root, 0.0, "compiling (or loading) executables: one-time costs "
                "unless the same line compiles again", "compiles")
            add(f"{compiles_root}|{e.name}|{trigger}", f"{leaf_label(e)} \u00b7 {trigger}", compiles_root, e.dur,
                "", "compile")
            return
        hover = ops_inside(e.detail["ops"]) if e.kind == "graph" and "ops" in e.detail else ""
        kind = {"graph": "run", "fallback": "op"}.get(e.kind, e.kind)
        node = add(f"{parent}|{e.kind}:{e.name}", leaf_label(e), parent, e.dur - compiled_inside(kids), hover, kind)
        inner = sum(k.dur for k, _ in kids)
        for k, grandkids in kids:
            place(k, grandkids, node, trigger)
        if e.kind == "sync" and kids and e.dur > inner:
            add(f"{node}|wait", "wait for device / copy to host", node, e.dur - inner, "", "wait")

    prev_end, last_frame = prof.t0, root
    for e, kids in top:
        frame = frames_of(e)
        gap = e.t - prev_end
        if gap > 0:
            add(f"{frame}|python", "Python", frame, gap, "host Python at this line before the op", "python")
        source = e.source or (e.stack[-1] if e.stack else None)
        place(e, kids, frame, _where(source) if source is not None else "")
        prev_end = max(prev_end, e.t + e.dur)
        last_frame = frame

    def settle(node_id: str) -> float:
        kids = sum(settle(c) for c in children[node_id])
        nodes[node_id][2] = max(nodes[node_id][2], kids)
        return nodes[node_id][2]

    trailing = prof.t0 + prof.wall_s - prev_end
    if trailing > 0:
        add(f"{last_frame}|python", "Python", last_frame, trailing, "host Python at this line", "python")
    covered = settle(root)
    nodes[root][2] = max(prof.wall_s, covered)
    tree = FlameTree()
    for node_id, (label, parent, value, hover, kind) in nodes.items():
        tree.ids.append(node_id)
        tree.labels.append(label)
        tree.parents.append(parent)
        tree.values.append(value)
        tree.hover.append(hover)
        tree.kinds.append(kind)
    return tree


def summarize(prof) -> Summary:
    """A profile's headline figures (``Profile.summary()`` is this as a dict)."""
    compiles = [c for c in prof.compiles if not c.detail.get("disk")]
    loads = len(prof.compiles) - len(compiles)
    graph_runs = prof.graphs
    # executions that needed no compile: fused graphs at syncs and ops run one at a time (strict/debug)
    hits = sum(1 for e in graph_runs + prof.ops if e.detail.get("cache_hit"))
    split = time_split(prof)
    rows = programs.profile_programs(prof)
    peaks = programs.device_peaks(prof)
    cost = programs.totals(rows, peaks)
    traced = _xprof_device_seconds(prof.xprof_dir) if prof.xprof_dir else None
    visits = advice.compile_visits(prof)
    warm = advice.warmup_compiles(prof, visits)
    return Summary(
        wall_s=prof.wall_s, device_s=traced if traced is not None else cost["program_s"] if rows else split["waiting"],
        python_s=split["python"], gc_s=split["gc"], gc_pauses=len(getattr(prof, "gc_spans", ())) // 3,
        tracing_s=split["tracing"], overhead_s=split["overhead"],
        compile_s=split["compiling"], wait_s=split["waiting"], mode=prof.mode, ops=len(prof.ops),
        graphs_executed=len(graph_runs), compiles=len(compiles),
        recompiles=sum(1 for c in compiles if c.detail.get("recompile")), disk_loads=loads, cache_hits=hits,
        cache_misses=len(compiles) + loads, syncs=len(prof.syncs), cpu_fallbacks=len(prof.fallbacks),
        collectives=len(prof.of_kind(EventKind.COLLECTIVE)), peak_bytes=prof.peak_bytes,
        start_bytes=prof.start_bytes, end_bytes=prof.end_bytes, limit_bytes=prof.limit_bytes,
        platform=prof.platform, error=prof.error, xprof_error=prof.xprof_error, flops=cost["flops"],
        bytes_accessed=cost["bytes_accessed"], peak_flops=peaks.flops if peaks else None,
        peak_bandwidth=peaks.bandwidth if peaks else None, peak_source=peaks.source if peaks else "unavailable",
        mfu=cost["mfu"], steady_compiles=sum(1 for c in prof.compiles if id(c) not in warm),
        device_traced=traced is not None)


def build_report(prof, top: int = 10) -> Report:
    """Everything the renderers show, computed once."""
    _labels.clear()
    summary = summarize(prof)
    groups = compile_groups(prof)
    syncs = sync_groups(prof)
    fallbacks = fallback_groups(prof)
    breaks = tuple(graph_break_rows(prof))
    rows = programs.profile_programs(prof)
    generation = generation_stats(prof, summary)
    found = advice.findings(prof, summary, groups, syncs, fallbacks, list(breaks), generation)
    far = programs.roofline_finding(rows, prof.wall_s)
    if far is not None and far.share >= advice.NOISE:  # last among the actionable findings
        n = sum(1 for f in found if f.actionable)
        found = [*found[:n], far, *found[n:]]
    return Report(
        summary=summary,
        time_labels=time_labels(prof.modes),
        findings=tuple(found),
        ops=op_table(prof, top),
        compiles=compile_rows(prof),
        compile_groups=tuple(groups[:top]),
        compile_groups_hidden=max(0, len(groups) - top),
        syncs=tuple(syncs[:top]),
        syncs_hidden=max(0, len(syncs) - top),
        fallbacks=tuple(fallbacks[:top]),
        graph_breaks=breaks,
        collectives=tuple(collective_groups(prof)),
        memory=memory_report(prof),
        flame=flame_tree(prof),
        xprof_dir=prof.xprof_dir,
        xprof_error=prof.xprof_error,
        xprof_command=xprof_command(prof.xprof_dir) if prof.xprof_dir else None,
        roofline=programs.roofline(rows, programs.device_peaks(prof)),
        memory_at_peak=tuple(memory_owners.at_peak(prof)),
        memory_timeline=tuple(memory_owners.timeline(prof)),
        generation=generation,
    )


def xprof_command(directory: str, port: int = 8791) -> str:
    """The shell command that serves an XProf trace directory: the ``xprof`` server that the ``lab`` extra's
    ``tensorboard-plugin-profile`` installs next to this interpreter (TensorBoard itself is not needed, and
    ``%load_ext tensorboard`` would fail without it). The full path works without an activated venv."""
    import shlex
    import shutil
    import sys

    beside = os.path.join(os.path.dirname(sys.executable), "xprof")
    exe = beside if os.path.exists(beside) else shutil.which("xprof") or "xprof"
    return f"{shlex.quote(exe)} server --logdir {shlex.quote(directory)} --port {port}"
