"""Text generation with a Hugging Face model on tpu: tokens equal CPU's; a decode step over a static KV cache
compiles once for any number of tokens (view offsets are graph inputs, device/views.py); a growing cache makes
the compile cause say why and what to do. Models are built from tiny configs (random init, no downloads)."""

import pytest
import torch

import torchtpu_lab
from torchtpu_lab import telemetry

transformers = pytest.importorskip("transformers")
from transformers import GPT2Config, GPT2LMHeadModel, StaticCache  # noqa: E402

PROMPT = 5
CACHE_LEN = 32


def _model(width: int):
    """A tiny GPT-2; ``width`` differs per test so each starts with nothing compiled for its shapes."""
    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=2, n_embd=width, n_head=2, vocab_size=97, n_positions=64, bos_token_id=0,
                     eos_token_id=0, pad_token_id=0)
    model = GPT2LMHeadModel(cfg).eval()
    prompt = torch.randint(1, 97, (1, PROMPT), generator=torch.Generator().manual_seed(1))
    return cfg, model, prompt


def _decode(model, cfg, prompt, device, new_tokens: int, forward=None) -> torch.Tensor:
    """Greedy decoding the way a static-shape loop does it: a preallocated token buffer written at a moving
    position, a StaticCache, one ``torch.tpu``-side sync per token."""
    forward = model if forward is None else forward
    cache = StaticCache(config=cfg, max_cache_len=CACHE_LEN)
    tokens = torch.zeros(1, CACHE_LEN, dtype=torch.long, device=device)
    tokens[:, :PROMPT] = prompt.to(device)
    position = torch.arange(PROMPT, device=device)
    with torch.no_grad():
        logits = model(tokens[:, :PROMPT], cache=cache, cache_position=position, use_cache=True).logits
        position = position[-1:] + 1
        for i in range(PROMPT, PROMPT + new_tokens):
            tokens[:, i] = logits[:, -1].argmax(-1)
            logits = forward(tokens[:, i:i + 1], cache=cache, cache_position=position, use_cache=True).logits
            position = position + 1
            if device != "cpu":
                torchtpu_lab.sync()
    return tokens[:, :PROMPT + new_tokens].cpu()


def _compiles() -> int:
    """Programs built: compiled by XLA, or loaded from a persistent cache (``compile_log`` is bounded, so its
    length stops growing in a long session)."""
    return int(telemetry.counters["compiles"] + telemetry.counters["disk_loads"])


def test_static_cache_decode_compiles_once_for_any_number_of_tokens():
    cfg, model, prompt = _model(24)
    expected = _decode(model, cfg, prompt, "cpu", 16)
    model = model.to("tpu")
    from torchtpu_lab.runtime import state

    state.clear()  # graphs an earlier test compiled must not hide this run's first compiles
    before = _compiles()
    eight = _decode(model, cfg, prompt, "tpu", 8)
    compiles_8 = _compiles() - before
    before = _compiles()
    sixteen = _decode(model, cfg, prompt, "tpu", 16)
    compiles_16_more = _compiles() - before
    assert torch.equal(eight, expected[:, :PROMPT + 8]) and torch.equal(sixteen, expected)
    assert compiles_8 > 0
    # 16 tokens need nothing that 8 did not: each decode step, at every position, is the same graph
    assert compiles_16_more == 0, [e.detail["cause"] for e in list(telemetry.compile_log)[before:]]


def test_moving_view_offset_is_a_graph_input_not_a_new_program():
    buf = torch.zeros(4, 16, device="tpu")
    out = torch.zeros(4, 16)
    before = _compiles()
    for i in range(16):
        buf[:, i] = buf[:, max(i - 1, 0)] + i  # read and write at a moving offset
        out[:, i] = out[:, max(i - 1, 0)] + i
        torchtpu_lab.sync()
    grown = _compiles() - before
    assert torch.equal(buf.cpu(), out)
    assert grown <= 4, [e.detail["cause"] for e in list(telemetry.compile_log)[before:]]


def test_generate_matches_cpu_and_a_growing_cache_says_why_it_recompiles():
    cfg, model, prompt = _model(20)
    expected = model.generate(prompt, max_new_tokens=8, do_sample=False)
    model = model.to("tpu")
    with torchtpu_lab.profile() as prof:
        out = model.generate(prompt.to("tpu"), max_new_tokens=8, do_sample=False)  # default: a dynamic cache
    assert torch.equal(out.cpu(), expected)
    causes = [str(r.cause) for r in prof.report().compiles if r.recompile]
    assert any("grows by one every step" in c and 'cache_implementation="static"' in c for c in causes), causes


@pytest.mark.parametrize("compiled", [False, True], ids=["fused-eager", "torch.compile"])
def test_generate_with_a_static_cache_compiles_the_same_for_16_tokens_as_for_8(compiled):
    """``generate`` itself: its loop appends each token with ``torch.cat`` (runtime/growth.py keeps the shape)
    and reads the newest one at a moving offset; on a tpu device transformers compiles the forward with
    ``torch.compile(backend="tpu")`` unless ``disable_compile``. A fixed ``max_cache_len`` fixes the cache."""
    import torch._dynamo

    if compiled and not _tpu_backend_registered():
        pytest.skip('torch._dynamo has no "tpu" backend registered')
    cfg, model, prompt = _model(16 if compiled else 12)
    expected = model.generate(prompt, max_new_tokens=16, do_sample=False)
    model = model.to("tpu")
    from torchtpu_lab.runtime import state

    def generate(new_tokens: int):
        state.clear()
        torch._dynamo.reset()
        before, graphs = _compiles(), torch._dynamo.utils.counters["stats"]["unique_graphs"]
        out = model.generate(prompt.to("tpu"), max_new_tokens=new_tokens, do_sample=False,
                             cache_implementation="static", max_cache_len=CACHE_LEN, disable_compile=not compiled)
        assert torch.equal(out.cpu(), expected[:, :PROMPT + new_tokens])
        return _compiles() - before, torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs

    compiles_8, graphs_8 = generate(8)
    compiles_16, graphs_16 = generate(16)
    assert compiles_8 > 0 and compiles_16 == compiles_8, (compiles_8, compiles_16)
    assert graphs_16 == graphs_8 == (1 if compiled else 0), (graphs_8, graphs_16)
    before = _compiles()  # and nothing at all once warm
    assert torch.equal(model.generate(prompt.to("tpu"), max_new_tokens=12, do_sample=False,
                                      cache_implementation="static", max_cache_len=CACHE_LEN,
                                      disable_compile=not compiled).cpu(), expected[:, :PROMPT + 12])
    assert _compiles() == before


def _tpu_backend_registered() -> bool:
    import torch._dynamo

    return "tpu" in torch._dynamo.list_backends(exclude_tags=())


@pytest.mark.skipif(not _tpu_backend_registered(),
                    reason='torch._dynamo has no "tpu" backend registered (torch.compile(backend="tpu") is built '
                           "by the compile issue); the fused-eager static-cache test above covers eager mode")
def test_static_cache_decode_under_torch_compile_compiles_the_same_for_16_tokens_as_for_8():
    import torch._dynamo

    cfg, model, prompt = _model(28)
    expected = _decode(model, cfg, prompt, "cpu", 16)
    model = model.to("tpu")
    forward = torch.compile(model, backend="tpu")
    eight = _decode(model, cfg, prompt, "tpu", 8, forward)
    before, graphs = _compiles(), torch._dynamo.utils.counters["stats"]["unique_graphs"]
    sixteen = _decode(model, cfg, prompt, "tpu", 16, forward)
    assert torch.equal(eight, expected[:, :PROMPT + 8]) and torch.equal(sixteen, expected)
    assert _compiles() == before
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == graphs
