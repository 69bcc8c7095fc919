"""The JupyterLab extension: the kernel side of its comm, its installation, and the real thing in a browser.

(a) drives ``torchtpu_lab.jupyter.comm``'s handler with a fake comm: only the fixed commands act, anything else
    is refused with an error reply and changes nothing;
(b) ``jupyter labextension list`` shows the prebuilt extension enabled (it is installed by ``pip install``);
(c) end to end: ``jupyter lab`` on a free port, Debian's chromium driven by Playwright, a notebook that loads
    the extension and compiles a graph, and the status bar and the side panel showing mode, compiles and
    memory. Skipped (with the reason) where /usr/bin/chromium or Playwright is missing.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from torchtpu_lab.jupyter import comm as tpucomm
from torchtpu_lab.runtime import compile_cache, modes

ROOT = Path(__file__).resolve().parents[1]
JUPYTER = Path(sys.executable).with_name("jupyter")
CHROMIUM = "/usr/bin/chromium"


class FakeComm:
    """Stands in for an ipykernel Comm: records what is sent and lets the test deliver messages."""

    def __init__(self):
        self.comm_id = uuid.uuid4().hex
        self.sent: list[dict] = []
        self._on_msg = None
        self.closed = False

    def send(self, data=None, **kwargs):
        json.dumps(data)  # what goes over the wire must be plain JSON
        self.sent.append(data)

    def on_msg(self, callback):
        self._on_msg = callback

    def on_close(self, callback):
        self._on_close = callback

    def close(self, *args, **kwargs):
        self.closed = True

    def deliver(self, data) -> dict:
        self._on_msg({"content": {"comm_id": self.comm_id, "data": data}})
        return self.sent[-1]


@pytest.fixture
def fake_comm():
    c = FakeComm()
    tpucomm._adopt(c)
    previous = modes.current()
    yield c
    tpucomm._forget(c)
    modes.set_eager_mode(previous)


MALFORMED = [
    None,
    "status",
    ["status"],
    42,
    {},
    {"command": "status"},  # no version
    {"v": 2, "id": "a", "command": "status"},
    {"v": "1", "id": "a", "command": "status"},
    {"v": True, "id": "a", "command": "status"},
    {"v": 1, "id": 7, "command": "status"},
    {"v": 1, "id": "x" * 500, "command": "status"},
    {"v": 1, "id": "a", "command": "status", "code": "import os"},
    {"v": 1, "id": "a", "command": ["set_mode"]},
    {"v": 1, "id": "a", "command": "set_mode"},
    {"v": 1, "id": "a", "command": "set_mode", "args": {"mode": "turbo"}},
    {"v": 1, "id": "a", "command": "set_mode", "args": {"mode": "debug", "extra": 1}},
    {"v": 1, "id": "a", "command": "set_mode", "args": "debug"},
    {"v": 1, "id": "a", "command": "set_mode", "args": {"mode": ["debug"]}},
    {"v": 1, "id": "a", "command": "clear_cache", "args": {"path": "/"}},
    {"v": 1, "id": "a", "command": "status", "args": {"x": 1}},
]

UNKNOWN = [
    {"v": 1, "id": "u1", "command": "exec", "args": {"code": "open('/tmp/pwned', 'w')"}},
    {"v": 1, "id": "u2", "command": "eval"},
    {"v": 1, "id": "u3", "command": "__import__('os').system('true')"},
    {"v": 1, "id": "u4", "command": "run_cell", "args": {}},
    {"v": 1, "id": "u5", "command": "STATUS"},
]


@pytest.fixture
def actions(monkeypatch):
    """Records every call of the two state-changing actions a request could reach."""
    calls: list = []
    real_set = modes.set_eager_mode
    monkeypatch.setattr(modes, "set_eager_mode", lambda m: (calls.append(("set_eager_mode", m)), real_set(m))[1])
    monkeypatch.setattr(compile_cache, "clear", lambda: calls.append(("clear",)) or 0)
    return calls


def _observable_state():
    return modes.current(), compile_cache.directory()


@pytest.mark.parametrize("payload", UNKNOWN, ids=lambda p: p["command"][:20])
def test_unknown_commands_are_refused_and_change_nothing(fake_comm, payload, actions):
    modes.set_eager_mode("strict")
    actions.clear()
    before = _observable_state()
    reply = fake_comm.deliver(payload)
    assert reply["v"] == 1 and reply["type"] == "error", reply
    assert reply["id"] == payload["id"]
    assert "unknown command" in reply["error"]
    assert "data" not in reply
    assert _observable_state() == before and actions == []
    assert not os.path.exists("/tmp/pwned")


@pytest.mark.parametrize("payload", MALFORMED, ids=lambda p: repr(p)[:40])
def test_malformed_payloads_are_refused_and_change_nothing(fake_comm, payload, actions):
    modes.set_eager_mode("strict")
    actions.clear()
    before = _observable_state()
    reply = fake_comm.deliver(payload)
    assert reply["v"] == 1 and reply["type"] == "error" and reply["error"], reply
    assert reply["id"] in (None, "a")
    assert "data" not in reply
    assert _observable_state() == before and actions == []


def test_malformed_comm_messages_are_refused(fake_comm):
    fake_comm._on_msg({"content": {"comm_id": fake_comm.comm_id}})  # no data at all
    assert fake_comm.sent[-1]["type"] == "error"
    fake_comm._on_msg("not a message")
    assert fake_comm.sent[-1]["type"] == "error"


def test_the_fixed_commands_act_and_reply_with_status(fake_comm, actions):
    reply = fake_comm.deliver({"v": 1, "id": "s1", "command": "status"})
    assert reply["type"] == "reply" and reply["id"] == "s1"
    data = reply["data"]
    for key in ("platform", "mode", "memory", "compiles", "cache_hit_rate", "compilations", "memory_history"):
        assert key in data
    json.dumps(data)
    reply = fake_comm.deliver({"v": 1, "id": "m1", "command": "set_mode", "args": {"mode": "debug"}})
    assert reply["type"] == "reply" and reply["message"] == "eager mode: debug" and modes.current() == "debug"
    assert reply["data"]["mode"] == "debug"
    reply = fake_comm.deliver({"v": 1, "id": "c1", "command": "clear_cache"})
    assert reply["type"] == "reply" and "removed " in reply["message"]
    assert actions == [("set_eager_mode", "debug"), ("clear",)]


def test_status_carries_compilations_with_causes_and_lines(fake_comm):
    import torch

    modes.set_eager_mode("fused")
    x = torch.randn(8, 8, device="tpu")
    (x @ x).relu().sum().item()
    data = fake_comm.deliver({"v": 1, "id": "s2", "command": "status"})["data"]
    assert data["compiles"] + data["disk_loads"] >= 1 and data["compilations"]
    last = data["compilations"][-1]
    assert last["cause"] and last["where"] and "seconds" in last


def test_setup_is_a_no_op_in_a_terminal_ipython():
    class Terminal:  # what a TerminalInteractiveShell looks like to setup(): no kernel
        events = None

    assert tpucomm.setup(Terminal(), lambda: True) is False


def _iopub_until_idle(kc, parent_id: str, timeout: float = 120) -> list[dict]:
    msgs = []
    deadline = time.time() + timeout
    while time.time() < deadline:
        msg = kc.get_iopub_msg(timeout=max(0.1, deadline - time.time()))
        if msg["parent_header"].get("msg_id") != parent_id:
            continue
        msgs.append(msg)
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            return msgs
    raise TimeoutError("kernel did not go idle")


@pytest.mark.timeout(300)
def test_in_a_real_kernel_the_comm_opens_answers_refuses_and_closes_on_unload(tmp_path):
    jupyter_client = pytest.importorskip("jupyter_client")
    pytest.importorskip("ipykernel")
    env = dict(os.environ, TORCHTPU_LAB_PLATFORM="cpu", TORCHTPU_LAB_CACHE_DIR=str(tmp_path / "xla-cache"),
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    km = jupyter_client.KernelManager(kernel_name="python3")
    km.kernel_spec.argv[0] = sys.executable  # this environment's Python, whatever the spec says
    km.start_kernel(env=env, cwd=str(tmp_path))
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=120)
        assert kc.comm_info(target_name=tpucomm.TARGET, reply=True)["content"]["comms"] == {}

        msgs = _iopub_until_idle(kc, kc.execute("%load_ext torchtpu_lab\nimport torch"))
        opens = [m for m in msgs if m["msg_type"] == "comm_open"]
        assert len(opens) == 1 and opens[0]["content"]["target_name"] == "torchtpu_lab"
        comm_id = opens[0]["content"]["comm_id"]
        pushes = [m["content"]["data"] for m in msgs if m["msg_type"] == "comm_msg"]
        assert pushes and pushes[-1]["v"] == 1 and pushes[-1]["type"] == "status"
        assert pushes[-1]["data"]["mode"] == "fused"
        comms = kc.comm_info(target_name=tpucomm.TARGET, reply=True)["content"]["comms"]
        assert list(comms) == [comm_id]  # what a reloaded page finds and attaches to

        def request(data) -> dict:
            msg = kc.session.msg("comm_msg", {"comm_id": comm_id, "data": data})
            kc.shell_channel.send(msg)
            replies = [m["content"]["data"] for m in _iopub_until_idle(kc, msg["header"]["msg_id"])
                       if m["msg_type"] == "comm_msg"]
            assert len(replies) == 1, replies
            return replies[0]

        reply = request({"v": 1, "id": "x", "command": "exec", "args": {"code": "import os; os.remove('x')"}})
        assert reply["type"] == "error" and "unknown command" in reply["error"] and "data" not in reply
        reply = request({"v": 1, "id": "y", "command": "set_mode", "args": {"mode": "strict"}})
        assert reply["type"] == "reply" and reply["id"] == "y" and reply["data"]["mode"] == "strict"

        msgs = _iopub_until_idle(kc, kc.execute("x = torch.ones(4, device='tpu'); x.sum().item()"))
        pushes = [m["content"]["data"] for m in msgs if m["msg_type"] == "comm_msg"]
        assert pushes[-1]["reason"] == "cell" and pushes[-1]["data"]["memory"]["allocated"] >= 16

        msgs = _iopub_until_idle(kc, kc.execute("%unload_ext torchtpu_lab"))
        assert [m["content"]["data"] for m in msgs if m["msg_type"] == "comm_msg"][-1] == {"v": 1, "type": "unloaded"}
        assert any(m["msg_type"] == "comm_close" and m["content"]["comm_id"] == comm_id for m in msgs)
        assert kc.comm_info(target_name=tpucomm.TARGET, reply=True)["content"]["comms"] == {}
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_frontend_unit_tests_pass():
    """``npm test`` in extension/ (the frontend model's unit tests); skipped where Node or node_modules is missing."""
    npm = shutil.which("npm")
    if npm is None or not (ROOT / "extension" / "node_modules").is_dir():
        pytest.skip("npm or extension/node_modules is missing (cd extension && npm ci)")
    out = subprocess.run([npm, "test"], cwd=ROOT / "extension", capture_output=True, text=True, timeout=300,
                         check=False)
    assert out.returncode == 0 and "# fail 0" in out.stdout, out.stdout[-3000:] + out.stderr[-3000:]


# ---- (b) installation ----------------------------------------------------------------------------------------

def test_labextension_list_shows_it_enabled():
    try:
        importlib.metadata.distribution("torchtpu-lab")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("torchtpu-lab is not pip-installed in this environment (make install does it)")
    if not JUPYTER.exists():
        pytest.skip("jupyterlab is not installed in this environment")
    out = subprocess.run([str(JUPYTER), "labextension", "list"], capture_output=True, text=True, timeout=120, check=False)
    text = re.sub(r"\x1b\[[0-9;]*m", "", out.stdout + out.stderr)
    assert re.search(r"torchtpu-lab v\S+ enabled\s+OK", text), text


def test_the_prebuilt_extension_is_in_the_package():
    built = ROOT / "torchtpu_lab" / "labextension"
    meta = json.loads((built / "package.json").read_text())
    assert meta["name"] == "torchtpu-lab"
    assert (built / meta["jupyterlab"]["_build"]["load"]).exists()


# ---- (c) end to end in a browser -----------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_http(url: str, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"jupyter lab exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except Exception:  # noqa: BLE001
            time.sleep(0.3)
    raise TimeoutError(url)


CELLS = [
    "%load_ext torchtpu_lab",
    "import torch\nx = torch.randn(128, 256, device='tpu')\ny = (x @ x.T).relu().sum()\nprint('result', y.item())",
    "%%tpu_profile --no-flame\nz = (x * 3).tanh().mean()\nprint('profiled', z.item())",
    # issue 22: the panel's views, with a comparison
    "%%tpu_profile --no-flame --compare -1\nw = (x @ x.T).relu()\nfor _ in range(3):\n    print('compared', w.sum().item())",
    # issue 23 (9): a compile of seconds (one ~800-op graph) shows "compiling… N s" while it runs
    ("v = x[:64, :64]\nfor i in range(400):\n    v = (v * 1.0001 + 0.5).sin() if i % 2 else (v @ v.T).tanh()\n"
     "print('long compile done', v.sum().item())"),
]

#: where screenshots go (kept by CI when set), else the test's tmp_path
SHOTS = os.environ.get("TORCHTPU_LAB_SCREENSHOTS")


@pytest.fixture(scope="module")
def lab_server(tmp_path_factory):
    """One ``jupyter lab`` per module, serving THIS checkout's built extension (``torchtpu_lab/labextension``)
    ahead of whatever a pip install put in the environment's share directory."""
    tmp_path = tmp_path_factory.mktemp("lab")
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is missing (apt-get install chromium)")
    pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")
    if not JUPYTER.exists():
        pytest.skip("jupyterlab is not installed in this environment")
    root = tmp_path / "root"
    root.mkdir()
    nb = {"nbformat": 4, "nbformat_minor": 5,
          "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
          "cells": [{"cell_type": "code", "id": f"c{i}", "metadata": {}, "execution_count": None, "outputs": [],
                     "source": src} for i, src in enumerate(CELLS)]}
    (root / "tpu.ipynb").write_text(json.dumps(nb))
    (root / "plain.ipynb").write_text(json.dumps({**nb, "cells": [nb["cells"][0] | {"source": "1 + 1"}]}))
    port, token = _free_port(), uuid.uuid4().hex
    env = dict(os.environ, TORCHTPU_LAB_PLATFORM="cpu", TORCHTPU_LAB_CACHE_DIR=str(tmp_path / "xla-cache"),
               JUPYTER_CONFIG_DIR=str(tmp_path / "config"), JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"),
               JUPYTERLAB_WORKSPACES_DIR=str(tmp_path / "workspaces"), JUPYTERLAB_SETTINGS_DIR=str(tmp_path / "settings"),
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    notification = tmp_path / "settings" / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    notification.parent.mkdir(parents=True)
    notification.write_text(json.dumps({"fetchNews": "false"}))
    ours = tmp_path / "labextensions"
    shutil.copytree(ROOT / "torchtpu_lab" / "labextension", ours / "torchtpu-lab")
    log = open(tmp_path / "lab.log", "w")
    proc = subprocess.Popen(
        [str(JUPYTER), "lab", "--no-browser", "--ip=127.0.0.1", f"--port={port}", "--ServerApp.port_retries=0",
         f"--LabApp.extra_labextensions_path={ours}",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
         "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate", "--LabApp.news_url=None"]
        + (["--allow-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else []),
        cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait_http(f"http://127.0.0.1:{port}/api/status?token={token}", proc, 60)
        yield f"http://127.0.0.1:{port}", token
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def _run_cell(page, index: int) -> None:
    page.locator(".jp-Notebook .jp-Cell").nth(index).click()
    page.keyboard.press("Shift+Enter")


def _check_status_item_fits(page, status_item, width: int) -> None:
    """Issue 23 (9): the item is as tall as the status bar, vertically centred in it, in JupyterLab's own font
    size, and not cut (its text fits its box) at this window width."""
    bar = page.locator("#jp-main-statusbar").bounding_box()
    box = status_item.bounding_box()
    assert box is not None and bar is not None
    assert abs((box["y"] + box["height"] / 2) - (bar["y"] + bar["height"] / 2)) <= 2, (box, bar)
    assert box["x"] + box["width"] <= width, (box, width)
    fits = status_item.evaluate("n => [n, ...n.children].every(e => e.scrollWidth <= e.clientWidth + 1)")
    assert fits, (width, status_item.inner_text())
    sizes = page.evaluate("""() => {
        const ours = document.querySelector('.jp-torchtpu-status');
        const theirs = [...document.querySelectorAll('#jp-main-statusbar .jp-StatusBar-TextItem')]
            .find(n => n.offsetParent !== null && !ours.contains(n));
        return [getComputedStyle(ours).fontSize, theirs ? getComputedStyle(theirs).fontSize : null];
    }""")
    assert sizes[1] is None or sizes[0] == sizes[1], sizes


def _new_views_compiling_and_links(page, panel, status_item, shots: Path) -> None:
    """Issues 22 and 23 (7, 9) in the browser: the profile views and the comparison in the panel, the compile
    share and the "compiling… N s" state in the status bar, the clear-cache confirmation, a report link that
    jumps to its cell, and screenshots at 1024 and 1440 px."""
    from playwright.sync_api import expect

    assert re.search(r"compile \d+% of time", status_item.inner_text()), status_item.inner_text()
    _run_cell(page, 3)  # %%tpu_profile --compare -1
    expect(panel.locator(".jp-torchtpu-profile-summary")).to_contain_text("(cell [4])", timeout=120_000)
    expect(panel.locator(".jp-torchtpu-compare")).to_contain_text("compared with -1")
    assert re.search(r"syncs: \d+ → \d+", panel.locator(".jp-torchtpu-compare").inner_text())
    expect(panel.locator(".jp-torchtpu-hardware")).to_contain_text("MFU")
    expect(panel.locator(".jp-torchtpu-hardware")).to_contain_text("peaks:")
    assert re.search(r"(compute|memory)-bound", panel.locator(".jp-torchtpu-programs").inner_text())
    expect(panel.locator(".jp-torchtpu-owners")).to_contain_text("tensor")
    expect(panel.locator(".jp-torchtpu-compile").first).to_contain_text("fused graph of")

    # every text the status item shows while the long compile runs
    page.evaluate("""() => {
        window.__tpuTexts = [];
        const n = document.querySelector('.jp-torchtpu-status');
        new MutationObserver(() => window.__tpuTexts.push(n.textContent))
            .observe(n, {childList: true, subtree: true, characterData: true});
    }""")
    _run_cell(page, 4)
    expect(page.locator(".jp-Notebook .jp-OutputArea-output").filter(has_text="long compile done")).to_be_visible(
        timeout=180_000)
    texts = page.evaluate("window.__tpuTexts")
    compiling = [t for t in texts if re.search(r"compiling… \d+ s", t)]
    assert compiling, texts[-10:]
    expect(status_item).not_to_contain_text("compiling", timeout=30_000)
    expect(panel.locator(".jp-torchtpu-compiling")).to_be_hidden()

    # clearing the compile cache asks first; Cancel changes nothing
    panel.locator("button.jp-torchtpu-clear-cache").click()
    dialog = page.locator(".jp-Dialog")
    expect(dialog).to_contain_text("Clear the compile cache?", timeout=10_000)
    expect(dialog).to_contain_text("compiles again")
    dialog.locator("button", has_text="Cancel").click()
    expect(dialog).to_be_hidden()
    assert "removed" not in panel.locator(".jp-torchtpu-message").inner_text()
    panel.locator("button.jp-torchtpu-clear-cache").click()
    page.locator(".jp-Dialog button", has_text="Clear").click()
    expect(panel.locator(".jp-torchtpu-message")).to_contain_text("removed", timeout=30_000)

    # issue 23 (7): "cell [N], line L" in the report jumps to that cell
    page.locator(".jp-Notebook .jp-Cell").first.click()
    link = page.locator(".jp-Notebook .jp-OutputArea-output a.ttl-goto[data-cell='4']").first
    link.scroll_into_view_if_needed()
    line = int(link.get_attribute("data-line"))
    link.click()
    active = page.locator(".jp-Notebook .jp-Cell.jp-mod-active")
    expect(active.locator(".jp-InputPrompt")).to_contain_text("[4]", timeout=10_000)
    cursor_line = page.evaluate("""() => {
        const view = document.querySelector('.jp-Cell.jp-mod-active .cm-content');
        const sel = window.getSelection();
        const lineNode = sel && sel.anchorNode ? (sel.anchorNode.nodeType === 1 ? sel.anchorNode
            : sel.anchorNode.parentElement).closest('.cm-line') : null;
        return lineNode ? [...view.querySelectorAll('.cm-line')].indexOf(lineNode) + 1 : null;
    }""")
    assert cursor_line == line, (cursor_line, line)

    for width in (1024, 1440):
        page.set_viewport_size({"width": width, "height": 900})
        page.wait_for_timeout(500)
        _check_status_item_fits(page, status_item, width)
        page.screenshot(path=str(shots / f"jupyterlab-panel-{width}.png"))
    panel.locator(".jp-torchtpu-profile").scroll_into_view_if_needed()
    panel.locator(".jp-torchtpu-profile").screenshot(path=str(shots / "jupyterlab-panel-profile-views.png"))


@pytest.mark.timeout(480)
def test_status_bar_and_panel_in_a_real_browser(lab_server, tmp_path):
    from playwright.sync_api import expect, sync_playwright

    base, token = lab_server
    shot = tmp_path / "jupyterlab.png"
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM,
            args=["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run"])
        page = browser.new_page(viewport={"width": 1500, "height": 950})
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        try:
            page.goto(f"{base}/lab/tree/tpu.ipynb?token={token}")
            # the kernel is ready when the toolbar's kernel status shows idle
            page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)
            expect(page.locator("#jp-main-statusbar")).to_contain_text("Idle", timeout=90_000)
            status_item = page.locator(".jp-torchtpu-status")
            # before %load_ext the item is hidden (the kernel has no torchtpu_lab): no text, not visible
            assert status_item.count() == 0 or not status_item.is_visible()

            _run_cell(page, 0)  # %load_ext torchtpu_lab
            page.keyboard.press("Shift+Enter")  # compile and run a graph
            page.keyboard.press("Shift+Enter")  # %%tpu_profile another
            for printed in ("result", "profiled"):
                # .first: the profile report also shows the printing line's source text
                expect(page.locator(".jp-Notebook .jp-OutputArea-output").filter(has_text=printed).first).to_be_visible(
                    timeout=120_000)

            expect(status_item).to_be_visible(timeout=30_000)
            expect(status_item).to_contain_text("fused", timeout=30_000)
            text = status_item.inner_text()
            assert re.search(r"tpu XLA:\w+ · fused · [\d.]+ (B|KiB|MiB|GiB) · ", text), text
            compiles = int(re.search(r"(\d+) compiles?\b", text).group(1))
            assert compiles > 0, text

            # open the side panel from its tab in the right sidebar
            page.locator(".jp-SideBar.jp-mod-right .lm-TabBar-tab[data-id='torchtpu-lab-panel']").click()
            panel = page.locator("#torchtpu-lab-panel")
            expect(panel).to_be_visible(timeout=10_000)
            expect(panel.locator(".jp-torchtpu-summary")).to_contain_text("eager mode: fused")
            summary = panel.locator(".jp-torchtpu-summary").inner_text()
            assert re.search(r"memory: [\d.]+ (B|KiB|MiB|GiB) \(peak", summary), summary
            assert int(re.search(r"compiles: (\d+)", summary).group(1)) > 0, summary
            expect(panel.locator(".jp-torchtpu-compile").first).to_contain_text("cell [")
            assert panel.locator(".jp-torchtpu-chart polyline").get_attribute("points")
            # the profiled cell now also shows the memory timeline (a graph's run counts), whose first plotly
            # figure imports plotly in the kernel: seconds on a busy 2-core machine
            expect(panel.locator(".jp-torchtpu-profile-summary")).to_contain_text(
                "last %%tpu_profile (cell [3])", timeout=120_000)
            expect(panel.locator(".jp-torchtpu-profile-summary")).to_contain_text("compiles 1")

            # a panel button runs a fixed action in the kernel: switch to strict mode and back
            panel.locator("button.jp-torchtpu-mode[data-mode='strict']").click()
            expect(status_item).to_contain_text("strict", timeout=30_000)
            expect(panel.locator(".jp-torchtpu-message")).to_contain_text("eager mode: strict")
            panel.locator("button.jp-torchtpu-mode[data-mode='fused']").click()
            expect(status_item).to_contain_text("fused", timeout=30_000)
            page.screenshot(path=str(shot))
            _new_views_compiling_and_links(page, panel, status_item, Path(SHOTS) if SHOTS else tmp_path)
            page.set_viewport_size({"width": 1500, "height": 950})

            # switching to a notebook whose kernel has no torchtpu_lab hides the item and empties the panel
            page.locator(".jp-DirListing-item", has_text="plain.ipynb").dblclick()
            expect(page.locator(".lm-TabBar-tab.lm-mod-current", has_text="plain.ipynb")).to_be_visible(
                timeout=30_000)
            expect(panel.locator(".jp-torchtpu-session")).to_contain_text("plain.ipynb", timeout=30_000)
            expect(panel.locator(".jp-torchtpu-empty")).to_contain_text("not loaded", timeout=60_000)
            expect(status_item).to_be_hidden(timeout=10_000)
            # and back: the tpu notebook's session again
            page.locator(".lm-TabBar-tab", has_text="tpu.ipynb").first.click()
            expect(panel.locator(".jp-torchtpu-summary")).to_contain_text("eager mode: fused", timeout=30_000)
            expect(status_item).to_contain_text("fused", timeout=30_000)

            # a page reload finds the open comm again (comm_info) without re-running %load_ext
            page.reload()
            page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)
            page.locator(".lm-TabBar-tab", has_text="tpu.ipynb").first.click()
            status_item = page.locator(".jp-torchtpu-status")
            expect(status_item).to_contain_text("fused", timeout=60_000)
            tab = page.locator(".jp-SideBar.jp-mod-right .lm-TabBar-tab[data-id='torchtpu-lab-panel']")
            if not page.locator("#torchtpu-lab-panel").is_visible():
                tab.click()
            panel = page.locator("#torchtpu-lab-panel")
            expect(panel.locator(".jp-torchtpu-summary")).to_contain_text("eager mode: fused", timeout=30_000)
            page.screenshot(path=str(tmp_path / "jupyterlab-after-reload.png"))
        except Exception:
            page.screenshot(path=str(tmp_path / "failure.png"))
            raise
        finally:
            browser.close()
    assert shot.exists()
    assert not [e for e in errors if "torchtpu" in e], errors


def test_status_is_pushed_live_while_a_cell_runs_throttled(fake_comm, monkeypatch):
    """Issue 12 (10): during a long loop the panel gets "live" statuses after compiles and syncs, at most one per
    interval, and the throttle costs the loop next to nothing."""
    import torch

    from torchtpu_lab import telemetry

    monkeypatch.setattr(tpucomm, "LIVE_INTERVAL_S", 0.05)
    hooked = tpucomm.live in telemetry.live_hooks
    if not hooked:
        telemetry.live_hooks.append(tpucomm.live)
    try:
        modes.set_eager_mode("fused")
        fake_comm.sent.clear()
        t0 = time.perf_counter()
        for n in range(2, 8):  # elementwise only: no graph that later tests' cause search could pick as nearest
            (torch.ones(n, 29).to("tpu") * 3 - 1).abs().amax().item()
            time.sleep(0.06)
        elapsed = time.perf_counter() - t0
    finally:
        if not hooked:
            telemetry.live_hooks.remove(tpucomm.live)
    live = [m for m in fake_comm.sent if m.get("type") == "status" and m.get("reason") == "live"]
    assert len(live) >= 3, [m.get("reason") for m in fake_comm.sent]
    assert len(live) <= elapsed / 0.05 + 1  # throttled
    counts = [m["data"]["compiles"] + m["data"]["disk_loads"] for m in live]
    assert counts == sorted(counts) and counts[-1] > counts[0]  # the counters move during the loop
    # the throttle itself: one clock read per compile/sync when nothing is due
    tpucomm._state["last_live"] = time.monotonic() + 3600
    t0 = time.perf_counter()
    for _ in range(10000):
        tpucomm.live()
    per_call = (time.perf_counter() - t0) / 10000
    tpucomm._state["last_live"] = 0.0
    assert per_call < 20e-6


# ---- issue 22 and 23 (9): the panel's views, the compiling state, peaks, ranks ---------------------------------

def test_panel_views_of_a_profiled_cell_and_its_comparison(ip):
    """The last %%tpu_profile's panel payload: FLOPs/MFU with the peaks' source, the costliest programs with
    their bound and line, the owners of memory at the peak, and the --compare summary (only for that cell)."""
    from IPython.utils.capture import capture_output

    with capture_output():
        ip.run_cell("%%tpu_profile --no-flame\nw = torch.randn(64, 64, device='tpu')\n"
                    "for _ in range(3):\n    (w @ w).relu().sum().item()")
        ip.run_cell("%%tpu_profile --no-flame --compare -1\nv = (w @ w).relu().sum()\nv.item()")
    info = tpucomm._profile_info(ip)
    views = info["views"]
    json.dumps(views)
    assert views["v"] == 1
    hw = views["hardware"]
    assert hw["flops"] > 0 and 0 < hw["mfu"] <= 1 and hw["peak_source"] and "MFU" in hw["text"]
    assert views["programs"] and views["programs"][0]["bound"] in ("compute", "memory")
    assert re.search(r"(compute|memory)-bound", views["programs"][0]["text"]), views["programs"][0]
    assert views["programs"][0]["source"].startswith("cell [")
    owners = views["memory_at_peak"]
    assert owners and sum(o["bytes"] for o in owners) <= views["peak_bytes"] and owners[0]["source"]
    rows = {r["what"]: r for r in views["compare"]["rows"]}
    assert views["compare"]["before"] == "-1" and rows["syncs"]["before"] == "3" and rows["syncs"]["after"] == "1"
    assert rows["syncs"]["change"].startswith("-2")
    with capture_output():
        ip.run_cell("%%tpu_profile --no-flame\n(w + 1).sum().item()")
    assert tpucomm._profile_info(ip)["views"]["compare"] is None  # a cell without --compare shows none


def test_a_long_compile_is_announced_once_and_its_end_follows(fake_comm, monkeypatch):
    """Issue 23 (9): a compile still running after ANNOUNCE_AFTER_S sends compile/start (from the watcher thread,
    while the compiling thread is busy) and compile/end; a short one sends nothing; statuses carry the state."""
    from torchtpu_lab import telemetry
    from torchtpu_lab.jupyter import compile_watch

    monkeypatch.setattr(compile_watch, "ANNOUNCE_AFTER_S", 0.05)
    compile_watch.start(tpucomm.broadcast)
    try:
        fake_comm.sent.clear()
        with telemetry.compiling("graph"):
            time.sleep(0.01)  # short: over before the watcher looks
        time.sleep(0.1)
        assert [m for m in fake_comm.sent if m.get("type") == "compile"] == []
        with telemetry.compiling("graph"):
            deadline = time.time() + 5
            while not any(m.get("type") == "compile" for m in fake_comm.sent) and time.time() < deadline:
                time.sleep(0.02)
            during = tpucomm.snapshot(None)["compiling"]
        msgs = [m for m in fake_comm.sent if m.get("type") == "compile"]
        assert [(m["v"], m["phase"], m["kind"]) for m in msgs] == [(1, "start", "graph"), (1, "end", "graph")]
        # a top-level "state" is ipywidgets' key: nbclient merges it into the notebook's widget state and fails
        assert not [m for m in fake_comm.sent if "state" in m]
        assert msgs[0]["seconds"] >= 0.05 and msgs[1]["seconds"] >= msgs[0]["seconds"]
        assert during["kind"] == "graph" and during["seconds"] > 0
        assert tpucomm.snapshot(None)["compiling"] is None
    finally:
        compile_watch.stop()


def test_every_xla_compile_is_marked_for_the_compiling_state():
    """The runtime marks its compiles (compile_cache.executable) with their kind, on the compiling thread."""
    import torch

    from torchtpu_lab import telemetry

    seen = []
    hook = lambda state, kind, seconds: seen.append((state, kind, seconds))
    telemetry.compile_hooks.append(hook)
    try:
        modes.set_eager_mode("fused")
        (torch.ones(3, 37).to("tpu") * 2.5).exp().sum().item()  # a shape no other test compiles
    finally:
        telemetry.compile_hooks.remove(hook)
    graph = [s for s in seen if s[1] == "graph"]
    assert [s[0] for s in graph[-2:]] == ["start", "end"] and graph[-1][2] > 0, seen
    assert not telemetry.compiling_now


def test_memory_history_marks_a_peak_between_two_samples(fake_comm):
    """The chart's top must be the true peak: a tensor created and freed between two status samples leaves a
    peak marker on the second sample; graph compiles carry their ops for a readable label."""
    import torch

    modes.set_eager_mode("fused")
    earlier = torch.ones(4096, 1024, device="tpu") * 2  # 16 MiB: the session's peak, set before this chart's samples
    earlier.sum().item()
    del earlier
    fake_comm.deliver({"v": 1, "id": "p0", "command": "status"})
    big = torch.ones(512, 1024, device="tpu") * 3  # 2 MiB, more than anything alive now, less than the peak
    big.sum().item()
    del big
    data = fake_comm.deliver({"v": 1, "id": "p1", "command": "status"})["data"]
    _, allocated, peak = data["memory_history"][-1]
    assert peak is not None and data["memory"]["peak"] > peak >= 2 * 1024 * 1024 > allocated
    data = fake_comm.deliver({"v": 1, "id": "p2", "command": "status"})["data"]
    assert data["memory_history"][-1][2] is None  # no new peak since
    graphs = [c for c in data["compilations"] if c["kind"] == "graph"]
    assert graphs and graphs[-1]["ops"] and all(isinstance(n, str) and k >= 1 for n, k in graphs[-1]["ops"])
    assert "compile_share" in data and "compile_seconds" in data and data["ranks"] is not None


def test_rank_progress_files_become_rows(tmp_path):
    """Ranks write their progress into the launch's directory; the launcher reads rows from it, and a process that
    failed is shown failed whatever its last row said."""
    from torchtpu_lab.distributed import rank_status

    rank_status.begin(3)
    assert [r["state"] for r in rank_status.rows()] == ["starting"] * 3
    reporter = rank_status.Reporter(str(tmp_path), 0)
    deadline = time.time() + 5
    while not (tmp_path / "rank0.status.json").exists() and time.time() < deadline:
        time.sleep(0.02)
    assert rank_status.poll(str(tmp_path), [None, None, None])
    row = rank_status.rows()[0]
    assert row["state"] == "running" and row["mode"] in modes.MODES and "compiles" in row
    reporter.finish(ok=True)
    rank_status.write_row(str(tmp_path), {**row, "rank": 1})
    (tmp_path / "rank2.status.json").write_text("{not json")
    assert rank_status.poll(str(tmp_path), [0, 3, None])
    states = [r["state"] for r in rank_status.rows()]
    assert states == ["done", "failed (exit 3)", "starting"], states
    assert not rank_status.poll(str(tmp_path), [0, 3, None])  # nothing new


def rank_job() -> float:
    """Run on each launched rank: one all_reduce on a tpu tensor."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("tpu")
    t = torch.ones(4, device="tpu") * (dist.get_rank() + 1)
    dist.all_reduce(t)
    return float(t.sum().item())


@pytest.mark.sweep
@pytest.mark.timeout(300)
def test_launched_ranks_report_to_the_panel():
    """End to end (slow: starts two Python processes): after launch() the status carries a done row per rank
    with the rank's own compiles."""
    from torchtpu_lab.distributed import launch

    pushes = []
    hook = lambda: pushes.append(1)
    from torchtpu_lab import telemetry

    telemetry.live_hooks.append(hook)
    try:
        results = launch(rank_job, nprocs=2, timeout=240)
    finally:
        telemetry.live_hooks.remove(hook)
    assert [r.value for r in results] == [12.0, 12.0]
    rows = tpucomm.snapshot(None)["ranks"]
    assert [r["rank"] for r in rows] == [0, 1] and all(r["state"] == "done" for r in rows), rows
    assert all(r["compiles"] + r["disk_loads"] > 0 and r["collectives"] >= 1 for r in rows), rows
    assert pushes


def test_report_lines_link_to_their_cell():
    """Issue 23 (7): "cell [N], line L" in the HTML report is a link the extension handles; other labels and
    user text stay escaped text."""
    from torchtpu_lab.render.cell_link import line_html

    html = line_html("cell [12], line 3")
    assert 'class="ttl-goto"' in html and 'data-cell="12"' in html and 'data-line="3"' in html
    assert "href" not in html  # inert without the extension: never navigates away
    assert line_html("train.py:41") == "train.py:41"
    assert line_html("<b>cell [2], line 1</b>").startswith("&lt;b&gt;<a ")
