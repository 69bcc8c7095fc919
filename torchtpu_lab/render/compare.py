"""A comparison of two profiles as text and HTML (rows of :class:`~..records.CompareRow`, formatted here)."""

from __future__ import annotations

from html import escape

from ..records import CompareReport, CompareRow
from .roofline import fmt_rate
from .text import fmt_bytes, fmt_pct, fmt_s


def value_text(name: str, what: str, v) -> str:
    if v is None:
        return "n/a"
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return str(v)
    if name == "mfu":
        return fmt_pct(v) if v < 0.01 or v >= 0.995 else f"{100 * v:.1f}%"
    if name == "flops":
        return fmt_rate(v, "FLOP")
    if "bytes" in name:
        return fmt_bytes(v)
    if name.endswith("_s") or "(s)" in what:
        return fmt_s(v)
    return f"{v:g}"


def change_text(r: CompareRow) -> str:
    if r.delta is None or r.delta == 0:
        return "" if r.delta is None else "="
    sign = "+" if r.delta > 0 else "-"
    amount = value_text(r.name, r.what, abs(r.delta)) if r.name != "mfu" else f"{100 * abs(r.delta):.1f} points"
    ratio = f" (x{r.ratio:.2f})" if r.ratio is not None else " (new)"
    return f"{sign}{amount}{ratio}"


def _lines(title: str, rows: tuple[CompareRow, ...], label, key_width: int = 34) -> list[str]:
    if not rows:
        return []
    out = [title]
    for r in rows:
        out.append(f"  {label(r):<{key_width}} {value_text(r.name, r.what, r.before):>12} -> "
                   f"{value_text(r.name, r.what, r.after):>12}  {change_text(r)}")
    return out


def compare_text(c: CompareReport) -> str:
    out = [f"compare: {c.before_label} -> {c.after_label}"]
    out += _lines("headline:", c.headline, lambda r: r.what)
    out += _lines("syncs by line:", c.syncs, lambda r: r.name, 60)
    out += _lines("compiles by cause:", c.compiles, lambda r: r.name, 60)
    out += _lines("top ops by host time:", c.ops, lambda r: r.name)
    return "\n".join(out)


def _table(title: str, rows: tuple[CompareRow, ...], c: CompareReport) -> str:
    if not rows:
        return ""
    body = "".join(
        f"<tr><td>{escape(r.what if title == 'Headline' else r.name)}</td>"
        f'<td class="num">{escape(value_text(r.name, r.what, r.before))}</td>'
        f'<td class="num">{escape(value_text(r.name, r.what, r.after))}</td>'
        f'<td class="num">{escape(change_text(r))}</td></tr>' for r in rows)
    return (f"<h4>{escape(title)}</h4><table><tr><th></th><th>{escape(c.before_label)}</th>"
            f"<th>{escape(c.after_label)}</th><th>change</th></tr>{body}</table>")


def compare_html(c: CompareReport) -> str:
    from .html import _STYLE

    return (_STYLE + '<div class="ttl-report ttl-compare">'
            + f'<div class="ttl-muted">torchtpu_lab compare: {escape(c.before_label)} &rarr; '
              f"{escape(c.after_label)}</div>"
            + _table("Headline", c.headline, c) + _table("Syncs by line", c.syncs, c)
            + _table("Compiles by cause", c.compiles, c) + _table("Top ops by host time", c.ops, c) + "</div>")
