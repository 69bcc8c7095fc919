"""torch.compile as users call it (issue 25): constants made inside traced code, Hugging Face and vision models,
``torch.compile(fn)`` with no backend, and eager/compiled parity (batch-norm eval statistics, RNG streams)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

import torchtpu_lab
from torchtpu_lab import native
from torchtpu_lab.compile import default_backend

# ---- 1. torch.tensor / as_tensor / lift_fresh under FakeTensorMode and Dynamo -------------------------------


def test_torch_tensor_and_as_tensor_fake_on_tpu():
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    with FakeTensorMode():
        a = torch.tensor([1.0, 2.0, 3.0], device="tpu")
        b = torch.as_tensor([[1, 2], [3, 4]], device="tpu")
        c = torch.tensor([], dtype=torch.float32, device="tpu")  # GPT-2's failing call
    for t, shape, dtype in ((a, (3,), torch.float32), (b, (2, 2), torch.int64), (c, (0,), torch.float32)):
        assert isinstance(t, FakeTensor) and t.device.type == "tpu"
        assert tuple(t.shape) == shape and t.dtype == dtype
    # the process's real tensors are untouched by the fake ones
    assert torch.tensor([5.0], device="tpu").cpu().item() == 5.0


def _constants(x):
    scale = torch.tensor([1.0, 2.0, 3.0], device=x.device)
    shift = torch.as_tensor([[0.5], [-0.5]], device=x.device)
    idx = torch.tensor([2, 0], device=x.device)
    return (x * scale + shift).index_select(1, idx) + torch.tensor(1.5, device=x.device)


@pytest.mark.parametrize("backend", ["tpu", "eager", "aot_eager"])
def test_constants_made_inside_a_compiled_region(backend):
    torch._dynamo.reset()
    x = torch.randn(2, 3)
    out = torch.compile(_constants, backend=backend, fullgraph=True)(x.to("tpu"))
    assert out.device.type == "tpu"
    torch.testing.assert_close(out.cpu(), _constants(x))


# ---- 2. torch.compile(fn) with no backend -------------------------------------------------------------------


def test_default_backend_compiles_tpu_inputs_with_tpu():
    torch._dynamo.reset()

    def fn(x):
        return (x.sin() * 2 + torch.tensor([1.0, 2.0], device=x.device)).sum(0)

    x = torch.randn(3, 2)
    before = len(default_backend.choices)
    out = torch.compile(fn)(x.to("tpu"))
    torch.testing.assert_close(out.cpu(), fn(x))
    assert list(default_backend.choices)[before:] == [("fn", "tpu")]


def test_default_backend_leaves_cpu_inputs_on_inductor(monkeypatch):
    """The choice itself is checked: Inductor's compile_fx is what the default backend calls for CPU graphs (a
    spy stands in for it, so the test does not pay for an Inductor build)."""
    from torch._inductor import compile_fx

    seen = []

    def spy(gm, example_inputs, **kwargs):
        seen.append([getattr(t, "device", None) for t in example_inputs])
        return gm.forward

    monkeypatch.setattr(compile_fx, "compile_fx", spy)
    torch._dynamo.reset()

    def fn_cpu(x):
        return x.cos() + 1

    x = torch.randn(4)
    before = len(default_backend.choices)
    torch.testing.assert_close(torch.compile(fn_cpu)(x), fn_cpu(x))
    assert list(default_backend.choices)[before:] == [("fn_cpu", "inductor")]
    assert seen == [[torch.device("cpu")]]
    torch._dynamo.reset()


def test_default_backend_routing_is_a_listed_global_change():
    said = [k for k, v in torchtpu_lab.global_changes().items() if k.startswith("torch._TorchCompileInductorWrapper")]
    assert len(said) == 1 and torchtpu_lab.global_changes()[said[0]] is True


# ---- 3. eager/compiled parity --------------------------------------------------------------------------------


def test_native_batch_norm_eval_matches_eager_and_cpu():
    torch._dynamo.reset()

    def bn(x, w, b, rm, rv):
        return torch.native_batch_norm(x, w, b, rm, rv, False, 0.1, 1e-5)

    args = [torch.randn(4, 3, 5), torch.randn(3), torch.randn(3), torch.randn(3), torch.rand(3) + 0.5]
    tpu_args = [a.to("tpu") for a in args]
    cpu = bn(*args)
    eager = bn(*tpu_args)
    compiled = torch.compile(bn, backend="tpu")(*tpu_args)
    for c, e, k in zip(cpu, eager, compiled):
        assert tuple(e.shape) == tuple(k.shape) == tuple(c.shape)
        torch.testing.assert_close(k.cpu(), c, rtol=1e-5, atol=1e-5)


def _random_ops(x):
    return (F.dropout(x, 0.5, training=True), torch.randn(3, 4, device=x.device),
            torch.bernoulli(torch.full((3, 4), 0.3, device=x.device)), torch.rand_like(x))


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_rng_streams_equal_in_eager_and_compiled(mode):
    torch._dynamo.reset()
    x = torch.ones(3, 4, device="tpu")
    with torchtpu_lab.eager_mode(mode):
        torch.manual_seed(0)
        eager = [t.cpu() for _ in range(2) for t in _random_ops(x)]
        torch.manual_seed(0)
        compiled_fn = torch.compile(_random_ops, backend="tpu")
        compiled = [t.cpu() for _ in range(2) for t in compiled_fn(x)]
    for e, c in zip(eager, compiled):
        assert torch.equal(e, c)
    assert not torch.equal(eager[0], eager[4])  # the second call draws new numbers


@pytest.mark.skipif(native.module() is None,  # torch.Generator("tpu") comes from the core
                    reason=f"no native core: {native.status().describe()}")
def test_rng_streams_equal_with_a_tpu_generator():
    torch._dynamo.reset()

    def fn(x, gen):
        return F.dropout(x, 0.5), torch.randn(3, 4, device=x.device, generator=gen), torch.rand(2, device=x.device)

    x = torch.ones(3, 4, device="tpu")
    gen = torch.Generator("tpu")
    runs = []
    for f in (fn, torch.compile(fn, backend="tpu")):
        torch.manual_seed(0)
        gen.manual_seed(3)
        runs.append([t.cpu() for t in f(x, gen)])
        runs[-1].append(gen.get_offset())
    eager, compiled = runs
    for e, c in zip(eager[:-1], compiled[:-1]):
        assert torch.equal(e, c)
    assert eager[-1] == compiled[-1] == 1


# ---- 4. whole-step compilation: forward, loss.backward() and opt.step() in one compiled function -----------


def test_dynamo_reads_grad_of_a_tpu_tensor():
    """A tpu tensor is a plain tensor to Dynamo: ``.grad`` of a non-parameter leaf can be read in a full graph."""
    torch._dynamo.reset()
    t = torch.randn(3, device="tpu", requires_grad=True)
    (t * t).sum().backward()
    out = torch.compile(lambda v: v.grad * 2 + v.detach(), backend="tpu", fullgraph=True)(t)
    torch.testing.assert_close(out.cpu(), (t.grad * 2 + t.detach()).cpu())


STEP_OPTIMIZERS = {
    "sgd": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
    "adam": lambda p: torch.optim.Adam(p, lr=1e-2),
    "adamw_foreach": lambda p: torch.optim.AdamW(p, lr=1e-2, foreach=True),
    "adamw_fused": lambda p: torch.optim.AdamW(p, lr=1e-2, fused=True),
    "sgd_fused": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, fused=True),
}


def _train_steps(make_opt, compiled: bool, steps: int = 4):
    """Losses, compiles per step and the Dynamo graphs of a step (compiled) of a small MLP."""
    from torchtpu_lab import telemetry

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).to("tpu")
    opt = make_opt(model.parameters())
    x, y = torch.randn(5, 8, device="tpu"), torch.randn(5, 4, device="tpu")

    def step(x, y):
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss.detach()

    fn = torch.compile(step, backend="tpu") if compiled else step
    losses, compiles = [], []
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    for _ in range(steps):
        opt.zero_grad()
        before = telemetry.counters["compiles"]
        losses.append(fn(x, y).item())
        compiles.append(telemetry.counters["compiles"] - before)
    return losses, compiles, torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs


@pytest.mark.parametrize("name", [n if n == "adamw_foreach" else pytest.param(n, marks=pytest.mark.sweep)
                                  for n in sorted(STEP_OPTIMIZERS)])
def test_compiled_training_step_matches_eager_step_for_step(name):
    """``torch.compile(train_step)`` with backward and the optimizer inside (PyTorch's compiled autograd): the
    losses follow eager's, the step is a few programs (forward, backward, the optimizer), and steady state
    compiles nothing. (``fullgraph=True`` with Dynamo's ``trace_autograd_ops``, one program:
    tests/test_compile_whole_step.py; ``trace_autograd_ops`` is not used here: in torch 2.13 it silently drops
    ``loss.backward()`` when the forward has a graph break, GPT-2 training with a constant loss, on the CPU with
    ``backend="eager"`` too.)"""
    torch._dynamo.reset()
    eager, _, _ = _train_steps(STEP_OPTIMIZERS[name], compiled=False)
    with torch._dynamo.config.patch(compiled_autograd=True):
        compiled, compiles, graphs = _train_steps(STEP_OPTIMIZERS[name], compiled=True)
    assert compiled == pytest.approx(eager, rel=2e-5)
    assert compiles[-1] == 0, compiles
    assert graphs <= 5, graphs  # forward, backward, optimizer (+ the first step's, which creates the state)
    breaks = " ".join(torch._dynamo.utils.counters["graph_break"])
    assert "tensor subclass" not in breaks


# ---- 1. real models: outputs and gradients against eager (tiny random configs, no downloads) --------------------

transformers = pytest.importorskip("transformers")


def _text(cls, config, vocab=64, **cfg):
    def build():
        return getattr(transformers, cls)(getattr(transformers, config)(vocab_size=vocab, **cfg))

    def batch(g):
        ids = torch.randint(1, vocab, (2, 8), generator=g)
        return {"input_ids": ids, "labels": ids.clone()}

    return build, batch


def _vision(cls, config, image=32, labels=5, **cfg):
    def build():
        return getattr(transformers, cls)(getattr(transformers, config)(num_labels=labels, num_channels=3, **cfg))

    def batch(g):
        return {"pixel_values": torch.randn(2, 3, image, image, generator=g),
                "labels": torch.randint(0, labels, (2,), generator=g)}

    return build, batch


_TINY = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64}
#: timm is not installed here (it needs torchvision): the CNN and ViT are transformers' own, with no timm code
MODELS = {
    "gpt2": _text("GPT2LMHeadModel", "GPT2Config", n_embd=32, n_layer=2, n_head=2, n_positions=32,
                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0),
    "llama": _text("LlamaForCausalLM", "LlamaConfig", num_key_value_heads=1, max_position_embeddings=32, **_TINY),
    "bert": _text("BertForMaskedLM", "BertConfig", max_position_embeddings=32, hidden_dropout_prob=0.0,
                  attention_probs_dropout_prob=0.0, **_TINY),
    "t5": _text("T5ForConditionalGeneration", "T5Config", d_model=32, d_kv=16, d_ff=64, num_layers=2,
                num_heads=2, dropout_rate=0.0, decoder_start_token_id=0),
    "resnet": _vision("ResNetForImageClassification", "ResNetConfig", embedding_size=8, hidden_sizes=[8, 16],
                      depths=[1, 1], layer_type="basic"),
    "vit": _vision("ViTForImageClassification", "ViTConfig", image_size=32, patch_size=8,
                   hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, **_TINY),
}


def _twins(name: str):
    """Two identical tpu copies of a tiny model (one to run eagerly, one to compile) and a batch for them."""
    build, make_batch = MODELS[name]
    torch.manual_seed(0)
    model = build().train()
    compiled_model = copy.deepcopy(model).to("tpu")
    model.to("tpu")
    return model, compiled_model, {k: v.to("tpu") for k, v in make_batch(torch.Generator().manual_seed(1)).items()}


@pytest.mark.sweep
@pytest.mark.parametrize("name", sorted(MODELS))
def test_hf_model_compiles_and_matches_eager(name):
    model, compiled_model, inputs = _twins(name)
    eager_out = model(**inputs)
    eager_out.loss.backward()
    torch._dynamo.reset()
    compiled = torch.compile(compiled_model, backend="tpu")
    out = compiled(**inputs)
    out.loss.backward()
    torch.testing.assert_close(out.logits.cpu(), eager_out.logits.detach().cpu(), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(out.loss.cpu(), eager_out.loss.detach().cpu(), rtol=1e-5, atol=1e-6)
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    compiled_grads = {n: p.grad for n, p in compiled_model.named_parameters() if p.grad is not None}
    assert grads and grads.keys() == compiled_grads.keys()
    for n, g in grads.items():
        torch.testing.assert_close(compiled_grads[n].cpu(), g.cpu(), rtol=1e-4, atol=1e-5, msg=n)
    # steady state: the same compiled forward and its backward compile nothing again. (The vision models' loss sets
    # config.problem_type on the first call, which Dynamo guards on: one recompile, the model's own doing.)
    from torchtpu_lab import telemetry

    compiles = []
    for _ in range(3):
        before = telemetry.counters["compiles"]
        compiled_model.zero_grad()
        compiled(**inputs).loss.backward()
        compiles.append(telemetry.counters["compiles"] - before)
    assert compiles[-2:] == [0, 0], compiles


def _steps(model, inputs, step_fn, steps: int) -> tuple[list[float], list[int], list[int]]:
    """Losses, XLA compiles and programs run, per step."""
    from torchtpu_lab import telemetry

    losses, compiles, programs = [], [], []
    for _ in range(steps):
        before = telemetry.counters["compiles"]
        with torchtpu_lab.profile() as prof:
            losses.append(step_fn(inputs))
        compiles.append(int(telemetry.counters["compiles"] - before))
        programs.append(prof.summary()["graphs_executed"])
    return losses, compiles, programs


def _trainer(model):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)

    def step(inputs):
        loss = model(**inputs).loss
        loss.backward()
        opt.step()
        return loss.detach()

    return opt, step


def _ignored_logging() -> set:
    """transformers' ``logger.warning_once``: GPT-2's forward calls it (reading ``loss_function`` warns that the
    config's ``loss_type`` is None), and Dynamo cannot trace a logger call — a graph break, an error under
    ``fullgraph=True``. ``torch._dynamo.config.ignore_logging_functions`` is PyTorch's switch for that: the call
    is left out of the traced graph."""
    from transformers.utils.logging import warning_once

    return {warning_once}


#: how the whole step is compiled: Dynamo settings, fullgraph
WHOLE_STEP = {"compiled_autograd": ({"compiled_autograd": True}, False),
              "fullgraph": ({"trace_autograd_ops": True, "ignore_logging_functions": _ignored_logging()}, True)}


@pytest.mark.sweep
@pytest.mark.parametrize("how", sorted(WHOLE_STEP))
@pytest.mark.parametrize("name", sorted(MODELS))
def test_hf_model_whole_step_compiles_matches_eager_and_settles(name, how):
    """forward + backward + AdamW compiled as one function, with compiled autograd (a few programs) or with
    ``fullgraph=True`` (one graph, one XLA program per step): losses follow eager step for step, parameters end
    equal, and the steps after the first two compile nothing (Dynamo, AOTAutograd and XLA)."""
    settings, fullgraph = WHOLE_STEP[how]
    model, compiled_model, inputs = _twins(name)
    results = []
    for m, compile_it in ((model, False), (compiled_model, True)):
        opt, step = _trainer(m)
        torch._dynamo.reset()
        fn = torch.compile(step, backend="tpu", fullgraph=fullgraph) if compile_it else step

        def run(inputs, opt=opt, fn=fn):
            opt.zero_grad()
            return fn(inputs).item()

        with torch._dynamo.config.patch(settings):
            results.append(_steps(m, inputs, run, 4))
    (eager, _, _), (compiled, compiles, programs) = results
    assert compiled == pytest.approx(eager, rel=1e-4), (eager, compiled)
    assert compiles[-2:] == [0, 0], compiles
    if fullgraph:
        assert programs[-2:] == [1, 1], programs
    noise = []
    for (n, p), q in zip(model.named_parameters(), compiled_model.parameters()):
        # a key projection's bias has an exact gradient of zero (softmax ignores a shift shared by all keys): its
        # float gradient is rounding noise, which AdamW's normalised update turns into steps of +-lr either way
        if p.grad is not None and p.grad.abs().max().item() < 1e-6:
            noise.append(n)
            continue
        torch.testing.assert_close(q.detach().cpu(), p.detach().cpu(), rtol=1e-3, atol=1e-5, msg=n)
    assert len(noise) <= 2 * len(list(model.parameters())) // 10, noise


@pytest.mark.sweep
@pytest.mark.parametrize("name", sorted(MODELS))
def test_fused_eager_training_without_sync_settles(name):
    """Fused eager mode, no ``.item()`` or ``sync()`` in the loop, a graph-size limit small enough that every step
    is cut several times: the cuts land at the same ops each step (runtime/graph_cuts.py), so the last steps
    compile nothing."""
    build, make_batch = MODELS[name]
    torch.manual_seed(0)
    model = build().to("tpu").train()
    inputs = {k: v.to("tpu") for k, v in make_batch(torch.Generator().manual_seed(1)).items()}
    opt, step = _trainer(model)

    def run(inputs):
        opt.zero_grad()
        step(inputs)

    from torchtpu_lab import config

    with torchtpu_lab.eager_mode("fused"), config.max_graph_ops(400):
        _, compiles, _ = _steps(model, inputs, run, 10)  # ViT's cuts settle by its 7th step
        torchtpu_lab.sync()
    assert sum(compiles) > 0 and compiles[-3:] == [0, 0, 0], compiles
