"""``model.to("tpu")`` moves parameters in place, as ``.to("cuda")`` does (issue 20 item 8): tied weights stay
one Parameter, a CPU forward output still alive does not block the move, optimizers made before or after the move
train as on CPU, and no process-wide switch (``swap_module_params_on_conversion``) is needed."""

from __future__ import annotations

import pytest
import torch

from compare import assert_same


class TiedLM(torch.nn.Module):
    """GPT-2's tie: the output head is the token embedding."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(11, 6)
        self.mix = torch.nn.Linear(6, 6)
        self.lm_head = torch.nn.Linear(6, 11, bias=False)
        self.lm_head.weight = self.embed.weight

    def forward(self, ids):
        return self.lm_head(torch.tanh(self.mix(self.embed(ids))))


def _pair() -> tuple[TiedLM, TiedLM]:
    torch.manual_seed(0)
    model, reference = TiedLM(), TiedLM()
    reference.load_state_dict(model.state_dict())
    return model, reference


def _train(model, opt, ids, steps=3) -> list[float]:
    losses = []
    for _ in range(steps):
        loss = torch.nn.functional.cross_entropy(model(ids).flatten(0, 1), ids.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_no_global_swap_switch():
    assert torch.__future__.get_swap_module_params_on_conversion() is False


@pytest.mark.parametrize("optimizer_made", ["before_move", "after_move"])
def test_tied_module_with_live_cpu_output_moves_and_trains_like_cpu(optimizer_made):
    model, reference = _pair()
    ids = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]])
    alive = model(ids).sum()  # autograd's graph holds the CPU parameters
    weight = model.embed.weight
    opt = torch.optim.Adam(model.parameters(), lr=0.05) if optimizer_made == "before_move" else None
    model.to("tpu")
    assert model.lm_head.weight is model.embed.weight is weight  # the same Parameter, moved in place
    assert isinstance(weight, torch.nn.Parameter) and weight.device.type == "tpu"
    assert len(list(model.parameters())) == 3  # the tie is still one parameter
    opt = opt or torch.optim.Adam(model.parameters(), lr=0.05)
    got = _train(model, opt, ids.to("tpu"))
    expected = _train(reference, torch.optim.Adam(reference.parameters(), lr=0.05), ids)
    assert got == pytest.approx(expected, rel=1e-5)
    assert_same(model.embed.weight, reference.embed.weight, rtol=1e-5, atol=1e-6)
    assert alive.grad_fn is not None  # kept alive through the move (the swap path refused to move then)
    model.to("cpu")
    assert model.lm_head.weight is model.embed.weight is weight and weight.device.type == "cpu"
    torch.testing.assert_close(model(ids), reference(ids), rtol=1e-5, atol=1e-6)


def test_data_assignment_follows_the_new_tensor():
    p = torch.nn.Parameter(torch.ones(3, device="tpu"))
    p.data = torch.full((2, 2), 5.0, device="tpu")
    assert_same(p * 1, torch.full((2, 2), 5.0))
    p.data = torch.arange(4.0)  # back to the CPU: a plain Parameter again
    assert p.device.type == "cpu" and type(p) is torch.nn.Parameter
    torch.testing.assert_close(p * 2, torch.arange(4.0) * 2)


def test_hf_gpt2_keeps_its_tie():
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=40, n_positions=16)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).eval()
    ids = torch.tensor([[1, 5, 9, 3]])
    expected = model(ids).logits  # a CPU output alive through the move
    model.to("tpu")
    assert model.lm_head.weight is model.transformer.wte.weight
    assert_same(model(ids.to("tpu")).logits, expected, rtol=1e-4, atol=1e-5)
