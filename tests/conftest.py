import os
import tempfile

os.environ.setdefault("TORCHTPU_LAB_PLATFORM", "cpu")
# The persistent executable cache's default directory (used by %load_ext in IPython tests and notebook kernels)
# lives under $XDG_CACHE_HOME: point it at a directory of this run, so no test reads executables an earlier run
# (or the user) stored, and none is left behind in the home directory.
os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="torchtpu-lab-tests-cache-")

import pytest  # noqa: E402
import torch  # noqa: E402

import torchtpu_lab  # noqa: E402,F401


@pytest.fixture
def seeded():
    torch.manual_seed(0)
    yield


@pytest.fixture(autouse=True)
def _restore_global_state():
    """Every test starts from, and leaves, the session defaults: eager mode, CPU fallback, finite checks, open
    recorders and memory listeners, source tracking, the graph-size limit and matmul precision. A test that
    fails half-way cannot leak its settings into the next one."""
    from torchtpu_lab import telemetry
    from torchtpu_lab.device import memory
    from torchtpu_lab.runtime import compile_cache, cpu_fallback, lazy, modes

    saved = (dict(modes._state), dict(cpu_fallback._state), list(telemetry._recorders), list(memory.listeners),
             memory.track_sources, lazy.track_sources, lazy.max_graph_ops, torch.get_float32_matmul_precision(),
             (compile_cache._state["dir"], compile_cache._state["writable"]))
    yield
    mode_state, fallback_state, recorders, listeners, track_mem, track_lazy, max_ops, precision, cache = saved
    # a test that turned the persistent cache on (%load_ext, configure) must not make later tests load
    # executables from disk rather than compile them (their compile counts would read 0)
    compile_cache._state["dir"], compile_cache._state["writable"] = cache
    left_failing_work = None
    if modes.current() != mode_state["mode"]:
        try:
            modes.set_eager_mode(mode_state["mode"])
        except Exception as e:  # noqa: BLE001 — restore everything first, then report it (below)
            left_failing_work = e
    modes._state.clear()
    modes._state.update(mode_state)
    cpu_fallback._state.clear()
    cpu_fallback._state.update(fallback_state)
    telemetry._recorders[:] = recorders
    memory.listeners[:] = listeners
    memory.track_sources, lazy.track_sources, lazy.max_graph_ops = track_mem, track_lazy, max_ops
    torch.set_float32_matmul_precision(precision)
    if left_failing_work is not None:
        raise AssertionError(f"the test left pending fused work that fails when it runs: {left_failing_work!r}") \
            from left_failing_work
