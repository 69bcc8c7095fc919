"""The native ledger (csrc/ledger.cpp) counts device memory exactly as device/memory.py's Python ledger does: the
same dicts, the same deferred frees, the same listener events; and dropping a tensor runs no Python frame."""

import gc
import os
import subprocess
import sys
import threading
import time
import weakref

import jax.numpy as jnp
import pytest
import torch

import torchtpu_lab  # noqa: F401  (registers the device)
from torchtpu_lab import native
from torchtpu_lab.device import memory, storage

needs_core = pytest.mark.skipif(native.module() is None or not hasattr(native.module(), "configure_ledger"),
                                reason=f"no native ledger: {native.status().describe()}")
DEVICE = 7  # a device index no other test counts on: the scenario's figures are its own
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _scenario(acquire, release, settle) -> list:
    """Every path of acquire/release/settle, with a snapshot of the counts after each step."""
    events: list = []
    listener = lambda kind, nbytes, device: events.append((kind, nbytes, device))  # noqa: E731
    memory.listeners.append(listener)
    peaks: list = []

    def on_peak(t, allocated, kind, nbytes):
        peaks.append((allocated, kind, nbytes))
        log.above = allocated + 40  # as a profile moves its mark up after a snapshot

    log = memory.SampleLog(DEVICE, 0, on_peak)
    other = memory.SampleLog(DEVICE + 1, 0, on_peak)  # another device's: never written
    memory.sample_logs.extend([log, other])
    seen, keys = [], ()

    def snap(label):
        with memory._lock:
            seen.append((label, memory.allocated(DEVICE), memory.peak(DEVICE), memory._counts["alloc"],
                         memory._counts["free"], *[(memory._live.get(k) or [0, 0])[1] for k in keys],
                         sorted(e[1:] for e in memory._deferred.values() if e[1] == DEVICE)))

    try:
        memory.reset_peak(DEVICE)
        a, b = jnp.arange(8.0) + 1, jnp.arange(16.0) + 2
        keys = (id(a), id(b))
        origin = ((8,), torch.float32, None)
        acquire(a, DEVICE, 32, origin)
        snap("a held")
        acquire(a, DEVICE, 32, origin)  # a second storage holds the same array: no new bytes
        acquire(b, DEVICE, 64)
        snap("a twice, b")
        release(a)
        snap("a once")
        release(a)  # last holder gone, the array still alive (we hold it): deferred
        snap("a deferred")
        acquire(a, DEVICE, 32, origin)  # held again before it was gone: no new bytes
        snap("a again")
        release(a)
        del a
        gc.collect()
        snap("a gone")
        b.delete()  # donated to a program that ran: free at once
        release(b)
        snap("b deleted")
        release(jnp.zeros(3))  # never held: nothing happens
        snap("stranger")
        c = jnp.arange(4.0) + 3
        acquire(c, DEVICE, 16)
        release(c)  # alive: deferred until it is gone or deleted
        snap("c deferred")
        settle()  # still alive and not deleted: stays
        snap("c settled alive")
        c.delete()  # what a program that took it as a donation does
        settle()
        snap("c settled deleted")
        del c
    finally:
        memory.listeners.remove(listener)
        memory.sample_logs.remove(log)
        memory.sample_logs.remove(other)
    assert other.samples == [] and log.samples[0::4] == sorted(log.samples[0::4])  # times, in order
    samples = [tuple(log.samples[i + 1:i + 4]) for i in range(0, len(log.samples), 4)]
    return [s for s in seen], events + [("samples", samples), ("peaks", peaks)]


@needs_core
def test_the_native_ledger_counts_as_the_python_one_does():
    assert memory.acquire is not memory.PYTHON_LEDGER[0]
    gc.collect()  # garbage earlier tests left (a cycle holding a tpu array) is freed now, not inside a scenario
    memory.settle()
    before_alloc, before_free = memory._counts["alloc"], memory._counts["free"]
    py_seen, py_events = _scenario(*memory.PYTHON_LEDGER)
    mid_alloc, mid_free = memory._counts["alloc"], memory._counts["free"]
    c_seen, c_events = _scenario(memory.acquire, memory.release, memory.settle)

    def relative(seen, alloc0, free0):  # the process-wide counters differ by what the first run counted
        return [(s[0], s[1], s[2], s[3] - alloc0, s[4] - free0, *s[5:]) for s in seen]

    assert relative(c_seen, mid_alloc, mid_free) == relative(py_seen, before_alloc, before_free)
    assert c_events == py_events  # the listeners' events, the sample log's samples and its peak calls
    samples, peaks = dict(c_events[-2:])["samples"], dict(c_events[-2:])["peaks"]
    assert samples[:2] == [(32, "alloc", 32), (96, "alloc", 64)] and samples[-1] == (0, "free", 16), samples
    assert peaks == [(32, "alloc", 32), (96, "alloc", 64)], peaks  # 96 > 32 + 40; nothing passed 136 after
    assert ("alloc", 32, DEVICE) in c_events and ("free", 64, DEVICE) in c_events and ("free", 16, DEVICE) in c_events
    assert [s[0] for s in c_seen if s[7]] == ["a deferred", "c deferred", "c settled alive"]
    assert memory.allocated(DEVICE) == 0 and c_seen[-1][7] == []


def _python_calls(fn) -> list[str]:
    """The qualified names of the Python functions called while ``fn()`` runs."""
    frames = []

    def trace(frame, event, arg):
        if event == "call":
            frames.append(frame.f_code.co_qualname)

    sys.setprofile(trace)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return frames


@needs_core
def test_a_dropped_tensor_runs_no_python_frame_and_frees_its_bytes():
    assert type(storage.Storage.__dict__["__del__"]).__name__ == "method_descriptor"
    held_x = [torch.randn(64, 64).to("tpu")]
    torchtpu_lab.sync()
    held = memory.allocated(0)
    frames = _python_calls(held_x.clear)  # drops the tensor
    assert [f for f in frames if "memory" in f or "Storage" in f] == []
    assert memory.allocated(0) == held - 64 * 64 * 4


@needs_core
def test_the_native_ledger_entries_stay_off_the_garbage_collector_lists():
    """A step makes a ledger entry per result and per released-but-alive buffer: none is tracked by the cyclic
    collector (they cannot close a cycle), so collections neither walk nor promote them. The one exception is a
    deferred entry's weak reference, which has a callback: the collector must see it (pyobjects.h)."""
    base = torch.randn(16, 16)
    x = base.to("tpu")
    torchtpu_lab.sync()
    old = x.tpu_storage.held
    with torchtpu_lab.eager_mode("fused"):
        x.add_(1.0)  # releases the old array, which the pending graph still reads
        deferred = memory._deferred[id(old)]
        assert not gc.is_tracked(deferred)  # the entry; its weak reference has a callback, so it stays tracked
        assert gc.is_tracked(deferred[0])  # (test_a_deferred_array_freed_by_the_cyclic_collector_...)
        del old
        torchtpu_lab.sync()  # the result is acquired by the sync's commit
    live = memory._live[id(x.tpu_storage.held)]
    assert not gc.is_tracked(live) and not gc.is_tracked(live[4])  # the entry and its origin tuple
    assert torch.equal(x.cpu(), base + 1)


_CYCLE_SCRIPT = """
import gc
import jax.numpy as jnp
import torch
import torchtpu_lab
from torchtpu_lab.device import memory
c = jnp.arange(4.0) + 3
memory.acquire(c, 7, 16)
memory.release(c)  # still alive: deferred, with a weak reference whose callback frees its bytes
cycle = [c]
cycle.append(cycle)  # the array is held by a reference cycle alone
del c, cycle
gc.collect()  # the array is cyclic garbage: the collector calls the weak reference's callback
print("freed", memory.allocated(7), len(memory._deferred))
a = torch.arange(0, 4, device="tpu")
try:  # the original report: pytest kept the failing assignment's traceback, and its gc.collect() crashed
    a[a > -1] = torch.tensor([]).to("tpu")
except RuntimeError as e:
    kept = e
del kept
gc.collect()
print("collected")
"""


@needs_core
def test_a_deferred_array_freed_by_the_cyclic_collector_calls_back_and_does_not_crash():
    """A released array still alive is deferred with a weak reference whose callback frees its bytes. That weak
    reference was untracked by the collector, and when the array became cyclic garbage (the frames of a failed
    assignment's traceback, which pytest keeps) gc.collect() moved the untracked reference onto its callback list
    and died with SIGSEGV. In a subprocess: the bug kills the interpreter."""
    env = dict(os.environ, TORCHTPU_LAB_PLATFORM="cpu")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH", "")) if p)
    out = subprocess.run([sys.executable, "-c", _CYCLE_SCRIPT], env=env, capture_output=True, text=True,
                         timeout=120, check=False)
    assert out.returncode == 0, (out.returncode, out.stderr[-3000:])
    assert out.stdout.split("\n")[:2] == ["freed 0 0", "collected"], out.stdout


@needs_core
def test_the_cores_untrack_keeps_a_weak_reference_with_a_callback_tracked():
    """The collector needs a weak reference with a callback on its lists (see pyobjects.h); one without stays
    untrackable, as the pending graph's are."""
    target = type("Target", (), {})()  # any weak-referenceable object
    with_callback, plain = weakref.ref(target, lambda r: None), weakref.ref(target)
    native.module().untrack(with_callback, plain)
    assert gc.is_tracked(with_callback) and not gc.is_tracked(plain)


@needs_core
def test_a_failing_listener_is_detached_and_the_count_stays_right():
    def bad(kind, nbytes, device):
        raise ValueError("listener broke")

    memory.listeners.append(bad)
    try:
        with pytest.warns(RuntimeWarning, match="listener broke"):
            x = torch.ones(10, device="tpu") * 3
            torchtpu_lab.sync()
        assert bad not in memory.listeners
        assert x.sum().item() == 30.0
    finally:
        if bad in memory.listeners:
            memory.listeners.remove(bad)


def test_a_failing_sample_log_is_detached_and_the_count_stays_right():
    def bad(t, allocated, kind, nbytes):
        raise ValueError("snapshot broke")

    log = memory.SampleLog(0, 0, bad)
    memory.sample_logs.append(log)
    try:
        with pytest.warns(RuntimeWarning, match="snapshot broke"):
            x = torch.ones(10, device="tpu") * 3
            torchtpu_lab.sync()
        assert log not in memory.sample_logs and log.samples  # sampled up to the failure
        assert x.sum().item() == 30.0
    finally:
        if log in memory.sample_logs:
            memory.sample_logs.remove(log)


def test_a_profile_samples_memory_without_a_python_call_per_allocation():
    """The native ledger writes a profile's samples itself: allocating under a profile runs no Python frame of
    memory accounting (the profile's peak snapshots aside), and the profile's timeline has every sample."""
    if memory.acquire is memory.PYTHON_LEDGER[0]:
        pytest.skip(f"no native ledger: {native.status().describe()}")
    x = torch.randn(32, 32).to("tpu")
    torchtpu_lab.sync()
    with torchtpu_lab.profile() as prof:
        held_y = [torch.randn(32, 32).to("tpu")]  # the peak rises: one snapshot
        frames = _python_calls(held_y.clear)  # a free: below the peak
    assert [f for f in frames if "memory" in f.lower() or "sample" in f.lower() or "peak" in f.lower()] == []
    kinds = [(m.kind, m.nbytes) for m in prof.memory]
    assert ("alloc", 32 * 32 * 4) in kinds and kinds[-1] == ("free", 32 * 32 * 4), kinds
    assert all(0 <= m.t <= prof.wall_s for m in prof.memory)
    assert prof.peak_snapshot.total == prof.peak_bytes
    del x


def test_a_syncs_commit_and_settle_are_one_sample_each_at_their_levels():
    """A sync commits all of its results at one moment: under a profile the native ledger writes one "alloc"
    sample for them (their bytes, at the level after the last). An in-place update's sync: its new array's
    sample, then the replaced one's free, each at its own level, so the timeline still passes through every
    level the device held, and its top is the peak."""
    if memory.acquire is memory.PYTHON_LEDGER[0]:
        pytest.skip(f"no native ledger: {native.status().describe()}")
    torchtpu_lab.sync()
    xs = [torch.randn(16, 16).to("tpu") for _ in range(6)]
    with torchtpu_lab.eager_mode("fused"), torchtpu_lab.profile() as prof:
        before = memory.allocated(0)
        outs = [x * 2 for x in xs]  # six outputs of one graph
        torchtpu_lab.sync()
        after = memory.allocated(0)
        xs[0].mul_(3)  # its new array, then the old one's free
        torchtpu_lab.sync()
    nbytes = 16 * 16 * 4
    commit = [m for m in prof.memory if m.kind == "alloc" and m.nbytes == 6 * nbytes]
    assert len(commit) == 1 and commit[0].allocated == after == before + 6 * nbytes, [
        (m.kind, m.nbytes, m.allocated) for m in prof.memory]
    assert not [m for m in prof.memory if m.kind == "alloc" and m.nbytes == nbytes and m.t < commit[0].t]
    replaced = [i for i, m in enumerate(prof.memory) if m.kind == "alloc" and m.nbytes == nbytes]
    assert replaced and prof.memory[replaced[-1] + 1].kind == "free"
    assert prof.memory[replaced[-1]].allocated == after + nbytes  # the level before the old array went
    assert max(m.allocated for m in prof.memory) == prof.peak_bytes
    torch.testing.assert_close(outs[1].cpu(), xs[1].cpu() * 2)


def test_threads_allocating_and_reading_the_counts_agree_at_the_end():
    gc.collect()  # an earlier test's tensors held by reference cycles (a kept traceback) must not go mid-count
    torchtpu_lab.sync()
    start = memory.allocated(0)
    errors = []

    def work():
        try:
            with torchtpu_lab.eager_mode("strict"):
                for _ in range(200):
                    y = torch.ones(32, device="tpu") + 1
                    del y
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    def read():
        try:
            for _ in range(300):
                memory.owners(0)
                memory.largest(0)
                memory.stats(0)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(2)] + [threading.Thread(target=read)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    gc.collect()
    assert errors == []
    assert memory.allocated(0) == start


@needs_core
def test_the_ledger_waits_for_the_counts_lock_another_thread_holds():
    """The counts' lock is the core's Lock, which the ledger takes with plain C calls; held by another thread (a
    reader in ``with memory._lock``), the ledger's write waits for it, with the GIL released, and then counts."""
    core = native.module()
    assert isinstance(memory._lock, core.Lock)
    held, go = threading.Event(), threading.Event()

    def reader():
        with memory._lock:
            held.set()
            go.wait(10)

    t = threading.Thread(target=reader)
    t.start()
    assert held.wait(10)
    a = jnp.arange(8.0) + 5
    before = memory.allocated(DEVICE)
    timer = threading.Timer(0.3, go.set)  # runs while the ledger waits: the GIL is free for it
    timer.start()
    t0 = time.perf_counter()
    core.ledger_acquire(a, DEVICE, 32, None)
    waited = time.perf_counter() - t0
    t.join(10)
    try:
        assert waited >= 0.25, waited
        assert memory.allocated(DEVICE) == before + 32
    finally:
        core.ledger_release(a)
        del a
        gc.collect()
        memory.settle()
