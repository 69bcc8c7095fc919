"""Profiles that tell the truth (issue 12) and profiles that fail safely (issue 14, items 6-8 and 10).

Each test fails on the code before the fix: exceptions reaching IPython after the report, device memory in fused
mode, the time split, grouped compiles with fixes, disk loads apart from compiles, findings, the formatted banner,
source text, the flame graph's Python layer, the XProf command, argument checks, a failed --xprof, the end-of-cell
flush error and escaped plotly strings.
"""

import os
import re
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..")




from test_jupyter import run  # noqa: E402  (one cell runner for every IPython test)
from fault_cases import HOSTILE_STRINGS, PROFILE_BAD_OPTIONS, check_bad_profile_option, check_escaped  # noqa: E402


# ---- 7: the cell's exception reaches IPython, after the report -------------------------------------------------

def test_exception_in_profiled_cell_reaches_ipython_after_the_report(ip):
    result, text, _ = run(ip, "%%tpu_profile --no-flame\nq = torch.ones(3, device='tpu') * 2\nraise ValueError('boom7')\n")
    assert isinstance(result.error_in_exec, ValueError) and "boom7" in str(result.error_in_exec)
    assert not result.success
    assert "partial report" in text and "torchtpu_lab profile" in text  # the report was shown
    assert ip.user_ns["_tpu_profile"].error == "ValueError: boom7"
    result, text, _ = run(ip, "print((q + 1).cpu().tolist())")
    assert result.success and "[3.0, 3.0, 3.0]" in text


def test_keyboard_interrupt_in_profiled_cell_reaches_ipython(ip):
    result, text, _ = run(ip, "%%tpu_profile --no-flame\nraise KeyboardInterrupt\n")
    assert isinstance(result.error_in_exec, KeyboardInterrupt)
    assert "torchtpu_lab profile" in text


@pytest.mark.timeout(240) if hasattr(pytest.mark, "timeout") else (lambda f: f)
def test_nbclient_stops_at_a_failing_profiled_cell(tmp_path):
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("%load_ext torchtpu_lab"),
                nbformat.v4.new_code_cell("%%tpu_profile --no-flame\nraise ValueError('stop here')"),
                nbformat.v4.new_code_cell("print('should not run')")]
    env_path = tmp_path / "nb.ipynb"
    nbformat.write(nb, env_path)
    client = NotebookClient(nb, timeout=200, kernel_name="python3", resources={"metadata": {"path": ROOT}})
    with pytest.raises(CellExecutionError, match="stop here"):
        client.execute()
    assert nb.cells[2].get("outputs", []) == []


# ---- 1: device memory in fused mode ----------------------------------------------------------------------------

def test_fused_training_step_peak_and_never_below_live_parameters(ip):
    run(ip, textwrap.dedent("""
        torch.manual_seed(0)
        mem_model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64)).to('tpu')
        mem_opt = torch.optim.Adam(mem_model.parameters())
        mem_x = torch.randn(128, 64).to('tpu')
        def mem_step():
            loss = mem_model(mem_x).square().mean()
            loss.backward()
            mem_opt.step()
            mem_opt.zero_grad(set_to_none=False)
        mem_step(); torchtpu_lab.sync()
    """))
    result, _, _ = run(ip, "%%tpu_profile --no-flame\nfor _ in range(3):\n    mem_step()\n    torchtpu_lab.sync()\n")
    assert result.success
    prof = ip.user_ns["_tpu_profile"]
    params = sum(p.numel() * 4 for p in ip.user_ns["mem_model"].parameters())
    largest_activation = 128 * 256 * 4
    # parameters + gradients + Adam's two moments + the largest layer's activations
    assert prof.peak_bytes >= 4 * params + largest_activation, (prof.peak_bytes, params)
    timeline = prof.report().memory.timeline
    assert min(b for _, b in timeline) >= params, (min(b for _, b in timeline), params)
    assert any(e.kind == "memory" and e.detail.get("temp", 0) + e.detail.get("output", 0) > 0 for e in prof.events)


# ---- 2: the time split ------------------------------------------------------------------------------------------

def test_time_split_adds_up_to_wall_and_keeps_compiling_out_of_waiting(ip):
    run(ip, "ts_w = torch.ones(11, 5, device='tpu')")
    run(ip, "%%tpu_profile --no-flame\nfor n in (3, 4, 5):\n    v = (torch.ones(n, 11).to('tpu') @ ts_w).sum().item()\n")
    s = ip.user_ns["_tpu_profile"].summary()
    parts = s["python_s"] + s["tracing_s"] + s["compile_s"] + s["wait_s"]
    assert parts == pytest.approx(s["wall_s"], rel=0.05)
    compile_total = sum(c.dur for c in ip.user_ns["_tpu_profile"].compiles)
    assert s["compile_s"] == pytest.approx(compile_total, rel=0.05)
    assert s["wait_s"] < sum(e.dur for e in ip.user_ns["_tpu_profile"].syncs) - 0.5 * compile_total
    labels = ip.user_ns["_tpu_profile"].report().time_labels
    assert "recording" in labels["tracing"]
    run(ip, "%tpu mode strict")
    try:
        _, text, _ = run(ip, "%%tpu_profile --no-flame\nv = (torch.ones(2, 11).to('tpu') @ ts_w).sum().item()\n")
    finally:
        run(ip, "%tpu mode fused")
    assert "dispatching ops" in text and "strict mode" in text


# ---- 3 + 11 + 9: grouped compiles with a fix, findings first, source text ---------------------------------------

def test_recompiles_grouped_with_pattern_fix_finding_and_code(ip):
    # graphs an earlier test compiled for one of these shapes must not hide a recompile
    run(ip, "from torchtpu_lab.runtime import state; state.clear(); g_w = torch.ones(17, 3, device='tpu')")
    result, text, html = run(ip, textwrap.dedent("""\
        %%tpu_profile --no-flame --top 3
        for bs in (5, 9, 13, 21, 30, 44):
            y = torch.randn(bs, 17).to('tpu') @ g_w  # GROUPED
            total = y.sum().item()
        """))
    assert result.success
    report = ip.user_ns["_tpu_profile"].report(3)
    group = next(g for g in report.compile_groups if g.recompile)
    assert group.count == 5 and "dim 0" in group.pattern and "took 6 values 5\u202644" in group.pattern
    assert "pad or bucket dim 0" in group.hint and "GROUPED" in group.code
    assert re.search(r"cell \[\d+\], line 3", group.line)
    finding = report.findings[0]
    assert "recompilation" in finding.title and 0 < finding.share <= 1
    assert text.index("findings:") < text.index("compilations")  # what matters comes first
    assert "Findings" in html and "GROUPED" in html
    rows = [x for x in text.splitlines() if "RECOMPILE" in x and "took 6 values" in x]
    assert len(rows) == 1, text  # one grouped row, not one per compile


def test_growing_graph_gets_the_sync_hint_and_the_table_is_capped(ip):
    run(ip, "gg = torch.ones(8, device='tpu'); torchtpu_lab.sync()")
    run(ip, textwrap.dedent("""\
        %%tpu_profile --no-flame --top 2
        acc = gg
        for step in range(5):
            acc = acc * 1.01 + 1
        s = acc.sum().item()
        """))
    report = ip.user_ns["_tpu_profile"].report(2)
    group = next(g for g in report.compile_groups if "torchtpu_lab.sync()" in g.hint)
    assert "unrolled" in group.pattern and "5 steps" in group.pattern and "acc * 1.01" in group.code
    assert "unrolled" in report.findings[0].title
    run(ip, "%tpu mode strict")
    try:
        run(ip, "%%tpu_profile --no-flame --top 2\nz = torch.arange(7.0, device='tpu').exp().sin().cos().tanh()"
                ".sigmoid().neg().abs().sqrt().log1p()\n")
    finally:
        run(ip, "%tpu mode fused")
    report = ip.user_ns["_tpu_profile"].report(2)
    assert len(report.compile_groups) <= 2


# ---- 4: disk loads are not compiles ------------------------------------------------------------------------------

_WARM = """
import os, json, torch, torchtpu_lab
torchtpu_lab.configure(cache_dir=os.environ["CACHE"])
w = torch.ones(19, 7, device="tpu")
with torchtpu_lab.profile() as prof:
    y = (torch.ones(5, 19).to("tpu") @ w).relu().sum().item()
print("SUMMARY" + json.dumps({k: prof.summary()[k] for k in ("compiles", "disk_loads", "memory_hits")}))
print("METRICS" + torchtpu_lab.metrics_report().replace("\\n", " | "))
"""


def test_disk_loads_counted_as_loads_in_a_fresh_process_with_a_warm_cache(tmp_path):
    env = dict(os.environ, CACHE=str(tmp_path / "cache"), PYTHONPATH=ROOT, TORCHTPU_LAB_PLATFORM="cpu")
    env.pop("TORCHTPU_LAB_CACHE_DIR", None)
    runs = []
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", _WARM], env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        import json

        line = next(x for x in out.stdout.splitlines() if x.startswith("SUMMARY"))
        metrics = next(x for x in out.stdout.splitlines() if x.startswith("METRICS"))
        runs.append((json.loads(line[len("SUMMARY"):]), metrics))
    (cold, _), (warm, metrics) = runs
    assert cold["compiles"] >= 1 and cold["disk_loads"] == 0, cold
    assert warm["compiles"] == 0 and warm["disk_loads"] >= 1, warm
    assert "0 compiled by XLA" in metrics and "loaded from the disk cache" in metrics


# ---- 6: banner and %tpu formatted --------------------------------------------------------------------------------

def test_banner_is_short_and_status_has_no_raw_values(ip):
    _, text, html = run(ip, "%reload_ext torchtpu_lab")
    lines = [x for x in text.splitlines() if x.strip()]
    assert len(lines) <= 6 and "changed globally:" in text and "jax_enable_x64" in text
    _, text, html = run(ip, "%tpu")
    assert "None" not in text and "None" not in html
    assert re.search(r"memory\s+[\d.]+ (B|KiB|MiB|GiB)", text), text
    assert re.search(r"hit rate (\d+%|n/a)", text) and "loaded from disk" in text
    assert not re.search(r"\b0\.\d{3,}\b", text)  # no raw fractions


# ---- 5: flame graph with the user's frames ----------------------------------------------------------------------

def test_flame_graph_has_user_function_frames_and_sync_children_add_up(ip):
    run(ip, "fl_m = torch.nn.Linear(32, 32).to('tpu')\ndef fl_step():\n    return fl_m(torch.ones(4, 32).to('tpu')).sum()")
    run(ip, "%%tpu_profile --no-flame\nfor _ in range(2):\n    fl_step().item()\n")
    prof = ip.user_ns["_tpu_profile"]
    tree = prof.report().flame
    labels = dict(zip(tree.ids, tree.labels))
    parent = dict(zip(tree.ids, tree.parents))
    func = [i for i, label in labels.items() if label.startswith("fl_step()")]
    assert func, tree.labels
    op_under_func = [i for i in tree.ids if parent[i] in func and labels[i].startswith("aten::")]
    assert op_under_func, tree.labels
    assert parent[func[0]] != "cell" and labels[parent[func[0]]].startswith("cell [")  # cell line -> function
    assert not any("not in torch ops" in label for label in tree.labels)
    values = dict(zip(tree.ids, tree.values))
    for i, label in labels.items():
        if label.startswith("sync:"):
            kids = [values[k] for k in tree.ids if parent[k] == i]
            if kids:
                assert sum(kids) == pytest.approx(values[i], rel=0.01)
    assert tree.total() == pytest.approx(prof.wall_s, rel=0.05)


# ---- 8: the XProf command works as printed -------------------------------------------------------------------

def _port_free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def test_xprof_command_printed_in_the_report_serves_the_trace(ip, tmp_path):
    out_dir = str(tmp_path / "trace")
    result, text, html = run(ip, f"%%tpu_profile --no-flame --xprof --output {out_dir}\nv = (torch.ones(4, device='tpu') + 1).sum().item()\n")
    assert result.success
    assert "%load_ext tensorboard" not in text + html
    # the tracer's cost is named, and no device time is claimed where the trace has no device lane (XLA:CPU)
    assert "includes the XProf tracer's own overhead" in text and "XProf tracer" in html
    if not ip.user_ns["_tpu_profile"].report().summary.device_traced:
        assert "device execution" not in text + html
    command = next(x.split("open it with (in a terminal):", 1)[1].strip() for x in text.splitlines()
                   if "open it with" in x)
    assert "--logdir" in command and out_dir in command
    port = int(command.rsplit("--port", 1)[1])
    if not _port_free(port):
        pytest.skip(f"port {port} is busy on this machine")
    server = subprocess.Popen(command, shell=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    try:
        deadline = time.time() + 90
        body = None
        while time.time() < deadline and body is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/data/plugin/profile/runs", timeout=5) as r:
                    assert r.status == 200
                    body = r.read()
            except OSError:
                assert server.poll() is None, "the xprof server exited"
                time.sleep(1)
        assert body is not None, "the xprof server did not answer"
    finally:
        os.killpg(server.pid, 15)
        server.wait(timeout=30)


# ---- issue 14: arguments, a failed --xprof, the end-of-cell flush, escaping -------------------------------------

def test_bad_profile_arguments_are_refused_naming_the_argument(ip):
    for line, word in PROFILE_BAD_OPTIONS:  # shared with bench/faults_table.py
        check_bad_profile_option(ip, line, word)


def test_failed_xprof_shows_the_report_and_the_next_xprof_works(ip, tmp_path):
    from torchtpu_lab.device import memory

    listeners = (len(memory.listeners), len(memory.sample_logs))
    bad = "/proc/no/such/dir"
    result, text, _ = run(ip, f"%%tpu_profile --no-flame --xprof --output {bad}\nv = torch.ones(3, device='tpu').sum().item()\n")
    assert result.success and "torchtpu_lab profile" in text and "XProf trace not" in text
    assert (len(memory.listeners), len(memory.sample_logs)) == listeners
    good = str(tmp_path / "ok")
    result, text, _ = run(ip, f"%%tpu_profile --no-flame --xprof --output {good}\nv = torch.ones(3, device='tpu').sum().item()\n")
    assert result.success and "XProf trace not" not in text and f"XProf trace: {good}" in text
    assert (len(memory.listeners), len(memory.sample_logs)) == listeners


def test_end_of_cell_flush_failure_is_the_cells_error(ip, monkeypatch):
    from torchtpu_lab import telemetry
    from torchtpu_lab.runtime import fused

    real = fused.sync

    def failing(reason=telemetry.SyncReason.USER_SYNC, *a, **k):
        if reason is telemetry.SyncReason.END_OF_CELL and fused.has_pending():
            raise RuntimeError("graph exploded at the flush")
        return real(reason, *a, **k)

    monkeypatch.setattr(fused, "sync", failing)
    result, text, _ = run(ip, "pending = torch.ones(3, device='tpu') * 5")
    monkeypatch.setattr(fused, "sync", real)
    assert not result.success and "graph exploded" in str(result.error_in_exec)
    result, text, _ = run(ip, "print(pending.cpu().tolist())")
    assert result.success and "[5.0, 5.0, 5.0]" in text


def test_plotly_labels_and_hover_are_escaped():
    from torchtpu_lab.profiling.processors import FlameTree
    from torchtpu_lab.render import plot

    tree = FlameTree(ids=["cell", "cell|<b>x</b>.py:1"], labels=["cell", "<img src=x onerror=alert(1)>:1"],
                     parents=["", "cell"], values=[1.0, 0.5], hover=["", "<script>alert(1)</script>"])
    fig = plot.flame_figure(tree)
    blob = fig.to_json()
    assert "<img" not in blob and "<script>" not in blob and "<b>x" not in blob
    assert "&lt;img" in blob


@pytest.mark.parametrize("error", [RuntimeError("disk vanished while writing"), KeyboardInterrupt()],
                         ids=["RuntimeError", "KeyboardInterrupt"])
def test_stop_trace_failure_leaks_nothing_and_the_next_xprof_works(ip, tmp_path, monkeypatch, error):
    """``jax.profiler.stop_trace`` (what the collector calls to end an ``--xprof`` trace) raising: an error is
    reported in the shown report and the cell succeeds; an interrupt (Ctrl-C while a large trace is written)
    reaches IPython after the report is shown. Either way the memory listener is detached, JAX's profiler is not left started and the
    next ``--xprof`` cell records a trace. (The interrupt used to skip the clean-up after it.)"""
    import jax

    from torchtpu_lab.device import memory

    listeners = (len(memory.listeners), len(memory.sample_logs))
    real = jax.profiler.stop_trace

    def failing_stop():
        raise error

    monkeypatch.setattr(jax.profiler, "stop_trace", failing_stop)
    cell = "%%tpu_profile --no-flame --xprof --output {}\nv = torch.ones(3, device='tpu').sum().item()\n"
    result, text, _ = run(ip, cell.format(tmp_path / "failing"))
    monkeypatch.setattr(jax.profiler, "stop_trace", real)
    if isinstance(error, Exception):
        assert result.success and "torchtpu_lab profile" in text, text
        assert "XProf trace not written: RuntimeError: disk vanished while writing" in text, text
        assert ip.user_ns["_tpu_profile"].xprof_error.endswith("disk vanished while writing")
    else:
        assert isinstance(result.error_in_exec, KeyboardInterrupt)
        assert "torchtpu_lab profile" in text and "KeyboardInterrupt" in text, text  # the report, then the error
    assert (len(memory.listeners), len(memory.sample_logs)) == listeners
    assert jax._src.profiler._profile_state.profile_session is None  # not "already started" for the next one
    good = tmp_path / "good"
    result, text, _ = run(ip, cell.format(good))
    assert result.success and "XProf trace not" not in text and f"XProf trace: {good}" in text, text
    assert list(good.rglob("*.xplane.pb"))
    assert (len(memory.listeners), len(memory.sample_logs)) == listeners


def test_flush_failure_at_the_end_of_a_profiled_cell_is_the_cells_error(ip, monkeypatch):
    """Every end-of-cell flush failing (the profiled body's, then the profile's own end-of-block one): the
    failure is the cell's error, shown in the report and then raised, and the pending work is still computed
    by the next read."""
    from torchtpu_lab import telemetry
    from torchtpu_lab.runtime import fused

    real = fused.sync
    at_the_end = (telemetry.SyncReason.END_OF_CELL, telemetry.SyncReason.PROFILE_END)

    def failing(reason=telemetry.SyncReason.USER_SYNC, *a, **k):
        if reason in at_the_end and fused.has_pending():
            raise RuntimeError(f"graph exploded at the {reason.name} flush")
        return real(reason, *a, **k)

    monkeypatch.setattr(fused, "sync", failing)
    result, text, _ = run(ip, "%%tpu_profile --no-flame\npending_p = torch.ones(3, device='tpu') * 7\n")
    monkeypatch.setattr(fused, "sync", real)
    assert not result.success and "graph exploded at the" in str(result.error_in_exec)
    assert "torchtpu_lab profile" in text and "partial report" in text, text
    assert "graph exploded" in ip.user_ns["_tpu_profile"].error
    result, text, _ = run(ip, "print(pending_p.cpu().tolist())")
    assert result.success and "[7.0, 7.0, 7.0]" in text


@pytest.mark.parametrize("hostile", HOSTILE_STRINGS)
def test_user_strings_are_escaped_in_the_report_and_its_flame_graph(ip, hostile):
    check_escaped(ip, hostile)
