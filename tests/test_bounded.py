"""Ops on tensors grown by appends run on their padded extent (runtime/bounded.py): values exactly PyTorch's CPU
values, errors PyTorch's, and what a decode loop builds from the grown length compiles once per capacity bucket."""

import pytest
import torch

import torchtpu_lab
from torchtpu_lab import telemetry
from torchtpu_lab.device import tensor
from torchtpu_lab.runtime import growth, recording


def _programs() -> int:
    return int(telemetry.counters["compiles"] + telemetry.counters["disk_loads"])


def _grown(device: str, n: int, rows: int = 2, dtype=torch.long):
    """A ``[rows, n]`` tensor built by appends (on tpu: the front of a padded storage), values ``1..``."""
    x = torch.arange(1, rows * 3 + 1, dtype=dtype).reshape(rows, 3).to(device)
    for i in range(n - 3):
        x = torch.cat([x, torch.full((rows, 1), 7 * i + 2, dtype=dtype, device=device)], dim=-1)
    return x


def _padding_mask(mask: torch.Tensor) -> torch.Tensor:
    """What ``transformers``' ``sdpa_mask`` does with a left-padded batch's 2-d mask in a decode step: a cast, a
    masked ``sum`` read on the host, ``arange`` of the length, unsqueezes, a compare, ``&``, a gather, ``expand``."""
    batch, n = mask.shape
    padding = mask.to(torch.bool)
    all_ones = bool(padding.sum() == padding.numel())
    kv = (torch.arange(n, device=mask.device) + 0)[None, None, None, :]
    q = (torch.arange(1, device=mask.device) + (n - 1))[None, None, :, None]
    b = torch.arange(batch, device=mask.device)[:, None, None, None]
    causal = torch.ones((), dtype=torch.bool, device=mask.device) & (kv <= q)
    out = (causal & padding[b, kv]).expand(batch, -1, 1, n)
    return out, all_ones


@pytest.mark.parametrize("mode", ["fused", "strict"])
def test_a_mask_built_from_a_grown_length_equals_cpu_and_compiles_once_per_bucket(mode):
    with torchtpu_lab.eager_mode(mode):
        _mask_steps()


def _mask_steps():
    mask_cpu = torch.ones(2, 7, dtype=torch.long)
    mask_cpu[1, :3] = 0
    mask = mask_cpu.to("tpu")
    counts = []
    for step in range(40):
        mask_cpu = torch.cat([mask_cpu, torch.ones(2, 1, dtype=torch.long)], dim=-1)
        mask = torch.cat([mask, torch.ones(2, 1, dtype=torch.long, device="tpu")], dim=-1)
        before = _programs()
        got, got_all = _padding_mask(mask)
        want, want_all = _padding_mask(mask_cpu)
        assert got.shape == want.shape and got_all == want_all
        assert torch.equal(got.cpu(), want), step
        counts.append(_programs() - before)
    assert growth.front(got) is not None  # the result is still the front of a padded storage
    assert sum(counts[5:]) == 0, counts  # every length in the bucket: the programs of the first steps


def test_sums_over_grown_padding_are_exact_and_keep_the_grown_dim_when_it_stays():
    x_cpu, x = _grown("cpu", 12, dtype=torch.float32), _grown("tpu", 12, dtype=torch.float32)
    assert growth.front(x) is not None
    # the padding holds exp(0) = 1 after this op: a sum that read it would be off by the padding's size
    e_cpu, e = torch.exp(x_cpu * 0.01), torch.exp(x * 0.01)
    assert growth.front(e) is not None
    torch.testing.assert_close(e.sum().cpu(), e_cpu.sum())
    torch.testing.assert_close(e.sum(dim=1).cpu(), e_cpu.sum(dim=1))
    kept = e.sum(dim=0, keepdim=True)
    assert growth.front(kept) is not None
    torch.testing.assert_close(kept.cpu(), e_cpu.sum(dim=0, keepdim=True))
    torch.testing.assert_close(e.sum(dim=0).cpu(), e_cpu.sum(dim=0))
    # not rewritten (a mean divides by the length): the ordinary path, same values
    torch.testing.assert_close(e.mean().cpu(), e_cpu.mean())


def test_pointwise_ops_of_grown_tensors_with_different_capacities_equal_cpu():
    ids_cpu, ids = _grown("cpu", 10, rows=1), _grown("tpu", 10, rows=1)  # small rows: a large capacity
    big_cpu, big = _grown("cpu", 10, rows=300, dtype=torch.float32), _grown("tpu", 10, rows=300,
                                                                             dtype=torch.float32)
    assert growth.front(ids).capacity != growth.front(big).capacity
    torch.testing.assert_close((big * ids + 1).cpu(), big_cpu * ids_cpu + 1)
    torch.testing.assert_close(torch.where(ids > 10, big, -big).cpu(), torch.where(ids_cpu > 10, big_cpu, -big_cpu))
    assert torch.equal(ids.to(torch.float16).cpu(), ids_cpu.to(torch.float16))


def test_indexing_a_grown_dim_wraps_and_raises_by_the_logical_length():
    x_cpu, x = _grown("cpu", 10), _grown("tpu", 10)
    f = growth.front(x)
    assert f is not None and f.length == 10 and f.capacity > 10
    rows = torch.tensor([[0], [1]])
    for cols in ([0, 9, -1, -10], [3, 3, 5, 2]):
        c = torch.tensor([cols])
        assert torch.equal(x[rows.to("tpu"), c.to("tpu")].cpu(), x_cpu[rows, c])
    for bad in (10, 11, -11):  # inside the padded capacity, outside the tensor: PyTorch raises, so must we
        c = torch.tensor([[0, bad]])
        with pytest.raises(IndexError):
            x_cpu[rows, c]
        with pytest.raises(IndexError, match="out of bounds"):
            x[rows.to("tpu"), c.to("tpu")].cpu()
    assert torch.equal(x.cpu(), x_cpu)  # the error lost nothing


@pytest.mark.parametrize("start", [False, True])
def test_arange_of_a_growing_length_is_the_front_of_its_capacity_and_of_a_finished_one_ordinary(start):
    x = _grown("tpu", 6)
    fronts = []
    for _ in range(8):  # a decode loop: append, then arange of the new length from one line (nanoGPT: from 0)
        x = torch.cat([x, torch.ones(2, 1, dtype=torch.long, device="tpu")], 1)
        a = torch.arange(0, x.shape[1], device="tpu") if start else torch.arange(x.shape[1], device="tpu")
        assert torch.equal(a.cpu(), torch.arange(x.shape[1])) and a.stride() == (1,)
        fronts.append(growth.front(a))
    n = x.shape[1]
    # the ids' capacity is large (small rows); what is computed from their length runs on its own bucket
    assert growth.front(x).capacity > 64
    assert all(f is not None and f.capacity == 64 == growth.extent(f.length, growth.front(x).capacity)
               for f in fronts)
    assert [f.length for f in fronts] == list(range(n - 7, n + 1))
    for _ in range(growth.RECENT_SYNCS + 1):  # x stops growing (a generated output kept during training)
        torchtpu_lab.sync()
        float(x.sum())
    assert growth.front(torch.arange(n, device="tpu")) is None


def test_filled_factories_of_a_growing_length_are_fronts_that_reduce_exactly_and_compile_once_per_bucket():
    x = _grown("tpu", 6)
    counts = []
    fixed = x.shape[1] + 3  # a size the growing length passes once (T5's cross-attention bias over the prompt)
    for step in range(12):  # BART's decoder: torch.ones(batch, cache length + 1) every token
        x = torch.cat([x, torch.ones(2, 1, dtype=torch.long, device="tpu")], 1)
        n = x.shape[1]
        before = _programs()
        made = [torch.ones(2, n, device="tpu"), torch.zeros(3, n, dtype=torch.long, device="tpu"),
                torch.full((1, 2, n), 2.5, device="tpu")]
        wants = [torch.ones(2, n), torch.zeros(3, n, dtype=torch.long), torch.full((1, 2, n), 2.5)]
        bias = torch.zeros(1, 4, 1, fixed, device="tpu")
        assert growth.front(bias) is None and torch.equal(bias.cpu(), torch.zeros(1, 4, 1, fixed))
        if step == 0:  # the first call of each: nothing says its length grows yet
            assert all(growth.front(t) is None for t in made)
            made = [torch.ones(2, n, device="tpu"), torch.zeros(3, n, dtype=torch.long, device="tpu"),
                    torch.full((1, 2, n), 2.5, device="tpu")]  # the same length again: still ordinary
            assert all(growth.front(t) is None for t in made)
            continue
        # the padding holds the fill value too: a sum or a product that read it would be off. All recorded
        # before the first read: one sync a step, as a decode step makes (a factory's length is "growing" for
        # a few syncs after its append)
        reduced = [(t.sum(-1), t @ torch.ones(n, 1, dtype=t.dtype, device="tpu")) for t in made]
        for got, want, (total, product) in zip(made, wants, reduced):
            assert growth.front(got) is not None and growth.front(got).length == n
            assert got.shape == want.shape and got.dtype == want.dtype
            assert torch.equal(got.cpu(), want)
            torch.testing.assert_close(total.cpu(), want.sum(-1))
            torch.testing.assert_close(product.cpu(), want @ torch.ones(n, 1, dtype=want.dtype))
        counts.append(_programs() - before)
    assert sum(counts[2:]) == 0, counts  # every length in the bucket: the programs of the first steps
    # a size with no growing length in it, and a grown length's factory once it stopped growing: ordinary
    assert growth.front(torch.ones(2, 5, device="tpu")) is None
    n = x.shape[1]
    for _ in range(growth.RECENT_SYNCS + 1):
        torchtpu_lab.sync()
        float(x.sum())
    plain = torch.ones(2, n, device="tpu")
    assert growth.front(plain) is None and plain.is_contiguous()


def test_index_select_across_a_grown_dim_keeps_it_grown_and_an_append_after_it_compiles_nothing():
    """Beam search reorders each layer's cache by beam every token (``cache.index_select(0, beam_idx)``) and then
    appends to it: the reordered cache must stay a front of its capacity, or every append starts a new buffer of
    the token's length (a program per token)."""
    rows = 3
    k_cpu = torch.arange(rows * 4 * 5, dtype=torch.float32).reshape(rows, 4, 5)
    k = k_cpu.to("tpu")
    counts, handed = [], None
    for step in range(10):
        if step == 4:
            handed = recording.stats().get("python_ops", {}).get("aten::index_select", 0)
        piece = torch.full((rows, 1, 5), float(step))
        k_cpu = torch.cat([k_cpu, piece], 1)
        k = torch.cat([k, piece.to("tpu")], 1)
        beams = torch.tensor([(step + j) % rows for j in range(rows)])
        before = _programs()
        k_cpu, k = k_cpu.index_select(0, beams), k.index_select(0, beams.to("tpu"))
        assert growth.front(k) is not None and growth.front(k).length == k_cpu.shape[1]
        assert torch.equal(k.cpu(), k_cpu), step
        counts.append(_programs() - before)
    assert sum(counts[3:]) == 0, counts
    if recording.stats():  # the native core records it on the front once taught (csrc/recorder.cpp as_first_front)
        assert recording.stats()["python_ops"].get("aten::index_select", 0) == handed
        with pytest.raises((IndexError, RuntimeError), match="out of range|out of bounds"):  # its check still runs
            k.index_select(0, torch.tensor([0, rows, 1], device="tpu")).cpu()
        assert torch.equal(k.cpu(), k_cpu)  # and the tensor is usable after the error
    # along the grown dim (which positions to keep): the ordinary path, the values PyTorch's
    keep = torch.tensor([0, 2, 3])
    torch.testing.assert_close(k.index_select(1, keep.to("tpu")).cpu(), k_cpu.index_select(1, keep))
    with pytest.raises(IndexError):
        k_cpu.index_select(0, torch.tensor([rows]))
    with pytest.raises((IndexError, RuntimeError), match="out of range|out of bounds"):
        k.index_select(0, torch.tensor([rows], device="tpu")).cpu()


def test_in_place_ops_and_gradients_through_grown_tensors_equal_cpu():
    x_cpu, x = _grown("cpu", 9, dtype=torch.float32), _grown("tpu", 9, dtype=torch.float32)
    y_cpu, y = x_cpu * 0.5, x * 0.5
    assert growth.front(y) is not None
    y_cpu.add_(1), y.add_(1)
    y_cpu[:, -1:].mul_(3), y[:, -1:].mul_(3)
    assert torch.equal(y.cpu(), y_cpu)
    assert torch.equal(x.cpu(), x_cpu)  # the op's input is untouched by the result's in-place changes
    w_cpu = torch.tensor([[0.3], [-0.2]]).requires_grad_()  # broadcast along the grown dim: rewritten ops
    w = w_cpu.detach().to("tpu").requires_grad_()
    loss_cpu = ((x_cpu * w_cpu).sigmoid() * x_cpu).sum()
    assert growth.front((x * w).sigmoid()) is not None
    loss = ((x * w).sigmoid() * x).sum()
    loss_cpu.backward()
    loss.backward()
    torch.testing.assert_close(loss.detach().cpu(), loss_cpu.detach())
    torch.testing.assert_close(w.grad.cpu(), w_cpu.grad)


def test_softmax_and_products_over_grown_padding_equal_cpu():
    """The padding of ``1 / x`` is ``inf`` (a grown storage's padding starts as zeros): a softmax along the grown
    dim or a product contracting it that read the padding would give ``nan``."""
    x_cpu, x = _grown("cpu", 11, dtype=torch.float32), _grown("tpu", 11, dtype=torch.float32)
    r_cpu, r = 1 / x_cpu, 1 / x  # [2, 11], grown along dim 1
    for dim in (1, 0):
        torch.testing.assert_close(r.softmax(dim).cpu(), r_cpu.softmax(dim))
        torch.testing.assert_close(r.log_softmax(dim).cpu(), r_cpu.log_softmax(dim))
    assert growth.front(r.softmax(1)) is not None
    a_cpu, a = r_cpu[None], r[None]  # [1, 2, n]: the contraction dim grown
    b_cpu, b = r_cpu[None].transpose(1, 2), r[None].transpose(1, 2)  # [1, n, 2]: a transposed view, grown too
    assert growth.front(b) is not None
    torch.testing.assert_close(torch.bmm(a, b).cpu(), torch.bmm(a_cpu, b_cpu))  # contracts the padding
    torch.testing.assert_close((r.t() @ torch.ones(2, 3, device="tpu")).cpu(), r_cpu.t() @ torch.ones(2, 3))
    product = torch.ones(3, 2, device="tpu") @ r  # the grown dim is the product's column dim
    assert growth.front(product) is not None
    torch.testing.assert_close(product.cpu(), torch.ones(3, 2) @ r_cpu)
    q_cpu = torch.linspace(-1, 1, 2 * 3).reshape(1, 2, 1, 3)
    k_cpu, k = r_cpu.reshape(1, 2, 11, 1).expand(1, 2, 11, 3), r.reshape(1, 2, 11, 1).expand(1, 2, 11, 3)
    scores_cpu = (q_cpu @ k_cpu.transpose(-1, -2)).softmax(-1)  # attention as transformers' eager path writes it
    scores = (q_cpu.to("tpu") @ k.transpose(-1, -2)).softmax(-1)
    assert growth.front(scores) is not None  # through matmul's own decomposition (expand, reshape, bmm, view)
    torch.testing.assert_close(scores.cpu(), scores_cpu)
    torch.testing.assert_close((scores @ k).cpu(), scores_cpu @ k_cpu)


def test_biased_products_of_grown_operands_equal_cpu_and_compile_once_per_bucket():
    """``baddbmm``/``addmm`` with a grown column (or row) operand and a bias grown alike or broadcast along it (BLOOM
    adds its ALiBi bias to the scores with ``baddbmm`` over a growing KV cache): CPU's values, the result grown,
    one program for every length in a bucket; a grown contraction dim with a plain bias gives a plain result."""
    q_cpu = torch.linspace(-1, 1, 4 * 3).reshape(4, 1, 3)
    counts = []
    k_cpu, k = _grown("cpu", 8, rows=12, dtype=torch.float32), _grown("tpu", 8, rows=12, dtype=torch.float32)
    for n in range(9, 15):  # one append a step, within one capacity bucket
        k_cpu = torch.cat([k_cpu, k_cpu[:, -1:] + 1], -1)
        k = torch.cat([k, k[:, -1:] + 1], -1)
        torchtpu_lab.sync()
        keys_cpu, keys = k_cpu.reshape(4, 3, n) / 50, k.reshape(4, 3, n) / 50  # [batch, d, n]: grown columns
        slopes = torch.tensor([0.5, 0.25, 0.125, 1.0])[:, None, None]
        alibi_cpu, alibi = k_cpu[:4, None] * slopes, k[:4, None] * slopes.to("tpu")  # [4, 1, n], grown like keys
        before = _programs()
        scores = alibi.baddbmm(q_cpu.to("tpu"), keys, beta=0.5, alpha=0.25)
        plain_bias = torch.ones(4, 1, 1, device="tpu").baddbmm(q_cpu.to("tpu"), keys)
        rows = (k[:1].t() * 0.5).addmm(k[:2].t(), torch.eye(2, device="tpu"))  # [n, 2]: grown rows and bias
        got = (scores.cpu(), plain_bias.cpu(), rows.cpu())
        counts.append(_programs() - before)
        assert all(growth.front(t) is not None for t in (scores, plain_bias, rows))
        unpadded = alibi.contiguous().baddbmm(q_cpu.to("tpu"), keys.contiguous(), beta=0.5, alpha=0.25)
        assert growth.front(unpadded) is None and torch.equal(got[0], unpadded.cpu()), n  # bit for bit
        torch.testing.assert_close(got[0], alibi_cpu.baddbmm(q_cpu, keys_cpu, beta=0.5, alpha=0.25))
        torch.testing.assert_close(got[1], torch.ones(4, 1, 1).baddbmm(q_cpu, keys_cpu))
        torch.testing.assert_close(got[2], (k_cpu[:1].t() * 0.5).addmm(k_cpu[:2].t(), torch.eye(2)))
    assert sum(counts[2:]) == 0, counts
    v_cpu, v = _grown("cpu", 11, rows=3, dtype=torch.float32), _grown("tpu", 11, rows=3, dtype=torch.float32)
    bias = torch.full((3, 3), 0.5)
    product = bias.to("tpu").addmm(1 / v, (1 / v).t())  # contracts the grown dim: padding of 1 / v is inf
    assert growth.front(product) is None
    torch.testing.assert_close(product.cpu(), bias.addmm(1 / v_cpu, (1 / v_cpu).t()))


def test_grouped_query_attention_over_a_grown_cache_copies_its_broadcast_on_the_padded_extent():
    """``repeat_kv`` expands a grown KV cache over a head group (a stride-0 dim) and ``matmul`` must copy it to
    reshape it to 3-d: the copy is made on the padded extent and grown again, so eager grouped-query attention is
    one program per bucket with CPU's values. A copy asked of a front without a broadcast dim (``contiguous()``)
    stays an ordinary, contiguous tensor of ``n`` positions."""
    q_cpu = torch.linspace(-1, 1, 2 * 4 * 8).reshape(2, 4, 1, 8)
    k_cpu = torch.linspace(0, 1, 2 * 1 * 5 * 8).reshape(2, 1, 5, 8)
    k = k_cpu.to("tpu")
    counts = []
    for step in range(8):
        piece = torch.full((2, 1, 1, 8), 0.1 * step)
        k_cpu, k = torch.cat([k_cpu, piece], -2), torch.cat([k, piece.to("tpu")], -2)
        torchtpu_lab.sync()
        before = _programs()
        grouped = k[:, :, None].expand(2, 1, 4, k.shape[2], 8).reshape(2, 4, k.shape[2], 8)
        grouped_cpu = k_cpu[:, :, None].expand(2, 1, 4, k_cpu.shape[2], 8).reshape(2, 4, k_cpu.shape[2], 8)
        weights = (q_cpu.to("tpu") @ grouped.transpose(2, 3)).softmax(-1)
        out = (weights @ grouped).cpu()
        counts.append(_programs() - before)
        assert growth.front(weights) is not None
        want = (q_cpu @ grouped_cpu.transpose(2, 3)).softmax(-1) @ grouped_cpu
        torch.testing.assert_close(out, want)
    assert sum(counts[2:]) == 0, counts
    copy = grouped.transpose(2, 3).clone()  # a broadcast copied: grown, bit for bit the unpadded copy
    assert growth.front(copy) is not None
    assert torch.equal(copy.cpu(), grouped_cpu.transpose(2, 3).clone())
    plain = k.contiguous()
    assert growth.front(plain) is None and plain.is_contiguous() and plain.view(-1).shape == (2 * k.shape[2] * 8,)
    assert torch.equal(plain.cpu(), k_cpu)


def test_padding_a_grown_tensor_to_a_fixed_length_fills_with_the_value_and_compiles_once():
    mask_cpu, mask = torch.ones(2, 5, dtype=torch.bool), torch.ones(2, 5, dtype=torch.bool, device="tpu")
    mask_cpu[0, :2], mask[0, :2] = False, False
    counts = []
    for step in range(20):
        mask_cpu = torch.cat([mask_cpu, torch.ones(2, 1, dtype=torch.bool)], -1)
        mask = torch.cat([mask, torch.ones(2, 1, dtype=torch.bool, device="tpu")], -1)
        before = _programs()
        for size, value in ((40, False), (3000, True)):  # within the capacity, and past it
            got = torch.nn.functional.pad(mask, (0, size - mask.shape[1]), value=value)
            assert growth.front(got) is None and got.shape == (2, size)
            assert torch.equal(got.cpu(), torch.nn.functional.pad(mask_cpu, (0, size - mask_cpu.shape[1]),
                                                                  value=value)), step
        rows = torch.nn.functional.pad(mask.float(), (0, 0, 1, 1), value=2.0)  # the other dim: still grown
        assert growth.front(rows) is not None
        assert torch.equal(rows.cpu(), torch.nn.functional.pad(mask_cpu.float(), (0, 0, 1, 1), value=2.0))
        counts.append(_programs() - before)
    assert sum(counts[3:]) == 0, counts


def test_gathers_and_scatters_by_grown_indices_equal_cpu_and_compile_once():
    """What ``transformers``' repetition penalty does every token with the grown token ids."""
    scores_cpu = torch.linspace(-3, 3, 2 * 40).reshape(2, 40)
    scores = scores_cpu.to("tpu")
    ids_cpu, ids = torch.tensor([[3, 5], [7, 7]]), torch.tensor([[3, 5], [7, 7]], device="tpu")
    counts = []
    for step in range(20):
        new = torch.tensor([[step % 40], [(3 * step) % 40]])
        ids_cpu, ids = torch.cat([ids_cpu, new], 1), torch.cat([ids, new.to("tpu")], 1)
        before = _programs()
        picked = torch.gather(scores, 1, ids)
        assert growth.front(picked) is not None
        penalized = torch.where(picked < 0, picked * 1.3, picked / 1.3)
        got = scores.scatter(1, ids, penalized)
        added = scores.scatter_add(1, ids, torch.ones_like(penalized))
        filled = scores.scatter(1, ids, 9.0)
        picked_cpu = torch.gather(scores_cpu, 1, ids_cpu)
        want = scores_cpu.scatter(1, ids_cpu, torch.where(picked_cpu < 0, picked_cpu * 1.3, picked_cpu / 1.3))
        torch.testing.assert_close(got.cpu(), want)
        torch.testing.assert_close(added.cpu(), scores_cpu.scatter_add(1, ids_cpu, torch.ones_like(picked_cpu)))
        assert torch.equal(filled.cpu(), scores_cpu.scatter(1, ids_cpu, 9.0))
        counts.append(_programs() - before)
    assert sum(counts[3:]) == 0, counts
    with pytest.raises(RuntimeError, match="out of bounds"):  # a logical index out of range still raises
        torch.gather(scores, 1, ids + 40).cpu()


def _ngram_ban(ids: torch.Tensor, scores: torch.Tensor, n: int) -> torch.Tensor:
    """What ``transformers``' ``no_repeat_ngram_size`` does with the grown token ids every token: the windows of
    an ``unfold`` compared with the last ``n - 1`` ids, and the tokens that would repeat an n-gram banned by an
    in-place scatter."""
    length, vocab = ids.shape[-1], scores.shape[-1]
    prefix = ids[:, length + 1 - n:]
    windows = ids.unfold(dimension=1, size=n, step=1)
    matches = (windows[..., :-1] == prefix.unsqueeze(1)).all(dim=-1)
    banned = scores.new_zeros((scores.shape[0], vocab + 1), dtype=torch.bool)
    banned.scatter_(1, torch.where(matches, windows[..., -1].clamp(max=vocab), vocab), True)
    return scores.masked_fill(banned[:, :vocab], -float("inf"))


@pytest.mark.parametrize("n", [2, 3])
def test_windows_of_an_unfold_along_a_grown_dim_are_fronts_and_an_ngram_ban_compiles_once(n):
    """``unfold`` along the grown dim gives windows whose other dim walks the grown positions too: the windows dim
    is the grown one, ``windows[..., -1]`` a front that starts ``n - 1`` positions in (a capacity that much
    smaller), and the n-gram ban built from them equals the CPU's at every length without a program per token."""
    scores_cpu = torch.linspace(-3, 3, 2 * 12).reshape(2, 12)
    scores = scores_cpu.to("tpu")
    ids_cpu = torch.tensor([[3, 5, 3, 5, 3], [7, 7, 7, 1, 7]])
    ids = ids_cpu.to("tpu")
    ids = torch.cat([ids, torch.tensor([[5], [7]], device="tpu")], 1)
    ids_cpu = torch.cat([ids_cpu, torch.tensor([[5], [7]])], 1)
    counts, banned, handed = [], 0, {}
    for step in range(24):
        if step == 4:
            handed = dict(recording.stats().get("python_ops", {}))
        before = _programs()
        windows = ids.unfold(1, n, 1)
        assert growth.front(windows) is not None and growth.front(windows[..., -1]) is not None
        got, want = _ngram_ban(ids, scores, n), _ngram_ban(ids_cpu, scores_cpu, n)
        assert torch.equal(got.cpu(), want), step
        banned += int(torch.isinf(want).sum())
        counts.append(_programs() - before)
        new = torch.tensor([[(3, 5)[step % 2]], [(step * 5) % 12]])
        ids_cpu, ids = torch.cat([ids_cpu, new], 1), torch.cat([ids, new.to("tpu")], 1)
    assert banned > 24  # the ban bans: repeated n-grams in both rows
    assert sum(counts[3:]) == 0, counts
    if handed:  # the native core records the pointwise ops on windows too (csrc/recorder.cpp front_of)
        clamps = recording.stats()["python_ops"].get("aten::clamp", 0) - handed.get("aten::clamp", 0)
        assert clamps == 0, clamps
    assert growth.front(ids[:, 1:]) is not None  # a view a fixed few positions in is a front
    assert growth.front(ids[:, ids.shape[1] - 3:]) is None  # the last positions: a start that moves with the length


def test_growing_prefixes_of_a_new_buffer_each_step_are_fronts_and_an_ngram_ban_compiles_once():
    """Beam search keeps its ids in a buffer of the final length, makes a new one every step (a gather by beam,
    then the new token written in) and hands the processors ``buffer[:, :, :n]`` flattened: nothing is appended.
    A slice of a growing prefix marks its buffer as grown (runtime/growth.py ``growing_prefix``), so the n-gram
    ban equals the CPU's at every length without a program per token."""
    batch, beams, capacity, vocab = 2, 3, 40, 12
    order = torch.tensor([[1, 0, 2], [2, 2, 0]])[:, :, None].expand(batch, beams, capacity)
    scores_cpu = torch.linspace(-3, 3, batch * beams * vocab).reshape(batch * beams, vocab)
    scores = scores_cpu.to("tpu")
    buf_cpu = torch.zeros(batch, beams, capacity, dtype=torch.long)
    buf_cpu[..., :5] = torch.tensor([3, 5, 3, 5, 3])
    buf = buf_cpu.to("tpu")
    counts, banned = [], 0
    for n in range(5, 32):
        before = _programs()
        ids, ids_cpu = buf[:, :, :n].reshape(batch * beams, n), buf_cpu[:, :, :n].reshape(batch * beams, n)
        got, want = _ngram_ban(ids, scores, 3), _ngram_ban(ids_cpu, scores_cpu, 3)
        assert torch.equal(got.cpu(), want), n
        banned += int(torch.isinf(want).sum())
        counts.append(_programs() - before)
        if n > 8:
            assert growth.front(ids) is not None, n
        new = torch.tensor([(3, 5)[n % 2], n % vocab, 7])[None, :].expand(batch, beams)
        buf_cpu = buf_cpu.gather(1, order).clone()
        buf_cpu[:, :, n] = new
        buf = buf.gather(1, order.to("tpu")).clone()
        buf[:, :, n] = new.to("tpu")
    assert banned > 27  # the ban bans
    assert sum(counts[6:]) == 0, counts


def test_a_constant_buffer_sliced_to_longer_inputs_is_not_marked_as_grown():
    """``position_ids[:, :n]`` of a model's buffer for inputs of growing length is not a growing sequence: a mark
    would make every later op on that buffer's prefixes run on its whole extent."""
    positions = torch.arange(64).expand(1, 64).contiguous().to("tpu")
    for n in (8, 16, 24, 32):
        torch.testing.assert_close((positions[:, :n] * 2).cpu(), torch.arange(n)[None] * 2)
    assert growth.grown_dim(tensor.adopt(positions).tpu_storage) is None


def test_reductions_and_cumulative_ops_over_grown_padding_equal_cpu():
    x_cpu, x = _grown("cpu", 13, dtype=torch.float32), _grown("tpu", 13, dtype=torch.float32)
    e_cpu, e = torch.exp(x_cpu * -0.01) - 2, torch.exp(x * -0.01) - 2  # padding: exp(0) - 2 = -1
    i_cpu, i = _grown("cpu", 13), _grown("tpu", 13)  # int64: padding 0 below every value
    close = torch.testing.assert_close
    close(e.mean().cpu(), e_cpu.mean())
    close(e.mean(1, keepdim=True).cpu(), e_cpu.mean(1, keepdim=True))
    close(e.mean(0).cpu(), e_cpu.mean(0))
    assert growth.front(e.mean(0)) is not None
    close(e.amax(1).cpu(), e_cpu.amax(1))  # every logical value is below -1: a max that read the padding is -1
    close((-e).amin().cpu(), (-e_cpu).amin())
    assert torch.equal(i.amin(1).cpu(), i_cpu.amin(1)) and torch.equal((-i).amax().cpu(), (-i_cpu).amax())
    assert bool((e < -1).all()) == bool((e_cpu < -1).all()) is True
    assert bool((e > -1).any()) == bool((e_cpu > -1).any()) is False
    assert torch.equal((e < -1.5).any(1).cpu(), (e_cpu < -1.5).any(1))
    for op in (torch.cumsum, torch.cumprod, torch.logcumsumexp):
        close(op(e, 1).cpu(), op(e_cpu, 1))
        close(op(e, 0).cpu(), op(e_cpu, 0))
    assert growth.front(torch.cumsum(e, 1)) is not None
    with pytest.raises(RuntimeError):  # PyTorch's error for a mean of integers, from the ordinary path
        i.mean()


def test_an_embedding_of_grown_indices_equals_cpu_and_stays_grown():
    weight_cpu = torch.linspace(-1, 1, 32 * 3).reshape(32, 3)
    ids_cpu, ids = _grown("cpu", 9) % 32, _grown("tpu", 9) % 32
    rows = torch.nn.functional.embedding(ids, weight_cpu.to("tpu"))
    assert growth.front(rows) is not None and rows.shape == (2, 9, 3)
    assert torch.equal(rows.cpu(), torch.nn.functional.embedding(ids_cpu, weight_cpu))


def test_a_bad_call_on_a_grown_tensor_raises_pytorchs_error_and_loses_nothing():
    x_cpu, x = _grown("cpu", 9, dtype=torch.float32), _grown("tpu", 9, dtype=torch.float32)
    with pytest.raises(RuntimeError, match="broadcast|size of tensor"):
        x + torch.ones(2, 5, device="tpu")  # not broadcastable: the ordinary path's (PyTorch's) error
    with pytest.raises(RuntimeError, match="Dimension out of range"):
        torch.softmax(x, 2).cpu()  # no dim 2 (raised when the graph runs, as every fused op's error)
    y = x * 2  # the session and every tensor made before still work, and the rewrite still applies
    assert growth.front(y) is not None
    assert torch.equal(y.cpu(), x_cpu * 2) and torch.equal(x.cpu(), x_cpu)


@pytest.mark.parametrize("mode", ["fused", "strict"])
def test_a_view_merging_a_grown_dim_takes_a_compact_copy_and_keeps_aliasing(mode):
    """``torch.cat([a, b], 1)`` is padded (an append), so its strides are the padded storage's; a ``view`` that
    merges the grown dim with another (``.view(-1)``, which PyTorch's contiguous result takes) moves the tensor to
    a contiguous copy of its own first, so the view works, aliases it, and gradients flow as on the CPU. With
    another view of it alive, moving it would break their aliasing: PyTorch's view error stands, losing
    nothing."""
    a_cpu = torch.arange(20, dtype=torch.float32).reshape(2, 10).requires_grad_()
    b_cpu = torch.arange(6, dtype=torch.float32).reshape(2, 3).requires_grad_()
    with torchtpu_lab.eager_mode(mode):
        a, b = a_cpu.detach().to("tpu").requires_grad_(), b_cpu.detach().to("tpu").requires_grad_()
        x, x_cpu = torch.cat([a, b], 1), torch.cat([a_cpu, b_cpu], 1)
        assert growth.front(x) is not None and not x.is_contiguous()
        flat = x.view(-1)
        assert x.is_contiguous() and growth.front(x) is None
        assert torch.equal(flat.detach().cpu(), x_cpu.detach().view(-1))
        (flat * torch.arange(26.0, device="tpu")).sum().backward()
        (x_cpu.view(-1) * torch.arange(26.0)).sum().backward()
        assert torch.equal(a.grad.cpu(), a_cpu.grad) and torch.equal(b.grad.cpu(), b_cpu.grad)
        y, y_cpu = _grown("tpu", 8, dtype=torch.float32), _grown("cpu", 8, dtype=torch.float32)
        assert growth.front(y) is not None
        y.view(-1)[0] = 100.0  # writes through the view reach the tensor
        y_cpu.view(-1)[0] = 100.0
        assert torch.equal(y.cpu(), y_cpu)
        z, z_cpu = _grown("tpu", 8, dtype=torch.float32), _grown("cpu", 8, dtype=torch.float32)
        head = z[:, :3]
        with pytest.raises(RuntimeError, match="view size is not compatible"):
            z.view(-1)
        head[0, 0] = -1.0  # still aliases z, and both stay usable
        z_cpu[0, 0] = -1.0
        assert torch.equal(z.cpu(), z_cpu) and torch.equal(z.reshape(-1).cpu(), z_cpu.reshape(-1))


def test_attention_reads_an_unwritten_contiguous_copy_of_a_grown_mask_from_its_source():
    """``transformers``' sdpa path makes T5's position-bias mask ``contiguous()``: the copy is an ordinary tensor
    of ``n`` positions (contiguous, as PyTorch's), and attention given it reads the grown tensor it was copied
    from, so a decode step is one program per bucket. A copy written after it was made is read as it is."""
    F = torch.nn.functional
    q_cpu = torch.linspace(-1, 1, 4 * 8).reshape(1, 4, 1, 8)
    k_cpu = torch.linspace(0, 1, 4 * 5 * 8).reshape(1, 4, 5, 8)
    bias_cpu = torch.zeros(1, 4, 1, 5)
    k = torch.cat([torch.tensor([], device="tpu"), k_cpu.to("tpu")], -2)
    bias = torch.cat([torch.tensor([], device="tpu"), bias_cpu.to("tpu")], -1)
    counts = []
    for step in range(10):
        piece, extra = torch.full((1, 4, 1, 8), 0.1 * step), torch.full((1, 4, 1, 1), -0.5 * step)
        k_cpu, k = torch.cat([k_cpu, piece], -2), torch.cat([k, piece.to("tpu")], -2)
        bias_cpu, bias = torch.cat([bias_cpu, extra], -1), torch.cat([bias, extra.to("tpu")], -1)
        torchtpu_lab.sync()
        before = _programs()
        mask = (bias * 2.0).contiguous()
        assert mask.is_contiguous() and growth.front(mask) is None
        out = F.scaled_dot_product_attention(q_cpu.to("tpu"), k, k, attn_mask=mask)
        del mask
        got = out.cpu()
        counts.append(_programs() - before)
        torch.testing.assert_close(got, F.scaled_dot_product_attention(q_cpu, k_cpu, k_cpu, attn_mask=bias_cpu * 2.0))
    assert sum(counts[2:]) == 0, counts
    written = (bias * 2.0).contiguous()
    written[..., 0] = 100.0  # the copy differs from its source now: attention reads the copy
    want = (bias_cpu * 2.0).contiguous()
    want[..., 0] = 100.0
    torch.testing.assert_close(F.scaled_dot_product_attention(q_cpu.to("tpu"), k, k, attn_mask=written).cpu(),
                               F.scaled_dot_product_attention(q_cpu, k_cpu, k_cpu, attn_mask=want))


def test_a_grown_tensor_with_a_live_contiguous_copy_still_takes_a_merging_view():
    """A ``contiguous()`` copy's record of its source (for attention) is not a view of the source: the source can
    still move to a contiguous copy of its own for a view, and the copy keeps its values."""
    x, x_cpu = _grown("tpu", 9, dtype=torch.float32), _grown("cpu", 9, dtype=torch.float32)
    copy = x.contiguous()
    flat = x.view(-1)
    flat[0] = -5.0
    x_cpu.view(-1)[0] = -5.0
    assert torch.equal(x.cpu(), x_cpu) and torch.equal(copy.cpu(), _grown("cpu", 9, dtype=torch.float32))
