"""The tpu device behaves like cuda from the user's side: creation, transfers, printing, errors."""

import subprocess
import sys

import numpy as np
import pytest
import torch

import torchtpu_lab


def test_import_registers_device_idempotently():
    from torchtpu_lab.backend.registration import register

    register()
    register()
    assert torch._C._get_privateuse1_backend_name() == "tpu"
    assert torch.device("tpu").type == "tpu"
    assert torch.tpu.is_available()
    assert torch.tpu.device_count() >= 1


def test_platform_is_reported_honestly():
    name = torch.tpu.platform_name()
    platform = torchtpu_lab.platform_info().platform
    assert f"XLA:{platform.upper()}" in name
    if platform == "cpu":
        assert "no TPU here" in name
    assert platform.upper() in torch.tpu.get_device_name()


def test_factories_transfers_and_flags():
    a = torch.ones(2, 3, device="tpu")
    assert a.device == torch.device("tpu:0") and a.is_tpu and not a.is_cpu
    b = torch.arange(6.0).reshape(2, 3).tpu()
    assert b.is_tpu
    c = (a + b).cpu()
    assert c.device.type == "cpu"
    np.testing.assert_array_equal(c.numpy(), np.arange(6.0).reshape(2, 3) + 1)
    assert torch.zeros(3, device="tpu", dtype=torch.int64).dtype == torch.int64
    assert b.sum().item() == 15.0
    assert isinstance(torch.tensor(3, device="tpu").item(), int)
    assert torch.tensor([1.5, 2.5]).to("tpu").tolist() == [1.5, 2.5]


def test_numpy_requires_cpu_copy_like_cuda():
    t = torch.ones(2, device="tpu")
    with pytest.raises(TypeError, match="tpu"):
        t.numpy()
    assert t.cpu().numpy().tolist() == [1.0, 1.0]


def test_module_to_tpu_moves_parameters_and_buffers():
    m = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3)).to("tpu")
    assert all(p.is_tpu for p in m.parameters())
    assert all(b.is_tpu for b in m.buffers())
    assert all(isinstance(p, torch.nn.Parameter) for p in m.parameters())
    m2 = torch.nn.Linear(2, 2).tpu()
    assert m2.weight.is_tpu


def test_printing_shows_values_device_and_grad():
    t = torch.tensor([[1.0, 2.0], [3.0, 4.0]], device="tpu", requires_grad=True)
    text = repr(t * 2)
    assert text.startswith("tensor([[2., 4.],")
    assert "device='tpu:0'" in text and "grad_fn=<MulBackward0>" in text
    assert str(torch.tensor([1, 2], device="tpu")) == "tensor([1, 2], device='tpu:0')"


def test_missing_device_index_lists_available_devices():
    n = len(torchtpu_lab.platform_info().devices)
    with pytest.raises(RuntimeError, match="available devices: tpu:0") as e:
        torch.ones(2).to(f"tpu:{n}")
    if torchtpu_lab.platform_info().platform == "cpu":  # says how XLA:CPU makes more devices
        assert f"--xla_force_host_platform_device_count={n + 1}" in str(e.value)


def test_mixing_cpu_and_tpu_tensors_raises_like_pytorch():
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch.ones(3, device="tpu") + torch.ones(3)
    # a 0-dim CPU tensor is allowed, as with cuda
    out = torch.ones(3, device="tpu") + torch.tensor(2.0)
    assert out.cpu().tolist() == [3.0, 3.0, 3.0]


_test_lib = torch.library.Library("ttl_test", "DEF")
_test_lib.define("frobnicate.special(Tensor x, int k) -> Tensor")
_test_lib.impl("frobnicate.special", lambda x, k: x * k, "CPU")
_test_lib.define("bump_(Tensor(a!) x) -> Tensor(a!)")
_test_lib.impl("bump_", lambda x: x.add_(1), "CPU")


def test_unlowered_op_names_op_and_overload_when_fallback_is_off():
    assert torch.ops.ttl_test.frobnicate.special(torch.ones(2), 3).tolist() == [3.0, 3.0]
    torchtpu_lab.set_cpu_fallback(False)
    try:
        with pytest.raises(NotImplementedError, match=r"ttl_test::frobnicate\.special"):
            torch.ops.ttl_test.frobnicate.special(torch.ones(2, device="tpu"), 3)
    finally:
        torchtpu_lab.set_cpu_fallback(True)


def test_cpu_fallback_runs_warns_once_and_counts_the_calling_line():
    from torchtpu_lab import telemetry
    from torchtpu_lab.runtime import cpu_fallback

    x = torch.ones(2, device="tpu")
    before = telemetry.counters["cpu_fallbacks"]
    with pytest.warns(RuntimeWarning, match="ttl_test::frobnicate.special is not lowered"):
        y = torch.ops.ttl_test.frobnicate.special(x, 3)  # FALLBACK_LINE
    assert y.is_tpu and y.cpu().tolist() == [3.0, 3.0]
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the second call does not warn again
        torch.ops.ttl_test.frobnicate.special(x, 2)
    assert telemetry.counters["cpu_fallbacks"] == before + 2
    entry = cpu_fallback.summary()["ttl_test::frobnicate.special"]
    assert entry["count"] >= 2
    assert any("test_device.py" in where for where in entry["sources"])


def test_cpu_fallback_writes_mutated_arguments_back():
    x = torch.zeros(3, device="tpu")
    v = x[1:]
    with pytest.warns(RuntimeWarning):
        out = torch.ops.ttl_test.bump_(v)
    assert out is v
    assert x.cpu().tolist() == [0.0, 1.0, 1.0]


def test_cpu_fallback_resizes_an_empty_out_tensor():
    # linalg_eigvals.out has no lowering: CPU's kernel grows the host copy of `out`, which must own its storage
    import warnings

    out = torch.tensor([], dtype=torch.complex64, device="tpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the fallback's own notice
        result = torch.linalg.eigvals(torch.diag(torch.tensor([2.0, 3.0], device="tpu")), out=out)
    assert result is out and sorted(out.cpu().real.tolist()) == [2.0, 3.0]


def test_bad_input_error_keeps_earlier_tensors_usable():
    a = torch.arange(4.0, device="tpu")
    with pytest.raises(RuntimeError):
        a.view(3, 5)
    with pytest.raises(RuntimeError):
        torch.ones(2, 3, device="tpu") @ torch.ones(4, 5, device="tpu")
    assert a.sum().item() == 6.0


def test_dtype_promotion_and_64_bit_types():
    i = torch.tensor([1, 2, 3], device="tpu")
    assert i.dtype == torch.int64
    assert (i + 1.5).dtype == torch.float32
    assert (i * 2).dtype == torch.int64
    big = torch.tensor([2**40], device="tpu")
    assert (big + 1).item() == 2**40 + 1
    d = torch.tensor([1.0], dtype=torch.float64, device="tpu")
    assert (d / 3).dtype == torch.float64
    assert (d / 3).item() == pytest.approx(1 / 3, rel=1e-15)
    h = torch.ones(2, dtype=torch.bfloat16, device="tpu")
    assert (h + 1).dtype == torch.bfloat16 and (h + 1).cpu().tolist() == [2.0, 2.0]
    b = torch.tensor([True, False], device="tpu")
    assert (b + b).dtype == torch.bool


def test_rng_is_seedable_and_reproducible():
    torch.manual_seed(123)
    a = torch.randn(5, device="tpu")
    torch.manual_seed(123)
    b = torch.randn(5, device="tpu")
    c = torch.randn(5, device="tpu")
    assert torch.equal(a.cpu(), b.cpu())
    assert not torch.equal(b.cpu(), c.cpu())
    torch.tpu.manual_seed(7)
    x = torch.rand(3, device="tpu")
    torch.tpu.manual_seed(7)
    assert torch.equal(x.cpu(), torch.rand(3, device="tpu").cpu())
    state = torch.tpu.get_rng_state()
    y = torch.rand(3, device="tpu")
    torch.tpu.set_rng_state(state)
    assert torch.equal(y.cpu(), torch.rand(3, device="tpu").cpu())


def test_memory_accounting_matches_jax_live_arrays_in_fresh_process():
    code = r"""
import os
os.environ.setdefault("TORCHTPU_LAB_PLATFORM", "cpu")
import gc, jax, torch, torchtpu_lab
def live():
    gc.collect()
    return sum(a.nbytes for a in jax.live_arrays())
assert torch.tpu.memory_allocated() == live() == 0, (torch.tpu.memory_allocated(), live())
a = torch.ones(1000, device="tpu")
b = torch.zeros(10, 10, dtype=torch.int64, device="tpu")
c = a[10:20]          # a view holds no new buffer
a.add_(1)             # replaces a's buffer
assert torch.tpu.memory_allocated() == live() == 4000 + 800, (torch.tpu.memory_allocated(), live())
peak = torch.tpu.max_memory_allocated()
assert peak >= 4800
assert torch.tpu.memory_reserved() == 4800 and torch.tpu.max_memory_reserved() == peak  # as torch.accelerator's
assert torch.accelerator.memory_reserved() == torch.tpu.memory_reserved()
del a, b
gc.collect()
assert torch.tpu.memory_allocated() == live() == 4000, (torch.tpu.memory_allocated(), live())  # c keeps a's storage
del c
gc.collect()
assert torch.tpu.memory_allocated() == live() == 0
torch.tpu.reset_peak_memory_stats()
assert torch.tpu.max_memory_allocated() == 0
stats = torch.tpu.memory_stats()
assert stats["allocated_bytes.all.current"] == 0
assert "allocated now" in torch.tpu.memory_summary()
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "ok" in out.stdout


def test_synchronize_and_module_api():
    x = torch.ones(100, device="tpu") * 3
    torch.tpu.synchronize()
    assert torch.tpu.current_device() == 0
    assert torch.tpu.memory_allocated() >= 400
    props = torch.tpu.get_device_properties(0)
    assert props["platform"] == torchtpu_lab.platform_info().platform
    assert x.sum().item() == 300


def test_each_tpu_index_is_one_jax_device():
    code = r"""
import os
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
os.environ["TORCHTPU_LAB_PLATFORM"] = "cpu"
import torch, torchtpu_lab
assert torch.tpu.device_count() == 2
a = torch.arange(3.0).to("tpu:1")
assert a.device == torch.device("tpu:1")
assert {d.id for d in a.tpu_storage.array.devices()} == {1}
b = a * 2
assert b.device == torch.device("tpu:1") and b.cpu().tolist() == [0.0, 2.0, 4.0]
assert {d.id for d in b.tpu_storage.array.devices()} == {1}
c = b.to("tpu:0")
torchtpu_lab.sync()
assert c.device == torch.device("tpu:0") and {d.id for d in c.tpu_storage.array.devices()} == {0}
try:
    b + c
    raise SystemExit("mixing devices must fail")
except RuntimeError as e:
    assert "tpu:1 and tpu:0" in str(e)
with torch.tpu.device(1):
    assert torch.zeros(2, device="tpu").device == torch.device("tpu:1")
assert torch.zeros(2, device="tpu").device == torch.device("tpu:0")
assert "device='tpu:1'" in repr(b)
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "ok" in out.stdout


def test_host_to_device_copies_take_jaxs_cpp_transfer_and_keep_every_dtype(monkeypatch):
    """`.to("tpu")` and `torch.tensor(..., device="tpu")` copy through JAX's C++ transfer, not jax.device_put's
    Python (ten times the cost of a small copy); values, dtypes and the user's own memory are kept."""
    import jax

    from torchtpu_lab.runtime import transfer

    if transfer._direct is None:
        pytest.skip("this JAX has no batched_device_put: jax.device_put serves (slower)")

    def refuse(*args, **kwargs):
        raise AssertionError("jax.device_put ran for a plain host copy")

    monkeypatch.setattr(jax, "device_put", refuse)
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.int8, torch.bool,
                  torch.float64, torch.complex64):
        host = (torch.randn(3, 5) * 4).to(dtype)
        moved = host.to("tpu")
        assert moved.dtype == dtype and moved.shape == host.shape
        assert torch.equal(moved.cpu(), host), dtype
    host = torch.arange(6.0)
    moved = host[::2].to("tpu")  # a strided view: its values, not its base's
    host.fill_(-1)  # the device copy never aliases the user's memory
    assert moved.cpu().tolist() == [0.0, 2.0, 4.0]
    assert torch.tensor([], device="tpu").shape == (0,)
    assert torch.tensor([[1, 2], [3, 4]], device="tpu").sum().item() == 10
    for view in (host.reshape(2, 3).t(), torch.randn(2, 3, 4).permute(2, 0, 1)[1:]):  # other layouts
        assert torch.equal(view.to("tpu").cpu(), view)
    made = []
    monkeypatch.setattr(transfer, "_shaped", lambda *a: made.append(a) or jax.core.ShapedArray(*a))
    monkeypatch.setattr(transfer, "_avals", {})
    for step in range(4):  # a batch of the same shape every step: its abstract value is made once
        batch = torch.full((2, 7), float(step))
        assert torch.equal(batch.to("tpu").cpu(), batch)
    assert len(made) == 1
    monkeypatch.setattr(transfer, "MAX_AVALS", 2)
    for n in range(1, 6):  # bounded
        assert torch.tensor([1.0] * n, device="tpu").cpu().tolist() == [1.0] * n
        assert len(transfer._avals) <= 2
    monkeypatch.undo()
    with pytest.raises(TypeError):  # not the machine's byte order: JAX's own error, never its bytes misread
        transfer.to_device(np.arange(6, dtype=">f4"), 0)


def test_a_host_copy_falls_back_to_jax_device_put_when_the_direct_transfer_refuses(monkeypatch):
    from torchtpu_lab.runtime import transfer

    calls = []

    def broken(*args, **kwargs):
        calls.append(args)
        raise TypeError("batched_device_put() takes other arguments in this JAX")

    monkeypatch.setattr(transfer, "_direct", broken)
    moved = torch.arange(4.0).to("tpu")
    assert calls and moved.cpu().tolist() == [0.0, 1.0, 2.0, 3.0]
    assert transfer._direct is None  # the public path from now on
    assert torch.tensor([7], device="tpu").item() == 7


def test_sparse_nested_and_quantized_tensors_are_refused_naming_the_op_and_layout():
    with pytest.raises(NotImplementedError, match=r"_sparse_coo_tensor_with_dims_and_tensors.*sparse COO tensors "
                                                  r"are not supported on tpu.*to_dense"):
        torch.randn(3, 3).to_sparse().to("tpu")
    csr = torch.randn(3, 3).to_sparse_csr().to("tpu")
    with pytest.raises(NotImplementedError, match=r"_to_dense.*sparse compressed .* not supported on tpu"):
        csr.to_dense()
    nested = torch.nested.nested_tensor([torch.randn(2), torch.randn(3)], device="tpu")
    with pytest.raises(NotImplementedError, match=r"unbind.*nested tensors are not supported on tpu"):
        nested.unbind()
    with pytest.raises(NotImplementedError, match=r"_empty_affine_quantized.*quantized tensors .* not supported on "
                                                  r"tpu.*dequantize"):
        torch._empty_affine_quantized([2], scale=0.5, zero_point=1, dtype=torch.quint8, device="tpu")
    assert torch.ones(2, device="tpu").sum().item() == 2.0  # the device goes on working
