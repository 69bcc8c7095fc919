"""Strict mode's repeated op run from the native core (issue 26, part 2; csrc/recorder.cpp ``try_run``,
runtime/recording.py ``learn_strict``): the cached executable called from C++ without entering Python. What
the user sees must be what the Python path gives — values, devices, the cache-hit counter, memory accounting,
errors — and everything the C++ path does not cover (debug mode, pending fused work, a ``TypeError``
from the executable, another thread in the runtime, the switch off) must reach the Python path."""

import os
import subprocess
import sys
import textwrap
import threading
import time
import weakref

import pytest
import torch

import torchtpu_lab
from torchtpu_lab import caches, config, native, telemetry
from torchtpu_lab.profiling import processors
from torchtpu_lab.runtime import fast_keys, fused, recording

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

needs_core = pytest.mark.skipif(not recording.available(native.module()),
                                reason=f"no recording kernel: {native.status().describe()}")


def _ran() -> int:
    return recording.stats()["ran"]


def _executable(name: str):
    return next(c for c in fast_keys.EXECUTABLES.values() if c.name == name)


@needs_core
def test_repeated_strict_ops_run_in_cpp_and_compute_what_cpu_does():
    x, w, b = torch.randn(6, 5), torch.randn(5, 5), torch.randn(5)
    tx, tw, tb = x.to("tpu"), w.to("tpu"), b.to("tpu")

    def step(x, w, b):
        h = torch.relu(x @ w + b)  # b broadcasts
        return (h * 0.5 - x[2]).sum(dim=1), x.t() @ h  # a row view, a transposed view

    with torchtpu_lab.eager_mode("strict"):
        step(tx, tw, tb)  # compiles each op; its next run teaches the kernel
        step(tx, tw, tb)
        before = _ran()
        outs = step(tx, tw, tb)
        ran = _ran() - before
    assert ran >= 6, ran  # mm, add, relu, mul by a wrapped scalar, sub, sum, mm
    for got, want in zip(outs, step(x, w, b)):
        assert got.device == torch.device("tpu:0") and got.dtype == want.dtype
        torch.testing.assert_close(got.cpu(), want)


@needs_core
def test_the_cache_hit_counter_and_memory_accounting_are_kept():
    a = torch.randn(32, 32).to("tpu")
    with torchtpu_lab.eager_mode("strict"):
        torch.tpu.synchronize()
        for _ in range(2):
            a * a
        hits, before, ran = telemetry.counters["op_cache_hits"], torch.tpu.memory_allocated(), _ran()
        outs = [a * a for _ in range(3)]
        assert _ran() == ran + 3
        assert telemetry.counters["op_cache_hits"] == hits + 3
        assert torch.tpu.memory_allocated() == before + 3 * 32 * 32 * 4
        assert outs[0].tpu_storage.nbytes == 32 * 32 * 4 and outs[0].tpu_storage.shape == (32, 32)
        del outs
        torch.tpu.synchronize()
        assert torch.tpu.memory_allocated() == before


@needs_core
def test_under_a_profile_a_strict_call_runs_in_cpp_with_its_op_record_and_debug_mode_takes_the_python_path():
    """Under a profile the C++ path still runs the call, and notes what the Python path notes: an op record (a
    cache hit, with the user's line) and the entry's span. Debug mode and the switch take the Python path."""
    a = torch.randn(8, 8).to("tpu")
    with torchtpu_lab.eager_mode("strict"):
        for _ in range(2):
            torch.exp(a)
        ran = _ran()
        with torchtpu_lab.profile() as prof:
            y = torch.exp(a); line = sys._getframe().f_lineno
        assert _ran() == ran + 1
        [event] = [e for e in prof.events if e.kind == "op" and "exp" in e.name]
        assert event.source.lineno == line and event.source.filename == __file__
        assert event.detail["cache_hit"] is True and event.dur > 0
        # its span at the runtime's door is its record's interval (the time split counts it as the op's)
        assert not any(t0 <= event.t <= t1 for t0, t1 in zip(prof.entry_spans[::2], prof.entry_spans[1::2]))
        assert processors.split_wall_time(prof)["tracing"] >= event.dur
        with config.native_recording(False):
            torch.exp(a)
        assert _ran() == ran + 1
        torch.exp(a)
        assert _ran() == ran + 2
    with torchtpu_lab.eager_mode("debug"):
        torch.exp(a)
        assert _ran() == ran + 2
    torch.testing.assert_close(y.cpu(), torch.exp(a.cpu()))


@needs_core
def test_a_new_dtype_is_its_own_entry_and_a_type_error_falls_back_to_jit():
    a = torch.arange(12.0).reshape(3, 4)
    ta = a.to("tpu")
    with torchtpu_lab.eager_mode("strict"):
        for _ in range(3):
            torch.neg(ta)
        ran = _ran()
        ti = ta.to(torch.int32)  # another key: the Python path, then learned
        for _ in range(3):
            out = torch.neg(ti)
        assert out.dtype == torch.int32 and _ran() == ran + 1
        torch.testing.assert_close(out.cpu(), -a.to(torch.int32))

        caches.clear_all()  # forget entries and executables: the next calls compile and teach again
        torch.neg(ta)
        compiled = _executable("aten::neg")
        real = compiled.executable

        def refuses(*args):
            raise TypeError("an input's weak type differs from the one it was compiled for")

        class Refusing:  # what a Compiled does for inputs it was not compiled for
            _call = staticmethod(refuses)
            __call__ = staticmethod(refuses)

        compiled.executable = Refusing()
        try:
            learned = recording.stats()["learned"]
            torch.neg(ta)  # the Python path: TypeError -> jit; teaches the kernel the refusing call
            assert recording.stats()["learned"] == learned + 1
            ran, python = _ran(), recording.stats()["python"]
            out = torch.neg(ta)  # C++ meets the TypeError and hands the call to Python, which uses jit
            assert _ran() == ran and recording.stats()["python"] == python + 1
            torch.testing.assert_close(out.cpu(), -a)
        finally:
            compiled.executable = real
            caches.clear_all()


@needs_core
def test_an_error_from_the_executable_is_the_python_exception_and_the_session_stays_usable():
    a = torch.randn(4, 4)
    ta = a.to("tpu")
    with torchtpu_lab.eager_mode("strict"):
        caches.clear_all()
        torch.sin(ta)
        compiled = _executable("aten::sin")
        real = compiled.executable

        def fails(*args):
            raise RuntimeError("device lost")

        class Failing:
            _call = staticmethod(fails)
            __call__ = staticmethod(fails)

        compiled.executable = Failing()
        try:
            learned = recording.stats()["learned"]
            with pytest.raises(RuntimeError, match="device lost"):
                torch.sin(ta)  # the Python path raises it, and teaches the kernel
            assert recording.stats()["learned"] == learned + 1
            ran, python = _ran(), recording.stats()["python"]
            with pytest.raises(RuntimeError, match="device lost"):
                torch.sin(ta)  # now from C++ (no Python kernel): the same exception
            assert _ran() == ran and recording.stats()["python"] == python
        finally:
            compiled.executable = real
            caches.clear_all()
        assert not fused.LOCK._is_owned()
        got = threading.Thread(target=lambda: fused.LOCK.acquire(timeout=5) and fused.LOCK.release())
        got.start()
        got.join(10)
        assert not got.is_alive()
        torch.testing.assert_close(torch.sin(ta).cpu(), torch.sin(a))
        torch.testing.assert_close(ta.cpu(), a)


@needs_core
def test_pending_fused_work_and_another_thread_in_the_runtime_take_the_python_path():
    a = torch.randn(5, 5)
    ta = a.to("tpu")
    with torchtpu_lab.eager_mode("strict"):
        for _ in range(2):
            torch.cos(ta)
        ran = _ran()
        config.eager_mode._store("fused")  # fused work left pending in strict mode (a switch would flush it)
        try:
            pending = ta * 3
            assert fused.has_pending()
        finally:
            config.eager_mode._store("strict")
        out = torch.cos(pending)  # the Python path syncs the fused work first
        assert _ran() == ran and not fused.has_pending()
        torch.testing.assert_close(out.cpu(), torch.cos(a * 3))

        holding, done = threading.Event(), []

        def hold():
            with fused.LOCK:
                holding.set()
                time.sleep(0.3)
                done.append(True)

        t = threading.Thread(target=hold)
        t.start()
        holding.wait(10)
        out = torch.cos(ta)  # the kernel does not wait for the lock: the Python kernel does
        assert done and _ran() == ran
        t.join()
        torch.testing.assert_close(out.cpu(), torch.cos(a))
        torch.cos(ta)
        assert _ran() == ran + 1


def _python(code: str, **env) -> subprocess.CompletedProcess:
    env = dict(os.environ, TORCHTPU_LAB_PLATFORM="cpu", **env)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH", "")) if p)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                          check=False, timeout=600)


@needs_core
def test_an_executable_runs_in_cpp_only_on_its_own_device():
    out = _python("""
        import os
        os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2"
        import torch, torchtpu_lab
        from torchtpu_lab.runtime import recording
        x = torch.arange(6.0)
        with torchtpu_lab.eager_mode("strict"):
            a0, a1 = x.to("tpu:0"), x.to("tpu:1")
            for _ in range(3):
                b0 = a0 * a0
            ran = recording.stats()["ran"]
            for _ in range(3):
                b1 = a1 * a1  # the same key, another device: the Python path (jit's dispatch)
            assert recording.stats()["ran"] == ran, recording.stats()
            assert b1.device == torch.device("tpu:1") and {d.id for d in b1.tpu_storage.array.devices()} == {1}
            assert b0.cpu().tolist() == b1.cpu().tolist() == (x * x).tolist()
        print("ok")
    """)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "ok" in out.stdout


def test_pure_python_mode_runs_strict_ops_on_the_python_path():
    out = _python("""
        import torch, torchtpu_lab
        from torchtpu_lab import telemetry
        from torchtpu_lab.runtime import recording
        x = torch.randn(4, 4)
        a = x.to("tpu")
        with torchtpu_lab.eager_mode("strict"):
            for _ in range(3):
                y = a + a[1]
            hits = telemetry.counters["op_cache_hits"]
            y = a + a[1]
            assert telemetry.counters["op_cache_hits"] == hits + 1
        torch.testing.assert_close(y.cpu(), x + x[1])
        assert recording.stats() == {}
        print("ok")
    """, TORCHTPU_LAB_NATIVE="0")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "ok" in out.stdout


@needs_core
def test_in_place_updates_run_in_cpp_and_training_matches_cpu():
    torch.manual_seed(0)
    model = torch.nn.Linear(6, 3)
    tpu_model = torch.nn.Linear(6, 3).to("tpu")
    tpu_model.load_state_dict({k: v.to("tpu") for k, v in model.state_dict().items()})
    # the per-parameter path (a foreach update is one program, run by its Python kernel: test_foreach_ops.py)
    opt = torch.optim.AdamW(model.parameters(), lr=0.05, foreach=False)
    tpu_opt = torch.optim.AdamW(tpu_model.parameters(), lr=0.05, foreach=False)
    x, y = torch.randn(5, 6), torch.randn(5, 3)
    tx, ty = x.to("tpu"), y.to("tpu")
    with torchtpu_lab.eager_mode("strict"):
        for step in range(4):
            for m, o, a, b in ((model, opt, x, y), (tpu_model, tpu_opt, tx, ty)):
                o.zero_grad()
                torch.nn.functional.mse_loss(m(a), b).backward()
                o.step()
            if step == 2:
                ran = _ran()
        assert _ran() - ran >= 10  # the last step's forward, backward and AdamW's in-place updates
        for p, tp in zip(model.parameters(), tpu_model.parameters()):
            torch.testing.assert_close(tp.detach().cpu(), p.detach())


@needs_core
def test_an_in_place_update_in_cpp_is_counted_by_the_native_ledger_exactly():
    """The C++ path writes an in-place op's result into self's storage with the native ledger's own steps (the
    Storage.array setter's: the new array acquired, the old one released): no Python frame, and the device holds
    the one tensor's bytes throughout."""
    from torchtpu_lab.device import memory

    if memory.acquire is memory.PYTHON_LEDGER[0]:
        pytest.skip(f"no native ledger: {native.status().describe()}")
    t = torch.ones(64, 64).to("tpu")
    with torchtpu_lab.eager_mode("strict"):
        for _ in range(3):
            t.add_(1)
        torch.tpu.synchronize()
        held, old, ran = memory.allocated(0), weakref.ref(t.tpu_storage.held), _ran()
        calls = []
        sys.setprofile(lambda frame, event, arg: calls.append(frame.f_code.co_name) if event == "call" else None)
        try:
            t.add_(1)
        finally:
            sys.setprofile(None)
        assert _ran() == ran + 1 and calls == [], calls
        assert old() is None and memory.allocated(0) == held  # the old array went when its storage let go
    torch.testing.assert_close(t.cpu(), torch.full((64, 64), 5.0))


@needs_core
def test_in_place_through_a_view_keeps_pytorchs_semantics():
    x = torch.arange(12.0).reshape(3, 4)
    tx = x.to("tpu")
    with torchtpu_lab.eager_mode("strict"):
        for _ in range(3):
            tx.mul_(2)  # a base: from C++ after the first calls
            tx[1].add_(1)  # a view: written back through the Python path
            x.mul_(2)
            x[1].add_(1)
        ran, version = _ran(), tx._version
        tx.mul_(2)
        assert _ran() == ran + 1 and tx._version == version + 1  # autograd's version counter still moves
        tx[1].add_(1)
        assert _ran() == ran + 1
        x.mul_(2)
        x[1].add_(1)
        torch.testing.assert_close(tx.cpu(), x)
