"""``aten::linear``'s tpu autograd kernel (``backend/linear_grad.py``) and the fused graph's output order.

Why these tests: tpu tensors report contiguous strides, so PyTorch's own ``addmm`` backward used to hand
``weight.grad`` a transposed view, and the fused SGD step then materialized a transpose per weight; and the
graph's outputs were laid out so that donated parameters aliased their gradients (an entry copy each). Both
are about *layout*, which no value test sees, so the orientation, the aliasing and the optimized HLO are
checked here, next to CPU-equal gradients in every eager mode.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torchtpu_lab
from torchtpu_lab.runtime import state

ATOL = 1e-5


@pytest.fixture(params=["debug", "strict", "fused"])
def eager_mode(request):
    with torchtpu_lab.eager_mode(request.param):
        yield request.param


def _pair(in_features: int, out_features: int, bias: bool) -> tuple[nn.Linear, nn.Linear]:
    """A CPU Linear and a tpu copy of it (same weights)."""
    cpu = nn.Linear(in_features, out_features, bias=bias)
    tpu = nn.Linear(in_features, out_features, bias=bias).to("tpu")
    tpu.load_state_dict(cpu.state_dict())
    return cpu, tpu


@pytest.mark.parametrize("shape", [(8, 16), (2, 8, 16), (16,)], ids=["2d", "3d", "1d"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_grads_equal_cpu_and_weight_grad_is_a_base(eager_mode, seeded, shape, bias):
    cpu, tpu = _pair(16, 4, bias)
    x = torch.randn(*shape, requires_grad=True)
    xt = x.detach().to("tpu").requires_grad_()
    cpu(x).sin().sum().backward()
    tpu(xt).sin().sum().backward()
    grad = tpu.weight.grad
    assert grad.shape == tpu.weight.shape
    assert grad.tpu_view is None, f"weight.grad is a view {grad.tpu_view} (a transposed gradient)"
    assert grad.is_contiguous()
    torch.testing.assert_close(grad.cpu(), cpu.weight.grad, atol=ATOL, rtol=1e-5)
    torch.testing.assert_close(xt.grad.cpu(), x.grad, atol=ATOL, rtol=1e-5)
    if bias:
        assert tpu.bias.grad.tpu_view is None
        torch.testing.assert_close(tpu.bias.grad.cpu(), cpu.bias.grad, atol=ATOL, rtol=1e-5)


def test_only_the_inputs_that_need_a_gradient_get_one(seeded):
    cpu, tpu = _pair(6, 3, True)
    tpu.weight.requires_grad_(False)
    x = torch.randn(5, 6, device="tpu")  # no grad
    tpu(x).sum().backward()
    assert tpu.weight.grad is None and x.grad is None
    torch.testing.assert_close(tpu.bias.grad.cpu(), torch.full((3,), 5.0))


@pytest.mark.parametrize("shape", [(5, 6), (2, 1, 6), (6,)], ids=["2d", "3d", "1d"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_no_grad_linear_is_one_op_equal_to_cpu(eager_mode, seeded, shape, bias):
    """Without a gradient (inference, ``generate``) a linear is one recorded op, not the decomposition's
    ``t``/``view``/``mm``/``_unsafe_view`` (each a dispatcher round trip): values equal CPU's, bit for bit here."""
    cpu, tpu = _pair(6, 3, bias)
    x = torch.randn(*shape)
    with torch.no_grad(), torchtpu_lab.profile() as prof:
        y = tpu(x.to("tpu"))
        got = y.cpu()
    assert y.grad_fn is None
    ops = [e.name for e in prof.events if e.kind == "op" and e.name.startswith("aten::")]
    assert ops.count("aten::linear") == 1 and not any("mm" in o for o in ops), ops
    torch.testing.assert_close(got, cpu(x).detach(), atol=ATOL, rtol=1e-5)
    with torch.inference_mode():
        torch.testing.assert_close(tpu(x.to("tpu")).cpu(), got, atol=0, rtol=0)
    y = tpu(x.to("tpu"))
    assert type(y.grad_fn).__name__ == "_LinearBackward"  # the autograd kernel is installed and used


def test_a_repeated_no_grad_linear_is_recorded_by_the_native_kernel(seeded):
    """A decode step's linears are repeated calls: the native core's autograd kernel sends them below autograd
    without a Python frame, to ``aten::linear``'s tpu kernel, which the recording kernel serves without entering
    the executor's Python (once taught by a first call); values stay CPU's."""
    import os
    import sys

    from torchtpu_lab import native
    from torchtpu_lab.runtime import recording

    if not recording.available(native.module()):
        pytest.skip(f"no recording kernel: {native.status().describe()}")
    cpu, tpu = _pair(6, 3, True)
    x = torch.randn(2, 1, 6)
    tx = x.to("tpu")
    torchtpu_lab.sync()
    with torchtpu_lab.eager_mode("fused"), torch.no_grad():
        outs = []
        files = []
        for i in range(5):  # the first two calls of this signature: compiled, then taught, by the Python path
            if i == 2:
                before = recording.stats()
            if i >= 2:
                sys.setprofile(lambda frame, event, arg: files.append(frame.f_code.co_filename))
            try:
                outs.append(F.linear(tx, tpu.weight, tpu.bias))
            finally:
                sys.setprofile(None)
        after = recording.stats()
    assert not [f for f in files if f.endswith(os.path.join("backend", "linear_grad.py"))]
    assert after["recorded"] - before["recorded"] == 3 and after["python"] == before["python"], (before, after)
    for y in outs:
        torch.testing.assert_close(y.cpu(), cpu(x).detach(), atol=ATOL, rtol=1e-5)


@pytest.mark.parametrize("bias_shape", [(3,), (1, 3), None], ids=["bias", "broadcast_bias", "nobias"])
def test_a_training_linear_runs_its_autograd_in_the_native_core(seeded, monkeypatch, bias_shape):
    """With the native core a linear that needs a gradient is a C++ autograd Function (csrc/autograd_kernels.cpp):
    neither its forward nor its backward runs linear_grad.py's Python Function (~50 us each way, a dozen times in
    a small transformer's step). Its gradients keep that Function's orientation and equal CPU's; a frozen weight
    gets none; activation checkpointing (saved-tensor hooks) recomputes through it; an input changed in place
    before the backward raises autograd's error and leaves the session usable."""
    from torchtpu_lab import native
    from torchtpu_lab.backend import linear_grad
    from torchtpu_lab.runtime import recording

    if not recording.available(native.module()):
        pytest.skip(f"no native core: {native.status().describe()}")
    python_calls = []
    for name in ("forward", "backward"):
        original = getattr(linear_grad._Linear, name)
        monkeypatch.setattr(linear_grad._Linear, name, staticmethod(
            lambda *a, _f=original, _n=name: python_calls.append(_n) or _f(*a)))
    x, w = torch.randn(2, 5, 6), torch.randn(3, 6)
    b = None if bias_shape is None else torch.randn(*bias_shape)

    def grads(device, frozen=False, checkpoint=False):
        xs, ws = x.to(device, copy=True).requires_grad_(), w.to(device, copy=True).requires_grad_(not frozen)
        bs = None if b is None else b.to(device, copy=True).requires_grad_()
        fn = lambda t: F.linear(t, ws, bs).tanh()  # noqa: E731
        y = torch.utils.checkpoint.checkpoint(fn, xs, use_reentrant=False) if checkpoint else fn(xs)
        y.sum().backward()
        return y, [t.grad for t in (xs, ws, bs) if t is not None]

    for frozen, checkpoint in ((False, False), (True, False), (False, True)):
        y, got = grads("tpu", frozen, checkpoint)
        _, want = grads("cpu", frozen, checkpoint)
        if not checkpoint:
            assert type(y.grad_fn.next_functions[0][0]).__name__ == "_LinearBackward"
            assert y.grad_fn.next_functions[0][0].name() == "torch::autograd::CppNode<torchtpu::Linear>"
        if not frozen:
            assert got[1].tpu_view is None  # the weight's gradient: a base tensor in the weight's orientation
        for g, c in zip(got, want):
            assert (g is None) == (c is None)
            if g is not None:
                torch.testing.assert_close(g.cpu(), c, atol=ATOL, rtol=1e-5)
    assert python_calls == []
    a = x.to("tpu").requires_grad_() * 1
    y = F.linear(a, w.to("tpu").requires_grad_())
    a.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()
    torch.testing.assert_close(F.linear(a, w.to("tpu")).cpu(), F.linear(x + 1, w), atol=ATOL, rtol=1e-5)


def test_compiled_autograd_traces_the_native_linear_backward(seeded):
    """An eager forward's backward run by compiled autograd (``torch._dynamo.compiled_autograd``) traces the C++
    linear node's backward (it is marked traceable: plain aten ops, no state): the same gradients as CPU's,
    with a broadcast bias and without one."""
    from torch._dynamo import compiled_autograd

    x, w, b = torch.randn(4, 6), torch.randn(3, 6), torch.randn(1, 3)
    grads = []
    for device in ("cpu", "tpu"):
        xs, ws, bs = (t.to(device, copy=True).requires_grad_() for t in (x, w, b))
        loss = F.linear(xs, ws, bs).tanh().sum() + F.linear(xs, ws).sum()
        with compiled_autograd._enable(torch.compile(backend="eager")):
            loss.backward()
        grads.append([t.grad.cpu() for t in (xs, ws, bs)])
    for got, want in zip(grads[1], grads[0]):
        torch.testing.assert_close(got, want, atol=ATOL, rtol=1e-5)


def test_double_backward_equals_cpu(seeded):
    x, w, b = torch.randn(3, 5, requires_grad=True), torch.randn(4, 5, requires_grad=True), torch.randn(4)
    xt, wt = (t.detach().to("tpu").requires_grad_() for t in (x, w))

    def grad_of_grad(x, w, b):
        gx, = torch.autograd.grad(F.linear(x, w, b).tanh().sum(), x, create_graph=True)
        return torch.autograd.grad(gx.square().sum(), (x, w))

    for got, want in zip(grad_of_grad(xt, wt, b.to("tpu")), grad_of_grad(x, w, b)):
        torch.testing.assert_close(got.cpu(), want, atol=ATOL, rtol=1e-5)


def test_forward_mode_ad_equals_cpu(seeded):
    import torch.autograd.forward_ad as fwad

    x, t, w = torch.randn(3, 5), torch.randn(3, 5), torch.randn(4, 5)
    tangents = []
    for device in ("cpu", "tpu"):
        with fwad.dual_level():
            dual = fwad.make_dual(x.to(device), t.to(device))
            tangents.append(fwad.unpack_dual(F.linear(dual, w.to(device).requires_grad_())).tangent.cpu())
    torch.testing.assert_close(tangents[1], tangents[0], atol=ATOL, rtol=1e-5)
    tangents = []  # a dual input and a weight that needs no gradient: not the no-grad fast path
    for device in ("cpu", "tpu"):
        with fwad.dual_level():
            dual = fwad.make_dual(x.to(device), t.to(device))
            tangents.append(fwad.unpack_dual(F.linear(dual, w.to(device))).tangent.cpu())
    torch.testing.assert_close(tangents[1], tangents[0], atol=ATOL, rtol=1e-5)


def test_fake_tensors_keep_seeing_aten_linear():
    """FakeTensorMode (torch.compile, export) must not run the tpu autograd kernel's Function."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(4, 6, device="tpu", requires_grad=True)
        w = torch.empty(3, 6, device="tpu", requires_grad=True)
        y = F.linear(x, w)
    assert type(y.grad_fn).__name__ != "_LinearBackward"


# ---- the fused SGD step's optimized HLO ------------------------------------------------------------------------


def _ops(hlo: str, name: str) -> int:
    """Instructions with opcode ``name`` ("x = type opcode(...)"; a tuple type is "(...)")."""
    return len(re.findall(rf"= (?:\([^()]*\)|\S+) {name}\(", hlo))


def _fused_sgd_step_hlo(sizes: tuple[int, ...], batch: int) -> str:
    """Optimized HLO of the fused graph of one SGD step of an MLP (ReLU between Linears, MSE loss)."""
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for a, b in zip(sizes, sizes[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    model = nn.Sequential(*layers[:-1]).to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(batch, sizes[0], device="tpu"), torch.randn(batch, sizes[-1], device="tpu")
    graphs = state.SESSION.graph_executables
    with torchtpu_lab.eager_mode("fused"):
        torchtpu_lab.sync()
        seen = {id(g) for g in graphs.values()}
        for _ in range(2):  # two steps: the step's graph is in the cache whether or not the second one hits it
            opt.zero_grad(set_to_none=True)
            F.mse_loss(model(x), y).backward()
            opt.step()
            torchtpu_lab.sync()
    # only graphs this step built: the largest graph of the whole cache may be another test's
    new = [g for g in graphs.values() if id(g) not in seen]
    assert new, "the SGD step built no fused graph"
    return max(new, key=lambda g: g.n_nodes).fn.as_text()


def _jax_sgd_step_hlo(sizes: tuple[int, ...], batch: int) -> str:
    """The same step written in JAX, jitted with its parameters donated (the baseline layout)."""
    params = [(jnp.ones((b, a)), jnp.ones((b,))) for a, b in zip(sizes, sizes[1:])]

    def loss(p, x, y):
        for i, (w, b) in enumerate(p):
            x = x @ w.T + b
            x = jax.nn.relu(x) if i < len(p) - 1 else x
        return jnp.mean((x - y) ** 2)

    def step(p, x, y):
        value, g = jax.value_and_grad(loss)(p, x, y)
        return value, jax.tree_util.tree_map(lambda a, b: a - 1e-3 * b, p, g)

    x, y = jnp.ones((batch, sizes[0])), jnp.ones((batch, sizes[-1]))
    return jax.jit(step, donate_argnums=0).lower(params, x, y).compile().as_text()


def test_fused_sgd_step_has_no_transpose_and_no_more_copies_than_jax():
    sizes, batch = (96, 80, 72, 56), 24  # sizes no other test uses: this step compiles its own graph
    ours, theirs = _fused_sgd_step_hlo(sizes, batch), _jax_sgd_step_hlo(sizes, batch)
    assert _ops(ours, "dot") == _ops(theirs, "dot")
    assert _ops(ours, "transpose") == 0, "a weight gradient is read transposed in the SGD update"
    # with the updated parameters first among the outputs, each donated weight aliases its own new value
    assert _ops(ours, "copy") <= _ops(theirs, "copy"), (_ops(ours, "copy"), _ops(theirs, "copy"))
