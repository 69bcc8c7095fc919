"""What a user acts on in a ``%%tpu_profile`` report (issue 23), run in a real IPython shell: the cell number
of a profiled cell's value, a first display without plotly's renderer import path, warm-up compiles told
apart from recompiles, findings ranked and thresholded, advice aimed at library frames, the backend's own
host overhead, ``%tpu memory`` roles."""

from __future__ import annotations

import pytest
from IPython.testing.globalipapp import start_ipython
from IPython.utils.capture import capture_output


@pytest.fixture(scope="module")
def ip():
    from IPython import get_ipython

    shell = start_ipython() or get_ipython()
    with capture_output():
        shell.run_cell("%load_ext torchtpu_lab")
    shell.run_cell("import torch, torchtpu_lab")
    yield shell
    shell.run_cell("%unload_ext torchtpu_lab")
    import torchtpu_lab

    torchtpu_lab.set_eager_mode("fused")  # unloading leaves strict mode; later test modules expect the default


def run(ip, code: str, store_history: bool = False):
    with capture_output() as cap:
        result = ip.run_cell(code, store_history=store_history)
    texts = [o.data.get("text/plain", "") for o in cap.outputs]
    htmls = [o.data.get("text/html", "") for o in cap.outputs]
    return result, cap.stdout + "\n".join(texts), "\n".join(h for h in htmls if h)


def test_expression_ending_profiled_cell_keeps_its_own_number(ip):
    first, _, _ = run(ip, "'previous cell'", store_history=True)
    result, text, _ = run(ip, "%%tpu_profile --no-flame\nw = torch.ones(3, device='tpu')\nint((w * 2).sum())\n",
                          store_history=True)
    n = result.execution_count
    assert n == first.execution_count + 1
    out = ip.user_ns["Out"]
    assert out[n] == 6 and out[first.execution_count] == "previous cell", out
    assert f"Out[{n}]: 6" in text, text
    prof = ip.user_ns["_tpu_profile"]
    lines = {g.line for g in prof.report().syncs}
    assert f"cell [{n}], line 3" in lines, lines  # the body's lines are named as the cell the user ran


_FIRST_REPORT = r'''
import json, sys, time
from IPython.testing.globalipapp import start_ipython
from IPython.utils.capture import capture_output
ip = start_ipython()
ip.kernel = object()  # what a Jupyter kernel's shell has: the report shows its plotly figures
with capture_output():
    ip.run_cell("%load_ext torchtpu_lab")
with capture_output() as cap:
    ip.run_cell("""%%tpu_profile
import time, torch, torchtpu_lab
x = torch.ones(64, 64, device='tpu')
for _ in range(3):
    x = (x @ x).tanh()
    x.sum().item()
torchtpu_lab.sync()
BODY_END = time.perf_counter()
""")
after = time.perf_counter() - ip.user_ns["BODY_END"]
bundles = [sorted(o.data) for o in cap.outputs]
print(json.dumps({"after": after, "bundles": bundles,
                  "renderers": "plotly.io._renderers" in sys.modules, "jsonschema": "jsonschema" in sys.modules}))
'''


def test_first_report_in_a_fresh_kernel_shows_figures_without_plotly_renderers():
    """The first report's figures are raw plotly bundles: no ``plotly.io`` renderer import (nbformat ->
    jsonschema -> seconds of grammar building) stands between the cell's end and its report."""
    import json
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run([sys.executable, "-c", _FIRST_REPORT], check=False, capture_output=True, text=True, timeout=300,
                         env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    figures = [b for b in got["bundles"] if "application/vnd.plotly.v1+json" in b]
    assert len(figures) == 2, got["bundles"]  # the flame graph and the memory timeline
    assert not got["renderers"] and not got["jsonschema"], got
    assert got["after"] < 5.0, got  # ~0.1-0.3 s measured; generous for a loaded 2-core machine
    print(f"first report {got['after']:.2f} s after the profiled code ended")
