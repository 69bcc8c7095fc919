"""The tutorial notebooks (02-06) execute under nbclient and show what they teach; Binder's configuration
installs the package and runs the quickstart in a fresh environment.

Each notebook has a budget of 120 s here (they take 20-50 s on a 2-core machine). The assertions read the
notebooks' outputs: a number that must drop, bytes that must halve, a trace file that must exist.

``test_binder_config_runs_quickstart`` builds a fresh virtual environment (a few minutes), so it is marked
``slow`` and runs only with ``TORCHTPU_LAB_SLOW=1``.
"""

import glob
import os
import re
import shutil
import subprocess
import sys
import time

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
NB_DIR = os.path.join(ROOT, "notebooks")
BUDGET_S = 120
BADGE = "https://colab.research.google.com/github/torchtpu-lab/torchtpu-lab/blob/main/notebooks/{}"
TUTORIALS = ["02_eager_modes.ipynb", "03_recompilations.ipynb", "04_host_syncs.ipynb", "05_memory.ipynb",
             "06_profiling.ipynb", "06_profiling_hardware.ipynb", "07_compile_and_kernels.ipynb", "08_multichip.ipynb", "09_huggingface.ipynb"]
# 08 starts two 2-rank jobs (fresh processes that import torch and JAX and compile): about 60 s idle.
BUDGETS = {"08_multichip.ipynb": 240}

_executed: dict = {}


def _reads_run(name: str):
    """Tests that read one notebook run stay on one xdist worker (``--dist loadgroup``), so it runs once."""
    return pytest.mark.xdist_group(name)


def _text(cell, mime="text/plain") -> str:
    from torchtpu_lab.run_notebook import cell_text

    return cell_text(cell, mime)


def _run(name: str):
    """Execute a notebook once per test session (several tests read the same run)."""
    if name not in _executed:
        from torchtpu_lab.run_notebook import execute

        t0 = time.perf_counter()
        nb = execute(os.path.join(NB_DIR, name), timeout=BUDGETS.get(name, BUDGET_S))
        _executed[name] = (nb, time.perf_counter() - t0)
    nb, seconds = _executed[name]
    budget = BUDGETS.get(name, BUDGET_S)
    assert seconds < budget, f"{name} took {seconds:.0f} s (budget {budget} s)"
    code = [c for c in nb.cells if c.cell_type == "code"]
    errors = [o for c in code for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors, [f"{e['ename']}: {e['evalue']}" for e in errors]
    return code


def _cell(code, marker: str):
    found = [c for c in code if marker in c.source]
    assert found, f"no code cell contains {marker!r}"
    return found[0]


def _has_plotly(cell) -> bool:
    return any("application/vnd.plotly.v1+json" in o.get("data", {}) for o in cell.get("outputs", []))


@pytest.mark.parametrize("name", TUTORIALS)
def test_tutorial_opens_like_the_quickstart(name):
    """Colab badge with the notebook's own name, then the same install-only-if-missing cell as 01."""
    import nbformat

    first = nbformat.read(os.path.join(NB_DIR, "01_quickstart.ipynb"), as_version=4)
    nb = nbformat.read(os.path.join(NB_DIR, name), as_version=4)
    assert nb.cells[0].cell_type == "markdown" and BADGE.format(name) in nb.cells[0].source
    assert nb.cells[1].cell_type == "code" and _same_install(nb.cells[1].source, first.cells[1].source)
    assert any(c.source.strip() == "%load_ext torchtpu_lab" for c in nb.cells if c.cell_type == "code")


def _same_install(a: str, b: str) -> bool:
    """Two install cells are the same cell up to the extras their notebook needs (``EXTRAS = [...]``)."""
    return re.sub(r"EXTRAS = \[.*\]", "EXTRAS = []", a) == re.sub(r"EXTRAS = \[.*\]", "EXTRAS = []", b)


@pytest.mark.parametrize("runtime,notebook", [("cpu", "01_quickstart.ipynb"), ("tpu", "01_quickstart.ipynb"),
                                              ("tpu", "09_huggingface.ipynb"), ("local", "01_quickstart.ipynb")])
def test_install_cell_in_a_simulated_colab(monkeypatch, tmp_path, runtime, notebook):
    """The install cell as Colab runs it: the package is missing (``local``: it is installed), a TPU runtime
    sets its environment variables. The pip command is asserted, not executed."""
    import importlib.metadata
    import importlib.util
    import subprocess as sp
    import tempfile

    import nbformat

    source = nbformat.read(os.path.join(NB_DIR, notebook), as_version=4).cells[1].source
    real_find_spec = importlib.util.find_spec
    if runtime != "local":
        monkeypatch.setattr(importlib.util, "find_spec",
                            lambda name, *a: None if name == "torchtpu_lab" else real_find_spec(name, *a))
    for var in ("COLAB_TPU_ADDR", "TPU_ACCELERATOR_TYPE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("COLAB_RELEASE_TAG", "release-colab-simulated")
    if runtime == "tpu":
        monkeypatch.setenv("TPU_ACCELERATOR_TYPE", "v5litepod-1")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    calls = []
    monkeypatch.setattr(sp, "check_call", lambda cmd, **kw: calls.append(cmd))
    exec(compile(source, notebook, "exec"), {})
    if runtime == "local":
        assert calls == []
        return
    (cmd,) = calls
    extras = (["hf"] if "09" in notebook else []) + (["tpu"] if runtime == "tpu" else [])
    spec = "torchtpu-lab" + (f"[{','.join(extras)}]" if extras else "")
    repo = re.search(r"colab.research.google.com/github/([^/]+/[^/]+)/blob", BADGE).group(1)
    assert cmd[:5] == [sys.executable, "-m", "pip", "install", "-q"]
    assert cmd[5] == f"{spec} @ git+https://github.com/{repo}@main"
    assert cmd[6] == "-c"
    with open(cmd[7]) as f:  # Colab's torch is pinned: pip may not replace it
        assert f.read().strip() == f"torch=={importlib.metadata.version('torch')}"


def test_02_eager_modes_timed_side_by_side_and_nan_caught():
    code = _run("02_eager_modes.ipynb")
    table = _text(_cell(code, "results = {mode: measure(mode)"))
    rows = {m.group(1): m for m in re.finditer(
        r"^(debug|strict|fused)\s+\|\s+([\d.]+) ms/step\s+\|\s+(\d+) compiles\s+\|\s+(\d+) ops/step\s+\|"
        r"\s+(\d+) XLA launches/step", table, re.M)}
    assert set(rows) == {"debug", "strict", "fused"}, table
    for m in rows.values():
        assert float(m.group(2)) > 0
    # fused runs the whole step as one XLA program; the per-op modes launch one per op
    assert int(rows["fused"].group(5)) == 1 and int(rows["strict"].group(5)) > 10
    assert int(rows["fused"].group(3)) >= 1 and int(rows["debug"].group(3)) > 10  # one graph vs one per op
    assert _has_plotly(_cell(code, "fig = make_subplots("))
    fused_nan = _text(_cell(code, "fused: loss ="))
    assert "nan" in fused_nan.lower()
    caught = _text(_cell(code, "torchtpu_lab.debug.check_finite(True)"))
    # the op, and the user function and line that called it (the division in normalize, line 2 of its cell)
    assert "FloatingPointError: aten::div.Tensor produced NaN" in caught, caught
    assert re.search(r":2 in normalize|cell \[\d+\], line 2", caught), caught


@_reads_run("03_recompilations.ipynb")
def test_03_recompilations_found_and_fixed_by_bucketing():
    code = _run("03_recompilations.ipynb")
    naive = _text(_cell(code, "for tokens, labels in batches:\n    loss = train_step(tokens"))
    assert "RECOMPILE" in naive and re.search(r"dim 1 of \S+ input \d+ took \d+ values", naive), naive
    assert "pad or bucket dim 1" in naive and naive.index("findings:") < naive.index("compilations")
    causes = _text(_cell(code, "naive = _tpu_profile.summary()"))
    assert re.search(r"changed shape \[16, \d+\] -> \[16, \d+\] \(recorded at cell \[\d+\], line \d+\)", causes)
    m = re.search(r"compiles: (\d+) unpadded -> (\d+) bucketed", _text(_cell(code, "bucketed = _tpu_profile")))
    assert m, "the compile counts are printed"
    before, after = int(m.group(1)), int(m.group(2))
    assert after < before and after <= 3 and before >= 8, (before, after)
    assert _has_plotly(_cell(code, "go.Scatter(y=lengths"))


def test_04_host_syncs_per_step_drop():
    code = _run("04_host_syncs.ipynb")
    report = _text(_cell(code, "total += loss.item()"))
    assert "item() / bool() / int() of a tensor" in report and "print / repr of a tensor" in report
    assert "a line that runs repeatedly" in report
    m = re.search(r"syncs per step: ([\d.]+) before -> ([\d.]+) after", _text(_cell(code, "after = syncs_per_step(")))
    assert m
    before, after = float(m.group(1)), float(m.group(2))
    assert before >= 2 and after < before, (before, after)
    m = re.search(r"value reads per step: ([\d.]+) before -> ([\d.]+) after",
                  _text(_cell(code, "after = syncs_per_step(")))
    assert float(m.group(1)) >= 2 and float(m.group(2)) <= 0.2
    assert _has_plotly(_cell(code, "go.Bar("))


@_reads_run("05_memory.ipynb")
def test_05_memory_accounting():
    code = _run("05_memory.ipynb")
    params = _text(_cell(code, "param_bytes = "))
    m = re.search(r"parameters: (\d+) bytes = (\d+) params x 4 bytes", params)
    assert m and int(m.group(1)) == 4 * int(m.group(2)), params
    adam = _text(_cell(code, "adam_bytes = "))
    assert "= 2.00 x the parameters" in adam, adam
    top = _text(_cell(code, "%tpu memory --top"))
    assert "float32[1024, 1024]" in top and "created at" in top
    peak = _text(_cell(code, "step_peak = "))
    m = re.search(r"peak during the step: ([\d.]+) MiB \(start ([\d.]+) MiB", peak)
    assert m and float(m.group(1)) > float(m.group(2)), peak  # activations and temporaries on top
    bf16 = _text(_cell(code, "bf16_bytes = "))
    m = re.search(r"fp32: (\d+) bytes, bf16: (\d+) bytes", bf16)
    assert m and 2 * int(m.group(2)) == int(m.group(1)), bf16
    freed = _text(_cell(code, "del model_bf16"))
    m = re.search(r"del model_bf16 freed (\d+) bytes", freed)
    assert m and 2 * int(m.group(1)) == int(re.search(r"fp32: (\d+)", bf16).group(1)), freed
    assert _has_plotly(_cell(code, "go.Waterfall("))


def test_08_multichip_ddp_and_fsdp2_match_single_process():
    code = _run("08_multichip.ipynb")
    ddp = _text(_cell(code, 'launch(train, nprocs=2, args=("ddp",)'))
    fsdp = _text(_cell(code, 'launch(train, nprocs=2, args=("fsdp",)'))
    for out in (ddp, fsdp):
        assert "rank 0/2" in out and "rank 1/2" in out
        diff = float(re.search(r"largest parameter difference ([0-9.e+-]+)", out).group(1))
        assert diff < 1e-4
    assert "all_reduce" in ddp and "holds 27168 of 27168" in ddp
    assert "all_gather_into_tensor" in fsdp and "reduce_scatter_tensor" in fsdp
    assert "holds 13584 of 27168" in fsdp and "each rank holds 50% of the parameters" in fsdp


def test_06_profiling_flamegraph_table_json_and_xprof():
    code = _run("06_profiling.ipynb")
    prof = _cell(code, "%%tpu_profile --top 8")
    assert "top ops by time" in _text(prof) and _has_plotly(prof)
    assert _has_plotly(_cell(code, "fig = _tpu_profile.flamegraph()"))
    table = _text(_cell(code, "report = _tpu_profile.report("))
    assert "aten::" in table and "by count" in table
    js = _text(_cell(code, "json.loads(_tpu_profile.to_json())"))
    assert "keys: ['summary', 'compiles', 'syncs', 'ops'" in js
    xprof = _text(_cell(code, "xplanes = glob.glob("))
    paths = re.findall(r"^\s*(\S+\.xplane\.pb)$", xprof, re.M)
    assert paths and all(os.path.getsize(p) > 0 for p in paths), xprof
    md = [c for c in _executed["06_profiling.ipynb"][0].cells if c.cell_type == "markdown"]
    assert any("xprof server --logdir" in c.source for c in md)
    assert not any("%load_ext tensorboard" in c.source for c in md)  # tensorboard is not installed by the extra
    report = _text(_cell(code, "%%tpu_profile --xprof"))
    assert re.search(r"open it with \(in a terminal\):\s+\S*xprof server --logdir \S+ --port \d+", report), report


def test_06_profiling_hardware_roofline_compare_expect():
    code = _run("06_profiling_hardware.ipynb")
    slow = _text(_cell(code, "losses = train_slow(5)"))
    assert "median of 3 runs" in slow and "programs against the roofline" in slow and "log_scalar" in slow
    figures = _text(_cell(code, "s = slow.summary()"))
    mfu = float(re.search(r"MFU ([0-9.]+)% of", figures).group(1))
    assert 0 < mfu <= 100 and re.search(r"peaks: (measured|table): ", figures), figures
    assert re.search(r"x5 .* (memory|compute)-bound\s+at cell \[\d+\], line \d+", figures), figures
    assert _has_plotly(_cell(code, "slow.roofline()"))
    compared = _text(_cell(code, "train_fast(5)"))
    assert "compare: slow -> this cell" in compared
    syncs = _text(_cell(code, "c = torchtpu_lab.compare(slow, fast)"))
    before, after = map(int, re.search(r"syncs \(before, after\): \((\d+), (\d+)\)", syncs).groups())
    assert after <= before - 5, syncs
    assert len(re.search(r"logged losses: \[(.*)\]", syncs).group(1).split(",")) == 5
    expect = _text(_cell(code, "torchtpu_lab.expect(compiles=0)"))
    assert "warm steps: no compile" in expect
    assert re.search(r"ExpectationError: .*\[64, 1, 16, 16\] -> \[48, 1, 16, 16\]", expect), expect
    owners = _text(_cell(code, "owners = fast.memory_at_peak()"))
    total, peak = map(int, re.search(r"owners, (\d+) B; peak_bytes (\d+) B", owners).groups())
    assert abs(total - peak) <= 0.01 * peak
    exports = _text(_cell(code, "fast.to_perfetto("))
    assert re.search(r"perfetto: \S+ \d+ events", exports) and "speedscope:" in exports


# ---- Binder ---------------------------------------------------------------------------------------------------

# What Binder's base image provides and a bare venv lacks: the kernel and the notebook client.
BINDER_BASE_IMAGE = ["ipykernel", "nbclient", "nbformat"]


def test_07_compile_graph_break_fixed_and_jax_kernels():
    code = _run("07_compile_and_kernels.ipynb")
    eager = re.search(r"eager: (\d+) ATen ops per step", _text(_cell(code, "eager = _tpu_profile.summary()")))
    assert eager and int(eager.group(1)) >= 40  # (the optimizer's foreach updates are one op each)
    compiled = _text(_cell(code, "steady = _tpu_profile.summary()"))
    assert "compiled: 0 compiles in the steady state" in compiled, compiled
    assert "compiled forward" in compiled and "compiled backward" in compiled and "compiled inference" in compiled
    assert re.search(r"eager [\d.]+ ms/step -> compiled [\d.]+ ms/step", compiled)
    breaks = _text(_cell(code, "for b in _tpu_profile.graph_breaks:"))
    # the .item() on line 8 of the Clipped cell
    assert re.search(r"graph break at cell \[\d+\], line 8: .*item\(\)", breaks), breaks
    profile = _text(_cell(code, "out = torch.compile(clipped"))
    assert "torch.compile graph breaks:" in profile, profile
    fixed = _text(_cell(code, "graph breaks after the fix"))
    assert "graph breaks after the fix: 0" in fixed and "same result: True" in fixed, fixed
    kernel = _text(_cell(code, "def swiglu("))
    assert "matches PyTorch: True" in kernel and "gradient matches: True" in kernel, kernel
    assert "pallas matches: True" in _text(_cell(code, "def scale_add("))
    inlined = _text(_cell(code, "def fused(a, g, q)"))
    assert "'tutorial::swiglu'" in inlined and "'tutorial::scale_add'" in inlined and "result matches: True" in inlined


def test_09_huggingface_fine_tunes_and_static_cache_compiles_stay_flat():
    pytest.importorskip("transformers")
    code = _run("09_huggingface.ipynb")
    m = re.search(r"loss: ([\d.]+) -> ([\d.]+)", _text(_cell(code, "losses = train(40)")))
    assert m and float(m.group(2)) < 0.5 * float(m.group(1)), m and m.groups()
    steady = _text(_cell(code, "compiles in steady state"))
    assert "compiles in steady state: 0" in steady, steady
    decode = _text(_cell(code, "new compiles per run"))
    m = re.search(r"new compiles per run: \{4: (\d+), 8: (\d+), 16: (\d+)\}", decode)
    assert m and int(m.group(1)) > 0 and m.group(2) == m.group(3) == "0", decode
    assert "follows the trained pattern: True" in decode, decode
    generate = _text(_cell(code, "grows-by-one recompiles"))
    assert "same tokens as the static-cache loop: True\ngrows-by-one recompiles: 0" in generate, generate
    # the default cache: one program per capacity bucket, so a call after the first builds nothing
    assert "generate(dynamic cache), new compiles per call: {4: 0, 8: 0, 16: 0}" in generate, generate
    assert generate.count("same tokens as the static-cache loop: True") == 2, generate
    static = _text(_cell(code, "new compiles per call"))
    m = re.search(r"new compiles per call: \{4: (\d+), 8: (\d+), 16: (\d+)\}", static)
    # the first call may build nothing: the default-cache cell above already built the same padded programs
    assert m and m.group(2) == m.group(3) == "0", static
    assert "same tokens as the static-cache loop: True" in static, static
    # a left-padded batch: the mask rebuilt from the grown length runs on the padded storage (runtime/bounded.py)
    batched = _text(_cell(code, "batched generate, new compiles per call"))
    m = re.search(r"batched generate, new compiles per call: \{4: (\d+), 8: (\d+), 16: (\d+)\}", batched)
    assert m and int(m.group(1)) > 0 and m.group(2) == m.group(3) == "0", batched
    assert "same tokens as on the CPU: True" in batched, batched


def _requirements_for_this_machine(path: str) -> list[str]:
    """binder/requirements.txt, less the lines that point pip at an index this machine cannot reach (the
    PyTorch CPU index): here pip's own configuration supplies the CPU torch wheel from local disk."""
    out = []
    for line in open(path):
        s = line.strip()
        if s.startswith(("--extra-index-url", "--index-url", "-i ")) and "download.pytorch.org" in s:
            continue
        out.append(line.rstrip("\n"))
    return out


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("TORCHTPU_LAB_SLOW") != "1", reason="slow (fresh venv): set TORCHTPU_LAB_SLOW=1")
def test_binder_config_runs_quickstart(tmp_path):
    binder = os.path.join(ROOT, "binder")
    reqs = _requirements_for_this_machine(os.path.join(binder, "requirements.txt"))
    assert any(r.strip().startswith("torch==") for r in reqs), "binder pins torch"
    # a clean copy of the repository, as repo2docker clones it
    repo = tmp_path / "repo"
    shutil.copytree(ROOT, repo, ignore=shutil.ignore_patterns(".venv", ".git", "__pycache__", ".pytest_cache",
                                                              "*.egg-info", "build", "dist"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = str(venv / "bin" / "python")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env.update(PATH=f"{venv / 'bin'}:{env.get('PATH', '')}", VIRTUAL_ENV=str(venv),
               JUPYTER_DATA_DIR=str(tmp_path / "jupyter"), JUPYTER_PATH="",
               TORCHTPU_LAB_CACHE_DIR=str(tmp_path / "xla_cache"))
    (tmp_path / "requirements.txt").write_text("\n".join(reqs) + "\n")

    def run(args, **kw):
        r = subprocess.run(args, env=env, capture_output=True, text=True, **kw)
        assert r.returncode == 0, f"{args} failed:\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
        return r

    run([py, "-m", "pip", "install", "-q", "-r", str(tmp_path / "requirements.txt")], cwd=repo)
    run(["bash", str(repo / "binder" / "postBuild")], cwd=repo)  # exactly as repo2docker runs it
    run([py, "-m", "pip", "install", "-q", *BINDER_BASE_IMAGE], cwd=repo)
    run([py, "-m", "ipykernel", "install", "--user", "--name", "python3"], cwd=repo)  # the venv's kernel
    versions = run([py, "-c", "import torch, torchtpu_lab, plotly; print(torch.__version__, torchtpu_lab.__file__)"],
                   cwd=tmp_path).stdout
    assert versions.startswith("2.13.0") and str(repo) in versions, versions
    # Binder opens notebooks with the notebook's folder as the working directory: the package is found only
    # because it was installed
    r = run([py, "-m", "torchtpu_lab.run_notebook", "01_quickstart.ipynb", "--timeout", "300"],
            cwd=repo / "notebooks", timeout=900)
    out = r.stdout
    assert "tpu device on XLA:" in out and "loss:" in out and "changed shape [256, 20] -> [100, 20]" in out, out
    assert "=== executed 01_quickstart.ipynb" in out


# ---- Screenshots of the profile reports (issue 12) --------------------------------------------------------------

CHROMIUM = "/usr/bin/chromium"
#: notebook -> (a line of its profiled cell, what its report must show)
REPORTS = {
    "01_quickstart.ipynb": ("%%tpu_profile --top 5", ("peak",)),
    "03_recompilations.ipynb": ("for tokens, labels in batches:\n    loss = train_step(tokens", ("findings", "grouped", "peak")),
    "05_memory.ipynb": ('with torchtpu_lab.eager_mode("strict"):', ("peak",)),
}


#: JupyterLab's own rules for HTML outputs (jlab_core's .jp-RenderedHTMLCommon), which the report must override:
#: they right-align every cell and let every cell wrap
_JUPYTERLAB_CSS = """
.jp-RenderedHTMLCommon td, .jp-RenderedHTMLCommon th, .jp-RenderedHTMLCommon tr {
  vertical-align: middle; padding: 0.5em; line-height: normal; white-space: normal; max-width: none; border: none; }
:not(.jp-RenderedMarkdown).jp-RenderedHTMLCommon td, :not(.jp-RenderedMarkdown).jp-RenderedHTMLCommon th,
:not(.jp-RenderedMarkdown).jp-RenderedHTMLCommon tr { text-align: right; }
"""

#: measured in the page: how far the document is wider than the window, text cells that are right-aligned,
#: how many lines of text each "line" cell takes (one, when it does not wrap)
_LAYOUT_JS = """() => {
  const report = document.querySelector('.ttl-report');
  const texts = [...report.querySelectorAll('td:not(.num)')].filter(td => td.innerText.trim() &&
      getComputedStyle(td).textAlign === 'right').map(td => td.innerText.slice(0, 40));
  return {page_overflow: document.documentElement.scrollWidth - window.innerWidth,
          right_aligned_text: texts,
          line_rows: [...report.querySelectorAll('td.line')].filter(td => td.innerText.trim()).map(td => {
            const r = document.createRange(); r.selectNodeContents(td);  // rows: distinct tops (a link adds a box)
            return new Set([...r.getClientRects()].map(b => Math.round(b.top))).size; })};
}"""


@pytest.mark.parametrize("name", [pytest.param(n, marks=_reads_run(n)) for n in sorted(REPORTS)])
def test_profile_report_screenshot_in_headless_chromium(name, tmp_path):
    """Each report is rendered by headless Chromium as the notebook shows it, screenshotted (kept under
    $TORCHTPU_LAB_SCREENSHOTS when set) and checked for its key elements: findings first, compiles grouped by
    cause with a fix, the memory peak."""
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is missing (apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    marker, must = REPORTS[name]
    code = _run(name)
    html = _text(_cell(code, marker), "text/html")
    assert 'class="ttl-report"' in html, html[:500]
    out_dir = os.environ.get("TORCHTPU_LAB_SCREENSHOTS") or str(tmp_path)
    os.makedirs(out_dir, exist_ok=True)
    shot = os.path.join(out_dir, name.replace(".ipynb", "_report.png"))
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--headless=new", "--no-sandbox", "--disable-gpu"])
        try:
            layout = {}
            for width in (1024, 1440):  # a laptop, and a wide window: nothing may be cut off at either
                page = browser.new_page(viewport={"width": width, "height": 900})
                page.set_content(f"<html><head><style>{_JUPYTERLAB_CSS}</style></head><body>"
                                 f'<div class="jp-RenderedHTMLCommon">{html}</div></body></html>')
                report = page.locator(".ttl-report")
                sync_api.expect(report).to_be_visible()
                report.screenshot(path=shot.replace(".png", f"_{width}.png"))
                layout[width] = page.evaluate(_LAYOUT_JS)
            report.screenshot(path=shot)
            peak = page.locator(".ttl-peak").inner_text()
            heads = page.locator(".ttl-report h4").all_inner_texts()
            findings = page.locator(".ttl-findings li").all_inner_texts()
            # a group's row, then its cause and fix on a full-width row under it
            recompile_rows = [a + "\n" + b for a, b in zip(page.locator("tr.ttl-recompile").all_inner_texts(),
                                                           page.locator("tr.ttl-recompile-detail").all_inner_texts())]
        finally:
            browser.close()
    assert os.path.getsize(shot) > 5000
    for width, got in layout.items():
        # every table fits its scroll box or scrolls in it (none reaches past the page), text is left-aligned,
        # and "cell [N], line L" stays on one line
        assert got["page_overflow"] <= 1, (width, got)
        assert got["right_aligned_text"] == [], (width, got)
        assert got["line_rows"] and all(n == 1 for n in got["line_rows"]), (width, got)
    assert re.fullmatch(r"[\d.]+ (KiB|MiB|GiB)", peak), peak
    assert "Where the wall time went" in heads
    if "findings" in must:
        assert heads[0] == "Findings" and findings and "recompilation" in findings[0], (heads, findings)
    if "grouped" in must:
        assert len(recompile_rows) == 1 and "took" in recompile_rows[0] and "fix: pad or bucket" in recompile_rows[0]
