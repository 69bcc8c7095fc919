import os
import tempfile

os.environ.setdefault("TORCHTPU_LAB_PLATFORM", "cpu")
# The persistent executable cache's default directory (used by %load_ext in IPython tests and notebook kernels)
# lives under $XDG_CACHE_HOME: point it at a directory of this run, so no test reads executables an earlier run
# (or the user) stored, and none is left behind in the home directory.
os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="torchtpu-lab-tests-cache-")
# The suite checks results, not the speed of the code XLA:CPU generates, and compiling is most of its time: LLVM's
# optimizer is most of each XLA:CPU compile (the conformance subset: 63 -> 40 s of CPU for 30 ops). Tests, their
# subprocesses and their notebook kernels compile with it off. TORCHTPU_LAB_TEST_OPTIMIZED=1 keeps XLA's defaults.
if os.environ["TORCHTPU_LAB_PLATFORM"] == "cpu" and os.environ.get("TORCHTPU_LAB_TEST_OPTIMIZED") != "1":
    os.environ["XLA_FLAGS"] = ("--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true "
                               + os.environ.get("XLA_FLAGS", "")).strip()

import pytest  # noqa: E402
import torch  # noqa: E402

import torchtpu_lab  # noqa: E402


@pytest.fixture(scope="module")
def ip():
    """A real IPython shell with ``%load_ext torchtpu_lab`` (its banner checked), shared by a test module."""
    from IPython import get_ipython
    from IPython.testing.globalipapp import start_ipython
    from IPython.utils.capture import capture_output

    shell = start_ipython() or get_ipython()
    with capture_output() as cap:
        shell.run_cell("%load_ext torchtpu_lab")
    assert "tpu device on XLA:" in cap.stdout or any("tpu device on XLA:" in o.data.get("text/plain", "")
                                                      for o in cap.outputs)
    shell.run_cell("import torch, torchtpu_lab")
    yield shell
    shell.run_cell("%unload_ext torchtpu_lab")
    torchtpu_lab.set_eager_mode("fused")  # unloading leaves strict mode; later test modules expect the default


@pytest.fixture
def limit():
    """Restore the fused graph size limit and forget cut points after the test (tests that lower the limit)."""
    from torchtpu_lab import config
    from torchtpu_lab.runtime import fused

    saved = config.max_graph_ops.value
    fused.CUTS.clear()
    yield
    torchtpu_lab.sync()
    config.max_graph_ops.set(saved)
    fused.CUTS.clear()


@pytest.fixture
def seeded():
    torch.manual_seed(0)
    yield


@pytest.fixture(autouse=True)
def _restore_global_state():
    """Every test starts from, and leaves, the session defaults: eager mode, CPU fallback, finite checks, open
    recorders and memory listeners, source tracking, the graph-size limit, matmul precision and the persistent
    cache directory (a test that turned it on must not make later tests load executables from disk rather than
    compile them: their compile counts would read 0). A test that fails half-way cannot leak its settings into
    the next one."""
    saved = torchtpu_lab.session.snapshot()
    yield
    torchtpu_lab.session.restore(saved)
