"""Views share storage with their base, in-place ops and out= write through them, as on CPU."""

import pytest
import torch
from compare import same_on_both_devices

import torchtpu_lab


def test_mutating_a_row_view_mutates_the_base():
    def f(d):
        x = torch.arange(12.0, device=d).reshape(3, 4)
        x[0].add_(1)
        x[:, 1].mul_(10)
        return x

    same_on_both_devices(f)


def test_write_through_transpose_and_strided_slices():
    def f(d):
        x = torch.zeros(4, 6, device=d)
        x.t()[1:3].fill_(2.0)
        x[::2, 1::3] = torch.tensor(7.0, device=d)
        y = x.view(2, 12)
        y[1, 5:] += 1
        return x, y

    same_on_both_devices(f)


def test_view_of_view_reads_and_setitem():
    def f(d):
        x = torch.arange(24.0, device=d).reshape(2, 3, 4)
        v = x.permute(2, 0, 1)[1:, :, 1]
        v.copy_(torch.full_like(v, -1.0))
        e = x[0, 0].expand(3, 4)
        return x, v, e + 0, x.diagonal(dim1=1, dim2=2) + 0, x.unfold(2, 2, 1) + 0

    same_on_both_devices(f)


def test_as_strided_on_a_base():
    def f(d):
        x = torch.arange(10.0, device=d)
        return x.as_strided((3, 3), (2, 1), 1) + 0

    same_on_both_devices(f)


def test_split_unbind_chunk_share_storage():
    def f(d):
        x = torch.arange(12.0, device=d).reshape(4, 3)
        a, b = x.split(2)
        b.zero_()
        for row in x.unbind(1):
            row.mul_(2)
        return x

    same_on_both_devices(f)


def test_detach_shares_storage_and_clone_does_not():
    x = torch.ones(3, device="tpu")
    d = x.detach()
    c = x.clone()
    d.add_(1)
    assert x.cpu().tolist() == [2.0, 2.0, 2.0]
    assert c.cpu().tolist() == [1.0, 1.0, 1.0]


def test_out_variant_writes_into_existing_tensor():
    a = torch.ones(3, device="tpu")
    out = torch.empty(3, device="tpu")
    r = torch.add(a, a, out=out)
    assert r is out
    assert out.cpu().tolist() == [2.0, 2.0, 2.0]
    view_out = torch.zeros(2, 3, device="tpu")
    torch.mul(a, 3, out=view_out[1])
    assert view_out.cpu().tolist() == [[0, 0, 0], [3, 3, 3]]


def test_inplace_type_and_shape_checks_match_pytorch():
    i = torch.ones(3, dtype=torch.int64, device="tpu")
    with pytest.raises(RuntimeError, match="can't be cast"):
        i.add_(1.5)
    x = torch.ones(3, device="tpu")
    with pytest.raises(RuntimeError):
        x.add_(torch.ones(2, 3, device="tpu"))
    assert x.cpu().tolist() == [1.0, 1.0, 1.0]


def test_copy_between_devices_and_dtypes():
    x = torch.zeros(2, 3, device="tpu")
    x.copy_(torch.arange(3))  # cpu int source broadcast into tpu float
    assert x.cpu().tolist() == [[0, 1, 2], [0, 1, 2]]
    host = torch.empty(2, 3, dtype=torch.float64)
    host.copy_(x)
    assert host.dtype == torch.float64 and host.tolist() == [[0, 1, 2], [0, 1, 2]]


def test_autograd_through_views_and_inplace():
    def f(d):
        w = torch.arange(6.0, device=d).reshape(2, 3).requires_grad_()
        y = w * 2
        y[0].mul_(3)
        y.t().sum().backward()
        return w.grad

    same_on_both_devices(f)


def test_inplace_view_ops_change_the_tensor_itself():
    x = torch.arange(6.0, device="tpu").reshape(2, 3)
    y = x[:1]
    y.squeeze_(0)
    assert y.shape == (3,) and y.cpu().tolist() == [0.0, 1.0, 2.0]
    y.unsqueeze_(1)
    assert y.shape == (3, 1)
    y.mul_(10)
    assert x.cpu().tolist() == [[0.0, 10.0, 20.0], [3.0, 4.0, 5.0]]
    z = torch.ones(2, 3, device="tpu")
    z.t_()
    assert z.shape == (3, 2)
    v = torch.ones(3, device="tpu") @ torch.ones(3, 2, device="tpu")  # matmul 1-D @ 2-D uses squeeze_
    assert v.cpu().tolist() == [3.0, 3.0]


def test_resize_keeps_leading_values_and_out_resizes():
    x = torch.arange(4.0, device="tpu")
    x.resize_(2, 3)
    assert x.shape == (2, 3) and x.cpu().flatten()[:4].tolist() == [0.0, 1.0, 2.0, 3.0]
    x.resize_(2)
    assert x.cpu().tolist() == [0.0, 1.0]
    out = torch.empty(0, device="tpu")
    torch.add(torch.ones(2, 2, device="tpu"), 1, out=out)
    assert out.shape == (2, 2) and out.cpu().tolist() == [[2.0, 2.0], [2.0, 2.0]]
    y = torch.arange(6.0, device="tpu")
    y.resize_as_(torch.zeros(2, 3, device="tpu"))  # refused every shape change before (a broadcast check)
    assert y.shape == (2, 3) and y.cpu().tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]


@pytest.mark.parametrize("op", [torch.exp, torch.add])
def test_resizing_an_out_tensor_that_had_elements_warns_as_cpu_does(op):
    import warnings

    def call(d, out_size):
        a = torch.tensor([1.0, 2.0, 3.0], device=d)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = op(*((a,) if op is torch.exp else (a, a)), out=torch.empty(out_size, device=d))
        return out.cpu(), [str(w.message) for w in caught if "was resized" in str(w.message)]

    for size in (3, 0):
        assert call("tpu", size)[1] == []
    cpu, cpu_warned = call("cpu", 2)
    tpu, tpu_warned = call("tpu", 2)
    assert torch.equal(cpu, tpu) and len(tpu_warned) == 1
    assert tpu_warned[0].startswith("An output with one or more elements was resized since it had shape [2], which "
                                    "does not match the required output shape [3].")
    assert cpu_warned[0].startswith(tpu_warned[0])  # CPU's adds where it was triggered


def test_a_resize_within_the_storage_keeps_sharing_it_with_the_base_and_views():
    """PyTorch keeps the storage when the new size fits in it from the tensor's offset: writes after the resize
    reach the base (an ``out=`` into a strided view that must be resized relies on it)."""
    import warnings

    def f(d):
        base = torch.zeros(8, device=d)
        head = base[:4]
        head.resize_(2)
        head.fill_(1)
        grid = torch.arange(12.0, device=d)
        tail = grid[2:]
        tail.resize_(3, 2)
        tail.mul_(-1)
        whole = torch.arange(6.0, device=d)
        alias = whole[3:]
        whole.resize_(2, 2)
        whole.add_(100)
        out = torch.zeros(2, 2, 6, device=d)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # PyTorch's deprecation of resizing a non-empty out
            torch.abs(torch.arange(-6.0, 6.0, device=d).reshape(2, 2, 3), out=out[:, :, 0:6:3])
        return base, grid, tail, whole, alias, out

    same_on_both_devices(f)


def test_set_to_another_tensor_shares_its_storage_and_is_set_to_says_so():
    """``a.set_(b)`` makes ``a`` a view of ``b``'s storage (writes through either reach the other) and
    ``is_set_to`` tells; both ran on the CPU, which gave ``a`` a copy and compared host copies (always False)."""

    def f(d):
        b = torch.arange(12.0, device=d).reshape(3, 4)
        a = torch.zeros(1, device=d).set_(b[1:, ::2])
        a.mul_(10)
        b.add_(1)
        whole = torch.tensor([], device=d).set_(b)
        flags = [a.is_set_to(b[1:, ::2]), whole.is_set_to(b), b.is_set_to(whole), a.is_set_to(b),
                 b.is_set_to(b.clone()), b.is_set_to(b.view(4, 3)), a.is_set_to(torch.tensor([], device=d).set_(a))]
        return a, b, whole, torch.tensor(flags, device=d), torch.tensor([a.storage_offset(), *a.stride()], device=d)

    same_on_both_devices(f)


def test_set_to_a_tensors_storage_views_it_with_the_given_geometry():
    """``a.set_(b.untyped_storage(), offset, size, stride)`` (PyTorch's own test_indexing and test_view_ops do it)
    makes ``a`` a view of ``b``'s data, another dtype reading the same bytes; past the storage's end it raises as
    CPU does for a storage that cannot grow. It raised "a tpu storage holds no bytes" before."""

    def f(d):
        b = torch.arange(1.0, 11.0, dtype=torch.float64, device=d)
        a = torch.tensor((), dtype=torch.float64, device=d)
        a.set_(b.untyped_storage(), 1, (2, 2), (4, 2))
        a[0, 1] = 100.0  # reaches b
        b.add_(1)  # shows in a
        whole = torch.tensor((), dtype=torch.float64, device=d).set_(b[3:].untyped_storage())
        bits = torch.tensor((), dtype=torch.int64, device=d).set_(b.untyped_storage(), 2, (3,), (1,))
        geometry = torch.tensor([a.storage_offset(), *a.stride(), whole.numel()], device=d)
        return a, b, whole, bits, geometry

    same_on_both_devices(f)
    b = torch.arange(4.0, device="tpu")
    with pytest.raises(RuntimeError, match="Trying to resize storage that is not resizable"):  # CPU's, non-resizable
        torch.tensor((), device="tpu").set_(b.untyped_storage(), 0, (3,), (2,))


def test_backward_of_ops_that_save_their_output():
    def f(d):
        x = torch.linspace(-2, 2, 7, device=d).requires_grad_()
        y = torch.exp(x).sum() + torch.tanh(x).sum() + torch.sigmoid(x).sum() + torch.relu(x).sum()
        y.backward()
        return x.grad

    same_on_both_devices(f)


def test_updates_of_a_whole_view_without_its_leading_ones_keep_pytorchs_semantics():
    """A pointwise op on ``[1, n]`` seen as ``[n]`` runs on the storage (runtime/mutation.py); anything else on
    such a view, or on ``[n, 1]`` seen as ``[n]``, keeps the view's own path, and PyTorch's errors."""
    with torchtpu_lab.eager_mode("fused"):
        for _ in range(3):
            base = torch.arange(8.0).reshape(1, 8).to("tpu")
            base.view(8).cumsum_(0)  # not pointwise: dim 0 of the view is dim 1 of the storage
            column = torch.arange(4.0).reshape(4, 1).to("tpu")
            column.view(4).mul_(torch.arange(4.0).to("tpu"))  # trailing ones: [4] * [4, 1] would broadcast
            with pytest.raises(RuntimeError, match=r"output with shape \[8\] doesn't match the broadcast shape"):
                base.view(8).mul_(torch.ones(2, 8).to("tpu"))
            torch.testing.assert_close(base.cpu(), torch.arange(8.0).cumsum(0).reshape(1, 8))
            torch.testing.assert_close(column.cpu(), (torch.arange(4.0) ** 2).reshape(4, 1))
            noise = torch.zeros(1, 6).to("tpu")
            noise.view(6).uniform_()  # random: drawn for the view's shape, on the Python path
            assert noise.shape == (1, 6) and bool((noise.cpu() > 0).all())


def test_a_size_one_dims_stride_does_not_make_a_new_program():
    """``x[:, None, -k:]`` of a growing tensor: the size-1 dim's stride is the length (a view op derives it from
    its neighbour), but it addresses nothing, so every length reads with one program (``transformers``'
    ``bad_words_ids``/``sequence_bias`` take this view of the grown token ids every token)."""
    from torchtpu_lab import telemetry

    def programs() -> int:
        return int(telemetry.counters["compiles"] + telemetry.counters["disk_loads"])

    base_cpu = torch.arange(64).reshape(2, 32)
    base = base_cpu.to("tpu")
    counts = []
    for n in range(6, 16):
        x_cpu, x = base_cpu[:, :n], base[:, :n]  # the first n positions of one storage, as a grown tensor is
        before = programs()
        got = x[:, None, -2:]
        assert got.stride()[1] == n  # PyTorch's stride, as on the CPU
        assert torch.equal((got == 7).cpu(), x_cpu[:, None, -2:] == 7)
        counts.append(programs() - before)
    assert sum(counts[2:]) == 0, counts


@pytest.mark.parametrize("src,dst", [(torch.float32, torch.int32), (torch.float32, torch.uint8),
                                     (torch.uint8, torch.float32), (torch.int64, torch.float16),
                                     (torch.bfloat16, torch.int16), (torch.complex64, torch.float32),
                                     (torch.float64, torch.complex64), (torch.bool, torch.int8),
                                     (torch.int16, torch.bfloat16)])
def test_view_as_another_dtype_reads_the_same_bytes(src, dst):
    """``x.view(dtype)`` reinterprets memory (PyTorch's generic kernel read the tpu storage's values cast
    instead: ``[1.0, -2.5].view(int32)`` gave ``[1, -2]``). Found by PyTorch's test_view_dtype_new."""
    g = torch.Generator().manual_seed(0)
    if src == torch.bool:
        x = torch.randint(0, 2, (3, 8), generator=g).bool()
    elif src.is_complex or src.is_floating_point:
        x = torch.randn(3, 8, generator=g).to(src)
    else:
        x = torch.randint(-100, 100, (3, 8), generator=g).to(src)
    want = x.view(dst)
    got = x.to("tpu").view(dst).cpu()
    assert got.shape == want.shape
    assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))


def test_assigning_the_real_or_imaginary_part_writes_the_tensor():
    """``x.real = v`` writes through PyTorch's component view, an alias of ``x``'s bytes (tests/test_dtype_views.py)."""

    def f(d):
        x = torch.zeros(2, 3, dtype=torch.complex64, device=d)
        x.real = torch.tensor([1.0, 2.0, 3.0], device=d)
        x.imag = 5
        y = torch.ones(3, device=d)
        y.real = torch.tensor([7.0, 8.0, 9.0], device=d)
        return x, y

    same_on_both_devices(f, exact=True)
    with pytest.raises(RuntimeError, match="imag is not implemented for tensors with non-complex dtypes"):
        torch.ones(2, device="tpu").imag = 1
