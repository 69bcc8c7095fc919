"""Text generation with a Hugging Face model on tpu: tokens equal CPU's; a decode step over a static KV cache
compiles once for any number of tokens (view offsets are graph inputs, device/views.py); over the default
dynamic cache once per capacity bucket (runtime/growth.py, runtime/padded_attention.py); attention that reads a
growing cache at its length makes the compile cause say why and what to do. Models are built from tiny configs
(random init, no downloads)."""

import pytest
import torch

import torchtpu_lab
from torchtpu_lab import telemetry
from torchtpu_lab.runtime import padded_attention

transformers = pytest.importorskip("transformers")
from transformers import GPT2Config, GPT2LMHeadModel, StaticCache

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


def _tiny(kind: str, width: int, attn: str = "sdpa"):
    """A tiny random-init Llama or GPT-2 without an end token (every call generates all it is asked for)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    none = {"bos_token_id": None, "eos_token_id": None, "pad_token_id": None}
    if kind == "llama":
        cfg = LlamaConfig(vocab_size=97, hidden_size=width, intermediate_size=2 * width, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256, **none)
        model = LlamaForCausalLM(cfg)
    else:
        model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=width, n_head=4, vocab_size=97, n_positions=256,
                                           **none))
    model.config._attn_implementation = attn
    return model.eval()


@pytest.mark.parametrize("kind", ["llama", pytest.param("gpt2", marks=pytest.mark.sweep)])
def test_default_cache_generate_builds_programs_per_capacity_not_per_token(kind):
    """The issue's bar: 32 new tokens with the default (dynamic) cache build at most 8 programs — the prompt's
    step, one decode step and generate's own small ones — and a second call with 64 tokens at most 2 more. The
    cache's keys and values grow into padded storage (runtime/growth.py) and attention reads the whole storage
    with the length as an input (runtime/padded_attention.py)."""
    model = _tiny(kind, 40)
    prompt = torch.randint(1, 97, (1, 7), generator=torch.Generator().manual_seed(1))
    expected = model.generate(prompt, max_new_tokens=64, do_sample=False)  # greedy: its first 32 are the 32's
    model = model.to("tpu")
    from torchtpu_lab.runtime import state

    state.clear()  # graphs an earlier test compiled must not hide this run's
    before = _compiles()
    out = model.generate(prompt.to("tpu"), max_new_tokens=32, do_sample=False)
    first = _compiles() - before
    assert torch.equal(out.cpu(), expected[:, :7 + 32])
    causes = [str(e.detail["cause"]) for e in list(telemetry.compile_log)[-first:]] if first else []
    assert 0 < first <= 8, causes
    assert not any("grows by one" in c for c in causes), causes
    before = _compiles()
    out = model.generate(prompt.to("tpu"), max_new_tokens=64, do_sample=False)
    assert torch.equal(out.cpu(), expected)
    assert _compiles() - before <= 2, [e.detail["cause"] for e in list(telemetry.compile_log)[before:]]


@pytest.mark.sweep  # ~35 s under load: a program per token, by design
@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_eager_attention_on_a_dynamic_cache_builds_programs_per_capacity(kind):
    """Eager attention (``matmul``/``softmax`` on the keys, ``transformers``' ``attn_implementation="eager"``)
    runs on the cache's padded extent (runtime/bounded.py: the score product keeps the grown dim, the softmax
    fills the padding with ``-inf``, the weighted sum zeroes it on both sides): CPU's tokens, and a longer call
    within the capacity bucket builds nothing new."""
    from torchtpu_lab.runtime import state

    model = _tiny(kind, 32, attn="eager")
    prompt = torch.randint(1, 97, (1, PROMPT), generator=torch.Generator().manual_seed(1))
    expected = model.generate(prompt, max_new_tokens=20, do_sample=False)
    model = model.to("tpu")
    state.clear()  # an arange the native kernel learned as ordinary in an earlier test would stay one
    assert torch.equal(model.generate(prompt.to("tpu"), max_new_tokens=6, do_sample=False).cpu(),
                       expected[:, :PROMPT + 6])
    before = _compiles()
    assert torch.equal(model.generate(prompt.to("tpu"), max_new_tokens=20, do_sample=False).cpu(), expected)
    assert _compiles() - before <= 1, [e.detail["cause"] for e in list(telemetry.compile_log)[-3:]]


def test_an_op_that_reads_a_growing_tensor_at_its_length_says_why_it_recompiles():
    """An op with no padded form (a flip along the grown dim: the padding would come first) reads the growing
    tensor at its logical length: correct, but a new graph per step; the compile cause names the op, the growth
    and the fixes."""
    cache_cpu, cache = torch.ones(1, 3, 4), torch.ones(1, 3, 4, device="tpu")
    with torchtpu_lab.profile() as prof:
        for _ in range(5):
            cache_cpu = torch.cat([cache_cpu, torch.ones(1, 1, 4)], 1)
            cache = torch.cat([cache, torch.ones(1, 1, 4, device="tpu")], 1)
            assert torch.equal(cache.flip(1)[:, 0].cpu(), cache_cpu.flip(1)[:, 0])
    causes = [str(r.cause) for r in prof.report().compiles if r.recompile]
    grew = [c for c in causes if "grows by one every step" in c]
    assert len(grew) >= 2, causes
    assert all("aten::flip" in c and "scaled_dot_product_attention" in c and 'cache_implementation="static"' in c
               for c in grew), grew


def test_attention_on_a_padded_cache_equals_cpu_and_builds_one_program_per_capacity():
    """Keys and values appended one position at a time (as a DynamicCache does: the first append is to an empty
    tensor) and attended to after each append: values as on the CPU (and as the same attention on unpadded
    copies of the keys), and the step is the same program for every length within a capacity bucket."""
    from torchtpu_lab.runtime import growth, state

    F = torch.nn.functional
    gen = torch.Generator().manual_seed(0)
    pieces = [torch.randn(1, 4, 5 if i < 2 else 1, 8, generator=gen) for i in range(2 * 20)]
    queries = [torch.randn(1, 4, 1, 8, generator=gen) for _ in range(20)]
    state.clear()
    with torch.no_grad():
        k, v = torch.tensor([], device="tpu"), torch.tensor([], device="tpu")
        k_cpu, v_cpu = pieces[0][:, :, :0], pieces[0][:, :, :0]
        per_step = []
        for i, q in enumerate(queries):
            before = _compiles()
            k = torch.cat([k, pieces[2 * i].to("tpu")], -2)
            v = torch.cat([v, pieces[2 * i + 1].to("tpu")], -2)
            got = F.scaled_dot_product_attention(q.to("tpu"), k, v)
            torchtpu_lab.sync()
            per_step.append(_compiles() - before)
            k_cpu, v_cpu = torch.cat([k_cpu, pieces[2 * i]], -2), torch.cat([v_cpu, pieces[2 * i + 1]], -2)
            assert growth.padded_length(k, 2) == k.shape[2] == 5 + i  # read from its padded storage
            want = F.scaled_dot_product_attention(q, k_cpu, v_cpu)
            torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-6)
            if i in (0, 6, 19):  # each unpadded length is a program of its own
                unpadded = F.scaled_dot_product_attention(q.to("tpu"), k.clone(), v.clone())
                assert growth.padded_length(k.clone(), 2) is None
                torch.testing.assert_close(got.cpu(), unpadded.cpu(), rtol=1e-5, atol=1e-6)
    # the first step builds the append-to-empty and the attention; after the second, nothing is new
    assert sum(per_step[2:]) == 0, per_step


@pytest.mark.parametrize("compiled", [False, True], ids=["fused-eager", "torch.compile"])
def test_generate_with_a_static_cache_compiles_the_same_for_16_tokens_as_for_8(compiled):
    """``generate`` itself: its loop appends each token with ``torch.cat`` (runtime/growth.py keeps the shape)
    and reads the newest one at a moving offset; on a tpu device transformers compiles the forward with
    ``torch.compile(backend="tpu")`` unless ``disable_compile``. A fixed ``max_cache_len`` fixes the cache."""
    import torch._dynamo

    if compiled and not _tpu_backend_registered():
        pytest.skip('torch._dynamo has no "tpu" backend registered')
    _, model, prompt = _model(16 if compiled else 12)
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


def test_a_profiled_decode_loop_reports_tokens_per_second_first_token_and_programs_per_token():
    """Any loop that appends one token per step (not only ``generate``): the token stream is the sequence with
    the most one-position appends, not the cache beside it (which starts with the whole prompt)."""
    from torchtpu_lab.profiling.generation import generation_stats

    with torchtpu_lab.profile() as prof:
        ids = torch.tensor([[3, 4, 5]], device="tpu")
        cache = torch.tensor([], device="tpu")
        for i in range(6):
            cache = torch.cat([cache, torch.ones(1, 2, 3 if i == 0 else 1, 4, device="tpu")], -2)
            ids = torch.cat([ids, (ids[:, -1:] * 7 + 1) % 97], -1)
            torchtpu_lab.sync()
    expected = [5]
    for _ in range(6):
        expected.append((expected[-1] * 7 + 1) % 97)
    assert ids.cpu().tolist()[0][3:] == expected[1:]
    stats = generation_stats(prof)
    assert stats is not None and stats.tokens == 6, stats
    assert stats.programs == len(prof.compiles) > 0 and stats.programs_per_token == stats.programs / 6
    assert 0 < stats.first_token_s < stats.wall_s == prof.wall_s
    assert stats.tokens_per_s == pytest.approx(6 / prof.wall_s)
    with torchtpu_lab.profile() as quiet:
        torch.ones(3, device="tpu").sum().item()
    assert generation_stats(quiet) is None


def test_a_profiled_beam_loop_that_reorders_its_cache_keeps_one_token_stream():
    """Beam search reorders each layer's cache by beam (``index_select``, in C++ once taught) before it appends to
    it: the reordered cache continues the cache's sequence, so the profile finds the token stream (an
    encoder-decoder's beam search appends no token ids; before, every step started a new sequence and the
    profile reported no generation)."""
    from torchtpu_lab.profiling.generation import generation_stats

    beams = torch.tensor([1, 0, 2], device="tpu")
    with torchtpu_lab.profile() as prof:
        cache = torch.tensor([], device="tpu")
        for i in range(10):
            cache = torch.cat([cache, torch.full((3, 2, 3 if i == 0 else 1, 4), float(i), device="tpu")], -2)
            cache = cache.index_select(0, beams)
            torchtpu_lab.sync()
    assert cache.shape == (3, 2, 12, 4) and torch.equal(cache[:, 0, -1, 0].cpu(), torch.full((3,), 9.0))
    stats = generation_stats(prof)
    assert stats is not None and stats.tokens == 9, stats


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_fused_attention_matches_cpu_and_training_keeps_its_gradients(mode):
    """``F.scaled_dot_product_attention`` on tpu (runtime/padded_attention.py): one fused op for inference —
    causal, bool and float masks, a mask with ``is_causal``, grouped-query heads — equal to the CPU's; a call
    that needs gradients takes PyTorch's math decomposition, so its gradients are the CPU's too."""
    F = torch.nn.functional
    gen = torch.Generator().manual_seed(0)
    keep = torch.rand(2, 1, 3, 6, generator=gen) > 0.3
    keep[..., 0] = True
    cases = [  # (query heads, key heads, query length, key length, is_causal, mask)
        (2, 2, 1, 5, False, None), (4, 2, 3, 7, True, None), (2, 2, 3, 6, False, keep),
        (2, 2, 3, 6, False, torch.randn(2, 1, 3, 6, generator=gen)), (2, 2, 3, 6, True, keep)]
    with torchtpu_lab.eager_mode(mode):
        for h, kh, length, s, causal, mask in cases:
            q = torch.randn(2, h, length, 8, generator=gen)
            k, v = torch.randn(2, kh, s, 8, generator=gen), torch.randn(2, kh, s, 8, generator=gen)
            kw = {"is_causal": causal, "enable_gqa": kh != h}
            if causal and mask is not None and padded_attention.cpu_refuses_mask_with_causal():  # torch 2.14 on
                for grad in (False, True):
                    with pytest.raises(RuntimeError, match="Explicit attn_mask should not be set when is_causal"):
                        F.scaled_dot_product_attention(q.to("tpu").requires_grad_(grad), k.to("tpu"), v.to("tpu"),
                                                       attn_mask=mask.to("tpu"), **kw)
                continue
            with torch.no_grad():
                want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **kw)
                got = F.scaled_dot_product_attention(q.to("tpu"), k.to("tpu"), v.to("tpu"),
                                                     attn_mask=None if mask is None else mask.to("tpu"), **kw)
            torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-6)
        q = torch.randn(1, 2, 3, 8, generator=gen, requires_grad=True)
        q_tpu = q.detach().to("tpu").requires_grad_()
        k = torch.randn(1, 2, 5, 8, generator=gen)
        F.scaled_dot_product_attention(q, k, k).square().sum().backward()
        F.scaled_dot_product_attention(q_tpu, k.to("tpu"), k.to("tpu")).square().sum().backward()
        torch.testing.assert_close(q_tpu.grad.cpu(), q.grad, rtol=1e-5, atol=1e-6)


def test_inference_attention_is_seen_by_a_dispatch_mode_and_skips_the_second_dispatch_without_one():
    """Inference attention calls the tpu kernel straight from its autograd kernel (one trip through the
    dispatcher per layer of a decode step, not two) only when no ``TorchDispatchMode`` is active: a user's mode
    (an op logger) still sees ``aten.scaled_dot_product_attention``, and the values are the CPU's either way."""
    from torch.utils._python_dispatch import TorchDispatchMode

    F = torch.nn.functional
    seen = []

    class Log(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            return func(*args, **(kwargs or {}))

    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 3, 8, generator=gen) for _ in range(3))
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    with torch.no_grad():
        direct = F.scaled_dot_product_attention(q.to("tpu"), k.to("tpu"), v.to("tpu"), is_causal=True)
        with Log():
            logged = F.scaled_dot_product_attention(q.to("tpu"), k.to("tpu"), v.to("tpu"), is_causal=True)
    assert torch.ops.aten.scaled_dot_product_attention.default in seen, seen
    torch.testing.assert_close(direct.cpu(), want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(logged.cpu(), want, rtol=1e-5, atol=1e-6)
