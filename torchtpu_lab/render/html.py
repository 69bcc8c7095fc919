"""HTML renderings for notebooks. Every user-controlled string goes through :func:`html.escape`."""

from __future__ import annotations

from html import escape

from .text import fmt_bytes, fmt_s

_STYLE = """
<style>
.ttl-report{font-family:var(--jp-ui-font-family,system-ui,sans-serif);font-size:13px;line-height:1.4;
 max-width:1100px}
.ttl-report h4{margin:12px 0 4px 0;font-size:13px}
.ttl-head{display:flex;flex-wrap:wrap;gap:6px;margin:4px 0}
.ttl-chip{border:1px solid #ccc;border-radius:6px;padding:3px 8px;background:rgba(127,127,127,.08)}
.ttl-chip b{font-size:14px}
.ttl-report table{border-collapse:collapse;margin:2px 0}
.ttl-report td,.ttl-report th{padding:2px 8px;text-align:left;border-bottom:1px solid rgba(127,127,127,.25)}
.ttl-report td.num{text-align:right;font-variant-numeric:tabular-nums}
.ttl-recompile{background:rgba(255,160,0,.18)}
.ttl-hint{color:#b35900}
.ttl-error{color:#c00;font-weight:bold}
.ttl-muted{color:#777}
</style>
"""


def _chip(label: str, value: str) -> str:
    return f'<span class="ttl-chip">{escape(label)} <b>{escape(value)}</b></span>'


def _table(headers, rows, classes=None) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = []
    for i, row in enumerate(rows):
        cls = f' class="{classes[i]}"' if classes and classes[i] else ""
        cells = "".join(f'<td class="num">{escape(str(c))}</td>' if isinstance(c, (int, float)) else
                        f"<td>{escape(str(c))}</td>" for c in row)
        body.append(f"<tr{cls}>{cells}</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def profile_html(r: dict) -> str:
    s = r["summary"]
    rate = "n/a" if s["cache_hit_rate"] is None else f"{100 * s['cache_hit_rate']:.0f}%"
    parts = [_STYLE, '<div class="ttl-report">',
             f'<div class="ttl-muted">torchtpu_lab profile &middot; {escape(s["platform"])}</div>',
             '<div class="ttl-head">',
             _chip("wall", fmt_s(s["wall_s"])), _chip("device", fmt_s(s["device_s"])),
             _chip("ops", str(s["ops"])), _chip("graphs", str(s["graphs_executed"])),
             _chip("compiles", f"{s['compiles']} ({s['recompiles']} re)"), _chip("cache hits", rate),
             _chip("syncs", str(s["syncs"])), _chip("CPU fallbacks", str(s["cpu_fallbacks"])),
             _chip("peak memory", fmt_bytes(s["peak_bytes"])), "</div>"]
    if s["error"]:
        parts.append(f'<div class="ttl-error">The cell raised {escape(s["error"])} &mdash; partial report.</div>')
    ops = r["ops"]
    if ops["by_time"]:
        parts.append(f"<h4>Top ops by time ({ops['distinct']} distinct)</h4>")
        parts.append(_table(("op", "calls", "total", "mean", "line"),
                            [(o["op"], o["count"], fmt_s(o["total_s"]), fmt_s(o["mean_s"]), o["line"])
                             for o in ops["by_time"]]))
        parts.append("<h4>Top ops by count</h4>")
        parts.append(_table(("op", "calls", "line"), [(o["op"], o["count"], o["line"]) for o in ops["by_count"]]))
    if r["compiles"]:
        parts.append("<h4>Compilations</h4>")
        rows = [(c["name"], c["n_ops"] or "", fmt_s(c["seconds"]), c["cause"], c["line"]) for c in r["compiles"]]
        parts.append(_table(("graph", "ops", "compile time", "cause", "line"), rows,
                            ["ttl-recompile" if c["recompile"] else "" for c in r["compiles"]]))
    if r.get("graph_breaks"):
        parts.append("<h4>torch.compile graph breaks</h4>")
        parts.append(_table(("reason", "line"), [(b["reason"], b["line"]) for b in r["graph_breaks"]]))
    if r["syncs"]:
        parts.append("<h4>Host syncs</h4>")
        parts.append(_table(("reason", "count", "waited", "line"),
                            [(g["reason"], g["count"], fmt_s(g["wait_s"]), g["line"]) for g in r["syncs"]]))
        for g in r["syncs"]:
            if g["hint"]:
                parts.append(f'<div class="ttl-hint">&#9888; {escape(g["hint"])}</div>')
    if r.get("collectives"):
        parts.append("<h4>Collectives</h4>")
        parts.append(_table(("collective", "count", "ranks", "bytes", "time", "line"),
                            [(g["kind"], g["count"], g["participants"], fmt_bytes(g["bytes"]), fmt_s(g["total_s"]),
                              g["line"]) for g in r["collectives"]]))
    if r["fallbacks"]:
        parts.append("<h4>CPU fallbacks</h4>")
        parts.append(_table(("op", "count", "line"), [(f["op"], f["count"], f["line"]) for f in r["fallbacks"]]))
    m = r["memory"]
    parts.append("<h4>Device memory</h4>")
    parts.append(f"<div>start {escape(fmt_bytes(m['start']))} &middot; end {escape(fmt_bytes(m['end']))} &middot; "
                 f"peak <b>{escape(fmt_bytes(m['peak']))}</b> &middot; limit {escape(fmt_bytes(m['limit']))} "
                 f"&middot; allocated {escape(fmt_bytes(m['allocated']))} &middot; freed "
                 f"{escape(fmt_bytes(m['freed']))}</div>")
    if m["largest"]:
        parts.append(_table(("size", "dtype", "shape", "created at"),
                            [(fmt_bytes(t["nbytes"]), t["dtype"], str(t["shape"]), t["source"] or "n/a")
                             for t in m["largest"][:10]]))
    if r["xprof_dir"]:
        parts.append("<h4>XProf trace</h4>")
        parts.append(f"<div>Written to <code>{escape(r['xprof_dir'])}</code>. Open it with:</div>"
                     f"<pre>%load_ext tensorboard\n%tensorboard --logdir {escape(r['xprof_dir'])}</pre>")
    parts.append("</div>")
    return "".join(parts)


def status_html(status: dict) -> str:
    rows = [(k, str(v)) for k, v in status.items()]
    return _STYLE + '<div class="ttl-report"><h4>torchtpu_lab</h4>' + _table(("", ""), rows) + "</div>"
