"""``model.generate`` on tpu the ways users call it, against PyTorch on the CPU: batched prompts with left padding
and an attention mask, sampling (top-k/top-p) reproducible from a seed across runs and eager modes,
``pipeline("text-generation", device="tpu")``, grouped-query attention (Mistral, Qwen2) and an encoder-decoder
(T5). Models are tiny random-init configs (no downloads); a few tokens each."""

import pytest
import torch

import torchtpu_lab
from torchtpu_lab import native

transformers = pytest.importorskip("transformers")

VOCAB = 97
COMMON = {"vocab_size": VOCAB, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 128, "bos_token_id": 1,
          "eos_token_id": None, "pad_token_id": 0}


def _decoder(kind: str):
    torch.manual_seed(0)
    if kind == "mistral":
        return transformers.MistralForCausalLM(transformers.MistralConfig(**COMMON, sliding_window=None)).eval()
    if kind == "qwen2":
        return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**COMMON)).eval()
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**COMMON)).eval()


def _prompts(batch: int, length: int, seed: int) -> torch.Tensor:
    return torch.randint(2, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def llama():
    """(CPU model, tpu copy): one model for the tests that only read it."""
    cpu = _decoder("llama")
    tpu = _decoder("llama").to("tpu")
    return cpu, tpu


def _programs() -> int:
    from torchtpu_lab import telemetry

    return int(telemetry.counters["compiles"] + telemetry.counters["disk_loads"])


def _calls_give_cpus_tokens_within(cpu, tpu, ids, calls, **kwargs) -> None:
    """For each ``(tokens, most)`` in ``calls``: ``generate`` on tpu gives CPU's tokens and builds at most ``most``
    programs (tensor keyword arguments, such as ``attention_mask``, are moved to tpu). Caches are cleared first:
    an ``arange(n)`` the native kernel learned as an ordinary call in an earlier test would stay one (a program
    for that length, once: runtime/bounded.py)."""
    from torchtpu_lab.runtime import state

    state.clear()
    on_tpu = {k: v.to("tpu") if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    for tokens, most in calls:
        want = cpu.generate(ids, max_new_tokens=tokens, **kwargs)
        before = _programs()
        got = tpu.generate(ids.to("tpu"), max_new_tokens=tokens, **on_tpu)
        assert torch.equal(got.cpu(), want)
        assert _programs() - before <= most, (tokens, _programs() - before)


def _twins(model_class, cfg):
    """(CPU model, tpu model with the same weights) of ``cfg``."""
    torch.manual_seed(0)
    cpu, tpu = model_class(cfg).eval(), model_class(cfg).eval()
    tpu.load_state_dict(cpu.state_dict())
    return cpu, tpu.to("tpu")


def _left_padded(seed: int, padding: int) -> tuple:
    """A batch of two 6-token prompts, the first left-padded by ``padding``, and its attention mask."""
    ids, mask = _prompts(2, 6, seed), torch.ones(2, 6, dtype=torch.long)
    ids[0, :padding], mask[0, :padding] = 0, 0
    return ids, mask


def test_batched_prompts_with_left_padding_and_a_mask_give_cpus_tokens_and_programs_per_capacity(llama):
    """The 4-d mask ``transformers`` rebuilds from the grown length every token runs on padded extents
    (runtime/bounded.py): a decode step is one program per capacity bucket, not one per token (it was 3 per
    token, the whole forward among them)."""
    cpu, tpu = llama
    ids = _prompts(2, 6, 2)
    mask = torch.ones(2, 6, dtype=torch.long)
    ids[0, :2], mask[0, :2] = 0, 0  # the shorter prompt, left-padded
    _calls_give_cpus_tokens_within(cpu, tpu, ids, ((8, 14), (16, 0)), attention_mask=mask, do_sample=False)


@pytest.mark.sweep  # ~20 s under load
def test_a_left_padded_batch_with_a_static_cache_compiles_nothing_for_a_longer_call(llama):
    """``transformers`` pads the grown mask to the static cache's length every token (``F.pad`` by ``max_cache_len
    - n``): on the padded extent that is the same program for every ``n`` (runtime/bounded.py)."""
    cpu, tpu = llama
    ids = _prompts(2, 6, 3)
    mask = torch.ones(2, 6, dtype=torch.long)
    ids[1, :3], mask[1, :3] = 0, 0
    static = {"cache_implementation": "static", "max_cache_len": 64, "disable_compile": True, "do_sample": False}
    _calls_give_cpus_tokens_within(cpu, tpu, ids, ((6, 14), (14, 0)), attention_mask=mask, **static)


def test_a_repetition_penalty_gives_cpus_tokens_and_programs_per_capacity(llama):
    """The penalty gathers and scatters the scores by the grown token ids every token (runtime/bounded.py runs
    both on the padded ids): it was the whole forward compiled again per token."""
    cpu, tpu = llama
    ids = _prompts(1, 6, 4)
    _calls_give_cpus_tokens_within(cpu, tpu, ids, ((6, 12), (14, 0)), repetition_penalty=1.3, do_sample=False)


def test_no_repeat_ngram_size_gives_cpus_tokens_and_programs_per_capacity(llama):
    """The n-gram ban unfolds the grown token ids every token (runtime/growth.py: the windows are fronts): it was
    the whole forward compiled again per token. The ban must change this prompt's greedy tokens, or the test
    would not test it."""
    cpu, tpu = llama
    ids = _prompts(2, 6, 4)
    assert not torch.equal(cpu.generate(ids, max_new_tokens=14, do_sample=False),
                           cpu.generate(ids, max_new_tokens=14, do_sample=False, no_repeat_ngram_size=2))
    _calls_give_cpus_tokens_within(cpu, tpu, ids, ((6, 12), (14, 0)), no_repeat_ngram_size=2, do_sample=False)


def test_beam_search_with_an_ngram_ban_gives_cpus_tokens_and_programs_per_buffer_length(llama):
    """Beam search hands the processors a prefix of a buffer of the final length, a new buffer every step, so the
    n-gram ban's windows grew without an append (runtime/growth.py ``growing_prefix``): it was the whole step
    compiled again per token (14 programs for 8 tokens, 22 for 20). A longer call makes a longer buffer, so it
    builds a few programs again; the same call again builds none."""
    cpu, tpu = llama
    ids = _prompts(2, 6, 4)
    beams = dict(num_beams=3, do_sample=False)
    assert not torch.equal(cpu.generate(ids, max_new_tokens=20, **beams),
                           cpu.generate(ids, max_new_tokens=20, no_repeat_ngram_size=3, **beams))
    _calls_give_cpus_tokens_within(cpu, tpu, ids, ((8, 10), (20, 6), (20, 0)), no_repeat_ngram_size=3, **beams)


def test_bad_words_and_sequence_bias_give_cpus_tokens_and_programs_per_capacity(llama):
    """Both match the last ids through ``input_ids[:, None, -k:]``, whose size-1 dim has the length as its stride
    (device/views.py keys such a stride as 0): it was the whole forward compiled again per token."""
    cpu, tpu = llama
    ids = _prompts(2, 6, 4)
    assert not torch.equal(cpu.generate(ids, max_new_tokens=14, do_sample=False),
                           cpu.generate(ids, max_new_tokens=14, do_sample=False, bad_words_ids=[[44, 76], [18]]))
    _calls_give_cpus_tokens_within(cpu, tpu, ids, ((6, 12), (14, 0)), bad_words_ids=[[44, 76], [18]],
                                   do_sample=False)
    _calls_give_cpus_tokens_within(cpu, tpu, ids, ((6, 12), (14, 0)), sequence_bias={(44, 76): -5.0, (18,): -5.0},
                                   do_sample=False)


@pytest.mark.sweep  # ~20 s under load
def test_a_batch_of_equal_length_prompts_without_a_mask_builds_programs_per_capacity_not_per_token(llama):
    """Prompts of equal length and no attention_mask give the CPU's tokens, and a longer call builds nothing new
    (the mask transformers makes is all ones, so the attention takes none)."""
    programs = _programs
    cpu, tpu = llama
    ids = _prompts(2, 6, 5)
    for tokens, most in ((8, 12), (16, 0)):
        before = programs()
        got = tpu.generate(ids.to("tpu"), max_new_tokens=tokens, do_sample=False)
        assert torch.equal(got.cpu(), cpu.generate(ids, max_new_tokens=tokens, do_sample=False))
        assert programs() - before <= most, (tokens, programs() - before)


@pytest.mark.sweep  # ~1.5 min under load: strict mode compiles every op of the model once
def test_sampling_is_reproducible_from_a_seed_across_runs_and_eager_modes(llama):
    cpu, tpu = llama
    prompt = _prompts(1, 6, 3).to("tpu")

    def sample(mode: str, seed: int) -> list:
        with torchtpu_lab.eager_mode(mode):
            torch.manual_seed(seed)  # seeds the tpu generator as well as the CPU's
            out = tpu.generate(prompt, max_new_tokens=6, do_sample=True, top_k=20, top_p=0.9, temperature=1.5)
        return out.cpu().tolist()

    first = sample("fused", 5)
    assert sample("fused", 5) == first and sample("strict", 5) == first
    assert all(2 <= t < VOCAB for t in first[0][:6]) and all(0 <= t < VOCAB for t in first[0])
    seeds = [sample("fused", s) for s in (6, 7)]
    assert any(s != first for s in seeds)  # the seed is used (3 seeds agreeing on 6 tokens of 97: no chance)
    # top_k=1 sampling is greedy: the CPU's tokens, whatever the seed
    greedy = cpu.generate(prompt.cpu(), max_new_tokens=6, do_sample=False)
    torch.manual_seed(9)
    assert torch.equal(tpu.generate(prompt, max_new_tokens=6, do_sample=True, top_k=1).cpu(), greedy)


@pytest.mark.skipif(native.module() is None,  # torch.Generator("tpu") comes from the core
                    reason=f"no native core: {native.status().describe()}")
def test_a_tpu_generator_draws_the_same_samples_for_the_same_seed():
    probs = torch.softmax(torch.randn(4, VOCAB, generator=torch.Generator().manual_seed(0)), -1).to("tpu")

    def draw(seed: int) -> list:
        g = torch.Generator("tpu").manual_seed(seed)
        return torch.multinomial(probs, 3, generator=g).cpu().tolist()

    assert draw(11) == draw(11) and draw(11) != draw(12)


def _tokenizer():
    """A word-level tokenizer built in code: token ``t{i}`` is id ``i``."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"t{i}": i for i in range(VOCAB)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="t2"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t2", pad_token="t0",
                                                bos_token="t1")


def test_text_generation_pipeline_on_tpu_gives_cpus_text():
    tokenizer = _tokenizer()
    text = "t5 t17 t33 t40"
    kw = {"max_new_tokens": 5, "do_sample": False, "return_full_text": False}
    want = transformers.pipeline("text-generation", model=_decoder("llama"), tokenizer=tokenizer,
                                 device="cpu")(text, **kw)
    pipe = transformers.pipeline("text-generation", model=_decoder("llama"), tokenizer=tokenizer, device="tpu")
    assert pipe.model.device.type == "tpu"
    got = pipe(text, **kw)
    assert got == want and got[0]["generated_text"].split()[0].startswith("t"), (got, want)


@pytest.mark.parametrize("kind", ["mistral", pytest.param("qwen2", marks=pytest.mark.sweep)])
def test_grouped_query_attention_models_give_cpus_tokens(kind):
    model = _decoder(kind)
    prompt = _prompts(1, 6, 1)
    want = model.generate(prompt, max_new_tokens=6, do_sample=False)
    got = model.to("tpu").generate(prompt.to("tpu"), max_new_tokens=6, do_sample=False)
    assert torch.equal(got.cpu(), want)


@pytest.mark.sweep
def test_encoder_decoder_t5_gives_cpus_tokens():
    torch.manual_seed(0)
    cfg = transformers.T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_heads=4,
                                decoder_start_token_id=0, pad_token_id=0, eos_token_id=None)
    model = transformers.T5ForConditionalGeneration(cfg).eval()
    prompt = _prompts(1, 6, 4)
    want = model.generate(prompt, max_new_tokens=5, do_sample=False)
    got = model.to("tpu").generate(prompt.to("tpu"), max_new_tokens=5, do_sample=False)
    assert torch.equal(got.cpu(), want)


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_t5_with_a_padded_batch_builds_programs_per_capacity(attention):
    """T5's relative position bias is an embedding of buckets computed from ``arange`` of the key length every
    token; with eager attention all of it runs on the padded extent (runtime/bounded.py). Its sdpa path makes the
    bias mask ``contiguous()`` (a tensor of ``n`` positions) and hands it to attention, which reads the grown
    tensor it was copied from instead, so the copy never reaches a program (it built one per token)."""
    cfg = transformers.T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_heads=4,
                                decoder_start_token_id=0, pad_token_id=0, eos_token_id=None)
    cfg._attn_implementation = attention
    cpu, tpu = _twins(transformers.T5ForConditionalGeneration, cfg)
    ids, mask = _prompts(2, 6, 6), torch.ones(2, 6, dtype=torch.long)
    ids[0, 4:], mask[0, 4:] = 0, 0
    _calls_give_cpus_tokens_within(cpu, tpu, ids, ((6, 16), (14, 0)), attention_mask=mask, do_sample=False)


def test_bloom_alibi_scores_over_a_growing_cache_build_programs_per_capacity():
    """BLOOM adds its ALiBi bias (built from the grown attention mask) to the scores with ``baddbmm`` over the
    growing KV cache: the product runs on the padded extent (runtime/bounded.py), so a left-padded batch builds
    programs per capacity bucket (it built one per token) and gives CPU's tokens."""
    cfg = transformers.BloomConfig(vocab_size=VOCAB, hidden_size=32, n_layer=2, n_head=4, bos_token_id=1,
                                   eos_token_id=None, pad_token_id=0)
    cpu, tpu = _twins(transformers.BloomForCausalLM, cfg)
    ids, mask = _left_padded(7, 2)
    _calls_give_cpus_tokens_within(cpu, tpu, ids, ((6, 8), (14, 0)), attention_mask=mask, do_sample=False)


def test_grouped_query_eager_attention_builds_programs_per_capacity():
    """Eager attention with fewer key/value heads than heads (``repeat_kv`` expands the grown cache, ``matmul``
    copies it to reshape it): the copy runs on the padded extent (runtime/bounded.py), so a left-padded batch
    builds programs per capacity bucket (it built one per token) and gives CPU's tokens."""
    cfg = transformers.LlamaConfig(**COMMON)
    cfg._attn_implementation = "eager"
    cpu, tpu = _twins(transformers.LlamaForCausalLM, cfg)
    ids, mask = _left_padded(8, 2)
    _calls_give_cpus_tokens_within(cpu, tpu, ids, ((6, 8), (14, 0)), attention_mask=mask, do_sample=False)
