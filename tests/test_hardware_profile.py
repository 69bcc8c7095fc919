"""How far from the hardware (issue 22): XLA cost per program, peaks and MFU, roofline, compare, expect, memory at
the peak, the sync-free scalar logger and trace exports; the magics' flags in a real IPython shell."""

import json
import re

import pytest
import torch
from cells import run_cell as _run

import torchtpu_lab
from torchtpu_lab import interrupts
from torchtpu_lab.profiling import peaks as peaks_mod
from torchtpu_lab.runtime import compile_cache, program_cost

MATMULS = 4 * 2 * 256**3


def _four_matmuls(a):
    b = a
    for _ in range(4):
        b = b @ a
    return b


@pytest.fixture(scope="module")
def matmul_profile():
    torchtpu_lab.set_eager_mode("fused")
    a = torch.randn(256, 256, device="tpu")
    _four_matmuls(a).sum().item()  # warm: the profiled run measures execution, not the compile
    with torchtpu_lab.profile() as prof:
        out = _four_matmuls(a)
        out.sum().item()
    return prof


def test_fused_matmuls_report_xla_flops_mfu_and_peak_source(matmul_profile):
    s = matmul_profile.summary()
    assert abs(s["flops"] - MATMULS) / MATMULS < 0.10, s["flops"]
    assert s["bytes_accessed"] > 0 and s["device_s"] > 0
    assert 0 < s["mfu"] <= 1, s
    assert s["peak_flops"] > 0 and s["peak_bandwidth"] > 0
    assert s["peak_source"].startswith(("measured: ", "table: ")), s["peak_source"]
    # the MFU is the summary's own figures put together, not a separate guess
    assert s["mfu"] == pytest.approx(s["flops"] / s["device_s"] / s["peak_flops"], rel=1e-6)


def test_programs_rows_carry_cost_bound_and_source(matmul_profile):
    rows = matmul_profile.programs()
    assert len(rows) == 1
    row = rows[0]
    for key in ("name", "runs", "flops", "bytes_accessed", "device_s", "intensity", "bound", "source"):
        assert key in row
    assert row["runs"] == 1 and row["bound"] in ("compute", "memory")
    assert row["intensity"] == pytest.approx(row["flops"] / row["bytes_accessed"])
    assert "test_hardware_profile.py" in row["source"] and row["code"] == "out.sum().item()"
    peaks = peaks_mod.peaks()
    assert row["bound"] == ("memory" if row["intensity"] < peaks.ridge else "compute")


def test_roofline_figure_has_roof_and_one_point_per_program(matmul_profile):
    fig = matmul_profile.roofline()
    roof, points = fig.data
    assert len(points.x) == 1 and points.x[0] == pytest.approx(matmul_profile.programs()[0]["intensity"])
    assert max(roof.y) == pytest.approx(matmul_profile.summary()["peak_flops"])
    assert "test_hardware_profile.py" in points.customdata[0][3]
    assert fig.layout.xaxis.type == "log"


def test_text_and_html_reports_show_the_hardware_sections(matmul_profile):
    text = matmul_profile.text()
    assert "MFU" in text and "programs against the roofline" in text and "memory at the peak" in text
    html = matmul_profile._repr_html_()
    assert "Programs against the roofline" in html and "Memory at the peak" in html and "MFU" in html


def test_cost_is_stored_with_disk_cache_entries_and_read_back(tmp_path):
    import jax
    import jax.numpy as jnp

    compile_cache_state = compile_cache.settings()
    compile_cache.enable(str(tmp_path))
    try:
        x = jnp.ones((64, 64))
        dev = jax.devices()[0]
        sig = ("test_hardware_profile", 64)
        exe, disk = compile_cache.executable(lambda a: a @ a, [x], "graph", sig, dev)
        assert not disk
        loaded, disk = compile_cache.executable(lambda a: a @ a, [x], "graph", sig, dev)
        assert disk
        cost = program_cost._COSTS.get(loaded)  # put there by the load, from the entry: no analysis ran
        assert cost is not None and cost.flops == pytest.approx(2 * 64**3, rel=0.1)
        assert cost == program_cost.of(exe)
    finally:
        compile_cache.use_settings(compile_cache_state)


def test_peak_table_and_calibration_cache(tmp_path, monkeypatch):
    h100 = peaks_mod.from_table("NVIDIA H100 80GB HBM3", "bfloat16")
    assert h100.flops == 989.4e12 and h100.bandwidth == 3.35e12 and "table" in h100.source
    assert peaks_mod.from_table("TPU v5 lite").flops == 197e12
    assert peaks_mod.from_table("TPU v6 lite").bandwidth == 1640e9
    assert peaks_mod.from_table("some new chip") is None
    monkeypatch.setenv("TORCHTPU_LAB_PEAKS_FILE", str(tmp_path / "peaks.json"))
    monkeypatch.setattr(peaks_mod, "_memo", {})
    calls = []
    real = peaks_mod.calibrate
    monkeypatch.setattr(peaks_mod, "calibrate",
                        lambda device: calls.append(1) or real(device, matmul_n=256, copy_mib=4, runs=2))
    first = peaks_mod.peaks()
    assert first.source.startswith("measured: 256x256 float32 matmul") and calls == [1]
    monkeypatch.setattr(peaks_mod, "_memo", {})
    again = peaks_mod.peaks()  # from the disk cache: no second calibration
    assert again == first and calls == [1]


def test_a_calibration_below_what_a_program_reached_is_raised_to_it(tmp_path, monkeypatch):
    """A calibration on a busy machine measures less than the device can do; a profiled program that computes
    faster than that roof raises it (in memory and in the cache), so its MFU is never over 100 %; the bandwidth
    stays (a program in cache outruns memory)."""
    monkeypatch.setenv("TORCHTPU_LAB_PEAKS_FILE", str(tmp_path / "peaks.json"))
    monkeypatch.setattr(peaks_mod, "_memo", {})
    monkeypatch.setattr(peaks_mod, "calibrate", lambda device: peaks_mod.Peaks(1e3, 1e3, "measured: a slow day"))
    a = torch.randn(256, 256, device="tpu")
    _four_matmuls(a).sum().item()
    with torchtpu_lab.profile() as prof:
        _four_matmuls(a).sum().item()
    s = prof.summary()
    assert 0 < s["mfu"] <= 1 and s["peak_flops"] > 1e3, s
    assert s["peak_source"].startswith("measured: a slow day; raised to ") and "profiled program" in s["peak_source"]
    assert s["peak_bandwidth"] == 1e3
    monkeypatch.setattr(peaks_mod, "_memo", {})
    assert peaks_mod.peaks().flops == s["peak_flops"]  # the cache holds the raised figures


def _step(x, w):
    return (x @ w).relu().sum()


def test_expect_is_quiet_on_a_warm_step_and_names_a_new_shape():
    torchtpu_lab.set_eager_mode("fused")
    w = torch.randn(16, 8, device="tpu")
    _step(torch.randn(4, 16, device="tpu"), w).item()
    x = torch.randn(4, 16, device="tpu")
    with torchtpu_lab.expect(compiles=0, syncs=None):
        _step(x, w).item()
    y = torch.randn(5, 16, device="tpu")
    with pytest.raises(torchtpu_lab.ExpectationError) as info, torchtpu_lab.expect(compiles=0):
        _step(y, w).item()
    message = str(info.value)
    assert info.value.what == "compiles" and message.startswith("expected none compiles in the block"), message
    line = _step.__code__.co_firstlineno + 1
    assert f"test_hardware_profile.py:{line}" in message and "(`return (x @ w).relu().sum()`)" in message, message
    assert "[4, 16] -> [5, 16]" in message, message
    assert _step(x, w).item() == pytest.approx(_step(x.cpu(), w.cpu()).item(), rel=1e-4)  # the session goes on


def test_expect_counts_syncs_and_lets_the_blocks_error_through():
    x = torch.ones(3, device="tpu")
    with (pytest.raises(torchtpu_lab.ExpectationError, match=r"at most 1 syncs.*got 3.*item\(\)"),
          torchtpu_lab.expect(compiles=None, syncs=1)):
        for _ in range(3):
            (x * 2).sum().item()
    with pytest.raises(ZeroDivisionError), torchtpu_lab.expect(compiles=0):
        raise ZeroDivisionError("the block's own error")
    with pytest.raises(ValueError, match="count >= 0"), torchtpu_lab.expect(compiles=-1):
        pass


def test_memory_at_peak_owners_sum_to_the_peak_with_sources():
    torchtpu_lab.set_eager_mode("fused")
    with torchtpu_lab.profile() as prof:
        a = torch.randn(128, 256, device="tpu")
        b = torch.randn(256, 64, device="tpu")
        c = (a @ b).relu()
        c.sum().item()
        del a
    owners = prof.memory_at_peak()
    peak = prof.summary()["peak_bytes"]
    assert abs(sum(o["bytes"] for o in owners) - peak) <= 0.01 * peak, (owners, peak)
    assert all(o["source"] for o in owners)
    kinds = {o["kind"] for o in owners}
    assert "tensor" in kinds
    # tensors an earlier test left alive (same worker) are owners too, with their own lines: look for ours
    ours = [o["shape"] for o in owners if o["kind"] == "tensor" and "test_hardware_profile.py" in o["source"]]
    assert [128, 256] in ours and [256, 64] in ours, owners
    html = prof._repr_html_()
    assert "Memory at the peak" in html and '<svg class="ttl-memory-timeline"' in html
    hovers = re.findall(r"<title>([^<]*)</title>", html)
    assert any("graph run (outputs + temporaries) at test_hardware_profile.py" in h for h in hovers), hovers
    assert any("as the graph of the sync at test_hardware_profile.py" in h for h in hovers), hovers


def _train(steps, read_each_step):
    w = torch.zeros(8, device="tpu", requires_grad=True)
    x = torch.randn(32, 8, device="tpu")
    for _ in range(steps):
        loss = ((x @ w - 1.0) ** 2).mean()
        loss.backward()
        with torch.no_grad():
            w -= 0.1 * w.grad
            w.grad = None
        if read_each_step:
            print(loss.item())  # the mistake: the host waits for the device every step
        else:
            torchtpu_lab.log_scalar("loss", loss)  # the fix: fetched with the next sync that happens anyway
        torchtpu_lab.sync()  # step boundary


def test_compare_shows_syncs_falling_after_the_item_fix(capsys):
    torchtpu_lab.set_eager_mode("fused")
    _train(2, True), _train(2, False)  # warm both versions
    torchtpu_lab.scalars(clear=True)
    with torchtpu_lab.profile() as before:
        _train(6, True)
    with torchtpu_lab.profile() as after:
        _train(6, False)
    capsys.readouterr()
    c = torchtpu_lab.compare(before, after)
    s = c.summary()
    assert set(s) == set(before.summary()) | set(after.summary())
    assert s["syncs"][0] >= 12 and s["syncs"][1] <= s["syncs"][0] - 6, s["syncs"]  # the 6 reads are gone
    assert all(isinstance(v, tuple) and len(v) == 2 for v in s.values())
    text = c.text()
    assert re.search(r"syncs\s+\d+ ->\s+\d+\s+-\d+", text), text
    assert "item() / bool() / int() of a tensor at test_hardware_profile.py" in text
    html = c._repr_html_()
    assert "Syncs by line" in html and "<th>before</th>" in html
    # the finding for the .item() loop points to the scalar logger
    assert any("log_scalar" in f.fix for f in before.report().findings)
    logged = torchtpu_lab.scalars()["loss"]
    assert len(logged) == 6 and all(isinstance(v, float) for v in logged) and logged[0] > logged[-1]


def test_log_scalar_adds_no_sync_and_fetches_in_one_transfer():
    from torchtpu_lab.runtime import scalar_log

    torchtpu_lab.set_eager_mode("fused")
    torchtpu_lab.scalars(clear=True)
    x = torch.arange(5.0, device="tpu")
    transfers = scalar_log.LOG.transfers
    with torchtpu_lab.profile() as prof:
        for i in range(5):
            torchtpu_lab.log_scalar("v", x[i] * 2)
            x.add_(0)  # an in-place op after logging must not change what was logged
    assert prof.summary()["syncs"] <= 1  # the end of the block only, no sync per log
    assert torchtpu_lab.scalars() == {"v": [0.0, 2.0, 4.0, 6.0, 8.0]}
    assert scalar_log.LOG.transfers - transfers <= 2
    torchtpu_lab.log_scalar("lr", 0.5)
    with pytest.raises(ValueError, match="one-element"):
        torchtpu_lab.log_scalar("bad", x)
    assert torchtpu_lab.scalars(clear=True)["lr"] == [0.5]
    assert torchtpu_lab.scalars() == {}


def test_to_perfetto_and_speedscope(matmul_profile, tmp_path):
    path = matmul_profile.to_perfetto(str(tmp_path / "trace.json"))
    with open(path) as f:
        trace = json.load(f)
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    lanes = {e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "thread_name"}
    assert {"host: torch ops", "host: syncs", "device: XLA programs"} <= lanes
    programs = [e for e in spans if e["cat"] == "device: XLA programs"]
    assert len(programs) == 1 and programs[0]["args"]["flops"] == pytest.approx(matmul_profile.summary()["flops"])
    assert sum(1 for e in spans if e["name"] == "aten::mm") == 4
    assert any(e["ph"] == "C" for e in trace["traceEvents"])
    path = matmul_profile.to_speedscope(str(tmp_path / "flame.speedscope.json"))
    with open(path) as f:
        doc = json.load(f)
    prof = doc["profiles"][0]
    assert prof["type"] == "sampled" and len(prof["samples"]) == len(prof["weights"]) > 0
    names = [f["name"] for f in doc["shared"]["frames"]]
    assert "aten::mm" in names and names[0] == "cell"
    assert sum(prof["weights"]) == pytest.approx(matmul_profile.report().flame.total(), rel=1e-6)


# ---- magics in a real IPython shell ---------------------------------------------------------------------






def test_magic_repeat_history_and_compare(ip):
    _run(ip, "wm = torch.randn(64, 64, device='tpu')")
    cell = "for i in range(3):\n    v = (wm @ wm).sum().item()\n"
    result, text, html = _run(ip, "%%tpu_profile --no-flame --repeat 3\n" + cell)
    assert result.error_in_exec is None
    rep = ip.user_ns["_tpu_profile"]
    assert len(rep.runs) == 3 and rep.summary()["runs"] == 3
    assert rep.summary()["syncs"] == sorted(p.summary()["syncs"] for p in rep.runs)[1]
    assert "median of 3 runs" in text and "programs against the roofline" in text
    assert "Programs against the roofline" in html
    ip.user_ns["slow"] = rep
    result, text, html = _run(ip, "%%tpu_profile --no-flame --compare slow\nv = (wm @ wm).sum()\ntorchtpu_lab.sync()\n")
    assert result.error_in_exec is None
    assert "compare: slow -> this cell" in text and re.search(r"syncs\s+3 ->\s+1", text), text
    assert "torchtpu_lab compare" in html
    history = ip.user_ns["_tpu_profiles"]
    assert history[-2] is rep and history[-1] is ip.user_ns["_tpu_profile"]
    result, text, _ = _run(ip, "%%tpu_profile --no-flame --compare -2\nv = (wm @ wm).sum().item()\n")
    assert result.error_in_exec is None and "compare: -2 -> this cell" in text
    result, _, _ = _run(ip, "%%tpu_profile --compare nothing_here\nx = 1\n")
    assert "nothing_here" in str(result.error_in_exec) or "nothing_here" in str(result.error_before_exec)
    result, _, _ = _run(ip, "%%tpu_profile --repeat 0\nx = 1\n")
    assert result.error_in_exec is not None or result.error_before_exec is not None


def test_torch_compile_graph_is_a_program_with_cost_and_json_carries_programs():
    torchtpu_lab.set_eager_mode("fused")
    model = torch.nn.Linear(64, 32).to("tpu")
    compiled = torch.compile(model, backend="tpu")
    x = torch.randn(16, 64, device="tpu")
    compiled(x).sum().item()
    with torchtpu_lab.profile() as prof:
        for _ in range(3):
            compiled(x)
        torchtpu_lab.sync()
    rows = [r for r in prof.programs() if r["name"].startswith("compiled")]
    assert len(rows) == 1 and rows[0]["runs"] == 3, prof.programs()
    assert rows[0]["flops_per_run"] == pytest.approx(2 * 16 * 64 * 32, rel=0.2)
    assert "test_hardware_profile.py" in rows[0]["source"]
    data = json.loads(prof.to_json())
    assert data["programs"][0]["runs"] >= 1 and data["graphs"][0]["detail"]["cost"]["flops"] > 0
    assert data["summary"]["mfu"] is None or 0 < data["summary"]["mfu"] <= 1


def test_side_panel_status_carries_the_hardware_figures_of_a_repeated_profile():
    """The JupyterLab panel shows the last profile's summary and text: a --repeat profile (medians) included,
    with its FLOPs, MFU and peak source, and the roofline and memory-at-peak sections in the text."""
    from torchtpu_lab.jupyter import comm
    from torchtpu_lab.profiling.repeat import Repeated

    torchtpu_lab.set_eager_mode("fused")
    a = torch.randn(64, 64, device="tpu")
    runs = []
    for _ in range(3):
        with torchtpu_lab.profile() as prof:
            (a @ a).sum().item()
        runs.append(prof)

    class Shell:
        def __init__(self, ns: dict) -> None:
            self.user_ns = ns

    info = comm._profile_info(Shell({"_tpu_profile": Repeated(runs)}))
    s = info["summary"]
    assert s["runs"] == 3 and s["flops"] > 0 and 0 < s["mfu"] <= 1 and s["peak_source"]
    assert "programs against the roofline" in info["text"] and "memory at the peak" in info["text"]
    assert "MFU" in info["text"]


def test_finding_when_the_costliest_program_is_far_below_its_roof():
    from torchtpu_lab.profiling import programs
    from torchtpu_lab.records import ProgramRow

    peaks = peaks_mod.Peaks(1e12, 1e11, "table: test chip")

    def row(name, device_s, flops_per_s, intensity):
        roof = min(peaks.flops, intensity * peaks.bandwidth)
        return ProgramRow(name, 10, 40, flops_per_s * device_s, flops_per_s * device_s / intensity, 0, 0, device_s,
                          intensity, "memory" if intensity < peaks.ridge else "compute", flops_per_s, None,
                          flops_per_s / roof, "cell [2], line 3", "")

    FAR = programs.FAR_BELOW
    far = [row("graph[40 ops]", 0.5, 2e10, 2.0), row("graph[3 ops]", 0.1, 9e11, 100.0)]
    f = programs.roofline_finding(far, wall_s=1.0)
    assert f is not None and "memory-bound" in f.title and "10.0% of its memory roof" in f.detail
    assert "batch" in f.fix and "cell [2], line 3" in f.detail and f.cost_s == 0.5
    near = [row("graph[40 ops]", 0.5, 1.5e11, 2.0)]  # 75% of its roof: nothing to say
    assert programs.roofline_finding(near, wall_s=1.0) is None
    compute = [row("graph[40 ops]", 0.5, 5e10, 100.0)]
    assert "compute-bound" in programs.roofline_finding(compute, wall_s=1.0).title
    tiny = [row("graph[2 ops]", 4e-4, 1e3, 0.25)]  # a 4-element add: launch latency, no roof to speak of
    assert tiny[0].roof_fraction < FAR and programs.roofline_finding(tiny, wall_s=5e-3) is None


def test_a_logged_value_that_was_never_computed_is_reported_once_and_the_rest_kept():
    from torchtpu_lab.device.storage import FailedValue
    from torchtpu_lab.runtime import scalar_log

    torchtpu_lab.scalars(clear=True)
    torchtpu_lab.log_scalar("ok", torch.ones((), device="tpu"))
    torchtpu_lab.log_scalar("bad", torch.ones((), device="tpu"))
    torchtpu_lab.sync()
    scalar_log.LOG.pending[-1][1].tpu_storage.array = FailedValue(RuntimeError("boom"), (1,), torch.float32)
    with pytest.raises(RuntimeError, match=r"logged as bad were never computed .*boom"):
        torchtpu_lab.scalars()
    assert torchtpu_lab.scalars(clear=True) == {"ok": [1.0]}


def test_a_profile_times_every_run_without_waiting_for_it(monkeypatch):
    """Waiting for runs serialized host and device (most of a small step's profiling cost, and the overlap a
    profile of a host-bound step is for): a profile times each run from the looks it takes after every op and
    call into the backend, waits only at its end, and a run seen done by an op recorded later or by a value read
    gets its device time."""
    waits = []
    real = program_cost.jax.block_until_ready
    monkeypatch.setattr(program_cost.jax, "block_until_ready", lambda x: waits.append(1) or real(x))
    a = torch.randn(64, 64, device="tpu")
    (a @ a).relu().sum().item()
    (a + 1).sum().item()  # its first compile would be a gap in the looks: the run it hid would be estimated
    (a @ a).sum().item()  # the read's program, compiled before: a first run is never timed (run alone, it was)
    with torchtpu_lab.profile() as prof:
        for _ in range(20):
            b = (a @ a).relu()  # a new program: its first run ever is in the profile
            torchtpu_lab.sync()
            for _ in range(10_000):  # host work while it runs (dropped: in no graph); a look after each op
                a + 1
                if not program_cost.timing():
                    break
        c = (b @ b).sum().item()  # a value read waits for its run, which is seen done as it ends
    assert len(waits) <= 1  # at most the end of the block waited (for what was still running)
    rows = [r for r in prof.programs() if r["runs"] == 20]
    assert len(rows) == 1, prof.programs()
    row = rows[0]
    events = [e for e in prof.graphs if e.detail.get("program") == prof.graphs[0].detail.get("program")]
    assert [i for i, e in enumerate(events) if e.detail["fresh"]] == [0]
    timed = [e.detail["device_s"] for e in events if e.detail["measured"]]
    # most, not all: a run first seen done after a gap in the looks (a loaded machine) is estimated instead
    assert len(timed) >= 10 and row["timed_runs"] == len(timed), [e.detail for e in events]
    assert all(0 < t < 0.5 for t in timed), timed
    assert row["device_s"] >= sum(timed)
    read = [e for e in prof.graphs if e.detail.get("program") != events[0].detail.get("program")][-1]
    assert 0 < read.detail["device_s"] < 0.5 and read.detail["measured"]
    assert not program_cost.timing() and program_cost.poll not in interrupts.after_entry
    del b, c


def test_a_programs_watched_output_is_found_once_and_looks_are_spaced(monkeypatch):
    """A timed run is watched by its program's smallest output, whose position is found at the program's first
    timed run and reused (a step's program has a hundred outputs); a look within LOOK_EVERY_S of the last is
    skipped (ops microseconds apart each asked), one after a wait never is."""
    import time

    real, programs, watched = program_cost.time_run, [], []

    def time_run(event, outputs, device, launch_look=None, program=None):
        programs.append(program)
        real(event, outputs, device, None, program)  # as if still running at its launch: watched
        watched.append(program_cost._UNTIMED[-1].outputs[0] if program_cost._UNTIMED else None)

    monkeypatch.setattr(program_cost, "time_run", time_run)
    a, small = torch.randn(64, 64, device="tpu"), torch.randn(2, device="tpu")
    with torchtpu_lab.profile():
        for _ in range(3):
            big, tiny = a @ a, small * 2
            torchtpu_lab.sync()
    program = programs[-1]
    assert program is not None and program_cost._WATCHED[program] in (0, 1)
    assert [tuple(w.shape) for w in watched[-3:]] == [(2,)] * 3
    looked = []
    monkeypatch.setattr(program_cost, "_bytes", lambda arr: looked.append(arr) or arr.size * arr.dtype.itemsize)
    outputs = [big.tpu_storage.array, tiny.tpu_storage.array][::1 if program_cost._WATCHED[program] == 1 else -1]
    assert program_cost._watched(outputs, program) is tiny.tpu_storage.array and not looked  # known: no sizes
    assert program_cost._watched(outputs, object()) is tiny.tpu_storage.array and len(looked) == 2
    assert program_cost._watched([None, 3], None) is None  # no array: nothing to watch
    program_cost._LAST_LOOK[0] = now = time.perf_counter()
    program_cost.poll()
    assert program_cost._LAST_LOOK[0] == now  # too soon: skipped
    program_cost.poll(waited=True)
    assert program_cost._LAST_LOOK[0] > now  # after a wait: looked


def test_a_run_whose_outputs_are_gone_is_estimated_from_the_timed_ones(monkeypatch):
    """A run the profile cannot see end (its outputs were donated to a later program before any look) is not
    timed; its device time is the mean of the timed runs'."""
    real_time_run, real_done, matmuls, gone = program_cost.time_run, program_cost._done, [], []

    def time_run(event, outputs, device, launch_look=None, program=None):
        matmul = tuple(program_cost._arrays(outputs)[0].shape) == (256, 256)
        if matmul:
            matmuls.append(event)
        if len(matmuls) == 2 and matmul:  # not done at its launch, and its outputs gone before the next look
            real_time_run(event, outputs, device, None, program)
            gone.append(program_cost._UNTIMED[-1].outputs[0])
        else:
            real_time_run(event, outputs, device, launch_look, program)

    monkeypatch.setattr(program_cost, "time_run", time_run)
    monkeypatch.setattr(program_cost, "_done",
                        lambda run: None if any(run.outputs[0] is g for g in gone) else real_done(run))
    a = torch.randn(256, 256, device="tpu")
    (a @ a).sum().item()
    (a + 1).sum().item()  # its first compile would be a gap in the looks: the run it hid would be estimated
    with torchtpu_lab.profile() as prof:
        for _ in range(4):
            b = a @ a
            torchtpu_lab.sync()
            for _ in range(10_000):  # host work while it runs: a look after each op
                a + 1
                if not program_cost.timing():
                    break
            b.sum().item()
    rows = [r for r in prof.programs() if r["runs"] == 4 and r["flops"] > 3e7]  # the matmul's
    assert len(rows) == 1, prof.programs()
    # the gone run is never timed; the others are unless a loaded machine left a gap in the looks around their end
    assert matmuls[1].detail["measured"] is False
    timed = [e.detail["device_s"] for e in matmuls if e.detail["measured"]]
    assert rows[0]["timed_runs"] == len(timed) and f"4 ({len(timed)} timed)" in prof.text()
    if not timed:
        pytest.skip("no run of the program was timed on this loaded machine: nothing to estimate from")
    typical = [e.detail["device_s"] for e in matmuls if e.detail["measured"] and not e.detail["fresh"]] or timed
    assert rows[0]["device_s"] == pytest.approx(sum(timed) + (4 - len(timed)) * sum(typical) / len(typical))
    del b


def test_device_time_estimate_leaves_a_slow_first_run_out_of_the_others():
    from types import SimpleNamespace

    from torchtpu_lab.profiling.programs import device_time

    def run(dur, measured=True, fresh=False):
        return SimpleNamespace(dur=dur, detail={"measured": measured, "fresh": fresh})

    first = run(10.0, fresh=True)  # the executable's first run ever: left out of the others' estimate
    assert device_time([first, run(1.0), run(3.0)] + [run(0.1, False)] * 4) == pytest.approx(14.0 + 4 * 2.0)
    assert device_time([run(10.0), run(1.0), run(3.0)] + [run(0.1, False)] * 4) == pytest.approx(14.0 + 4 * 14 / 3)
    assert device_time([run(5.0, fresh=True)] + [run(0.1, False)] * 2) == pytest.approx(15.0)  # the only one
    assert device_time([run(0.5, False), run(0.25, False)]) == pytest.approx(0.75)  # never waited for: as run
