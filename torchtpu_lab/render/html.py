"""HTML renderings for notebooks. Every user-controlled string goes through :func:`html.escape`."""

from __future__ import annotations

from html import escape

from ..records import Report, Status
from .cell_link import line_html
from .text import fmt_bytes, fmt_s

_STYLE = """
<style>
.ttl-report{font-family:var(--jp-ui-font-family,system-ui,sans-serif);font-size:13px;line-height:1.4;
 max-width:1100px}
.ttl-report h4{margin:12px 0 4px 0;font-size:13px}
.ttl-head{display:flex;flex-wrap:wrap;gap:6px;margin:4px 0}
.ttl-chip{border:1px solid #ccc;border-radius:6px;padding:3px 8px;background:rgba(127,127,127,.08)}
.ttl-chip b{font-size:14px}
.ttl-scroll{overflow-x:auto;max-width:100%}
.ttl-report table{border-collapse:collapse;margin:2px 0}
.ttl-report td,.ttl-report th{padding:2px 8px;text-align:left !important;vertical-align:top;
 border-bottom:1px solid rgba(127,127,127,.25)}
.ttl-report td.num,.ttl-report th.num{text-align:right !important;font-variant-numeric:tabular-nums;
 white-space:nowrap}
.ttl-report td.line{white-space:nowrap}
.ttl-report td.code code{white-space:pre}
.ttl-report tr.ttl-detail td{border-bottom:1px solid rgba(127,127,127,.25);padding-left:24px}
.ttl-report tr.ttl-main td{border-bottom:none}
.ttl-warmup{color:#777}
.ttl-ok{color:#2e7d32}
.ttl-recompile,.ttl-recompile-detail{background:rgba(255,160,0,.18)}
.ttl-hint{color:#b35900}
.ttl-error{color:#c00;font-weight:bold}
.ttl-muted{color:#777}
.ttl-report code{font-size:12px}
.ttl-findings{margin:2px 0 6px 0}
.ttl-goto{cursor:pointer;text-decoration:underline dotted;color:inherit}
.ttl-goto:hover{color:var(--jp-brand-color1,#1976d2)}
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
    return f"<div class=\"ttl-scroll\"><table><tr>{head}</tr>{''.join(body)}</table></div>"


def _code_cell(code: str) -> str:
    return f"<code>{escape(code)}</code>" if code else ""


def _table_html(headers, rows, classes=None, details=None) -> str:
    """Like :func:`_table`, for rows whose cells are already HTML (each escaped by its producer). ``details``:
    per row, HTML for a full-width row under it (a cause and its fix need the table's width, not a column's)."""
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = []
    for i, row in enumerate(rows):
        detail = details[i] if details else ""
        names = " ".join(x for x in ((classes[i] if classes else ""), "ttl-main" if detail else "") if x)
        cls = f' class="{names}"' if names else ""
        body.append(f"<tr{cls}>" + "".join(f'<td class="{c}">{v}</td>' if c else f"<td>{v}</td>"
                                              for v, c in row) + "</tr>")
        if detail:
            extra = f" {classes[i]}-detail" if classes and classes[i] else ""
            body.append(f'<tr class="ttl-detail{extra}"><td colspan="{len(headers)}">{detail}</td></tr>')
    return f"<div class=\"ttl-scroll\"><table><tr>{head}</tr>{''.join(body)}</table></div>"


def _line(line: str) -> tuple[str, str]:
    return line_html(line), "line"


def profile_html(r: Report) -> str:
    from .generation import generation_html
    from .text import NO_ISSUE, cache_text, finding_text, fmt_pct, python_text, time_rows

    s = r.summary
    mode = f" &middot; {escape(s.mode)} mode" if s.mode else ""
    parts = [_STYLE, '<div class="ttl-report">',
             f'<div class="ttl-muted">torchtpu_lab profile &middot; {escape(s.platform)}{mode}</div>',
             '<div class="ttl-head">',
             _chip("wall", fmt_s(s.wall_s)), _chip("Python", python_text(s)),
             _chip("torchtpu_lab overhead", fmt_s(s.overhead_s)),
             _chip("tracing", fmt_s(s.tracing_s)), _chip("compiling", fmt_s(s.compile_s)),
             _chip("waiting", fmt_s(s.wait_s)),
             _chip("ops", str(s.ops)), _chip("graphs", str(s.graphs_executed)),
             _chip("compiles", f"{s.compiles} ({s.recompiles} re)"),
             _chip("steady state compiles", str(s.steady_compiles)), _chip("disk loads", str(s.disk_loads)),
             _chip("memory hits", str(s.cache_hits)),
             _chip("syncs", str(s.syncs)), _chip("CPU fallbacks", str(s.cpu_fallbacks)),
             _chip("peak memory", fmt_bytes(s.peak_bytes)), "</div>"]
    if s.error:
        parts.append(f'<div class="ttl-error">The cell raised {escape(s.error)} &mdash; partial report.</div>')
    parts.append(generation_html(r.generation))
    parts.append("<h4>Findings</h4>")
    actionable = [f for f in r.findings if f.actionable]
    if actionable:
        parts.append('<ol class="ttl-findings">')
        parts += [f"<li>{escape(finding_text(f))}</li>" for f in actionable]
        parts.append("</ol>")
    else:
        parts.append(f'<div class="ttl-ok">{escape(NO_ISSUE)}</div>')
    warm = [f for f in r.findings if not f.actionable]
    if warm:
        parts.append('<ul class="ttl-findings ttl-warmup">')
        parts += [f"<li>{escape(finding_text(f))}</li>" for f in warm]
        parts.append("</ul>")
    parts.append("<h4>Where the wall time went</h4>")
    rows = [((escape(fmt_s(seconds)), "num"),
             (escape(fmt_pct(seconds / s.wall_s if s.wall_s else None)), "num"),
             (escape(label), "")) for seconds, label in time_rows(r)]
    parts.append(_table_html(("time", "share", "what it measures"), rows))
    ops = r.ops
    if ops.by_time:
        parts.append(f"<h4>Top ops by time ({ops.distinct} distinct)</h4>"
                     f'<div class="ttl-muted">{escape(ops.measures)}</div>')
        parts.append(_table_html(("op", "calls", "total", "mean", "line", "code"),
                                 [((escape(o.op), ""), (str(o.count), "num"), (escape(fmt_s(o.total_s)), "num"),
                                   (escape(fmt_s(o.mean_s)), "num"), _line(o.line),
                                   (_code_cell(o.code), "code")) for o in ops.by_time]))
        parts.append("<h4>Top ops by count</h4>")
        parts.append(_table_html(("op", "calls", "line"), [((escape(o.op), ""), (str(o.count), "num"), _line(o.line))
                                                           for o in ops.by_count]))
    if r.compile_groups:
        parts.append(f"<h4>Compilations</h4><div class=\"ttl-muted\">{escape(cache_text(s))}; grouped by cause, "
                     "costliest first</div>")
        rows, classes, details = [], [], []
        for g in r.compile_groups:
            fix = f'<div class="ttl-hint">fix: {escape(g.hint)}</div>' if g.hint else ""
            rows.append(((str(g.count), "num"), (escape(fmt_s(g.seconds)), "num"), _line(g.line),
                         (_code_cell(g.code), "code")))
            details.append(f"<div>{escape(g.pattern)}</div>{fix}")
            classes.append("ttl-recompile" if g.is_recompile else "")
        parts.append(_table_html(("count", "time", "line", "code"), rows, classes, details))
        if r.compile_groups_hidden:
            parts.append(f'<div class="ttl-muted">{r.compile_groups_hidden} more groups (--top N shows more)</div>')
    if r.graph_breaks:
        parts.append("<h4>torch.compile graph breaks</h4>")
        parts.append(_table_html(("reason", "line"), [((escape(b.reason), ""), _line(b.line))
                                                     for b in r.graph_breaks]))
    if r.syncs:
        parts.append("<h4>Host syncs</h4>")
        parts.append(_table_html(("reason", "count", "waited", "line", "code"),
                                 [((escape(g.reason), ""), (str(g.count), "num"),
                                   (escape(fmt_s(g.wait_s)), "num"), _line(g.line),
                                   (_code_cell(g.code), "code")) for g in r.syncs], None,
                                 [f'<div class="ttl-hint">&#9888; {escape(g.hint)}</div>' if g.hint else ""
                                  for g in r.syncs]))
    if r.collectives:
        parts.append("<h4>Collectives</h4>")
        parts.append(_table_html(("collective", "count", "ranks", "bytes", "time", "line"),
                                 [((escape(g.kind), ""), (str(g.count), "num"),
                                   (escape(str(g.participants)), "num"), (escape(fmt_bytes(g.bytes)), "num"),
                                   (escape(fmt_s(g.total_s)), "num"), _line(g.line))
                                  for g in r.collectives]))
    if r.fallbacks:
        parts.append("<h4>CPU fallbacks</h4>")
        parts.append(_table_html(("op", "count", "line", "code"),
                                 [((escape(f.op), ""), (str(f.count), "num"), _line(f.line),
                                   (_code_cell(f.code), "code")) for f in r.fallbacks]))
    parts.append(hardware_html(r))
    m = r.memory
    parts.append("<h4>Device memory</h4>")
    parts.append(f"<div>start {escape(fmt_bytes(m.start))} &middot; end {escape(fmt_bytes(m.end))} &middot; "
                 f'peak <b class="ttl-peak">{escape(fmt_bytes(m.peak))}</b> &middot; limit '
                 f"{escape(fmt_bytes(m.limit))} &middot; allocated {escape(fmt_bytes(m.allocated))} &middot; "
                 f"freed {escape(fmt_bytes(m.freed))}</div>")
    if m.largest:
        parts.append(_table(("size", "dtype", "shape", "created at"),
                            [(fmt_bytes(t["nbytes"]), t["dtype"], str(t["shape"]), t["source"] or "n/a")
                             for t in m.largest[:10]]))
    if r.xprof_error:
        parts.append(f'<div class="ttl-error">{escape(r.xprof_error)}</div>')
    if r.xprof_dir:
        parts.append("<h4>XProf trace</h4>")
        parts.append(f"<div>Written to <code>{escape(r.xprof_dir)}</code>. Open it in a terminal with:</div>"
                     f"<pre>{escape(r.xprof_command)}</pre><div>then browse http://localhost:8791</div>")
    parts.append("</div>")
    return "".join(parts)


def hardware_html(r: Report) -> str:
    """How far from the hardware: FLOPs and MFU with the peaks' source, the programs against the roofline,
    and what held memory at the peak."""
    from .memory_peak import memory_at_peak_html
    from .roofline import fmt_rate, roofline_html
    from .text import fmt_pct

    s = r.summary
    head = ""
    if s.flops:
        head = ('<div class="ttl-head ttl-hardware">' + _chip("FLOPs", fmt_rate(s.flops, "FLOP"))
                + _chip("bytes accessed", fmt_rate(s.bytes_accessed, "B")) + _chip("device", fmt_s(s.device_s))
                + _chip("MFU", fmt_pct(s.mfu)) + "</div>"
                + f'<div class="ttl-muted">peaks: {escape(s.peak_source)}</div>')
    return head + roofline_html(r.roofline) + memory_at_peak_html(r.memory_at_peak, r.memory_timeline)


def status_html(status: Status) -> str:
    from .text import status_rows

    return _STYLE + '<div class="ttl-report"><h4>torchtpu_lab</h4>' + _table(("", ""), status_rows(status)) + "</div>"
