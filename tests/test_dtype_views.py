"""Views that change the dtype (``x.view(torch.int32)``, ``torch.view_as_real``/``view_as_complex``, ``x.real``,
``x.imag``) are aliases of their base's bytes, as on CPU: a write through one reaches the base and every other
view, and a write to the base shows in them. They were copies: ``x.real.fill_(1)`` changed nothing, so
``torch.testing.make_tensor(..., dtype=torch.complex64, device="tpu")`` returned zeros."""

import pytest
import torch
from compare import assert_same, same_on_both_devices

import torchtpu_lab

MODES = ["fused", "strict", "debug"]


@pytest.mark.parametrize("mode", MODES)
def test_writes_through_component_views_reach_the_complex_tensor(mode):
    def f(d):
        x = torch.zeros(2, 3, dtype=torch.complex64, device=d)
        x.real.fill_(1.5)
        x.imag[1].add_(2)
        torch.view_as_real(x)[0, :, 1].mul_(3).sub_(1)
        r = x.real  # a view: later writes to x show in it
        x.mul_(1j)
        return x, r, x.imag + 0

    with torchtpu_lab.eager_mode(mode):
        same_on_both_devices(f, exact=True)


@pytest.mark.parametrize("mode", MODES)
def test_bit_views_of_other_widths_alias_the_storage(mode):
    def f(d):
        x = torch.arange(8, dtype=torch.float32, device=d)
        x.view(torch.int32)[2:4].add_(1)  # the next float after 2.0 and 3.0
        h = x.view(torch.int16).view(4, 4)
        h[:, 0].fill_(7)  # the low halves (little-endian)
        b = x.view(torch.uint8)
        b[-1] = 0x40
        w = x.view(torch.float64)  # two floats per element
        w[0] = -1.0
        return x, h + 0, b + 0, w + 0

    with torchtpu_lab.eager_mode(mode):
        same_on_both_devices(f, exact=True)


def test_a_loop_of_writes_through_a_dtype_view_in_fused_mode():
    """The same write, recorded several times in one graph (the native recording kernel leaves views with a cast
    to the Python path, which reads and writes the storage's bytes)."""
    def f(d):
        x = torch.ones(4, dtype=torch.complex64, device=d)
        for i in range(5):
            x.imag.add_(i)
            torch.view_as_real(x)[:, 0].mul_(2)
            y = x.abs()  # reads the complex values between the writes
        return x, y

    with torchtpu_lab.eager_mode("fused"):
        same_on_both_devices(f, exact=True)


def test_view_as_complex_of_a_real_tensor_writes_the_pairs():
    def f(d):
        x = torch.arange(12.0, device=d).view(2, 3, 2)
        c = torch.view_as_complex(x)
        c[1].mul_(1j)
        c.conj_physical_()
        back = torch.view_as_real(c)  # back in the storage's own dtype: an ordinary view of x
        back[0, 0, 0] = 100
        return x, c + 0, back._base is x

    same_on_both_devices(f, exact=True)


def test_a_wider_view_of_part_of_a_storage_whose_size_it_does_not_divide():
    """Three bytes: ``b[:2].view(int16)`` reads the first two; writing it leaves the third alone."""
    def f(d):
        b = torch.tensor([1, 2, 3], dtype=torch.int8, device=d)
        v = b[:2].view(torch.int16)
        v.add_(0x0101)
        return b, v + 0

    same_on_both_devices(f, exact=True)


def test_a_bool_view_leaves_the_bytes_it_does_not_write():
    def f(d):
        u = torch.tensor([2, 0, 7, 1], dtype=torch.uint8, device=d)
        m = u.view(torch.bool)
        m[1] = True
        return u, m + 0, m.sum()

    same_on_both_devices(f, exact=True)


def test_dtype_views_are_views_of_their_base():
    x = torch.zeros(3, dtype=torch.complex64, device="tpu")
    r = torch.view_as_real(x)
    assert r._base is x and r.data_ptr() == x.data_ptr()
    assert (r.shape, r.stride(), r.storage_offset()) == ((3, 2), (2, 1), 0)
    im = x.imag
    assert (im.stride(), im.storage_offset(), im.dtype) == ((2,), 1, torch.float32)
    assert x.view(torch.int64).is_contiguous() and x.view(torch.int64).shape == (3,)


def test_make_tensor_of_a_complex_dtype_is_random_on_tpu():
    """PyTorch's own ``make_tensor`` fills ``view_as_real`` of a complex result: zeros on tpu while that was a copy
    (PyTorch's complex tests then tested zeros)."""
    torch.manual_seed(0)
    t = torch.testing.make_tensor(64, dtype=torch.complex64, device="tpu", low=-3, high=3)
    real, imag = t.real.cpu(), t.imag.cpu()
    assert (real != 0).all() and (imag != 0).all() and not torch.equal(real, imag)
    assert real.abs().max() <= 3 and imag.abs().max() <= 3


def test_gradients_flow_through_dtype_views():
    def f(d):
        w = torch.tensor([[1.0, -2.0], [0.5, 3.0]], device=d, requires_grad=True)
        c = torch.view_as_complex(w * 2)
        loss = (c * c.conj()).real.sum() + torch.view_as_real(c.exp()).sum()
        loss.backward()
        return loss.detach(), w.grad

    same_on_both_devices(f)


def test_an_error_in_a_write_through_a_dtype_view_loses_nothing():
    x = torch.arange(4.0, device="tpu")
    v = x.view(torch.int32)
    with pytest.raises(RuntimeError):
        v.add_(torch.ones(3, dtype=torch.int32, device="tpu"))  # CPU's broadcast error
    v.add_(1)
    assert_same(x, torch.arange(4.0).view(torch.int32).add_(1).view(torch.float32), exact=True)


def test_resize_of_a_dtype_view_stays_in_its_storage():
    def f(d):
        x = torch.zeros(4, dtype=torch.float64, device=d)
        v = x.view(torch.float32)
        v.resize_(2, 3)
        v.fill_(1.0)
        return x, v + 0

    same_on_both_devices(f, exact=True)


def test_in_place_writes_through_dtype_views_of_tensors_that_need_gradients():
    """Autograd replays a view that changes the dtype with its own view function (not ``as_strided``) when a
    write through it rebases the graph: the gradients must be CPU's."""
    def f(d):
        w = torch.tensor([1 + 2j, -0.5 + 1j, 3 - 1j], device=d, requires_grad=True)
        y = w * 2
        torch.view_as_real(y)[:, 0].mul_(3)
        y.imag.add_(1)
        v = torch.linspace(-1, 1, 12, device=d).view(3, 4).requires_grad_()
        z = torch.view_as_complex((v * 1).view(3, 2, 2))
        z.mul_(1j)
        loss = (y.abs() ** 2).sum() + z.real.sum() * 2 + z.imag.pow(2).sum()
        loss.backward()
        return loss.detach(), w.grad, v.grad

    same_on_both_devices(f)


def test_dtype_views_under_torch_compile():
    """A compiled graph computes the views' values with their lowerings (rotary embeddings as Meta's Llama writes
    them: pairs viewed as complex numbers, rotated, viewed back), with gradients."""
    def rotary(x, freqs):
        pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
        out = torch.view_as_real(pairs * freqs).flatten(-2)
        return out.type_as(x) + x.view(torch.int32).bitwise_and(0xFF).float() * 1e-3

    def f(d, fn):
        angles = torch.outer(torch.arange(6.0), torch.linspace(0.1, 1.0, 4))
        freqs = torch.polar(torch.ones_like(angles), angles).to(d)
        x = torch.linspace(-2, 2, 2 * 6 * 8).view(2, 6, 8).to(d).requires_grad_()  # the same bits on both
        y = fn(x, freqs)
        y.pow(2).sum().backward()
        return y.detach(), x.grad

    want = f("cpu", rotary)
    got = f("tpu", torch.compile(rotary, backend="tpu", dynamic=False))
    for g, w in zip(got, want):
        assert_same(g, w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", ["fused", "strict"])
def test_the_recording_kernel_keys_the_storage_dtype_of_a_view_it_records(mode):
    """Ops on views of another dtype, and the dtype-changing views themselves, are served without Python once
    taught (complex rotary embeddings handed 20 calls a step to Python), with the right dtype (a view back in the
    storage's dtype is of that dtype), and the same geometry over storages of two dtypes is two different calls."""
    from torchtpu_lab.runtime import recording

    def f(d):
        x = torch.tensor([1 + 2j, -3 + 0.5j, 0.25 - 1j], device=d)
        y = torch.tensor([1.5, -2.0, 3.25, 4.0, 0.5, 8.0]).view(torch.int64).to(d)  # normal floats' bits
        outs = []
        for _ in range(3):
            outs.append(torch.view_as_real(x) * 2)  # (3, 2) float32 over a (3,) complex64 storage
            outs.append(y.view(torch.float32).view(3, 2) * 2)  # the same geometry over a (3,) int64 storage
            outs.append(torch.view_as_complex(torch.view_as_real(x)))  # the storage's own dtype again
            outs.append(x.view(torch.float32)[2:6].view(torch.complex64) + 1)
        return outs

    with torchtpu_lab.eager_mode(mode):
        same_on_both_devices(f, exact=True)
        if recording.stats():  # the native core is built
            f("tpu")
            before = recording.stats().get("python", 0)
            f("tpu")
            assert recording.stats().get("python", 0) == before
