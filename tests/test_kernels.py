"""JAX and Pallas functions as PyTorch ops on the tpu device (torchtpu_lab.jax_op / call_jax)."""

from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
import pytest
import torch
from jax.experimental import pallas as pl
from torch._subclasses.fake_tensor import FakeTensorMode

import torchtpu_lab
from torchtpu_lab import call_jax, jax_op, telemetry
from torchtpu_lab.runtime import fused

MODES = ["strict", "fused", "debug"]


@jax_op("ttl_test::scaled_gelu", autograd="vjp")
def scaled_gelu(x: jax.Array, scale: float) -> jax.Array:
    return jax.nn.gelu(x) * scale


def _add_kernel(x_ref, y_ref, o_ref):
    o_ref[...] = x_ref[...] * 2.0 + y_ref[...]


@jax_op("ttl_test::pallas_axpy")
def pallas_axpy(x: jax.Array, y: jax.Array) -> jax.Array:
    return pl.pallas_call(_add_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                          interpret=jax.default_backend() != "tpu")(x, y)


def _axpy_backward(ctx, grad):
    return grad * 2.0, grad


pallas_axpy.register_autograd(_axpy_backward)


def _gelu_ref(x, scale):
    return torch.nn.functional.gelu(x, approximate="tanh") * scale


@pytest.fixture(params=MODES)
def mode(request):
    with torchtpu_lab.eager_mode(request.param):
        yield request.param


def test_jax_op_forward_and_vjp_backward_in_every_mode(mode):
    x = torch.randn(3, 4)
    xt = x.to("tpu").requires_grad_()
    y = scaled_gelu(xt, 2.0)
    y.sum().backward()
    xc = x.clone().requires_grad_()
    _gelu_ref(xc, 2.0).sum().backward()
    torch.testing.assert_close(y.detach().cpu(), _gelu_ref(x, 2.0), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(xt.grad.cpu(), xc.grad, rtol=1e-5, atol=1e-5)


def test_pallas_kernel_forward_and_registered_backward_in_every_mode(mode):
    x, y = torch.randn(8, 128), torch.randn(8, 128)
    xt, yt = x.to("tpu").requires_grad_(), y.to("tpu").requires_grad_()
    out = pallas_axpy(xt, yt)
    (out * 3).sum().backward()
    torch.testing.assert_close(out.detach().cpu(), 2 * x + y)
    torch.testing.assert_close(xt.grad.cpu(), torch.full_like(x, 6.0))
    torch.testing.assert_close(yt.grad.cpu(), torch.full_like(y, 3.0))


@jax_op("ttl_test::tpu_written_scale")
def tpu_written_scale(x: jax.Array) -> jax.Array:  # as written for a TPU: no interpret=, a TPU grid spec
    from jax.experimental.pallas import tpu as pltpu

    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 3.0

    spec = pl.BlockSpec((8, 128), lambda i: (i, 0), memory_space=pltpu.VMEM)
    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(x.shape[0] // 8,),
                          in_specs=[spec], out_specs=spec)(x)


def test_pallas_kernel_written_for_tpu_runs_off_tpu_without_interpret(mode):
    x = torch.randn(16, 128)
    torch.testing.assert_close(tpu_written_scale(x.to("tpu")).cpu(), x * 3)
    torch.testing.assert_close(tpu_written_scale(x), x * 3)  # the host implementation, on CPU tensors


def test_fused_mode_records_the_op_without_a_sync():
    with torchtpu_lab.eager_mode("fused"):
        torchtpu_lab.sync()
        x = torch.randn(4, 4, device="tpu") + 1  # pending work feeds the op
        with telemetry.Recorder() as events:
            y = scaled_gelu(x, 0.5)
            pending = fused.pending_ops()
        assert pending >= 2, "the op was recorded into the lazy graph with its input"
        assert not [e for e in events if e.kind == "sync"]
        assert tuple(y.shape) == (4, 4)
        torch.testing.assert_close(y.cpu(), _gelu_ref(x.cpu(), 0.5), rtol=1e-5, atol=1e-5)


def test_jax_ops_inside_torch_compile_are_inlined():
    torch._dynamo.reset()

    def f(a, b):
        return (pallas_axpy(scaled_gelu(a, 0.5), b) * b).sum()

    a, b = torch.randn(8, 128), torch.randn(8, 128)
    at, bt = a.to("tpu").requires_grad_(), b.to("tpu").requires_grad_()
    with torchtpu_lab.profile() as prof:
        out = torch.compile(f, backend="tpu", dynamic=False)(at, bt)
        out.backward()
    ac, bc = a.clone().requires_grad_(), b.clone().requires_grad_()
    ref = ((2 * _gelu_ref(ac, 0.5) + bc) * bc).sum()
    ref.backward()
    torch.testing.assert_close(out.detach().cpu(), ref.detach(), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(at.grad.cpu(), ac.grad, rtol=1e-4, atol=1e-4)
    compiled = [e for e in prof.compiles if e.detail.get("kind") == "compiled"]
    forward = next(e for e in compiled if "forward" in e.name)
    assert {"ttl_test::scaled_gelu", "ttl_test::pallas_axpy"} <= set(forward.detail["ops"])
    assert not [e for e in prof.compiles if e.detail.get("kind") == "eager-graph"]


def test_shapes_under_fake_tensor_mode():
    with FakeTensorMode():
        x = torch.empty(5, 7, device="tpu")
        y = scaled_gelu(x, 1.0)
        z = pallas_axpy(x, x)
    assert tuple(y.shape) == (5, 7) and y.device.type == "tpu" and y.dtype == torch.float32
    assert tuple(z.shape) == (5, 7)


def test_opcheck_passes():
    x = torch.randn(3, 4)
    torch.library.opcheck(scaled_gelu, (x.to("tpu"), 2.0))
    torch.library.opcheck(scaled_gelu, (x.clone().requires_grad_(), 2.0))
    torch.library.opcheck(pallas_axpy, (torch.randn(8, 128).to("tpu"), torch.randn(8, 128).to("tpu")))


def test_call_jax_one_off_with_several_outputs():
    a, b = torch.randn(3, 4), torch.randn(4, 2)
    prod, total = call_jax(lambda p, q: (p @ q, p.sum()), a.to("tpu"), b.to("tpu"))
    torch.testing.assert_close(prod.cpu(), a @ b, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(total.cpu(), a.sum(), rtol=1e-5, atol=1e-5)
    single = call_jax(jnp.tanh, a.to("tpu"))
    torch.testing.assert_close(single.cpu(), torch.tanh(a), rtol=1e-6, atol=1e-6)


def test_mutating_jax_op_writes_its_argument(mode):
    @jax_op(f"ttl_test::accumulate_{mode}", mutates_args=("acc",))
    def accumulate(acc: jax.Array, x: jax.Array) -> jax.Array:
        return acc + x

    acc = torch.zeros(3, device="tpu")
    view = acc[1:]
    assert accumulate(view, torch.ones(2, device="tpu")) is None
    torch.testing.assert_close(acc.cpu(), torch.tensor([0.0, 1.0, 1.0]))


def test_error_in_the_jax_function_names_the_op_and_the_line():
    @jax_op("ttl_test::bad")
    def bad(x: jax.Array) -> jax.Array:
        return x @ jnp.ones((7, 7))  # wrong inner dimension

    line = inspect.currentframe().f_lineno + 2
    with pytest.raises(RuntimeError) as info:
        bad(torch.ones(2, 3, device="tpu"))
    text = str(info.value)
    assert "ttl_test::bad" in text and f"test_kernels.py:{line}" in text


def test_annotations_are_required_and_checked():
    with pytest.raises(TypeError, match="needs an annotation"):
        jax_op("ttl_test::unannotated", lambda x: x)

    def wrong(x: dict) -> jax.Array:
        return x

    with pytest.raises(TypeError, match="annotated"):
        jax_op("ttl_test::wrong", wrong)


def test_an_edited_jax_op_never_loads_the_old_program_from_the_persistent_cache(tmp_path):
    """A kernel edited between two processes keeps its name: the persistent cache must not hand the new process
    the old program (jax_op ops are never keyed on disk by name)."""
    from fresh_process import run_with_cache

    script = """
        import jax, torch, torchtpu_lab
        @torchtpu_lab.jax_op("edited::scale")
        def scale(a: jax.Array) -> jax.Array:
            return a * {factor}
        x = torch.ones(4, device="tpu")
        with torchtpu_lab.eager_mode("strict"):
            strict = scale(x).cpu().tolist()
        with torchtpu_lab.eager_mode("fused"):
            fused = (scale(x + 1) + 1).cpu().tolist()
        extra = {{"strict": strict, "fused": fused}}
    """
    first = run_with_cache(script.format(factor=2.0), tmp_path)
    second = run_with_cache(script.format(factor=3.0), tmp_path)
    assert (first["strict"], first["fused"]) == ([2.0] * 4, [5.0] * 4)
    assert (second["strict"], second["fused"]) == ([3.0] * 4, [7.0] * 4)
