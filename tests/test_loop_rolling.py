"""A Python loop of slice assignments (``x[idx[i]] = src[i]``: PyTorch's ``test_index_copy_deterministic`` does
3 x 40,000) keeps bounded memory: its graph is cut at the size limit like any op's, and each graph's program is one
loop (runtime/loop_rolling.py), not a kernel per assignment (XLA:CPU compiled each as an LLVM module of its own:
~1 MB of memory and ~18 ms apiece; 40,000 of them in one graph got the test OOM-killed). Values are those of the
unrolled program and of CPU."""

import pytest
import torch

import torchtpu_lab
from torchtpu_lab import caches, config
from torchtpu_lab.runtime import fused, loop_rolling


@pytest.fixture
def unrolled(monkeypatch):
    """Trace graphs op after op (no run is long enough to roll), in fresh caches: the reference program."""
    def use():
        torchtpu_lab.sync()
        caches.clear_all()
        monkeypatch.setattr(loop_rolling, "MIN_BLOCKS", 10**9)
    yield use
    torchtpu_lab.sync()
    caches.clear_all()


def _new_programs(before: set) -> list:
    return [g for g in fused.GRAPHS.values() if id(g) not in before]


def _kernels(n: int) -> int:
    """XLA kernels (fusions) in the program of one graph of ``n`` slice assignments."""
    g = torch.Generator().manual_seed(n)
    x = torch.zeros(50, 4, 3, device="tpu")
    src = torch.rand(n, 4, 3, generator=g).to("tpu")
    idx = torch.randint(50, (n,), generator=g).tolist()
    torchtpu_lab.sync()
    before = {id(v) for v in fused.GRAPHS.values()}
    for i in range(n):
        x[idx[i], :, :] = src[i, :, :]
    torchtpu_lab.sync()
    (program,) = _new_programs(before)
    return program.fn.as_text().count(" fusion(")


def test_program_of_a_loop_of_slice_assignments_does_not_grow_with_the_loop(limit):
    config.max_graph_ops.set(10**6)
    short, long = _kernels(100), _kernels(400)
    assert long <= short + 2, (short, long)  # op after op: a kernel per assignment (~100 vs ~400)


def test_slice_assignments_are_cut_at_the_graph_size_limit(limit):
    config.max_graph_ops.set(150)
    x = torch.zeros(50, 4, 3, device="tpu")
    src = torch.rand(600, 4, 3).to("tpu")
    torchtpu_lab.sync()
    pending = []
    for i in range(600):
        x[i % 50] = src[i]
        pending.append(fused.pending_ops())
    assert max(pending) <= 150  # the assignments were one graph of 600 ops: the pending graph grew with the loop
    expected = torch.zeros(50, 4, 3)
    for i in range(600):
        expected[i % 50] = src[i].cpu()
    assert torch.equal(x.cpu(), expected)


@pytest.mark.parametrize("dim", [0, 1, 2])
@pytest.mark.parametrize("max_ops", [100, 2000])
def test_index_copy_loop_matches_cpu(limit, dim, max_ops):
    """PyTorch's test_index_copy_deterministic, shortened: repeated indices (the last write wins), every
    dimension (contiguous rows, strided columns, a gathered last dimension), cut into graphs or not."""
    config.max_graph_ops.set(max_ops)
    g = torch.Generator().manual_seed(dim)
    a = [5, 4, 3]
    a[dim] = 40
    b = list(a)
    b[dim] = 300
    x, src = torch.zeros(a), torch.rand(b, generator=g)
    index = torch.randint(a[dim], (300,), generator=g).tolist()
    xt, st = x.to("tpu"), src.to("tpu")
    for i, j in enumerate(index):
        for dst, s in ((x, src), (xt, st)):
            if dim == 0:
                dst[j, :, :] = s[i, :, :]
            elif dim == 1:
                dst[:, j, :] = s[:, i, :]
            else:
                dst[:, :, j] = s[:, :, i]
    assert torch.equal(xt.cpu(), x)


def _recurrence(dtype, keep_every: int):
    """A block of several ops per iteration, carried through the tensor it writes, with Python numbers (weak
    types) in it; every ``keep_every``-th value is also kept (read after the loop)."""
    x = torch.zeros(150, 8, dtype=dtype, device="tpu")
    x[0] = torch.arange(8, dtype=dtype).to("tpu")
    torchtpu_lab.sync()
    kept = []
    for i in range(1, 150):
        x[i] = x[i - 1] * 0.5 + i
        if i % keep_every == 0:
            kept.append(x[i].clone())
    return [x.cpu()] + [k.cpu() for k in kept]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("keep_every", [1000, 50])
def test_rolled_blocks_equal_the_unrolled_program(unrolled, dtype, keep_every):
    before = {id(v) for v in fused.GRAPHS.values()}
    rolled = _recurrence(dtype, keep_every)
    texts = [p.fn.as_text() for p in _new_programs(before)]
    if keep_every > 32:  # runs of 32 repetitions or more between kept values are loops
        assert any("while(" in t for t in texts)
    unrolled()
    reference = _recurrence(dtype, keep_every)
    for r, u in zip(rolled, reference, strict=True):
        assert r.dtype == u.dtype == dtype
        assert torch.equal(r, u)
    x = torch.zeros(150, 8, dtype=torch.float64)
    x[0] = torch.arange(8)
    for i in range(1, 150):
        x[i] = x[i - 1] * 0.5 + i
    torch.testing.assert_close(rolled[0].double(), x, rtol=2e-3 if dtype == torch.float16 else 1e-6, atol=1e-3)


def test_plan_rolls_only_repetitions_nothing_outside_reads(limit):
    """Runs end where a repetition's value is read later (here every 40th is kept): each stretch between two
    kept values is a loop of its own, and every kept value is right."""
    config.max_graph_ops.set(10**6)
    x = torch.zeros(8, device="tpu")
    torchtpu_lab.sync()
    kept, expected, y = [], [], torch.zeros(8)
    for i in range(400):
        x[1:].mul_(0.5).add_(i)  # in place through a view: a write of part of x, as x[i] = v is
        y[1:].mul_(0.5).add_(i)
        if i % 40 == 39:
            kept.append(x.clone())
            expected.append(y.clone())
    before = {id(v) for v in fused.GRAPHS.values()}
    values = [k.cpu() for k in kept]
    assert any("while(" in p.fn.as_text() for p in _new_programs(before))
    for k, e in zip(values, expected, strict=True):
        torch.testing.assert_close(k, e)


def test_an_elementwise_loop_stays_one_fused_program(limit):
    """Without a write of part of an array, a repeated block is left to XLA, which fuses the whole chain into one
    kernel that reads and writes memory once (a loop would read and write it every repetition)."""
    config.max_graph_ops.set(10**6)
    x = torch.ones(64, device="tpu")
    torchtpu_lab.sync()
    before = {id(v) for v in fused.GRAPHS.values()}
    for i in range(100):
        x = x * 0.5 + i
    y = torch.ones(64)
    for i in range(100):
        y = y * 0.5 + i
    torch.testing.assert_close(x.cpu(), y)
    assert not any("while(" in p.fn.as_text() for p in _new_programs(before))
