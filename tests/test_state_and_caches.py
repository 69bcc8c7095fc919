"""The session's state and caches: bounded caches that report evictions and clear completely, recorders, RNG
state, what makes an op or graph signature (matmul precision), a fused failure replayed op by op, JAX's global
cache configuration left alone, and the user's line found however the package was imported. (First written as
the regression tests of the architecture review, issue 10: each failed on the code before it.)"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import jax
import pytest
import torch

import torchtpu_lab
from torchtpu_lab import caches, telemetry
from torchtpu_lab.ops import LOWERINGS
from torchtpu_lab.runtime import executor, fused, state


def test_nested_recorders_with_equal_lists_each_remove_their_own():
    outer = telemetry.Recorder()
    inner = telemetry.Recorder()
    with outer as outer_events:
        with inner:
            pass  # both lists are empty, hence equal: removal by equality would drop the outer one here
        assert any(r is outer_events for r in telemetry.recorders)
        telemetry.emit("op", "probe", with_source=False)
    assert [e.name for e in outer_events] == ["probe"]
    assert not any(r is outer_events for r in telemetry.recorders)


@pytest.mark.parametrize("seed", [2**63, 2**63 + 12345, 2**64 - 1])
def test_rng_state_round_trip_keeps_seeds_above_2_63(seed):
    torch.tpu.manual_seed(seed)
    fresh = torch.rand(8, device="tpu").cpu()
    torch.tpu.manual_seed(seed)
    saved = torch.tpu.get_rng_state()
    torch.rand(3, device="tpu")  # advance, then restore
    torch.tpu.set_rng_state(saved)
    assert torch.tpu.initial_seed() == seed
    assert torch.equal(torch.rand(8, device="tpu").cpu(), fresh)


def test_set_rng_state_rejects_garbage_with_a_clear_error():
    with pytest.raises(RuntimeError, match="16 bytes"):
        torch.tpu.set_rng_state(torch.zeros(3))


def test_strict_mode_counts_op_cache_hits():
    from torchtpu_lab.jupyter.status import status

    with torchtpu_lab.eager_mode("strict"):
        x = torch.ones(5, 7, device="tpu")
        before = status().cache_hits
        for _ in range(4):
            x = x * 1.5
        x.cpu()
        with torchtpu_lab.profile() as prof:
            for _ in range(3):
                x = x * 1.5
    assert status().cache_hits >= before + 3
    assert status().cache_hit_rate > 0
    s = prof.summary()
    assert s["cache_hits"] >= 3 and s["cache_hit_rate"] == 1.0


def test_caches_are_bounded_and_evictions_are_reported():
    ops = state.SESSION.op_executables
    old = ops.maxsize
    try:
        caches.resize("ops", 3)
        with torchtpu_lab.eager_mode("strict"):
            for n in range(2, 9):  # seven shapes: seven signatures through a cache of three
                (torch.ones(n, device="tpu") + 1).cpu()
        assert len(ops) <= 3
        assert ops.evictions >= 4
        report = torchtpu_lab.metrics_report()
        assert f"cache ops: {len(ops)}/3 entries" in report and "evictions" in report
    finally:
        caches.resize("ops", old)


def test_cache_clear_empties_every_in_memory_cache_and_work_goes_on():
    (torch.arange(6.0, device="tpu").reshape(2, 3)[1] * 2).cpu()
    assert sum(c["entries"] for c in caches.stats().values()) > 0
    pending = torch.ones(4, device="tpu") * 3  # pending fused work is run, not lost
    message = state.clear_everything()
    assert "in-memory cache entries" in message
    assert all(c["entries"] == 0 for c in caches.stats().values()), caches.stats()
    assert pending.cpu().tolist() == [3.0] * 4
    assert (torch.arange(6.0, device="tpu").reshape(2, 3)[1] * 2).cpu().tolist() == [6.0, 8.0, 10.0]


def test_matmul_precision_is_part_of_the_signature():
    a, b = torch.randn(16, 16, device="tpu"), torch.randn(16, 16, device="tpu")
    with torchtpu_lab.eager_mode("strict"):
        (a @ b).cpu()
        torch.set_float32_matmul_precision("medium")
        with torchtpu_lab.profile() as prof:
            (a @ b).cpu()
    causes = [str(c.detail["cause"]) for c in prof.compiles]
    assert any("matmul precision changed 'highest' -> 'medium'" in c for c in causes), causes


def test_fused_failure_replays_names_the_op_and_poisons_only_its_dependents():
    """An error only XLA sees (here: a host callback that fails when the graph runs) is replayed op by op: the
    error names the op and line, the values depending on it are poisoned, the others are computed."""
    low = LOWERINGS[torch.ops.aten.sin.default]

    def boom(x):
        raise ValueError("device says no")

    def failing_sin(x):
        return jax.pure_callback(boom, jax.ShapeDtypeStruct(x.shape, x.dtype), x)

    state.clear()  # no cached sin signature may bypass the patched lowering
    original = low.fn
    object.__setattr__(low, "fn", failing_sin)  # Lowering is frozen: tests are the one place that swaps a rule
    try:
        with torchtpu_lab.eager_mode("fused"):
            a = torch.arange(4.0, device="tpu")
            torchtpu_lab.sync()
            b = a * 2
            c = torch.sin(b)  # recorded fine: shapes are right; fails only when the graph runs
            d = a + 1
            with pytest.raises(RuntimeError, match=r"aten::sin failed \(recorded at .*test_state_and_caches.py:\d+"):
                torchtpu_lab.sync()
            assert b.cpu().tolist() == [0.0, 2.0, 4.0, 6.0]
            assert d.cpu().tolist() == [1.0, 2.0, 3.0, 4.0]
            with pytest.raises(RuntimeError, match="aten::sin failed"):
                c.cpu()
    finally:
        object.__setattr__(low, "fn", original)
        state.clear()
    assert a.cpu().tolist() == [0.0, 1.0, 2.0, 3.0]
    assert torch.sin(a).cpu().tolist() == pytest.approx(torch.sin(torch.arange(4.0)).tolist())


def test_bare_import_leaves_jax_global_cache_config_alone():
    script = textwrap.dedent("""
        import jax, torch, torchtpu_lab
        x = (torch.ones(3, device="tpu") * 2).sum().item()
        print(repr(jax.config.jax_compilation_cache_dir), torchtpu_lab.global_changes()["jax_enable_x64"])
    """)
    env = {k: v for k, v in os.environ.items() if k != "TORCHTPU_LAB_CACHE_DIR"}
    env["TORCHTPU_LAB_PLATFORM"] = "cpu"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["None", "True"]


def test_configure_never_overrides_a_users_own_jax_cache_dir(tmp_path):
    script = textwrap.dedent(f"""
        import jax
        jax.config.update("jax_compilation_cache_dir", {str(tmp_path / 'theirs')!r})
        import torchtpu_lab
        torchtpu_lab.configure(cache_dir={str(tmp_path / 'ours')!r})
        print(jax.config.jax_compilation_cache_dir)
    """)
    env = {k: v for k, v in os.environ.items() if k != "TORCHTPU_LAB_CACHE_DIR"}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == str(tmp_path / "theirs")


def test_ops_seen_is_filled_off_the_hot_path():
    executor.OPS_SEEN.clear()
    x = torch.ones(3, device="tpu")
    (x + x).cpu()
    assert torch.ops.aten.add.Tensor in executor.OPS_SEEN
    executor.OPS_SEEN.clear()
    (x + x).cpu()  # a cache hit records nothing
    assert torch.ops.aten.add.Tensor not in executor.OPS_SEEN


def test_user_line_is_found_when_the_package_is_imported_through_a_dotted_path(tmp_path):
    """bench/ scripts put ``bench/..`` on sys.path: frames inside the package then carry that unnormalised path,
    and must still not be mistaken for the user's line."""
    import pathlib

    dotted = pathlib.Path(__file__).resolve().parent / ".."  # tests/.. : the repository, not normalised
    script = tmp_path / "user_script.py"
    script.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(dotted)!r})\n"
        "import torch, torchtpu_lab\n"
        "from torchtpu_lab import telemetry\n"
        "with telemetry.Recorder() as events:\n"
        "    x = torch.ones(3, device='tpu') + 1\n"
        "assert torchtpu_lab.__file__.startswith(sys.path[0]), torchtpu_lab.__file__\n"
        "print(sorted({telemetry.describe(e.source) for e in events if e.kind == 'op'}))\n")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "['user_script.py:6']", out.stdout
