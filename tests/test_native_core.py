"""The native core (torchtpu_lab/csrc): generators as on CUDA, pinned memory, events, the build cache and the
pure-Python fallback. Tests that need the core skip, saying why, when it is not loaded."""

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch

import torchtpu_lab
from torchtpu_lab import native
from torchtpu_lab.native import build

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
needs_core = pytest.mark.skipif(native.module() is None, reason=f"no native core: {native.status().describe()}")
MODES = ("debug", "strict", "fused")


def _python(code: str, **env_extra) -> subprocess.CompletedProcess:
    env = dict(os.environ, TORCHTPU_LAB_PLATFORM="cpu", **env_extra)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH", "")) if p)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True, check=False,
                          timeout=600)


def _draws(g: torch.Generator) -> list[torch.Tensor]:
    """One draw of every random op that takes ``generator=``, in a fixed order."""
    probs = torch.tensor([0.1, 0.5, 0.2, 0.2], device="tpu")
    return [
        torch.randn(5, device="tpu", generator=g),
        torch.rand(5, device="tpu", generator=g),
        torch.randint(0, 100, (5,), device="tpu", generator=g),
        torch.bernoulli(torch.full((6,), 0.5, device="tpu"), generator=g),
        torch.randperm(7, device="tpu", generator=g),
        torch.multinomial(probs, 3, generator=g),
        torch.empty(5, device="tpu").normal_(2.0, 3.0, generator=g),
        torch.empty(5, device="tpu").uniform_(-1.0, 1.0, generator=g),
    ]


@needs_core
def test_generator_streams_depend_on_their_seed_only_and_agree_across_eager_modes():
    results = {}
    for i, mode in enumerate(MODES):
        with torchtpu_lab.eager_mode(mode):
            torch.manual_seed(100 + i)  # the global seed must not matter
            results[mode] = [t.cpu() for t in _draws(torch.Generator("tpu").manual_seed(7))]
    for mode in MODES[1:]:
        for a, b in zip(results["debug"], results[mode]):
            assert torch.equal(a, b), mode
    other = [t.cpu() for t in _draws(torch.Generator("tpu").manual_seed(8))]
    assert not torch.equal(other[0], results["debug"][0])
    assert sorted(results["debug"][4].tolist()) == list(range(7))


@needs_core
def test_a_generator_does_not_touch_the_default_stream_and_vice_versa():
    torch.manual_seed(3)
    expected = torch.rand(4, device="tpu").cpu()
    torch.manual_seed(3)
    g = torch.Generator("tpu").manual_seed(3)
    torch.randn(10, device="tpu", generator=g)
    assert torch.equal(torch.rand(4, device="tpu").cpu(), expected)
    assert g.get_offset() == 1 and g.initial_seed() == 3


@needs_core
def test_generator_state_round_trips_and_fused_mode_draws_fresh_values_across_syncs():
    g = torch.Generator("tpu").manual_seed(11)
    with torchtpu_lab.eager_mode("fused"):
        state = g.get_state()
        first = [torch.rand(3, device="tpu", generator=g) for _ in range(2)]
        torchtpu_lab.sync()
        third = torch.rand(3, device="tpu", generator=g).cpu()
        assert not torch.equal(first[0].cpu(), first[1].cpu()) and not torch.equal(first[1].cpu(), third)
        g.set_state(state)
        assert torch.equal(torch.rand(3, device="tpu", generator=g).cpu(), first[0].cpu())
    assert state.dtype == torch.uint8 and state.device.type == "cpu" and state.numel() == 16


@needs_core
def test_generator_of_another_device_type_is_refused_as_on_cuda():
    with pytest.raises(RuntimeError, match="Expected a 'tpu' device type for generator but found 'cpu'"):
        torch.randn(3, device="tpu", generator=torch.Generator())


@needs_core
def test_default_generators_are_the_device_streams_and_fork_rng_restores_them():
    gens = torch.tpu.default_generators
    assert len(gens) == torch.tpu.device_count() and all(g.device.type == "tpu" for g in gens)
    torch.manual_seed(21)
    assert gens[0].initial_seed() == 21
    a = torch.rand(3, device="tpu").cpu()
    assert gens[0].get_offset() == 1
    torch.manual_seed(21)
    with torch.random.fork_rng(device_type="tpu"):
        torch.rand(5, device="tpu")
    assert torch.equal(torch.rand(3, device="tpu").cpu(), a)


def test_set_rng_state_refuses_a_state_that_is_not_a_cpu_byte_tensor():
    before = torch.tpu.get_rng_state()
    on_device = before.to("tpu")
    with pytest.raises(RuntimeError, match="set_rng_state: expected a torch.uint8 tensor of 16 bytes on the CPU"):
        torch.tpu.set_rng_state(on_device)
    assert torch.equal(torch.tpu.get_rng_state(), before)


@needs_core
def test_pin_memory_and_dataloader_pin_memory():
    x = torch.arange(6.0).reshape(2, 3)
    p = x.pin_memory()
    assert p.is_pinned() and not x.is_pinned() and torch.equal(p, x)
    y = p.to("tpu", non_blocking=True)
    assert torch.equal(y.cpu(), x)
    data = torch.utils.data.TensorDataset(torch.arange(8.0).reshape(4, 2))
    batches = list(torch.utils.data.DataLoader(data, batch_size=2, pin_memory=True))
    assert all(b.is_pinned() for (b,) in batches)
    assert torch.equal(torch.cat([b for (b,) in batches]), data.tensors[0])


@needs_core
def test_a_slice_of_pinned_memory_is_pinned_and_a_stream_without_an_index_is_the_current_devices():
    """As on CUDA (OpenReg's test_rewrapped_storage and test_stream_create): pinned memory is a block the core
    hands out, and any pointer inside it is pinned; ``torch.Stream(device="tpu")`` is the current device's."""
    pinned = torch.randn(10).pin_memory()
    # a storage's is_pinned() asks CUDA unless told the device up to torch 2.11 (the accelerator from 2.13)
    assert pinned.untyped_storage()[2:].is_pinned("tpu") and pinned[2:5].is_pinned()
    assert not torch.randn(10).untyped_storage()[2:].is_pinned("tpu")
    assert torch.Stream(device="tpu").device_index == torch.tpu.current_device()
    assert torch.Stream(device="tpu") == torch.accelerator.current_stream()


@needs_core
def test_pytorchs_profiler_times_tpu_ops_with_the_cores_stubs():
    """``torch.autograd.profiler.profile(use_device="tpu")`` reads PrivateUse1 profiler stubs; PyTorch's default
    ones failed every record and the table showed negative totals (OpenReg's test_profiler_key_averages). A
    record is host time, as a tpu event's."""
    from torch.autograd.profiler import profile

    with profile(use_device="tpu") as prof:
        x = torch.randn(32, 32, device="tpu")
        (x @ x + x).sum().item()
    rows = {e.key: e for e in prof.key_averages()}
    assert {"aten::mm", "aten::add"} <= set(rows) or {"aten::matmul", "aten::add"} <= set(rows), sorted(rows)
    assert all(e.cpu_time_total >= 0 and e.device_time_total >= 0 for e in rows.values())
    assert rows["aten::add"].device_time_total > 0


@needs_core
def test_events_time_and_streams_are_the_device_default():
    start, end = torch.Event("tpu", enable_timing=True), torch.Event("tpu", enable_timing=True)
    start.record()
    torch.ones(64, 64, device="tpu").sum().item()
    end.record()
    assert start.query() and end.query()
    assert start.elapsed_time(end) >= 0
    stream = torch.accelerator.current_stream()
    assert stream.device == torch.device("tpu", torch.tpu.current_device()) and stream.query()


@needs_core
def test_current_device_is_the_cores_and_follows_the_guard():
    assert torch.accelerator.current_device_index() == torch.tpu.current_device() == native.module().current_device()


def test_autocast_without_a_dtype_computes_in_bfloat16():
    assert torch.get_autocast_dtype("tpu") == torch.bfloat16
    a = torch.randn(4, 4, device="tpu")
    with torch.autocast("tpu"):
        assert (a @ a).dtype == torch.bfloat16


def test_status_says_which_mode_runs():
    described = torchtpu_lab.global_changes()["native core"]
    assert described == native.status().describe()
    assert described.startswith("native core" if native.module() is not None else "pure Python")
    from torchtpu_lab.jupyter import status as jstatus

    s = jstatus.status()
    assert s.device_core == described
    assert any(line.strip().startswith("device core:") for line in jstatus.banner_lines(s))


def test_pure_python_mode_runs_and_says_what_is_missing():
    out = _python("""
        import torch, torchtpu_lab
        assert torch.ones(3, device="tpu").sum().item() == 3
        print(torchtpu_lab.global_changes()["native core"])
        try:
            torch.Generator("tpu")
        except NotImplementedError:
            print("no generator")
    """, TORCHTPU_LAB_NATIVE="0")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "pure Python (TORCHTPU_LAB_NATIVE=0; missing: " in out.stdout and "torch.Generator" in out.stdout
    assert "no generator" in out.stdout


def test_the_build_key_follows_the_sources_and_the_torch_build(tmp_path, monkeypatch):
    key = build.build_key()
    assert torch.__version__.replace("+", "_") in key and sys.implementation.cache_tag in key
    copy = tmp_path / "csrc"
    shutil.copytree(build.SOURCES, copy)
    monkeypatch.setattr(build, "SOURCES", copy)
    assert build.build_key() == key
    (copy / "guard.cpp").write_text((copy / "guard.cpp").read_text() + "\n// changed\n")
    assert build.build_key() != key


def test_a_process_that_finds_a_build_under_way_waits_and_loads_its_module(tmp_path, monkeypatch):
    """The lock that makes concurrent first imports (xdist workers) build once: while the builder holds it, a second
    process waits, then returns the module the builder wrote, without compiling. (The compile itself runs in
    ``make install``, and every test that imports ``torchtpu_lab._C`` uses its result.)"""
    monkeypatch.setenv("TORCHTPU_LAB_NATIVE_DIR", str(tmp_path))
    code = "from torchtpu_lab.native import build; print(build.build(verbose=True))"
    target = build.module_path()
    with build._locked(target.parent.with_suffix(".lock")):
        waiter = subprocess.Popen([sys.executable, "-c", code], env=dict(os.environ, PYTHONPATH=ROOT),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(3)  # the waiter imports torch and blocks on the lock
        assert waiter.poll() is None, waiter.communicate()
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(b"built by the other process")
    out, err = waiter.communicate(timeout=120)
    assert waiter.returncode == 0, err[-2000:]
    assert out.strip() == str(target) and "building the native core" not in err
    assert target.read_bytes() == b"built by the other process"


@needs_core
def test_a_compiled_function_taking_a_generator_draws_the_eager_stream():
    def f(x, g):
        return x + torch.randn(x.shape, device=x.device, generator=g)

    compiled = torch.compile(f, backend="tpu")
    x = torch.zeros(4, device="tpu")
    g, eager = torch.Generator("tpu").manual_seed(1), torch.Generator("tpu").manual_seed(1)
    got = [compiled(x, g).cpu() for _ in range(2)]
    want = [f(x, eager).cpu() for _ in range(2)]
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]) and not torch.equal(got[0], got[1])
    assert g.get_offset() == eager.get_offset() == 2


def test_accelerator_memory_stats_have_cudas_keys_and_agree_with_torch_tpu():
    x = torch.ones(1000, device="tpu")
    torchtpu_lab.sync()
    stats = torch.accelerator.memory_stats()
    for key in ("allocated_bytes.all.current", "active_bytes.all.current", "reserved_bytes.all.current",
                "allocated_bytes.all.peak", "active_bytes.all.peak", "reserved_bytes.all.peak"):
        assert key in stats, key
    assert torch.accelerator.memory_allocated() == torch.tpu.memory_allocated() == stats["allocated_bytes.all.current"]
    assert torch.accelerator.memory_reserved() == stats["reserved_bytes.all.current"] >= x.numel() * 4
    assert torch.accelerator.max_memory_allocated() == torch.tpu.max_memory_allocated()


@needs_core
def test_rrelu_with_noise_draws_from_a_tpu_generator():
    x = torch.randn(6, 7, device="tpu")
    runs = []
    for _ in range(2):
        noise = torch.empty_like(x)
        torch.ops.aten.rrelu_with_noise(x, noise, 0.1, 0.3, True, torch.Generator("tpu").manual_seed(3))
        runs.append(noise.cpu())
    assert torch.equal(runs[0], runs[1])
    n, neg = runs[0], (x <= 0).cpu()
    assert torch.all(torch.where(neg, (n >= 0.1) & (n <= 0.3), n == 1)) and neg.any()


@needs_core
@pytest.mark.parametrize("wait", ["accelerator", "stream", "event"])
def test_pytorchs_own_synchronize_calls_run_pending_fused_work(wait):
    from torchtpu_lab.runtime import fused

    with torchtpu_lab.eager_mode("fused"):
        x = torch.ones(128, device="tpu") * 3
        assert fused.pending_ops() > 0
        if wait == "accelerator":
            torch.accelerator.synchronize()
        elif wait == "stream":
            torch.Stream("tpu").synchronize()
        else:
            event = torch.Event("tpu")
            event.record()
            event.synchronize()
        assert fused.pending_ops() == 0
    assert "torch.accelerator.synchronize" not in torchtpu_lab.global_changes()["torch.accelerator (wrapped)"]
    assert x.sum().item() == 384


@needs_core
def test_an_interrupt_inside_the_synchronize_hook_reaches_the_caller_and_the_session_stays_usable():
    """The one C++ callback that enters Python passes a Python exception on (a Ctrl-C would otherwise abort)."""
    core = native.module()

    def interrupted(index: int) -> None:
        raise KeyboardInterrupt

    core.set_synchronize(interrupted)
    try:
        with pytest.raises(KeyboardInterrupt):
            torch.accelerator.synchronize()
    finally:
        core.set_synchronize(torch.tpu.synchronize)
    x = torch.ones(3, device="tpu") + 1
    torch.accelerator.synchronize()
    assert x.sum().item() == 6


def _locks():
    kinds = [pytest.param(threading.RLock, id="threading.RLock"),
             pytest.param(native.RefusableLock, id="pure-Python mode's lock")]
    core = native.module()
    kinds.append(pytest.param(core.Lock if core is not None else None, id="core Lock",
                              marks=pytest.mark.skipif(core is None, reason="no native core")))
    return kinds


@pytest.mark.parametrize("make", _locks()[1:])
def test_a_refused_lock_raises_at_every_acquire(make):
    """``refuse(message)``: what a child forked after the device started does to the runtime lock
    (backend/fork_guard.py, tests/test_fork_guard.py)."""
    lock = make()
    with lock:
        assert lock._is_owned()
    lock.refuse("no more")
    with pytest.raises(RuntimeError, match="no more"):
        lock.acquire()
    with pytest.raises(RuntimeError, match="no more"):
        with lock:
            pass
    assert not lock._is_owned()


@pytest.mark.parametrize("make", _locks())
def test_the_runtime_lock_keeps_threading_rlocks_semantics(make):
    """fused.LOCK is the core's Lock when the core is loaded; it must behave as the RLock it replaced (the same
    assertions run against RLock itself)."""
    lock = make()
    assert lock.acquire() and lock.acquire(False) and lock._is_owned()
    lock.release()
    assert lock._is_owned()
    lock.release()
    assert not lock._is_owned()
    with pytest.raises(RuntimeError):
        lock.release()
    with pytest.raises(ValueError):
        lock.acquire(False, 1)
    with pytest.raises(ValueError):
        lock.acquire(timeout=-2)
    with pytest.raises(KeyError):
        with lock:
            assert lock._is_owned()
            raise KeyError("inside")
    assert not lock._is_owned()

    held, go, seen = threading.Event(), threading.Event(), []

    def holder():
        with lock:
            held.set()
            go.wait(10)

    t = threading.Thread(target=holder)
    t.start()
    assert held.wait(10)
    assert not lock._is_owned()
    assert lock.acquire(False) is False
    t0 = time.monotonic()
    assert lock.acquire(timeout=0.2) is False
    assert time.monotonic() - t0 >= 0.15
    waiter = threading.Thread(target=lambda: seen.append(lock.acquire(timeout=10)) or lock.release())
    waiter.start()
    go.set()
    t.join(10)
    waiter.join(10)
    assert seen == [True]
    assert lock.acquire(blocking=True, timeout=1) is True
    lock.release()


@pytest.mark.parametrize("make", _locks())
def test_a_signal_interrupts_a_wait_for_the_runtime_lock(make):
    """Ctrl-C while the main thread waits for the lock another thread holds reaches the caller (as with RLock),
    and the lock is not left taken."""
    lock = make()
    held, go = threading.Event(), threading.Event()

    def holder():
        with lock:
            held.set()
            go.wait(10)

    class Alarm(Exception):
        pass

    def ring(*_):
        raise Alarm

    t = threading.Thread(target=holder)
    t.start()
    assert held.wait(10)
    old = signal.signal(signal.SIGALRM, ring)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        with pytest.raises(Alarm):
            lock.acquire(timeout=10)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        go.set()
        t.join(10)
    assert not lock._is_owned()
    assert lock.acquire(False)
    lock.release()


def test_the_runtime_lock_is_the_cores_when_the_core_is_loaded():
    from torchtpu_lab.runtime import fused

    core = native.module()
    assert type(fused.LOCK) is (core.Lock if core is not None else native.RefusableLock)
