"""plotly figures for profiles: the flame graph (an icicle chart) and the memory timeline.

plotly renders a subset of HTML in labels and hover text, so every string that reaches it (file names, source
lines, op names: all user-controlled) goes through :func:`html.escape` first.
"""

from __future__ import annotations

from html import escape

from .text import fmt_bytes, fmt_s


def flame_figure(tree, height: int = 420):
    import plotly.graph_objects as go

    hover = getattr(tree, "hover", None) or [""] * len(tree.ids)
    fig = go.Figure(go.Icicle(
        ids=[escape(i) for i in tree.ids], labels=[escape(x) for x in tree.labels],
        parents=[escape(p) for p in tree.parents], values=tree.values, branchvalues="total",
        tiling={"orientation": "v", "flip": "y"}, root_color="lightgrey",
        hovertemplate="%{label}<br>%{customdata[0]}<br>%{percentRoot:.1%} of the cell<br>%{customdata[1]}"
                      "<extra></extra>",
        customdata=[[fmt_s(v), escape(h)] for v, h in zip(tree.values, hover)],
    ))
    fig.update_layout(title=f"Where the time went ({fmt_s(tree.total())})", height=height,
                      margin={"t": 40, "l": 5, "r": 5, "b": 5})
    return fig


def memory_figure(timeline: list, limit: int | None = None, height: int = 260):
    import plotly.graph_objects as go

    xs = [t for t, _ in timeline]
    ys = [b / 2**20 for _, b in timeline]
    fig = go.Figure(go.Scatter(x=xs, y=ys, mode="lines", line_shape="hv", name="on the device",
                               customdata=[fmt_bytes(b) for _, b in timeline],
                               hovertemplate="%{x:.3f} s: %{customdata}<extra></extra>"))
    if limit:
        fig.add_hline(y=limit / 2**20, line_dash="dot", annotation_text="limit")
    fig.update_layout(title="Device memory during the cell (held buffers + running graphs)",
                      xaxis_title="seconds since the cell started", yaxis_title="MiB",
                      height=height, margin={"t": 40, "l": 50, "r": 5, "b": 40})
    return fig
