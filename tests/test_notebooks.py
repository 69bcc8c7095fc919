"""Notebooks execute top to bottom under nbclient on the CPU-backed device, with their key outputs checked.

Per-notebook time budget: 300 s (the quickstart takes about 20 s here).
"""

import glob
import json
import os
import time

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..")
NOTEBOOKS = sorted(glob.glob(os.path.join(ROOT, "notebooks", "*.ipynb")))
BUDGET_S = 300


def _outputs(cell, mime="text/plain") -> str:
    from torchtpu_lab.run_notebook import cell_text

    return cell_text(cell, mime)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_notebooks_are_committed_without_outputs(path):
    with open(path) as f:
        nb = json.load(f)
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            assert cell.get("outputs", []) == [] and cell.get("execution_count") is None, path


def test_quickstart_runs_and_shows_the_profile():
    from torchtpu_lab.run_notebook import execute

    t0 = time.perf_counter()
    nb = execute(os.path.join(ROOT, "notebooks", "01_quickstart.ipynb"), timeout=BUDGET_S)
    assert time.perf_counter() - t0 < BUDGET_S
    code = [c for c in nb.cells if c.cell_type == "code"]
    errors = [o for c in code for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors, errors
    by_source = {c.source.splitlines()[0]: c for c in code if c.source}
    banner = by_source["%load_ext torchtpu_lab"]
    assert "tpu device on XLA:" in _outputs(banner) and "XLA:" in _outputs(banner, "text/html")
    train = next(c for c in code if "losses = [train_step()" in c.source)
    first, last = (float(v) for v in _outputs(train).split("loss:")[1].split("->"))
    assert last < first
    profiled = next(c for c in code if c.source.startswith("%%tpu_profile --top 5"))
    html = _outputs(profiled, "text/html")
    assert "ttl-report" in html and "Top ops by time" in html and "Host syncs" in html
    assert "wall" in _outputs(profiled) and "syncs" in _outputs(profiled)
    figures = [o for o in profiled.get("outputs", []) if "application/vnd.plotly.v1+json" in o.get("data", {})
               or "plotly" in o.get("data", {}).get("text/html", "")]
    assert figures, "the flame graph is shown with plotly"
    cause = next(c for c in code if c.source.startswith("cause = "))
    assert "changed shape [256, 20] -> [100, 20]" in _outputs(cause)
