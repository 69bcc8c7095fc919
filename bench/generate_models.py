"""``model.generate`` across model families on tpu: tokens against PyTorch on the CPU, and the programs each call
builds, for the case that used to compile per token (a left-padded batch of 2 with an ``attention_mask``,
default cache, greedy). A sweep to run and report, not a test: about 4 minutes on 2 cores.

Each family is a tiny random-init config from ``transformers`` (2 layers, width 64, no downloads). Per row: the
programs built by a first call of ``--tokens`` new tokens, then by a second call of twice as many (a model whose
programs grow with the cache's capacity buckets builds a few; one compiling per token builds one per new
token), the first call's seconds, whether both calls gave CPU's tokens, and, for a model that still compiles
per token, the op and line of the last compile's cause (``telemetry``'s compile events, as the lab shows them).
With ``--options``, the rows are ``generate``'s options instead (logits processors that read the grown token ids
every token: ``no_repeat_ngram_size``, ``bad_words_ids``, ``sequence_bias``, ``repetition_penalty``, ...; sampling
warpers), each on the first family of ``--models``.

    python bench/generate_models.py [--tokens 20] [--models gpt2,llama,...] [--options all|name,...]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
os.environ.setdefault("TORCHTPU_LAB_CACHE_DIR", tempfile.mkdtemp(prefix="bench_generate_models_cache_"))

import torch

import torchtpu_lab  # noqa: F401  (registers the tpu device)
from bench.common import table
from torchtpu_lab import telemetry

VOCAB = 101
NONE = {"vocab_size": VOCAB, "bos_token_id": None, "eos_token_id": None, "pad_token_id": None}
DECODER = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4}

#: family -> (model class, config class, config arguments); ``gqa`` rows have fewer key/value heads than heads
FAMILIES = {
    "gpt2": ("GPT2LMHeadModel", "GPT2Config", {"n_layer": 2, "n_embd": 64, "n_head": 4}),
    "llama (gqa)": ("LlamaForCausalLM", "LlamaConfig", {**DECODER, "num_key_value_heads": 2}),
    "llama eager attention": ("LlamaForCausalLM", "LlamaConfig", {**DECODER, "attn_implementation": "eager"}),
    "llama eager attention (gqa)": ("LlamaForCausalLM", "LlamaConfig",
                                    {**DECODER, "num_key_value_heads": 2, "attn_implementation": "eager"}),
    "mistral (gqa)": ("MistralForCausalLM", "MistralConfig", {**DECODER, "num_key_value_heads": 2,
                                                              "sliding_window": None}),
    "qwen2 (gqa)": ("Qwen2ForCausalLM", "Qwen2Config", {**DECODER, "num_key_value_heads": 2}),
    "qwen3 (gqa)": ("Qwen3ForCausalLM", "Qwen3Config", {**DECODER, "num_key_value_heads": 2, "head_dim": 16}),
    "phi": ("PhiForCausalLM", "PhiConfig", DECODER),
    "phi3": ("Phi3ForCausalLM", "Phi3Config", DECODER),
    "gemma (mqa)": ("GemmaForCausalLM", "GemmaConfig", {**DECODER, "num_key_value_heads": 1, "head_dim": 16}),
    "gemma2 (mqa; eager attention)": ("Gemma2ForCausalLM", "Gemma2Config",
                                      {**DECODER, "num_key_value_heads": 1, "head_dim": 16, "sliding_window": 8}),
    "stablelm": ("StableLmForCausalLM", "StableLmConfig", {**DECODER, "num_key_value_heads": 4}),
    "gpt_neox": ("GPTNeoXForCausalLM", "GPTNeoXConfig", DECODER),
    "gptj": ("GPTJForCausalLM", "GPTJConfig", {"n_embd": 64, "n_layer": 2, "n_head": 4, "rotary_dim": 8}),
    "gpt_bigcode (mqa)": ("GPTBigCodeForCausalLM", "GPTBigCodeConfig", {"n_embd": 64, "n_layer": 2, "n_head": 4}),
    "opt": ("OPTForCausalLM", "OPTConfig", {"hidden_size": 64, "ffn_dim": 128, "num_hidden_layers": 2,
                                            "num_attention_heads": 4, "word_embed_proj_dim": 64}),
    "bloom (alibi)": ("BloomForCausalLM", "BloomConfig", {"hidden_size": 64, "n_layer": 2, "n_head": 4}),
    "falcon": ("FalconForCausalLM", "FalconConfig", {"hidden_size": 64, "num_hidden_layers": 2,
                                                     "num_attention_heads": 4}),
    "t5 (encoder-decoder)": ("T5ForConditionalGeneration", "T5Config",
                             {"d_model": 64, "d_ff": 128, "num_layers": 2, "num_heads": 4, "d_kv": 16,
                              "decoder_start_token_id": 0}),
    "t5 eager attention": ("T5ForConditionalGeneration", "T5Config",
                           {"d_model": 64, "d_ff": 128, "num_layers": 2, "num_heads": 4, "d_kv": 16,
                            "decoder_start_token_id": 0, "attn_implementation": "eager"}),
    "bart (encoder-decoder)": ("BartForConditionalGeneration", "BartConfig",
                               {"d_model": 64, "encoder_layers": 2, "decoder_layers": 2,
                                "encoder_attention_heads": 4, "decoder_attention_heads": 4, "encoder_ffn_dim": 128,
                                "decoder_ffn_dim": 128, "decoder_start_token_id": 2, "forced_eos_token_id": None}),
}


#: option row -> ``generate`` keyword arguments (greedy unless they sample; a sampled row compares no tokens)
OPTIONS = {
    "none": {},
    "no_repeat_ngram_size=2": {"no_repeat_ngram_size": 2},
    "no_repeat_ngram_size=3 + repetition_penalty": {"no_repeat_ngram_size": 3, "repetition_penalty": 1.2},
    "bad_words_ids": {"bad_words_ids": [[44, 76], [18]]},
    "sequence_bias": {"sequence_bias": {(44, 76): -5.0, (18,): 1.5}},
    "repetition_penalty": {"repetition_penalty": 1.3},
    "num_beams=3": {"num_beams": 3},
    "num_beams=3 + no_repeat_ngram_size=3": {"num_beams": 3, "no_repeat_ngram_size": 3},
    "suppress_tokens + begin_suppress_tokens": {"suppress_tokens": [4, 8], "begin_suppress_tokens": [2]},
    "min_new_tokens": {"min_new_tokens": 10, "eos_token_id": 3},
    "exponential_decay_length_penalty": {"exponential_decay_length_penalty": (4, 1.5), "eos_token_id": 3},
    "sampling: top_k, top_p": {"do_sample": True, "top_k": 20, "top_p": 0.9},
    "sampling: typical_p": {"do_sample": True, "typical_p": 0.9, "top_k": 0},
    "sampling: min_p": {"do_sample": True, "min_p": 0.1, "top_k": 0},
    "sampling: epsilon_cutoff": {"do_sample": True, "epsilon_cutoff": 3e-4, "top_k": 0},
}


def build(family: str):
    import transformers

    model_cls, config_cls, kwargs = FAMILIES[family]
    kwargs = dict(kwargs)
    attn = kwargs.pop("attn_implementation", None)
    config = getattr(transformers, config_cls)(**NONE, **kwargs)
    if attn is not None:
        config._attn_implementation = attn
    torch.manual_seed(0)
    return getattr(transformers, model_cls)(config).eval()


def programs() -> int:
    return int(telemetry.counters["compiles"] + telemetry.counters["disk_loads"])


def last_cause(events: list) -> str:
    """The op and user line the last graph compile names (what still grows in the program's shapes)."""
    if not events:
        return ""
    text, site = str(events[-1].detail.get("cause")).split(";")[0], events[-1].detail.get("site")
    return f"{text[:70]} ({telemetry.describe(site)})" if site is not None else text[:90]


def sweep(family: str, tokens: int, options: dict | None = None, label: str | None = None) -> tuple:
    cpu = build(family)
    ids = torch.randint(3, VOCAB, (2, 9), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 9, dtype=torch.long)
    ids[0, :3], mask[0, :3] = 1, 0
    kwargs = {"do_sample": False, "pad_token_id": 1, **(options or {})}

    def generate(model, n: int, device: str):
        torch.manual_seed(0)
        return model.generate(ids.to(device), attention_mask=mask.to(device), max_new_tokens=n, **kwargs)

    with torch.no_grad():
        want = [generate(cpu, n, "cpu") for n in (tokens, 2 * tokens)]
        tpu = build(family).to("tpu")
        built, equal = [], True
        t0 = time.perf_counter()
        for i, n in enumerate((tokens, 2 * tokens)):
            before = programs()
            got = generate(tpu, n, "tpu")
            equal = equal and (kwargs["do_sample"] or torch.equal(got.cpu(), want[i]))
            built.append(programs() - before)
            if i == 0:
                first = time.perf_counter() - t0
    graphs = [e for e in telemetry.compile_log if e.detail.get("kind") == "graph"]
    per_token = built[1] >= tokens // 2
    same = "sampled" if kwargs["do_sample"] else "yes" if equal else "NO"
    return (label or family, built[0], built[1], f"{first:.1f}", same, last_cause(graphs) if per_token else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=20)
    parser.add_argument("--models", default=",".join(FAMILIES), help="comma-separated family names (see FAMILIES)")
    parser.add_argument("--options", default="", help="'all' or comma-separated rows of OPTIONS, on the first "
                                                      "family of --models")
    args = parser.parse_args()
    families = args.models.split(",")
    if args.options:
        names = list(OPTIONS) if args.options == "all" else args.options.split(",")
        unknown = [name for name in names if name not in OPTIONS]
        if unknown:
            parser.error(f"unknown --options {unknown}; the rows are: {', '.join(OPTIONS)}")
        cases = [(families[0], OPTIONS[name], name) for name in names]
    else:
        cases = [(family, None, None) for family in families]
    rows = []
    for family, options, label in cases:
        try:
            rows.append(sweep(family, args.tokens, options, label))
        except Exception as e:  # noqa: BLE001 — reported in the table, not hidden
            rows.append((label or family, "", "", "", f"error: {type(e).__name__}: {str(e)[:80]}", ""))
        print(rows[-1], flush=True)
    print()
    what = f"generate options on {families[0]}" if args.options else "generate across families"
    print(table(f"{what}: left-padded batch of 2 with attention_mask, default cache, greedy unless sampling; "
                f"programs built by a {args.tokens}-token call, then by a {2 * args.tokens}-token call", rows,
                ("option" if args.options else "family", "programs, first call", "programs, second call",
                 "first call s", "tokens = cpu", "still per token: last compile's cause")))


if __name__ == "__main__":
    main()
