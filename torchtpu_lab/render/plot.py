"""plotly figures for profiles: the flame graph (an icicle chart) and the memory timeline.

Each figure is built as plotly's own JSON (a ``{"data": [...], "layout": {...}}`` dict) and shown through
:class:`PlotlyBundle`, a raw ``application/vnd.plotly.v1+json`` display bundle. Displaying a ``plotly`` figure
object instead goes through ``plotly.io``'s renderers, whose first use imports nbformat and jsonschema (seconds
of grammar building before the first report appears); the raw bundle needs no plotly import in the kernel at
all. ``flame_figure`` and ``memory_figure`` still return ``plotly.graph_objects.Figure`` objects for users who
want to restyle or save them.

plotly renders a subset of HTML in labels and hover text, so every string that reaches it (file names, source
lines, op names: all user-controlled) goes through :func:`html.escape` first.
"""

from __future__ import annotations

import sys
from html import escape

from .roofline import roofline_spec
from .text import fmt_bytes, fmt_s

#: box colours of the flame graph by what a box is: compiles stand out (one-time, or a recompile to fix),
#: the user's Python and frames are quiet, device work is blue
FLAME_COLOURS = {
    "cell": "#eeeeee", "frame": "#d9dee8", "python": "#c7c7c7", "op": "#8fb8de", "fallback": "#e377c2",
    "sync": "#9ecae1", "wait": "#6baed6", "run": "#3182bd", "compile": "#f28e2b", "compiles": "#e15759",
}

#: what the figure's ``config`` asks of plotly.js (no plotly logo, responsive width)
_CONFIG = {"displaylogo": False, "responsive": True}


#: plotly.js for frontends without a plotly mime renderer (Colab): the version the installed plotly bundles
_PLOTLY_CDN = "https://cdn.plot.ly/plotly-{version}.min.js"


class PlotlyBundle:
    """A plotly figure as a raw display bundle: plotly's JSON for JupyterLab's (and VS Code's) plotly renderer
    and a line of text for every other viewer; on Colab, which renders no plotly mime type, also an HTML part
    that loads plotly.js from its CDN (what plotly's own Colab renderer does)."""

    def __init__(self, spec: dict, text: str):
        self.spec = spec
        self.text = text

    def _repr_mimebundle_(self, include=None, exclude=None):
        figure = {**self.spec, "config": _CONFIG}
        bundle = {"application/vnd.plotly.v1+json": figure, "text/plain": self.text}
        if "google.colab" in sys.modules:
            bundle["text/html"] = _html(figure)
        return bundle


def _html(figure: dict) -> str:
    import json
    import uuid

    from plotly.offline import get_plotlyjs_version

    div = f"ttl-plot-{uuid.uuid4().hex}"
    # "</" cannot end the script early: JSON allows "<\/"
    data = json.dumps(figure).replace("</", "<\\/")
    return (f'<div id="{div}"></div><script src="{_PLOTLY_CDN.format(version=get_plotlyjs_version())}"></script>'
            f"<script>(function(f){{Plotly.newPlot('{div}', f.data, f.layout, f.config);}})({data});</script>")


def flame_spec(tree, height: int = 420) -> dict:
    """The flame graph as plotly JSON. The whole-cell box is not drawn (its total is in the title), so every
    band is a line of the cell; compiles are a top-level box of their own colour."""
    total = tree.total() or 1e-12
    hover = getattr(tree, "hover", None) or [""] * len(tree.ids)
    kinds = getattr(tree, "kinds", None) or ["frame"] * len(tree.ids)
    root = tree.ids[0] if tree.ids else ""
    keep = [i for i, node in enumerate(tree.ids) if node != root]
    trace = {
        "type": "icicle",
        "ids": [escape(tree.ids[i]) for i in keep],
        "labels": [escape(tree.labels[i]) for i in keep],
        "parents": ["" if tree.parents[i] == root else escape(tree.parents[i]) for i in keep],
        "values": [tree.values[i] for i in keep],
        "branchvalues": "total",
        "tiling": {"orientation": "v", "flip": "y"},
        "marker": {"colors": [FLAME_COLOURS.get(kinds[i], "#d9dee8") for i in keep]},
        "textinfo": "label",
        "insidetextfont": {"size": 11},
        "customdata": [[f"{fmt_s(tree.values[i])} ({100 * tree.values[i] / total:.1f}% of the cell)",
                        escape(hover[i])] for i in keep],
        "hovertemplate": "%{label}<br>%{customdata[0]}<br>%{customdata[1]}<extra></extra>",
    }
    layout = {"title": {"text": f"Where the time went ({fmt_s(tree.total())}); orange: XLA compiles"},
              "height": height, "margin": {"t": 40, "l": 5, "r": 5, "b": 5}, "uniformtext": {"minsize": 9}}
    return {"data": [trace], "layout": layout}


def memory_spec(timeline: list, limit: int | None = None, height: int = 260) -> dict:
    """The memory timeline as plotly JSON, with the peak marked (and the device's limit when it has one)."""
    xs = [t for t, _ in timeline]
    ys = [b / 2**20 for _, b in timeline]
    data = [{"type": "scatter", "x": xs, "y": ys, "mode": "lines", "line": {"shape": "hv"},
             "name": "on the device", "customdata": [fmt_bytes(b) for _, b in timeline],
             "hovertemplate": "%{x:.3f} s: %{customdata}<extra></extra>"}]
    shapes, notes = [], []
    if timeline:
        t_peak, b_peak = max(timeline, key=lambda p: p[1])
        data.append({"type": "scatter", "x": [t_peak], "y": [b_peak / 2**20], "mode": "markers+text",
                     "marker": {"size": 9, "color": "#e15759"}, "text": [f"peak {fmt_bytes(b_peak)}"],
                     "textposition": "top center", "name": "peak", "hoverinfo": "text"})
    if limit:
        shapes.append({"type": "line", "xref": "paper", "x0": 0, "x1": 1, "y0": limit / 2**20, "y1": limit / 2**20,
                       "line": {"dash": "dot"}})
        notes.append({"xref": "paper", "x": 1, "y": limit / 2**20, "text": "limit", "showarrow": False,
                      "xanchor": "right", "yanchor": "bottom"})
    layout = {"title": {"text": "Device memory during the cell (held buffers + running graphs)"},
              "xaxis": {"title": {"text": "seconds since the cell started"}},
              "yaxis": {"title": {"text": "MiB"}, "rangemode": "tozero"}, "showlegend": False,
              "height": height, "margin": {"t": 40, "l": 50, "r": 5, "b": 40}, "shapes": shapes,
              "annotations": notes}
    return {"data": data, "layout": layout}


def flame_bundle(tree) -> PlotlyBundle:
    return PlotlyBundle(flame_spec(tree), f"flame graph: where {fmt_s(tree.total())} went")


def roofline_bundle(r) -> PlotlyBundle:
    """The roofline (:mod:`.roofline`) as a raw plotly bundle."""
    return PlotlyBundle(roofline_spec(r), f"roofline: {len(r.programs)} programs ({r.source})")


def memory_bundle(timeline: list, limit: int | None = None) -> PlotlyBundle:
    peak = max((b for _, b in timeline), default=0)
    return PlotlyBundle(memory_spec(timeline, limit), f"device memory timeline (peak {fmt_bytes(peak)})")


def flame_figure(tree, height: int = 420):
    """The flame graph as a ``plotly`` figure object (imports plotly)."""
    import plotly.graph_objects as go

    return go.Figure(flame_spec(tree, height))


def memory_figure(timeline: list, limit: int | None = None, height: int = 260):
    """The memory timeline as a ``plotly`` figure object (imports plotly)."""
    import plotly.graph_objects as go

    return go.Figure(memory_spec(timeline, limit, height))
