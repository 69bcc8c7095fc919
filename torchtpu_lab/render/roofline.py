"""The roofline of a profile (plotly) and its program table (text, HTML): where each XLA program sits against
the device's compute roof and memory-bandwidth roof. Every figure is read off the :class:`~..records.Roofline`
record; nothing is computed here but axis ranges. User-controlled strings are escaped for plotly and HTML."""

from __future__ import annotations

from html import escape

from ..records import ProgramRow, Roofline
from ..units import fmt_s
from .cell_link import line_html


def fmt_rate(value: float | None, unit: str) -> str:
    """``1.23 TFLOP/s``-style figures (``n/a`` for an unknown)."""
    if value is None:
        return "n/a"
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def roofline_spec(r: Roofline, height: int = 380) -> dict:
    """Log-log roofline as plotly JSON: the roofs as a line (bandwidth x intensity up to the ridge, then flat at
    the peak), one marker per program at (intensity, achieved FLOP/s), its area proportional to its device time."""
    points = [p for p in r.programs if p.intensity and p.flops_per_s]
    data = []
    if r.peak_flops and r.peak_bandwidth:
        ridge = r.peak_flops / r.peak_bandwidth
        lo = min([ridge / 100] + [p.intensity / 3 for p in points])
        hi = max([ridge * 100] + [p.intensity * 3 for p in points])
        xs = [lo, ridge, hi]
        data.append({"type": "scatter", "x": xs, "y": [min(r.peak_flops, x * r.peak_bandwidth) for x in xs],
                     "mode": "lines", "name": "roof", "line": {"color": "black"},
                     "hovertemplate": escape(r.source) + "<extra></extra>"})
    longest = max((p.device_s for p in points), default=0.0) or 1.0
    data.append({
        "type": "scatter", "x": [p.intensity for p in points], "y": [p.flops_per_s for p in points],
        "mode": "markers", "name": "programs",
        "marker": {"size": [8 + 40 * (p.device_s / longest) ** 0.5 for p in points],
                   "color": ["#d62728" if p.bound == "memory" else "#1f77b4" for p in points], "opacity": 0.7},
        "customdata": [[escape(p.name), p.runs, p.n_ops, escape(p.source), escape(p.code), fmt_s(p.device_s),
                        escape(p.bound or "?"), _pct(p.roof_fraction)] for p in points],
        "hovertemplate": ("%{customdata[0]}: %{customdata[1]} runs, %{customdata[2]} ops<br>"
                          "%{customdata[3]}: %{customdata[4]}<br>device %{customdata[5]}, %{customdata[6]}-bound, "
                          "%{customdata[7]} of its roof<br>%{x:.3g} FLOP/byte, %{y:.3g} FLOP/s<extra></extra>")})
    layout = {"title": {"text": "Roofline: each XLA program against the device's peaks"}, "height": height,
              "xaxis": {"type": "log", "title": {"text": "arithmetic intensity (FLOPs per byte accessed)"}},
              "yaxis": {"type": "log", "title": {"text": "achieved FLOP/s"}},
              "margin": {"t": 40, "l": 60, "r": 5, "b": 40}, "showlegend": False,
              "annotations": [{"text": escape(r.source), "xref": "paper", "yref": "paper", "x": 0, "y": -0.22,
                               "showarrow": False, "font": {"size": 10}}]}
    return {"data": data, "layout": layout}


def roofline_figure(r: Roofline, height: int = 380):
    """The roofline as a ``plotly`` figure object (imports plotly)."""
    import plotly.graph_objects as go

    return go.Figure(roofline_spec(r, height))


def _row_cells(p: ProgramRow) -> tuple:
    runs = p.runs if p.timed_runs is None or p.timed_runs >= p.runs else f"{p.runs} ({p.timed_runs} timed)"
    return (p.name, runs, fmt_s(p.device_s), fmt_rate(p.flops, "FLOP"), fmt_rate(p.bytes_accessed, "B"),
            "n/a" if p.intensity is None else f"{p.intensity:.3g}", p.bound or "n/a",
            fmt_rate(p.flops_per_s, "FLOP/s"), _pct(p.roof_fraction), p.source)


HEADERS = ("program", "runs", "device", "FLOPs", "bytes", "FLOP/B", "bound", "achieved", "of roof", "line")


def roofline_text(r: Roofline | None, top: int = 10) -> list[str]:
    """The programs table as text lines (empty when no program with a known cost ran)."""
    if r is None or not r.programs:
        return []
    out = [(f"programs against the roofline ({r.source}; peak {fmt_rate(r.peak_flops, 'FLOP/s')}, "
           f"{fmt_rate(r.peak_bandwidth, 'B/s')}):")]
    for p in r.programs[:top]:
        c = _row_cells(p)
        out.append(f"  {c[0]:<22} x{c[1]:<4} {c[2]:>9}  {c[3]:>12} {c[4]:>10}  {c[5]:>6} FLOP/B  {c[6]:<7} "
                   f"{c[7]:>14}  {c[8]:>6} of roof  {c[9]}")
    return out


def roofline_html(r: Roofline | None, top: int = 10) -> str:
    """The programs table as an HTML section (empty when no program with a known cost ran)."""
    if r is None or not r.programs:
        return ""
    head = "".join(f"<th>{escape(h)}</th>" for h in HEADERS)
    rows = []
    for p in r.programs[:top]:
        cells = _row_cells(p)
        rows.append("<tr>" + "".join(f'<td class="num">{escape(str(c))}</td>' if isinstance(c, int) else
                                     f"<td>{escape(str(c))}</td>" for c in cells[:-1])
                    + f'<td class="line">{line_html(cells[-1])}</td></tr>')
    return (f'<h4>Programs against the roofline</h4><div class="ttl-muted ttl-roofline">peak '
            f"{escape(fmt_rate(r.peak_flops, 'FLOP/s'))}, {escape(fmt_rate(r.peak_bandwidth, 'B/s'))} &middot; "
            f"{escape(r.source)}</div><table>{'<tr>' + head + '</tr>'}{''.join(rows)}</table>")
