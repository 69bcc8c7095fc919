"""What held device memory at the peak (text and HTML), read off the owner dicts the profile computed."""

from __future__ import annotations

from html import escape

from ..units import fmt_bytes


def _what(o: dict) -> str:
    if o.get("shape") is not None:
        return f"{o['dtype']}{o['shape']}"
    return o.get("program", "")


def memory_at_peak_text(owners, top: int = 8) -> list[str]:
    if not owners:
        return []
    out = [f"memory at the peak ({fmt_bytes(sum(o['bytes'] for o in owners))} in {len(owners)} owners):"]
    for o in owners[:top]:
        out.append(f"  {fmt_bytes(o['bytes']):>10}  {o['kind']:<20} {_what(o):<24} {o['source']}")
    if len(owners) > top:
        out.append(f"  ... {len(owners) - top} more ({fmt_bytes(sum(o['bytes'] for o in owners[top:]))})")
    return out


def memory_at_peak_html(owners, top: int = 10) -> str:
    if not owners:
        return ""
    rows = "".join(f'<tr><td class="num">{escape(fmt_bytes(o["bytes"]))}</td><td>{escape(o["kind"])}</td>'
                   f"<td>{escape(_what(o))}</td><td>{escape(o['source'])}</td></tr>" for o in owners[:top])
    more = (f'<div class="ttl-muted">{len(owners) - top} more owners</div>' if len(owners) > top else "")
    return ('<h4>Memory at the peak</h4><table class="ttl-memory-peak"><tr><th>size</th><th>kind</th>'
            f"<th>what</th><th>created at</th></tr>{rows}</table>{more}")
