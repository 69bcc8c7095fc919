"""What held device memory at the peak (text and HTML), read off the owner dicts the profile computed."""

from __future__ import annotations

from html import escape

from ..units import fmt_bytes
from .cell_link import line_html


def owner_what(o: dict) -> str:
    if o.get("shape") is not None:
        return f"{o['dtype']}{o['shape']}"
    return o.get("program", "")


def memory_at_peak_text(owners, top: int = 8) -> list[str]:
    if not owners:
        return []
    out = [f"memory at the peak ({fmt_bytes(sum(o['bytes'] for o in owners))} in {len(owners)} owners):"]
    for o in owners[:top]:
        out.append(f"  {fmt_bytes(o['bytes']):>10}  {o['kind']:<20} {owner_what(o):<24} {o['source']}")
    if len(owners) > top:
        out.append(f"  ... {len(owners) - top} more ({fmt_bytes(sum(o['bytes'] for o in owners[top:]))})")
    return out


def timeline_svg(points, width: int = 600, height: int = 90) -> str:
    """An inline step chart of device memory (no script, no plotly): each step is a bar whose hover (an SVG
    ``<title>``) says what changed, how much, and at which line."""
    if len(points) < 3:
        return ""
    t_end = max(p[0] for p in points) or 1.0
    top = max(p[1] for p in points) or 1
    bars = []
    for (t, b, what), nxt in zip(points, [*points[1:], points[-1]]):
        x = t / t_end * width
        w = max(1.0, (nxt[0] - t) / t_end * width)
        h = b / top * (height - 4)
        bars.append(f'<rect x="{x:.1f}" y="{height - h:.1f}" width="{w:.1f}" height="{h:.1f}" '
                    f'fill="#4c78a8"><title>{escape(f"{t * 1e3:.2f} ms: {fmt_bytes(b)}; {what}")}</title></rect>')
    return (f'<svg class="ttl-memory-timeline" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" role="img" aria-label="device memory over the cell">'
            f"{''.join(bars)}</svg><div class=\"ttl-muted\">device memory over the cell, 0 to "
            f"{escape(fmt_bytes(top))}; hover a step for what changed and where</div>")


def memory_at_peak_html(owners, points=(), top: int = 10) -> str:
    if not owners:
        return ""
    rows = "".join(f'<tr><td class="num">{escape(fmt_bytes(o["bytes"]))}</td><td>{escape(o["kind"])}</td>'
                   f"<td>{escape(owner_what(o))}</td><td>{line_html(o['source'])}</td></tr>" for o in owners[:top])
    more = (f'<div class="ttl-muted">{len(owners) - top} more owners</div>' if len(owners) > top else "")
    return ('<h4>Memory at the peak</h4><table class="ttl-memory-peak"><tr><th>size</th><th>kind</th>'
            f"<th>what</th><th>created at</th></tr>{rows}</table>{more}" + timeline_svg(points))
