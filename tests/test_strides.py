"""tpu tensors report the strides, storage offset and contiguity PyTorch's view semantics give, as CPU does
(issue 20 item 7), and everything PyTorch decides from them follows: ``view`` raises where CPU raises,
``reshape`` copies where CPU copies, ``as_strided`` addresses the base's storage, autograd's ``CopySlices``
writes a view's gradient where the view lies, ``torch.compile(backend="tpu")`` sees the same fake strides."""

from __future__ import annotations

import pytest
import torch

import torchtpu_lab
from compare import assert_same, no_cpu_fallback, raises_like_cpu, same

MODES = ("debug", "strict", "fused")

#: view ops (and chains of them) on a (3, 4, 5) base
VIEWS = {
    "t_of_2d": lambda x: x[0].t(),
    "transpose": lambda x: x.transpose(0, 2),
    "permute": lambda x: x.permute(2, 0, 1),
    "step_slice": lambda x: x[:, ::2, 1::2],
    "select": lambda x: x[1],
    "select_inner": lambda x: x[:, 2],
    "expand": lambda x: x[:, :1].expand(3, 6, 5),
    "diagonal": lambda x: x.diagonal(0, 1, 2),
    "diagonal_offset": lambda x: x.diagonal(1, 0, 2),
    "as_strided": lambda x: x.as_strided((4, 3), (2, 7), 5),
    "unfold": lambda x: x.unfold(2, 2, 1),
    "narrow": lambda x: x.narrow(1, 1, 2),
    "unsqueeze_of_t": lambda x: x[0].t().unsqueeze(1),
    "view_of_slice": lambda x: x[1:].view(2, 20),
    "reshape_of_permute": lambda x: x.permute(1, 0, 2).reshape(4, 15),
    "view_of_transpose_inner": lambda x: x.transpose(0, 1).view(4, 3, 5),
    "split": lambda x: x.split(2, dim=1)[1],
    "unbind": lambda x: x.unbind(2)[3],
    "squeeze_of_select": lambda x: x[:, 1:2].squeeze(1),
    "select_of_permute": lambda x: x.permute(2, 1, 0)[3],
}


def _base(device: str) -> torch.Tensor:
    return torch.arange(60.0).reshape(3, 4, 5).to(device)


def _geometry(t: torch.Tensor) -> tuple:
    return tuple(t.shape), t.stride(), t.storage_offset(), t.is_contiguous()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", sorted(VIEWS))
def test_view_geometry_and_values_match_cpu(name, mode):
    fn = VIEWS[name]
    cpu = fn(_base("cpu"))
    with torchtpu_lab.eager_mode(mode), no_cpu_fallback():
        tpu = fn(_base("tpu"))
        assert _geometry(tpu) == _geometry(cpu)
        assert_same(tpu, cpu, exact=True)
        dense = tpu.contiguous()
        assert dense.is_contiguous() and dense.stride() == cpu.contiguous().stride()
        assert_same(dense, cpu.contiguous(), exact=True)
        assert_same(tpu.reshape(-1), cpu.reshape(-1), exact=True)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", ["t_of_2d", "transpose", "permute", "step_slice", "expand", "diagonal", "unfold"])
def test_view_of_a_non_viewable_layout_raises_like_cpu(name, mode):
    fn = VIEWS[name]
    with torchtpu_lab.eager_mode(mode):
        error = raises_like_cpu(lambda x: fn(x).view(-1), _base("cpu"))
    assert "view size is not compatible" in str(error)


@pytest.mark.parametrize("mode", MODES)
def test_writes_through_strided_views_land_where_cpu_puts_them(mode):
    def write(x):
        x.t()[1:3].mul_(10)
        x[:, ::2].add_(1)
        x.diagonal().zero_()
        x.as_strided((2, 2), (1, 5), 2).fill_(-1)
        return x

    with torchtpu_lab.eager_mode(mode):
        same(write, torch.arange(20.0).reshape(4, 5))


@pytest.mark.parametrize("mode", MODES)
def test_as_strided_round_trips(mode):
    def chain(x):
        y = x[1:].t()  # storage offset 5, strides (1, 5)
        z = y.as_strided(y.shape, y.stride(), y.storage_offset())  # the same view again
        w = torch.as_strided(z, (3,), (6,), 1)  # absolute offset into the base's storage
        return z, w, y.as_strided((2, 2), (1, 5))  # default offset: the view's own

    with torchtpu_lab.eager_mode(mode):
        z, w, d = same(chain, torch.arange(20.0).reshape(4, 5))
    assert (z.stride(), z.storage_offset(), w.storage_offset(), d.storage_offset()) == ((1, 5), 5, 1, 5)


@pytest.mark.parametrize("mode", MODES)
def test_autograd_through_transposed_and_sliced_views(mode):
    def step(device):
        w = torch.arange(12.0, device=device).reshape(3, 4).requires_grad_()
        y = w * 1
        y.t()[1:].mul_(2)  # CopySlices: the gradient goes through the view's real geometry
        z = (y.t() @ torch.ones(3, 2, device=device)).sum() + y[:, ::2].square().sum()
        z.backward()
        return w.grad

    with torchtpu_lab.eager_mode(mode):
        assert_same(step("tpu"), step("cpu"), exact=True)


@pytest.mark.parametrize("mode", MODES)
def test_empty_strided_and_channels_last(mode):
    def make(device):
        e = torch.empty_strided((2, 3), (1, 2), device=device)
        e.copy_(torch.arange(6.0).reshape(2, 3))
        c = torch.empty((2, 3, 4, 5), device=device, memory_format=torch.channels_last)
        c.copy_(torch.arange(120.0).reshape(2, 3, 4, 5))
        assert c.is_contiguous(memory_format=torch.channels_last)
        conv = torch.nn.Conv2d(3, 4, 3).to(device)
        with torch.no_grad():
            conv.weight.copy_(torch.linspace(-1, 1, 108).reshape(4, 3, 3, 3))
            conv.bias.zero_()
        out = conv.to(memory_format=torch.channels_last)(c)  # numbers as CPU's, whatever the layout reported
        return e, (e.stride(), c.stride()), c, out

    with torchtpu_lab.eager_mode(mode):
        tpu = make("tpu")
    cpu = make("cpu")
    assert tpu[1] == cpu[1]
    assert_same(tpu[0], cpu[0], exact=True)
    assert_same(tpu[2], cpu[2], exact=True)
    assert_same(tpu[3], cpu[3], rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("mode", MODES)
def test_resize_to_a_memory_format_restrides_as_cpu_does(mode):
    """``resize_(size, memory_format=)`` gives that format's strides over the same storage elements (values move
    with the strides, as CPU's restride moves them), grown or not; ``resize_as_(t, preserve_format)`` takes the
    template's format. Before, both stayed row-major (PyTorch's own test_view_ops caught it)."""
    def make(device):
        flat = torch.arange(24.0, device=device)
        flat.resize_((2, 3, 2, 2), memory_format=torch.channels_last)
        same = torch.arange(24.0, device=device).reshape(2, 3, 2, 2)
        same.resize_((2, 3, 2, 2), memory_format=torch.channels_last)
        base = torch.zeros(40, device=device)
        inner = base[10:]
        inner.resize_((2, 3, 2, 2), memory_format=torch.channels_last)  # fits: a view of the same storage
        inner.fill_(1.0)
        template = torch.empty((2, 3, 2, 2), device=device, memory_format=torch.channels_last)
        preserved = torch.arange(24.0, device=device)
        preserved.resize_as_(template, memory_format=torch.preserve_format)
        plain = torch.arange(24.0, device=device)
        plain.resize_as_(template)
        back = torch.empty((2, 3, 2, 2), device=device, memory_format=torch.channels_last)
        back.copy_(torch.arange(24.0).reshape(2, 3, 2, 2))
        back.resize_(back.shape, memory_format=torch.contiguous_format)  # the same sizes restride too
        tensors = (flat, same, inner, base, preserved, plain, back)
        return [t.stride() for t in tensors], [t.storage_offset() for t in tensors], tensors

    with torchtpu_lab.eager_mode(mode):
        tpu = make("tpu")
    cpu = make("cpu")
    assert tpu[0] == cpu[0] and tpu[1] == cpu[1]
    assert tpu[2][0].is_contiguous(memory_format=torch.channels_last)
    for got, want in zip(tpu[2], cpu[2]):
        assert_same(got, want, exact=True)


@pytest.mark.parametrize("fn, ok", [
    (lambda x: x.t().view(-1), False),
    (lambda x: x.t().reshape(-1), True),
    (lambda x: x.t().contiguous().view(-1), True),
    (lambda x: (x.t().is_contiguous(), x.t().stride(), x[1:].storage_offset()), True),
])
def test_compiled_transposed_views_behave_like_cpu(fn, ok):
    torch._dynamo.reset()
    x = torch.arange(6.0).reshape(2, 3)
    if not ok:
        with pytest.raises(Exception) as cpu_error:
            torch.compile(fn, backend="eager")(x.clone())
        with pytest.raises(type(cpu_error.value)) as tpu_error:
            torch.compile(fn, backend="tpu")(x.to("tpu"))
        assert "view" in str(tpu_error.value)
        return
    expected = torch.compile(fn, backend="eager")(x.clone())
    got = torch.compile(fn, backend="tpu")(x.to("tpu"))
    if isinstance(expected, torch.Tensor):
        assert_same(got, expected, exact=True)
    else:
        assert got == expected == (False, (1, 3), 3)


@pytest.mark.parametrize("name, fn", [
    ("as_strided_of_transposed_input", lambda x: x.as_strided((2, 2), (1, 4), 1) * 1),
    ("alias_of_transposed_input", lambda x: x[1:]),
    ("write_through_transposed_input", lambda x: x[1].mul_(2)),
    ("view_after_layout_preserving_op", lambda x: (x * 2).t().view(-1)),
])
def test_compiled_graph_on_a_transposed_input_matches_cpu(name, fn):
    """Inside a graph every value is a row-major array; what depends on layout (as_strided, aliasing outputs,
    input mutation) must still match CPU, whose fake strides Dynamo now sees."""
    results = []
    for device, backend in (("cpu", "eager"), ("tpu", "tpu")):
        torch._dynamo.reset()
        base = torch.arange(12.0).reshape(3, 4).to(device)
        out = torch.compile(fn, backend=backend)(base.t())
        results.append((out, base))
    (tpu, tpu_base), (cpu, cpu_base) = results[1], results[0]
    assert_same(tpu, cpu, exact=True)
    if not name.startswith("as_strided"):  # an alias of the input (a non-view op's output is row-major here)
        assert (tpu.stride(), tpu.storage_offset()) == (cpu.stride(), cpu.storage_offset())
    assert_same(tpu_base, cpu_base, exact=True)
