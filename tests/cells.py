"""Running a cell in the tests' real IPython shell and reading what it showed."""

from __future__ import annotations

from IPython.utils.capture import capture_output


def run_cell(ip, code: str, store_history: bool = False):
    """Run ``code`` in ``ip``; returns ``(result, text, html)``: the ExecutionResult, stdout plus every displayed
    text/plain, and every displayed text/html."""
    with capture_output() as cap:
        result = ip.run_cell(code, store_history=store_history)
    texts = [o.data.get("text/plain", "") for o in cap.outputs]
    htmls = [o.data.get("text/html", "") for o in cap.outputs]
    return result, cap.stdout + "\n".join(texts), "\n".join(h for h in htmls if h)
