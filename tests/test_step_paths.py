"""The fused training step's own paths (issue 26): attention with gradients as one fused op forward and one
backward (runtime/training_attention.py), factories recorded into the step's graph, and optimizers on their
foreach path (backend/foreach_types.py). Each is checked for values against PyTorch on CPU and for the path it
takes, so a regression to the slow path fails here."""

import pytest
import torch
import torch.nn.functional as F

import torchtpu_lab
from torchtpu_lab import telemetry
from torchtpu_lab.runtime import fused
from torchtpu_lab.telemetry import Counter


@pytest.mark.parametrize("mode", ["fused", "strict"])
@pytest.mark.parametrize("causal, mask, key_heads", [(True, None, 4), (False, "bool", 4), (False, "float", 4),
                                                     (True, None, 2), (False, "float", 1)])
def test_attention_with_gradients_is_one_op_each_way_and_matches_cpu(mode, causal, mask, key_heads):
    """Grouped-query heads (fewer key heads than query heads, ``enable_gqa``: Llama 3, Mistral, Qwen2) too: the
    shared heads' gradients are the sums over their groups, as on CPU."""
    torch.manual_seed(0)
    q = torch.randn(2, 4, 8, 16, requires_grad=True)
    k, v = (torch.randn(2, key_heads, 8, 16, requires_grad=True) for _ in range(2))
    gqa = {"enable_gqa": True} if key_heads != 4 else {}
    m = None
    if mask == "bool":
        m = torch.rand(8, 8) > 0.3
    elif mask == "float":
        m = torch.randn(2, 1, 8, 8, requires_grad=True)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=m, is_causal=causal, **gqa)
    g = torch.randn_like(out)
    out.backward(g)
    want = [out.detach(), q.grad, k.grad, v.grad] + ([m.grad] if mask == "float" else [])
    tq, tk, tv = (t.detach().to("tpu").requires_grad_() for t in (q, k, v))
    tm = None if m is None else m.detach().to("tpu")
    if mask == "float":
        tm.requires_grad_()
    with torchtpu_lab.eager_mode(mode):
        o = F.scaled_dot_product_attention(tq, tk, tv, attn_mask=tm, is_causal=causal, **gqa)
        assert type(o.grad_fn).__name__ == "ScaledDotProductFusedAttentionOverrideableBackward0"
        o.backward(g.to("tpu"))
        got = [o.detach(), tq.grad, tk.grad, tv.grad] + ([tm.grad] if mask == "float" else [])
    for w, t in zip(want, got):
        torch.testing.assert_close(t.cpu(), w, atol=2e-5, rtol=1e-4)


def test_attention_outside_the_fused_op_keeps_pytorchs_decomposition():
    """Dropout with gradients takes PyTorch's math decomposition (and its gradients); so does a grouped-query call
    without ``enable_gqa``, whose error is PyTorch's."""
    q = torch.randn(1, 4, 6, 8).to("tpu").requires_grad_()
    kv = torch.randn(1, 4, 6, 8).to("tpu").requires_grad_()
    torch.manual_seed(0)
    out = F.scaled_dot_product_attention(q, kv, kv, dropout_p=0.5)
    assert "Overrideable" not in type(out.grad_fn).__name__
    out.sum().backward()
    assert q.grad is not None and kv.grad is not None
    with pytest.raises(RuntimeError) as raised:
        F.scaled_dot_product_attention(q, kv[:, :2], kv[:, :2])
    with pytest.raises(RuntimeError) as on_cpu:
        F.scaled_dot_product_attention(q.detach().cpu(), kv[:, :2].detach().cpu(), kv[:, :2].detach().cpu())
    assert str(raised.value).split("\n")[0] == str(on_cpu.value).split("\n")[0]


def test_a_direct_call_the_fused_kernel_cannot_compute_names_the_op():
    q = torch.randn(1, 2, 4, 8).to("tpu")
    with pytest.raises(NotImplementedError, match="_scaled_dot_product_fused_attention_overrideable"):
        torch.ops.aten._scaled_dot_product_fused_attention_overrideable(q, q, q, None, 0.5)


def test_factories_are_recorded_into_the_graph_in_fused_mode():
    """``arange``/``ones``/``full`` in the middle of a step are nodes of its graph, not programs run on their
    own: one execution per sync, values as on CPU. A factory that would start a graph still runs at once (its
    memory is allocated where it was made)."""
    x = torch.randn(4, 6).to("tpu")
    with torchtpu_lab.eager_mode("fused"):
        torchtpu_lab.sync()
        first = torch.zeros(3, device="tpu")
        assert not fused.has_pending() and not isinstance(first.tpu_storage.held, fused.LazyValue)
        for _ in range(2):
            torchtpu_lab.sync()
            before = telemetry.counters[Counter.EXECUTIONS]
            x = x * 1.0
            pos = torch.arange(6, device="tpu")
            mask = torch.ones(6, 6, device="tpu", dtype=torch.bool).tril()
            y = x + pos + torch.full((4, 6), 2.5, device="tpu")
            z = y.masked_fill(~mask[:4], 0.0)
            torchtpu_lab.sync()
            executions = telemetry.counters[Counter.EXECUTIONS] - before
    assert executions == 1, executions
    xc = x.cpu()
    want = (xc + torch.arange(6) + 2.5).masked_fill(~torch.ones(6, 6, dtype=torch.bool).tril()[:4], 0.0)
    torch.testing.assert_close(z.cpu(), want)


def _adamw_steps(device, foreach):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=foreach)
    x, y = torch.randn(5, 8), torch.randn(5, 4)
    losses = []
    for _ in range(3):
        opt.zero_grad()
        loss = F.mse_loss(model(x.to(device)), y.to(device))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, [p.detach().cpu() for p in model.parameters()]


def test_optimizers_take_the_foreach_path_on_tpu_parameters_and_match_cpu():
    from torch.optim.optimizer import _default_to_fused_or_foreach

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4).to("tpu")
    model(torch.randn(2, 4).to("tpu")).sum().backward()  # the runtime adopts the parameters (TpuTensor)
    assert _default_to_fused_or_foreach([p for p in model.parameters()], False) == (False, True)
    cpu_losses, cpu_params = _adamw_steps("cpu", None)
    with torchtpu_lab.eager_mode("fused"):
        losses, params = _adamw_steps("tpu", None)
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(cpu_losses), atol=1e-5, rtol=1e-5)
    for p, c in zip(params, cpu_params):
        torch.testing.assert_close(p, c, atol=1e-5, rtol=1e-5)
