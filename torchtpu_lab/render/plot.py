"""plotly figures for profiles: the flame graph (an icicle chart) and the memory timeline."""

from __future__ import annotations

from .text import fmt_s


def flame_figure(tree, height: int = 420):
    import plotly.graph_objects as go

    fig = go.Figure(go.Icicle(
        ids=tree.ids, labels=tree.labels, parents=tree.parents, values=tree.values, branchvalues="total",
        tiling={"orientation": "v", "flip": "y"}, root_color="lightgrey",
        hovertemplate="%{label}<br>%{customdata}<br>%{percentRoot:.1%} of the cell<extra></extra>",
        customdata=[fmt_s(v) for v in tree.values],
    ))
    fig.update_layout(title=f"Where the time went ({fmt_s(tree.total())})", height=height,
                      margin={"t": 40, "l": 5, "r": 5, "b": 5})
    return fig


def memory_figure(timeline: list, limit: int | None = None, height: int = 260):
    import plotly.graph_objects as go

    xs = [t for t, _ in timeline]
    ys = [b / 2**20 for _, b in timeline]
    fig = go.Figure(go.Scatter(x=xs, y=ys, mode="lines", line_shape="hv", name="allocated"))
    if limit:
        fig.add_hline(y=limit / 2**20, line_dash="dot", annotation_text="limit")
    fig.update_layout(title="Device memory during the cell", xaxis_title="seconds", yaxis_title="MiB",
                      height=height, margin={"t": 40, "l": 5, "r": 5, "b": 5})
    return fig
