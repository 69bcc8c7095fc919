"""``cell [N], line L`` in an HTML report as a link that jumps to that cell and line in JupyterLab.

The label is what ``telemetry.describe`` writes for a notebook cell; any other label (``train.py:41``, "end of
cell") stays plain text. The link is an anchor with ``data-cell`` and ``data-line`` and no ``href``: the
torchtpu-lab JupyterLab extension handles clicks on ``a.ttl-goto`` (``extension/src/goto.ts``) by selecting the
cell whose prompt is ``[N]`` in the notebook that holds the report and putting the cursor on line ``L``;
without the extension it is inert text, never a navigation away from the notebook.
"""

from __future__ import annotations

import re
from html import escape

_CELL_LINE = re.compile(r"cell \[(\d+)\], line (\d+)")


def line_html(label: str) -> str:
    """``label`` escaped, with each ``cell [N], line L`` in it made a jump link."""
    out, last = [], 0
    for m in _CELL_LINE.finditer(label):
        out.append(escape(label[last:m.start()]))
        cell, line = m.group(1), m.group(2)
        out.append(f'<a class="ttl-goto" data-cell="{cell}" data-line="{line}" tabindex="0" role="link" '
                   f'title="go to cell [{cell}], line {line}">{escape(m.group(0))}</a>')
        last = m.end()
    out.append(escape(label[last:]))
    return "".join(out)
