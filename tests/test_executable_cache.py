"""The persistent executable cache (runtime/compile_cache.py): keyed by our own signatures, path-independent,
read-only when it must be, and never trusting a damaged entry."""

import os
import shutil

import jax
import pytest
import torch

import torchtpu_lab
from torchtpu_lab import telemetry
from torchtpu_lab.runtime import compile_cache, state
from torchtpu_lab.runtime.signatures import OpSignature, Slot, Static, digest


@pytest.fixture
def disk_cache(tmp_path):
    """A fresh cache directory for the test; the session's cache setting is restored afterwards."""
    previous = compile_cache.settings()
    d = compile_cache.enable(str(tmp_path / "cache"))
    assert d is not None
    state.clear()  # executables compiled by earlier tests would otherwise never reach this directory
    yield d
    compile_cache.use_settings(previous)


def _step():
    """A few strict-mode ops on shapes no other test uses; returns the result on the CPU."""
    with torchtpu_lab.eager_mode("strict"):
        x = torch.arange(35.0).reshape(5, 7).to("tpu")
        return (torch.sin(x) * 3 + x.t().sum(0)[:5, None]).cpu()


def _expected():
    x = torch.arange(35.0).reshape(5, 7)
    return torch.sin(x) * 3 + x.t().sum(0)[:5, None]


def _counts():
    keys = ("persistent_cache_hits", "persistent_cache_misses", "persistent_cache_errors", "jax_traces",
            "xla_compiles")
    return {k: telemetry.counters.get(k, 0) for k in keys}


def _delta(before):
    return {k: v - before[k] for k, v in _counts().items()}


def _fresh_process_view():
    """Forget every in-memory executable, as a restarted kernel would."""
    state.clear()


def test_copied_cache_hits_without_tracing(disk_cache, tmp_path):
    torch.testing.assert_close(_step(), _expected())
    assert compile_cache.entries() > 0
    copy = tmp_path / "other" / "place"
    shutil.copytree(disk_cache, copy)
    compile_cache.enable(str(copy))
    _fresh_process_view()
    before = _counts()
    torch.testing.assert_close(_step(), _expected())
    d = _delta(before)
    assert d["persistent_cache_hits"] > 0 and d["persistent_cache_misses"] == 0, d
    assert d["jax_traces"] == 0 and d["xla_compiles"] == 0, d
    disk_events = [e for e in telemetry.compile_log if e.detail.get("disk")]
    assert disk_events, "compile events of executables loaded from disk carry detail['disk']"


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_checks_of_an_executable_loaded_from_disk_still_raise(disk_cache, mode):
    """A disk hit is never traced, and tracing is what ties an op's flag outputs to the errors they stand for:
    the entry stores them, so an out-of-range index raises in a warm process as in a cold one."""
    def gather(index_value: int):
        with torchtpu_lab.eager_mode(mode):
            x = torch.arange(13.0, device="tpu")
            return x[torch.tensor([1, index_value], device="tpu")].cpu()

    assert gather(12).tolist() == [1.0, 12.0]  # compiled and stored
    _fresh_process_view()
    before = _counts()
    with pytest.raises(IndexError, match="out of bounds"):
        gather(13)
    assert _delta(before)["persistent_cache_hits"] > 0, _delta(before)
    assert gather(3).tolist() == [1.0, 3.0]  # and the session carries on


def _damage_all(directory, how):
    names = [n for n in os.listdir(directory) if n.endswith(".tpx")]
    assert names
    for n in names:
        path = os.path.join(directory, n)
        data = open(path, "rb").read()
        if how == "truncated":
            open(path, "wb").write(data[: len(data) // 2])
        elif how == "flipped":
            b = bytearray(data)
            b[len(b) // 2] ^= 0xFF
            open(path, "wb").write(bytes(b))
        elif how == "garbage":
            open(path, "wb").write(os.urandom(4096))
        elif how == "empty":
            open(path, "wb").close()
        elif how == "endless":
            os.remove(path)
            os.symlink("/dev/zero", path)
        elif how == "fifo":
            os.remove(path)
            os.mkfifo(path)
        elif how == "directory":
            os.remove(path)
            os.mkdir(path)
        elif how == "swapped":  # a valid entry under another entry's name
            other = os.path.join(directory, names[(names.index(n) + 1) % len(names)])
            if other != path:
                open(path, "wb").write(open(other, "rb").read() if os.path.isfile(other) else b"")
            else:
                open(path, "wb").write(b"")
    return names


@pytest.mark.parametrize("how", ["truncated", "flipped", "garbage", "empty", "endless", "fifo", "directory",
                                 "swapped"])
def test_damaged_entries_warn_and_compile(disk_cache, how):
    if how == "fifo" and not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs here")
    torch.testing.assert_close(_step(), _expected())
    _damage_all(disk_cache, how)
    _fresh_process_view()
    before = _counts()
    with pytest.warns(RuntimeWarning, match="damaged compilation cache entry"):
        out = _step()
    torch.testing.assert_close(out, _expected())
    d = _delta(before)
    assert d["persistent_cache_errors"] > 0 and d["xla_compiles"] > 0, d
    if how != "directory":  # a directory in the way cannot be replaced by a rename; the others are rewritten
        _fresh_process_view()
        before = _counts()
        torch.testing.assert_close(_step(), _expected())
        d = _delta(before)
        assert d["persistent_cache_errors"] == 0 and d["persistent_cache_hits"] > 0, d


def test_oversized_entries_are_refused(disk_cache, monkeypatch):
    torch.testing.assert_close(_step(), _expected())
    monkeypatch.setenv("TORCHTPU_LAB_CACHE_MAX_ENTRY_MB", "0.001")  # 1 KiB: every real entry is larger
    _fresh_process_view()
    with pytest.warns(RuntimeWarning, match="entry cap"):
        torch.testing.assert_close(_step(), _expected())


def test_read_only_cache_is_read(disk_cache, monkeypatch):
    torch.testing.assert_close(_step(), _expected())
    n = compile_cache.entries()

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    # the test runs as root in CI, where chmod cannot make a directory unwritable: refuse file creation instead
    monkeypatch.setattr(compile_cache.tempfile, "NamedTemporaryFile", refuse)
    monkeypatch.setattr(compile_cache.tempfile, "mkstemp", refuse)
    with pytest.warns(RuntimeWarning, match="read-only"):
        assert compile_cache.enable(disk_cache) == disk_cache
    assert compile_cache.read_only()
    _fresh_process_view()
    before = _counts()
    torch.testing.assert_close(_step(), _expected())
    d = _delta(before)
    assert d["persistent_cache_hits"] > 0 and d["persistent_cache_misses"] == 0 and d["xla_compiles"] == 0, d
    with torchtpu_lab.eager_mode("strict"):  # a new signature compiles and is not written
        assert (torch.ones(3, 11, device="tpu") * 2).sum().item() == 66.0
    assert compile_cache.entries() == n
    assert compile_cache.clear() == 0 and compile_cache.entries() == n


def test_enabling_the_cache_leaves_jax_config_alone(disk_cache):
    assert jax.config.jax_compilation_cache_dir in (None, "")
    assert torchtpu_lab.global_changes()["jax_compilation_cache_dir"] in (None, "")


def test_signature_digests_are_canonical():
    slot = Slot("T", 0, torch.float32, (2, 3), (2, 3), None)
    sig = OpSignature(torch.ops.aten.add.Tensor, (slot, Static(int, 1)), (), "highest")
    assert digest(sig) == digest(OpSignature(torch.ops.aten.add.Tensor, (slot, Static(int, 1)), (), "highest"))
    # 1, True and 1.0 are different programs; so are dtypes and ops
    assert len({digest(sig._replace(args=(slot, Static(t, t(1))))) for t in (int, bool, float)}) == 3
    assert digest(sig._replace(op=torch.ops.aten.sub.Tensor)) != digest(sig)
    assert digest(sig._replace(args=(slot._replace(dtype=torch.float16), Static(int, 1)))) != digest(sig)
    # a value identified only by its address is never written to disk
    assert digest(sig._replace(args=(slot, Static(object, object())))) is None
    assert digest(sig._replace(args=(slot, lambda: 0))) is None


def test_op_signature_encodings_are_remembered_by_identity_not_equality():
    """A graph's key encodes each node's op signature; the encoding is remembered per signature object. Equal
    signatures may still be different programs (0.0 == -0.0), so the memo must not answer for an equal one."""
    from torchtpu_lab.runtime import signatures

    slot = Slot("T", 0, torch.float32, (2, 3), (2, 3), None)
    pos, neg = (OpSignature(torch.ops.aten.clamp.default, (slot, Static(float, z)), (), "highest") for z in (0.0, -0.0))
    assert pos == neg
    first = digest((pos, pos, neg))
    assert digest(neg) != digest(pos)
    signatures._OP_TEXT.clear()
    assert digest((pos, pos, neg)) == first  # the memo gives what a fresh encoding gives
    assert signatures._OP_TEXT[id(pos)][0] is pos
