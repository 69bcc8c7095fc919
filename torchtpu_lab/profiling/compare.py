"""``torchtpu_lab.compare(before, after)``: what changed between two profiles of a cell (or two medians of
repeated runs): every summary figure side by side, and the parts a change usually moves: compiles, syncs by
line, the time split, the top ops, the memory peak and MFU, each with its change.

Lines are matched by their label (``cell [3], line 2``): a cell edited between the two runs keeps its lines'
labels when they keep their numbers; a line found in one run only is shown against zero.
"""

from __future__ import annotations

from ..records import CompareReport, CompareRow


def _change(before, after) -> tuple[float | None, float | None]:
    """(after - before, after / before) for numbers; ``None`` where it does not apply."""
    if not isinstance(before, (int, float)) or not isinstance(after, (int, float)) or isinstance(before, bool):
        return None, None
    return after - before, (after / before if before else None)


def _row(name: str, what: str, before, after) -> CompareRow:
    delta, ratio = _change(before, after)
    return CompareRow(name, what, before, after, delta, ratio)


#: the headline figures a comparison leads with: (summary key, what it is)
HEADLINE = (
    ("wall_s", "wall time (s)"), ("python_s", "Python (s)"), ("tracing_s", "tracing (s)"),
    ("compile_s", "compiling (s)"), ("wait_s", "waiting for the device (s)"), ("device_s", "device time (s)"),
    ("compiles", "compiles"), ("recompiles", "recompiles"), ("disk_loads", "disk loads"), ("syncs", "syncs"),
    ("cpu_fallbacks", "CPU fallbacks"), ("graphs_executed", "programs run"), ("ops", "torch ops"),
    ("flops", "FLOPs"), ("mfu", "MFU"), ("peak_bytes", "memory peak (bytes)"),
)


def _by_line(report) -> dict:
    return {(g.reason, g.line): g.count for g in report.syncs}


def _ops(report) -> dict:
    return {o.op: (o.total_s, o.count) for o in report.ops.by_time}


def compare_reports(before_report, after_report, before_summary: dict, after_summary: dict,
                    labels: tuple[str, str]) -> CompareReport:
    """The comparison of two reports (and their summaries as dicts)."""
    headline = tuple(_row(k, what, before_summary.get(k), after_summary.get(k)) for k, what in HEADLINE)
    b_sync, a_sync = _by_line(before_report), _by_line(after_report)
    syncs = tuple(_row(f"{reason} at {line}", "syncs", b_sync.get((reason, line), 0), a_sync.get((reason, line), 0))
                  for reason, line in dict.fromkeys([*b_sync, *a_sync]))
    b_ops, a_ops = _ops(before_report), _ops(after_report)
    ops = tuple(_row(op, "host time (s)", b_ops.get(op, (0.0, 0))[0], a_ops.get(op, (0.0, 0))[0])
                for op in dict.fromkeys([*b_ops, *a_ops]))
    b_comp = {g.pattern: g.count for g in before_report.compile_groups}
    a_comp = {g.pattern: g.count for g in after_report.compile_groups}
    compiles = tuple(_row(p, "compiles", b_comp.get(p, 0), a_comp.get(p, 0)) for p in dict.fromkeys([*b_comp, *a_comp]))
    return CompareReport(labels[0], labels[1], headline, syncs, ops, compiles)


class Comparison:
    """Two profiles side by side: :meth:`summary` maps every summary key to ``(before, after)``; :meth:`text`
    and the notebook HTML view show the headline figures, syncs by line, top ops and compiles with changes."""

    def __init__(self, before, after, labels: tuple[str, str] = ("before", "after")) -> None:
        for name, p in (("before", before), ("after", after)):
            if not (hasattr(p, "summary") and hasattr(p, "report")):
                raise TypeError(f"compare(): {name} must be a profile (torchtpu_lab.profile(), %%tpu_profile's "
                                f"_tpu_profile or an entry of _tpu_profiles), got {type(p).__name__}")
        self.before, self.after, self.labels = before, after, labels

    def summary(self) -> dict:
        """Every key of either summary mapped to ``(before, after)`` (``None`` where one has no such key)."""
        b, a = self.before.summary(), self.after.summary()
        return {k: (b.get(k), a.get(k)) for k in dict.fromkeys([*b, *a])}

    def report(self, top: int = 10) -> CompareReport:
        return compare_reports(self.before.report(top), self.after.report(top), self.before.summary(),
                               self.after.summary(), self.labels)

    def text(self) -> str:
        from ..render.compare import compare_text

        return compare_text(self.report())

    def _repr_html_(self) -> str:
        from ..render.compare import compare_html

        return compare_html(self.report())

    def __repr__(self) -> str:
        return self.text()


def compare(before, after, labels: tuple[str, str] = ("before", "after")) -> Comparison:
    """Compare two profiles (``Profile`` or repeated runs): ``compare(p1, p2).summary()["syncs"] == (40, 1)``."""
    return Comparison(before, after, labels)
