"""A cell profiled N times (``%%tpu_profile --repeat N``): medians, so that two versions of a cell can be compared
on a noisy machine. One run's wall time says little when the same loop takes 2.17 s and 1.20 s twice in a row.

:class:`Repeated` behaves as a profile for everything that reads one: its ``summary()`` holds the median of every
number over the runs (counts as the lower median, so they stay whole), its report is the median run's (the run
whose wall time is the median) with that summary; the runs themselves are in :attr:`Repeated.runs`.
"""

from __future__ import annotations

import dataclasses
import statistics

from ..records import Report, Summary


def median_summary(summaries: list[Summary], base: Summary) -> Summary:
    """``base`` with every numeric field replaced by its median over ``summaries``."""
    changes = {}
    for f in dataclasses.fields(Summary):
        values = [getattr(s, f.name) for s in summaries]
        if all(isinstance(v, bool) for v in values) or not all(isinstance(v, (int, float)) for v in values):
            continue
        if all(isinstance(v, int) for v in values):
            changes[f.name] = statistics.median_low(values)
        else:
            changes[f.name] = statistics.median(values)
    return dataclasses.replace(base, **changes)


class Repeated:
    """Profiles of the same cell run several times, read as one profile of medians."""

    def __init__(self, runs: list) -> None:
        if not runs:
            raise ValueError("Repeated needs at least one profile")
        self.runs = list(runs)
        order = sorted(range(len(runs)), key=lambda i: runs[i].wall_s)
        #: the run whose wall time is the (lower) median: its events stand for the cell in the report
        self.median_run = runs[order[(len(runs) - 1) // 2]]

    def __getattr__(self, name: str):  # programs(), memory_at_peak(), roofline(), events...: the median run's
        if name in ("runs", "median_run"):
            raise AttributeError(name)
        return getattr(self.median_run, name)

    def summary(self) -> dict:
        """The median of every headline figure over the runs (plus ``runs``: how many)."""
        from .processors import summarize

        out = median_summary([summarize(p) for p in self.runs], summarize(self.median_run)).as_dict()
        out["runs"] = len(self.runs)
        return out

    def report(self, top: int = 10) -> Report:
        from .processors import build_report, summarize

        base = build_report(self.median_run, top)
        return dataclasses.replace(base, summary=median_summary([summarize(p) for p in self.runs], base.summary))

    def text(self, top: int = 10) -> str:
        from ..render.text import profile_text

        return f"median of {len(self.runs)} runs\n" + profile_text(self.report(top))

    def _repr_html_(self) -> str:
        from ..render.html import profile_html

        return f"<div>median of {len(self.runs)} runs</div>" + profile_html(self.report())

    def __repr__(self) -> str:
        s = self.summary()
        return f"<Repeated {len(self.runs)} runs, median {s['wall_s'] * 1e3:.1f} ms wall, {s['syncs']} syncs>"
