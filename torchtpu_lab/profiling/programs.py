"""How far each XLA program ran from the hardware: the programs of a profile with XLA's cost of each run, their
device time, and where they sit against the device's roofs (compute and memory bandwidth).

A program is one executable: every run of it in the block is one row. Its cost is XLA's cost analysis
(:mod:`~torchtpu_lab.runtime.program_cost`), its device time the runs' durations: a profile waits for a sample of each
program's runs (``runtime/program_cost.py``), so a sampled run lasts as long as the device took, and the other runs
count as the mean of the sampled ones after the first. Strict/debug mode ops, which run one small executable each
and are not waited for, are not programs here: their cost would be read against dispatch time.
"""

from __future__ import annotations

import bisect
from collections import Counter, defaultdict

from ..records import Finding, ProgramRow, Roofline
from ..telemetry import code_text, describe
from .peaks import Peaks

#: a program below this fraction of its roof gets a finding (when it is also the costliest)
FAR_BELOW = 0.25
#: a run whose work would take less than this at its roof is bound by launch latency, not by a roof: its distance
#: from the roof says nothing (a 4-element add is "0.001% of its memory roof" on every chip)
LAUNCH_FLOOR_S = 20e-6


def _run_sources(prof) -> dict[int, object]:
    """The user line that ran each program run (by id of the event): the sync it ran in (a fused graph), else
    the innermost user frame of its stack (a torch.compile graph)."""
    syncs = sorted(prof.syncs, key=lambda e: e.t)
    starts = [e.t for e in syncs]
    out = {}
    for g in prof.graphs:
        i = bisect.bisect_right(starts, g.t) - 1
        src = syncs[i].source if i >= 0 and g.t <= syncs[i].t + syncs[i].dur else None
        if src is None:
            src = g.source or (g.stack[-1] if g.stack else None)
        out[id(g)] = src
    return out


def device_time(events: list) -> float:
    """The device time of a program's runs: the timed runs' device time (``device_s``, see
    :mod:`~torchtpu_lab.runtime.program_cost`), plus for each run not timed (its outputs were dropped or donated
    before anyone looked) the mean of the timed runs that were not the executable's first run ever (a first run
    often pays one-time costs, such as XLA:CPU building its kernels), or of all timed runs when there is no other.
    A program never timed (one running over a process group) counts its runs' durations."""
    measured = [e.detail.get("device_s", e.dur) for e in events if e.detail.get("measured", True)]
    rest = len(events) - len(measured)
    if not measured:
        return sum(e.dur for e in events)
    total = sum(measured)
    if not rest:
        return total
    typical = [e.detail.get("device_s", e.dur) for e in events
               if e.detail.get("measured", True) and not e.detail.get("fresh", False)] or measured
    return total + rest * sum(typical) / len(typical)


def _runs(prof) -> dict[object, list]:
    """The profile's program runs, per program (in the order each first ran)."""
    runs: dict[object, list] = defaultdict(list)
    for e in prof.graphs:
        runs[e.detail.get("program", ("unnamed", e.name))].append(e)
    return runs


def _fastest(prof) -> float:
    """The highest FLOP/s at which a program of the profile ran (0 where none has a cost)."""
    flops_s = 0.0
    for events in _runs(prof).values():
        cost, seconds = events[0].detail.get("cost"), device_time(events)
        if cost is not None and seconds > 0:
            flops_s = max(flops_s, cost.flops * len(events) / seconds)
    return flops_s


def program_rows(prof, peaks: Peaks | None) -> list[ProgramRow]:
    """One row per program that ran in the block, the longest device time first."""
    sources = _run_sources(prof)
    rows = []
    for events in _runs(prof).values():
        first = events[0]
        cost = first.detail.get("cost")
        n = len(events)
        device_s = device_time(events)
        per_run_flops = cost.flops if cost is not None else 0.0
        per_run_bytes = cost.bytes_accessed if cost is not None else 0.0
        flops, nbytes = per_run_flops * n, per_run_bytes * n
        intensity = flops / nbytes if cost is not None and nbytes > 0 else None
        bound = roof_fraction = None
        flops_s = flops / device_s if cost is not None and device_s > 0 else None
        bytes_s = nbytes / device_s if cost is not None and device_s > 0 else None
        if intensity is not None and peaks is not None:
            bound = "memory" if intensity < peaks.ridge else "compute"
            roof = min(peaks.flops, intensity * peaks.bandwidth)
            roof_fraction = flops_s / roof if flops_s is not None and roof > 0 else None
        src = Counter(sources.get(id(e)) for e in events).most_common(1)[0][0]
        rows.append(ProgramRow(
            name=first.name, runs=n, n_ops=int(first.detail.get("n_ops") or 0), flops=flops, bytes_accessed=nbytes,
            flops_per_run=per_run_flops, bytes_per_run=per_run_bytes, device_s=device_s, intensity=intensity,
            bound=bound, flops_per_s=flops_s, bytes_per_s=bytes_s, roof_fraction=roof_fraction,
            source=describe(src), code=code_text(src),
            timed_runs=sum(1 for e in events if e.detail.get("measured", True))))
    return sorted(rows, key=lambda r: -r.device_s)


def totals(rows: list[ProgramRow], peaks: Peaks | None) -> dict:
    """The cell's FLOPs, bytes and program device time, and its MFU (FLOP/s over the programs' device time,
    over the peak)."""
    flops = sum(r.flops for r in rows)
    nbytes = sum(r.bytes_accessed for r in rows)
    device_s = sum(r.device_s for r in rows)
    mfu = flops / device_s / peaks.flops if peaks is not None and flops > 0 and device_s > 0 else None
    return {"flops": flops, "bytes_accessed": nbytes, "program_s": device_s, "mfu": mfu}


def roofline(rows: list[ProgramRow], peaks: Peaks | None) -> Roofline:
    return Roofline(peaks.flops if peaks else None, peaks.bandwidth if peaks else None,
                    peaks.source if peaks else "", tuple(r for r in rows if r.intensity is not None))


def roofline_finding(rows: list[ProgramRow], wall_s: float) -> Finding | None:
    """A finding when the program with the most device time runs far below its roof: which roof, and what
    usually helps."""
    costly = next((r for r in rows if r.roof_fraction is not None), None)
    if costly is None or costly.roof_fraction >= FAR_BELOW:
        return None
    if costly.roof_fraction * costly.device_s / max(costly.runs, 1) < LAUNCH_FLOOR_S:
        return None
    if costly.bound == "memory":
        fix = ("it moves more bytes than it computes on: larger batches (more FLOPs per weight read), fewer "
               "syncs and graph breaks (so XLA can fuse elementwise ops instead of writing each result), and "
               "bfloat16 activations raise the intensity")
    else:
        fix = ("the device waits on small or oddly shaped work: a larger batch, matmul dimensions in multiples "
               "of 128 (the TPU's MXU tile) and fewer fusion breaks (syncs, .item(), CPU fallbacks) keep it busy")
    detail = (f"{costly.name} ({costly.runs} run{'s' if costly.runs != 1 else ''}, {costly.n_ops} ops, at "
              f"{costly.source}) reaches {100 * costly.roof_fraction:.1f}% of its {costly.bound} roof")
    return Finding(f"the costliest program is {costly.bound}-bound, far below its roof", costly.device_s, detail,
                   fix, costly.device_s / (wall_s or 1e-9))


def device_peaks(prof) -> Peaks | None:
    """The peaks of the profile's device (kept on the profile: a calibration runs once per machine, the table
    lookup once per profile), a measured one no lower than what the profile's programs reached; ``None`` when
    they cannot be had (the report then shows no roofs)."""
    memo = getattr(prof, "_peaks", None)
    if memo is None:
        from . import peaks

        try:
            memo = (peaks.at_least(prof.device_index, _fastest(prof)),)
        except Exception:  # noqa: BLE001 — a failed calibration costs the roofline, never the profile
            memo = (None,)
        prof._peaks = memo
    return memo[0]


def profile_programs(prof) -> list[ProgramRow]:
    """:func:`program_rows` of the profile against its device's peaks, computed once per state of the profile
    (the summary, the report and ``Profile.programs()`` all ask)."""
    key = len(prof.events)
    memo = getattr(prof, "_programs", None)
    if memo is None or memo[0] != key:
        memo = (key, program_rows(prof, device_peaks(prof)))
        prof._programs = memo
    return list(memo[1])
