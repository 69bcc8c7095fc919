"""Loops that run a forward over their whole grown sequence every step — nanoGPT's ``generate``, ``transformers``'
``use_cache=False`` — compile once per capacity bucket (runtime/bounded.py: row-wise ops, attention over
queries and keys grown alike, joins and prepends, copies of a batch of one), and a loop that appends without
ever syncing runs one graph per iteration (runtime/growth.py ``_loop_step``) instead of one graph of every
iteration so far. Tokens and values equal PyTorch's on the CPU."""

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchtpu_lab
from bench.whole_sequence import NanoGPT, nanogpt_generate
from torchtpu_lab import telemetry
from torchtpu_lab.runtime import growth, recording


def _programs() -> int:
    return int(telemetry.counters["compiles"] + telemetry.counters["disk_loads"])


@pytest.mark.parametrize("sync", [True, False], ids=["synced", "never-synced"])
def test_a_whole_sequence_generation_loop_equals_cpu_and_compiles_once_per_bucket(sync):
    torch.manual_seed(0)
    model = NanoGPT(24 + 8 * sync).eval()  # a width per case: nothing compiled for its shapes yet
    prompt = torch.randint(0, 53, (1, 5), generator=torch.Generator().manual_seed(1))
    want = [nanogpt_generate(model, prompt, n, False) for n in (12, 24)]
    tpu = copy.deepcopy(model).to("tpu")
    built = []
    with torchtpu_lab.profile() as prof:
        for n in (12, 24, 24):
            before = _programs()
            got = nanogpt_generate(tpu, prompt.to("tpu"), n, sync).cpu()
            built.append(_programs() - before)
            assert torch.equal(got, want[n == 24]), n
    # one per token before (synced), or one graph of every token compiled for each call length (never synced)
    assert built[0] <= 6 and built[1] <= 1 and built[2] == 0, built
    cuts = [g for g in prof.report().syncs if g.reason == telemetry.SyncReason.LOOP_ITERATION.text]
    if sync:
        assert not cuts  # a loop that syncs every token is never cut
    else:
        assert sum(g.count for g in cuts) >= 12 + 24 + 24 - 3  # each iteration a graph, from the second on
        assert "torch.cat((idx, nxt), dim=1)" in cuts[0].code and "once per bucket" in cuts[0].hint


def test_an_evaluation_loop_that_accumulates_without_syncing_runs_a_graph_per_batch():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))
    batches = [torch.randn(4, 6, generator=torch.Generator().manual_seed(i)) for i in range(30)]

    def evaluate(model, device):
        outs = torch.zeros(0, 3, device=device)
        with torch.no_grad():
            for x in batches:
                outs = torch.cat([outs, model(x.to(device))])
        return outs

    want = evaluate(net, "cpu")
    tpu = copy.deepcopy(net).to("tpu")
    before, syncs = _programs(), telemetry.counters["syncs"]
    got = evaluate(tpu, "tpu")
    assert telemetry.counters["syncs"] - syncs >= 25  # a graph per batch, not one graph of 30 forwards
    torch.testing.assert_close(got.cpu(), want)
    assert _programs() - before <= 6
    before = _programs()
    torch.testing.assert_close(evaluate(tpu, "tpu").cpu(), want)
    assert _programs() == before


def test_a_training_step_that_accumulates_a_recurrent_nets_outputs_stays_one_graph():
    """With gradients on, the unrolled loop is one graph per step, compiled once for its length, as before: the
    cut is for loops that generate or evaluate."""
    torch.manual_seed(0)
    cell, head = nn.GRUCell(4, 8), nn.Linear(8, 2)
    xs, ys = torch.randn(12, 3, 4), torch.randn(3, 12, 2)

    def train(device: str) -> list:
        c, h_ = copy.deepcopy(cell).to(device), copy.deepcopy(head).to(device)
        opt = torch.optim.SGD([*c.parameters(), *h_.parameters()], lr=0.1)
        losses = []
        for _ in range(3):
            h, outs = torch.zeros(3, 8, device=device), torch.zeros(3, 0, 8, device=device)
            for x in xs:
                h = c(x.to(device), h)
                outs = torch.cat([outs, h[:, None]], 1)
            loss = ((h_(outs) - ys.to(device)) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses

    want = train("cpu")
    syncs = telemetry.counters["syncs"]
    got = train("tpu")
    assert telemetry.counters["syncs"] - syncs <= 3 + 1  # one per step's loss.item(), not one per timestep
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=1e-5, atol=1e-6)


def _front(device: str, n: int, width: int = 8, batch: int = 1):
    """A ``[batch, n, width]`` float tensor built by appends along dim 1 (on tpu: the front of a padded
    storage)."""
    g = torch.Generator().manual_seed(n)
    x = torch.randn(batch, 3, width, generator=g).to(device)
    for _ in range(n - 3):
        x = torch.cat([x, torch.randn(batch, 1, width, generator=g).to(device)], dim=1)
    return x


def test_linear_and_layer_norm_of_a_front_equal_cpu_and_stay_fronts():
    torch.manual_seed(0)
    lin, norm = nn.Linear(8, 5), nn.LayerNorm(8)
    weights = [t.to("tpu") for t in (lin.weight, lin.bias, norm.weight, norm.bias)]
    handed = []
    for n in range(9, 15):  # once taught, the native core records both on a front of any length
        x_cpu, x = _front("cpu", n, batch=2), _front("tpu", n, batch=2)
        assert growth.front(x) is not None
        y = F.linear(x, *weights[:2])
        assert growth.front(y) is not None and y.shape == (2, n, 5)
        torch.testing.assert_close(y.cpu(), lin(x_cpu))
        outs = torch.native_layer_norm(x, [8], *weights[2:], 1e-5)
        wants = torch.native_layer_norm(x_cpu, [8], norm.weight, norm.bias, 1e-5)
        for got, want in zip(outs, wants):  # the output, mean and rstd: each the front of a padded result
            assert growth.front(got) is not None and got.shape == want.shape
            torch.testing.assert_close(got.cpu(), want)
        python = recording.stats().get("python_ops", {})
        handed.append(python.get("aten::linear", 0) + python.get("aten::native_layer_norm", 0))
    if recording.stats():
        assert handed[-1] == handed[-3], handed  # no call handed to Python for the last lengths
    # the grown dim among the normalized ones: the ordinary path, same values
    torch.testing.assert_close(F.layer_norm(x, [n, 8]).cpu(), F.layer_norm(x_cpu, [n, 8]))


@pytest.mark.parametrize("causal", [True, False])
def test_attention_over_queries_and_keys_grown_alike_equals_cpu(causal):
    x_cpu, x = _front("cpu", 13, width=16), _front("tpu", 13, width=16)

    def heads(t):
        return t.view(1, t.shape[1], 2, 8).transpose(1, 2)

    q, k, v = heads(x * 0.5), heads(x.cos()), heads(x.sin())
    assert all(growth.front(t) is not None for t in (q, k, v))
    got = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    want = F.scaled_dot_product_attention(heads(x_cpu * 0.5), heads(x_cpu.cos()), heads(x_cpu.sin()),
                                          is_causal=causal)
    assert growth.front(got) is not None and got.shape == want.shape
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-6)


def test_a_contiguous_copy_of_a_front_is_a_front_where_pytorchs_would_be_contiguous_too():
    one, two = _front("tpu", 9, width=6), _front("tpu", 9, width=6, batch=2)
    a = one.view(1, 9, 2, 3).transpose(1, 2).transpose(1, 2).contiguous()
    assert growth.front(a) is not None and a.is_contiguous()
    b = two.view(2, 9, 2, 3).transpose(1, 2).contiguous()  # PyTorch's is contiguous: ours is, not padded
    assert growth.front(b) is None and b.is_contiguous()
    ids = _front("tpu", 9, width=1)[..., 0].long()
    c = ids.clone(memory_format=torch.contiguous_format)  # generate copies a batch of one's ids every token
    assert growth.front(c) is not None and c.is_contiguous() and torch.equal(c.cpu(), ids.cpu())
    torch.testing.assert_close(a.cpu(), one.cpu().view(1, 9, 2, 3))
    kept = one.view(1, 9, 2, 3).transpose(2, 3).clone()  # preserve_format of a non-contiguous front: not padded
    assert growth.front(kept) is None
    torch.testing.assert_close(kept.cpu(), one.cpu().view(1, 9, 2, 3).transpose(2, 3))


def test_joins_of_fronts_and_a_prepend_equal_cpu_and_stay_fronts():
    x_cpu, x = _front("cpu", 10), _front("tpu", 10)
    joined = torch.cat((-x[..., 4:], x[..., :4]), dim=-1)  # rotary's rotate_half: halves joined along the head dim
    assert growth.front(joined) is not None
    torch.testing.assert_close(joined.cpu(), torch.cat((-x_cpu[..., 4:], x_cpu[..., :4]), dim=-1))
    ids_cpu = torch.arange(10).view(1, 10) * 3
    grown = _front("tpu", 10, width=1)  # alive, as a loop's sequence is
    ids = grown[..., 0] * 0 + torch.arange(10, device="tpu") * 3
    assert growth.front(ids) is not None
    diff = torch.diff(ids, prepend=ids[:, :1] - 1, dim=-1)  # transformers' packed-sequence check
    assert growth.front(diff) is not None
    torch.testing.assert_close(diff.cpu(), torch.diff(ids_cpu.float(), prepend=ids_cpu[:, :1].float() - 1))


def test_what_a_long_buffer_of_ids_feeds_is_computed_on_the_lengths_bucket():
    grown = _front("tpu", 9, width=1)  # alive: a loop's sequence (positions of its length are built from it)
    ids = grown[..., 0].long().abs() % 7
    assert growth.front(ids).capacity > 64  # small rows: a long buffer, so it never changes bucket
    emb = nn.Embedding(7, 4).to("tpu")(ids)
    f = growth.front(emb)
    assert f is not None and f.capacity == 64 and growth.extent(9, 4096) == 64 and growth.extent(64, 4096) == 128
    pos = torch.arange(0, ids.shape[1], device="tpu")
    assert growth.front(pos).capacity == 64 and math.prod(pos.shape) == 9
