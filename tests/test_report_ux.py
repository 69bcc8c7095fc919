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
