"""The IPython extension and magics, run in a real IPython shell; outputs are checked for content."""

import re

import pytest
from cells import run_cell as run


def test_loading_twice_is_harmless_and_reload_shows_the_banner(ip):
    result, text, _ = run(ip, "%load_ext torchtpu_lab")
    assert result.error_in_exec is None and "already loaded" in text
    _, text, html = run(ip, "%reload_ext torchtpu_lab")
    assert "eager mode fused" in text and "compile cache:" in text
    assert "XLA:" in html


def test_status_mode_cache_memory_metrics_and_usage(ip):
    _, text, _ = run(ip, "%tpu")
    assert "eager mode" in text
    _, text, _ = run(ip, "%tpu mode strict")
    assert "eager mode: strict" in text
    _, text, _ = run(ip, "%tpu mode fused")
    assert "eager mode: fused" in text
    _, text, _ = run(ip, "%tpu cache")
    assert "entries on disk" in text
    run(ip, "keep = torch.zeros(256, 1024, device='tpu')  # BIG_LINE")
    _, text, _ = run(ip, "%tpu memory --top 3")
    assert "1.00 MiB" in text and re.search(r"float32\[256, 1024\]\s+created at cell \[\d+\], line 1", text), text
    _, text, _ = run(ip, "%tpu metrics")
    assert "CompileTime" in text and "Counters:" in text
    result, text, _ = run(ip, "%tpu frobnicate")
    assert result.error_in_exec is None and "unknown subcommand 'frobnicate'" in text and "usage:" in text
    _, text, _ = run(ip, "%tpu mode warp")
    assert "unknown eager mode" in text


def test_profile_reports_recompiles_with_changed_dim_and_cell_line(ip):
    # a graph of one of these shapes compiled by an earlier test on this worker (test_profile_truth's grouped
    # recompiles) would be a cache hit here, not a compile
    run(ip, "from torchtpu_lab.runtime import state; state.clear(); w17 = torch.ones(17, 3, device='tpu')")
    result, text, html = run(ip, """%%tpu_profile --no-flame
for bs in (5, 6, 7):
    y = torch.randn(bs, 17).to('tpu') @ w17
    total = y.sum().item()
""")
    assert result.error_in_exec is None
    prof = ip.user_ns["_tpu_profile"]
    graph_compiles = [c for c in prof.compiles if c.detail["kind"] == "graph"]
    assert len(graph_compiles) == 3, [c.detail["cause"] for c in graph_compiles]
    causes = [str(c.detail["cause"]) for c in graph_compiles[1:]]
    assert "[5, 17] -> [6, 17]" in causes[0] and "[6, 17] -> [7, 17]" in causes[1], causes
    assert all(re.search(r"cell \[\d+\], line 3", c) for c in causes), causes
    assert "RECOMPILE" in text and "Compilations" in html and "ttl-recompile" in html


def test_item_in_a_loop_reports_one_sync_per_step_at_that_line(ip):
    run(ip, """%%tpu_profile --no-flame
x = torch.ones(8, device='tpu')
for _ in range(10):
    x = x * 1.5
    v = x.sum().item()
""")
    prof = ip.user_ns["_tpu_profile"]
    report = prof.report()
    group = next(g for g in report.syncs if "item()" in g.reason)
    assert group.count == 10 and re.fullmatch(r"cell \[\d+\], line 5", group.line), group
    assert "read it once at the end" in group.hint


def test_big_tensor_peak_and_creating_line(ip):
    run(ip, """%%tpu_profile --no-flame
a = torch.zeros(16, 1024, 1024, device='tpu')
b = a + 1
del a, b
""")
    prof = ip.user_ns["_tpu_profile"]
    assert prof.summary()["peak_bytes"] >= 64 * 2**20
    timeline = prof.report().memory.timeline
    assert max(b for _, b in timeline) >= 64 * 2**20


def test_cell_that_raises_shows_traceback_partial_report_and_kernel_goes_on(ip):
    result, text, html = run(ip, """%%tpu_profile --no-flame
z = torch.ones(4, device='tpu') * 3
raise ValueError("<script>alert('x')</script> boom")
""")
    prof = ip.user_ns["_tpu_profile"]
    assert prof.error and "boom" in prof.error
    assert "partial report" in text
    assert "<script>" not in html and "&lt;script&gt;" in html  # user strings are escaped
    result, text, _ = run(ip, "print((z + 1).cpu().tolist())")
    assert result.error_in_exec is None and "[4.0, 4.0, 4.0, 4.0]" in text


def test_flame_graph_total_matches_measured_time(ip):
    run(ip, """%%tpu_profile --no-flame
m = torch.nn.Linear(64, 64).to('tpu')
for _ in range(3):
    out = m(torch.randn(8, 64).to('tpu')).relu().sum()
    out.backward()
    out.item()
""")
    prof = ip.user_ns["_tpu_profile"]
    tree = prof.report().flame
    assert tree.total() == pytest.approx(prof.wall_s, rel=0.10)
    children = sum(v for v, p in zip(tree.values, tree.parents) if p == "cell")
    assert children == pytest.approx(tree.total(), rel=0.10)
    # The boxes of measured work must hold the measured time: the op, sync and fallback events' own durations
    # (summed independently of the tree), not the padding that makes the root equal the wall time.
    measured = sum(e.dur for e in prof.events if e.kind in ("op", "sync", "fallback"))
    python = sum(v for v, label in zip(tree.values, tree.labels) if label.startswith("Python"))
    assert measured > 0
    assert tree.total() - python == pytest.approx(measured, rel=0.10)
    fig = prof.flamegraph()
    assert fig.data[0].type == "icicle"


def test_profile_outside_jupyter_has_text_and_json():
    import json

    import torch

    import torchtpu_lab

    with torchtpu_lab.profile() as prof:
        (torch.ones(3, device="tpu") * 2).sum().item()
    s = prof.summary()
    for key in ("ops", "graphs_executed", "compiles", "cache_hits", "cache_misses", "syncs", "cpu_fallbacks",
                "peak_bytes", "wall_s"):
        assert key in s
    assert s["syncs"] >= 1 and s["ops"] >= 2
    data = json.loads(prof.to_json())
    assert data["summary"]["ops"] == s["ops"] and data["syncs"][0]["source"]["line"] > 0
    assert "torchtpu_lab profile" in prof.text()


def test_watch_panel_updates_while_cells_run(ip):
    import time

    from torchtpu_lab.jupyter import watch

    result, _, _ = run(ip, "%tpu watch")
    assert result.error_in_exec is None and watch.running()
    widget = watch._state["widget"]
    before = widget.children[1].value
    run(ip, "for _ in range(3): (torch.ones(33, device='tpu') * 7).sum().item()")
    time.sleep(1.5)
    assert widget.children[1].value != before and "syncs" in widget.children[1].value
    run(ip, "%tpu watch stop")
    assert not watch.running()


def test_unload_restores_plain_eager_behaviour(ip):
    shell = ip
    assert shell.run_cell("torchtpu_lab.eager_mode_name()").result == "fused"
    shell.run_cell("%unload_ext torchtpu_lab")
    assert shell.run_cell("torchtpu_lab.eager_mode_name()").result == "strict"
    assert "tpu" not in shell.magics_manager.magics["line"]
    shell.run_cell("%load_ext torchtpu_lab")  # and it can come back
    assert "tpu" in shell.magics_manager.magics["line"]
