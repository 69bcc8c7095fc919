"""The last profile's views for the JupyterLab side panel, as a small versioned JSON payload.

The panel is a narrow column, so it gets the headline of each view rather than the report's tables: the cell's
FLOPs and MFU with the source of the peaks, the costliest programs with their bound, the largest owners of
memory at the peak, and the comparison when the cell ran with ``--compare``. Every figure is read off the
:class:`~..records.Report` (and :class:`~..records.CompareReport`) the HTML and text reports show, and formatted
here with the same helpers, so the panel never disagrees with the report. The frontend treats every string as
text (``extension/src/model.ts`` parses this payload; bump :data:`VERSION` when a field changes meaning).
"""

from __future__ import annotations

from ..records import CompareReport, CompareRow, ProgramRow, Report
from ..units import fmt_bytes, fmt_s
from .compare import change_text, value_text
from .memory_peak import owner_what
from .roofline import fmt_rate

VERSION = 1
TOP_PROGRAMS = 3
TOP_OWNERS = 5
#: the comparison figures the panel has room for, in this order, when they changed (the report has them all)
COMPARE_KEYS = ("wall_s", "syncs", "compiles", "recompiles", "cpu_fallbacks", "mfu", "peak_bytes", "compile_s",
                "wait_s", "flops")
TOP_COMPARE = 6


def _pct(fraction: float | None) -> str:
    """A share with the digits a small one needs: ``42.0%``, ``0.12%``."""
    if fraction is None:
        return "n/a"
    return f"{100 * fraction:.1f}%" if fraction >= 0.01 else f"{100 * fraction:.2g}%"


def _program(p: ProgramRow) -> dict:
    runs = f"{p.runs} run{'s' if p.runs != 1 else ''}"
    roof = f", {_pct(p.roof_fraction)} of its roof" if p.roof_fraction is not None else ""
    bound = f"{p.bound}-bound{roof}" if p.bound else "bound unknown (no cost analysis)"
    return {"name": p.name, "runs": p.runs, "n_ops": p.n_ops, "device_s": p.device_s, "bound": p.bound,
            "roof_fraction": p.roof_fraction, "source": p.source,
            "text": f"{p.name} · {runs} · {fmt_s(p.device_s)} · {bound}"}


def _owner(o: dict) -> dict:
    what = owner_what(o)
    return {"bytes": int(o["bytes"]), "kind": str(o["kind"]), "source": str(o["source"]),
            "text": f"{fmt_bytes(o['bytes'])} · {o['kind']}{' ' + what if what else ''}"}


def _compare_row(r: CompareRow) -> dict:
    change = change_text(r)
    return {"what": r.what, "before": value_text(r.name, r.what, r.before),
            "after": value_text(r.name, r.what, r.after), "change": change, "changed": change not in ("", "=")}


def _compare(c: CompareReport) -> dict:
    by_key = {r.name: r for r in c.headline}
    rows = [_compare_row(by_key[k]) for k in COMPARE_KEYS if k in by_key]
    changed = [r for r in rows if r["changed"]]
    return {"before": c.before_label, "after": c.after_label, "rows": changed[:TOP_COMPARE],
            "unchanged": len(rows) - len(changed)}


def panel_views(report: Report, comparison: CompareReport | None = None) -> dict:
    """The panel's views of one profiled cell (plain JSON-able data; ``v`` is the payload's version)."""
    s = report.summary
    hardware = None
    if s.flops or s.mfu is not None:
        hardware = {"flops": s.flops, "bytes_accessed": s.bytes_accessed, "mfu": s.mfu, "peak_flops": s.peak_flops,
                    "peak_bandwidth": s.peak_bandwidth, "peak_source": s.peak_source,
                    "text": (f"{fmt_rate(s.flops, 'FLOP')} · {fmt_rate(s.bytes_accessed, 'B')} accessed · "
                             f"MFU {_pct(s.mfu)} of {fmt_rate(s.peak_flops, 'FLOP/s')}")}
    roofline = report.roofline
    owners = list(report.memory_at_peak)
    return {
        "v": VERSION,
        "hardware": hardware,
        "programs": [_program(p) for p in (roofline.programs if roofline is not None else ())[:TOP_PROGRAMS]],
        "programs_total": len(roofline.programs) if roofline is not None else 0,
        "memory_at_peak": [_owner(o) for o in owners[:TOP_OWNERS]],
        "memory_owners_total": len(owners),
        "peak_bytes": int(s.peak_bytes),
        "compare": _compare(comparison) if comparison is not None else None,
    }
