"""Training across ``transformers`` model families, all in one process, on tpu against PyTorch on the CPU.

Each family is a tiny random-init config (2 layers, width 32, no downloads, dropout and drop-path off so both
devices compute the same function), trained for ``--steps`` AdamW steps on the same batches, ``loss.item()``
each step. A sweep to run and report, not a test: ~5 minutes for the 30 families on 2 cores.

Per family: whether the losses match CPU's float32 losses (rtol and atol 2e-4), the CPU fallbacks, and the
seconds. Where they do not match, the same steps run on the CPU in float64: a model whose float32 losses are
themselves that far from float64 (a batch norm over two samples: LeViT) is *ill-conditioned*, and tpu passes when
it is no farther from float64 than CPU's float32 is. At the end: the process's memory maps, the code-budget
evictions (``runtime/code_budget.py``: XLA:CPU maps each program's code, and thirty families' programs once
reached the OS's limit uncounted) and the programs each code cache holds.

    python bench/family_training.py [--steps 3] [--families bert,llama,...]
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import torch  # noqa: E402
import transformers  # noqa: E402

import torchtpu_lab  # noqa: E402, F401  (registers the tpu device)
from bench.common import table  # noqa: E402
from torchtpu_lab import caches, telemetry  # noqa: E402
from torchtpu_lab.runtime import code_budget  # noqa: E402

TEXT = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, vocab_size=96,
            max_position_embeddings=64)
DECODER = dict(TEXT, num_key_value_heads=1)


def _no_dropout(config) -> None:
    for name in list(vars(config)):
        if "drop" in name and isinstance(getattr(config, name), float):
            setattr(config, name, 0.0)


def _builder(cls: str, config: str, **fields):
    def build():
        cfg = getattr(transformers, config)(**fields)
        _no_dropout(cfg)
        return getattr(transformers, cls)(cfg)

    return build


def _tokens(g):
    ids = torch.randint(3, 90, (2, 12), generator=g)
    return {"input_ids": ids, "labels": ids.clone()}


def _classes(g):
    return {"input_ids": torch.randint(3, 90, (2, 12), generator=g), "labels": torch.tensor([0, 1])}


def _translation(g):
    ids = torch.randint(3, 90, (2, 12), generator=g)
    return {"input_ids": ids, "labels": torch.randint(3, 90, (2, 7), generator=g)}


def _images(g):
    return {"pixel_values": torch.randn(2, 3, 32, 32, generator=g), "labels": torch.tensor([0, 2])}


def _vision(cls: str, config: str, **fields):
    return _builder(cls, config, num_labels=3, **fields), _images


FAMILIES = {
    "bert": (_builder("BertForMaskedLM", "BertConfig", **TEXT), _tokens),
    "roberta": (_builder("RobertaForMaskedLM", "RobertaConfig", **TEXT), _tokens),
    "distilbert": (_builder("DistilBertForSequenceClassification", "DistilBertConfig", vocab_size=96, dim=32,
                            n_layers=2, n_heads=2, hidden_dim=64), _classes),
    "albert": (_builder("AlbertForMaskedLM", "AlbertConfig", embedding_size=16, **TEXT), _tokens),
    "electra": (_builder("ElectraForMaskedLM", "ElectraConfig", embedding_size=16, **TEXT), _tokens),
    "deberta-v2": (_builder("DebertaV2ForMaskedLM", "DebertaV2Config", **TEXT), _tokens),
    "bart": (_builder("BartForConditionalGeneration", "BartConfig", vocab_size=96, d_model=32, encoder_layers=1,
                      decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64,
                      decoder_ffn_dim=64), _translation),
    "mistral": (_builder("MistralForCausalLM", "MistralConfig", **DECODER), _tokens),
    "qwen2": (_builder("Qwen2ForCausalLM", "Qwen2Config", **DECODER), _tokens),
    "phi": (_builder("PhiForCausalLM", "PhiConfig", **TEXT), _tokens),
    "phi3": (_builder("Phi3ForCausalLM", "Phi3Config", pad_token_id=0, eos_token_id=1, **DECODER), _tokens),
    "gpt-neox": (_builder("GPTNeoXForCausalLM", "GPTNeoXConfig", **TEXT), _tokens),
    "opt": (_builder("OPTForCausalLM", "OPTConfig", ffn_dim=64, word_embed_proj_dim=32, **TEXT), _tokens),
    "bloom (alibi)": (_builder("BloomForCausalLM", "BloomConfig", vocab_size=96, hidden_size=32, n_layer=2,
                               n_head=2), _tokens),
    "falcon": (_builder("FalconForCausalLM", "FalconConfig", **TEXT), _tokens),
    "gemma": (_builder("GemmaForCausalLM", "GemmaConfig", head_dim=16, **DECODER), _tokens),
    "gemma2": (_builder("Gemma2ForCausalLM", "Gemma2Config", head_dim=16, **DECODER), _tokens),
    "gptj": (_builder("GPTJForCausalLM", "GPTJConfig", vocab_size=96, n_embd=32, n_layer=2, n_head=2, rotary_dim=8,
                      bos_token_id=1, eos_token_id=1), _tokens),
    "codegen": (_builder("CodeGenForCausalLM", "CodeGenConfig", vocab_size=96, n_embd=32, n_layer=2, n_head=2,
                         rotary_dim=8), _tokens),
    "mpt": (_builder("MptForCausalLM", "MptConfig", vocab_size=96, d_model=32, n_heads=2, n_layers=2), _tokens),
    "swin": _vision("SwinForImageClassification", "SwinConfig", image_size=32, patch_size=4, embed_dim=16,
                    depths=[1, 1], num_heads=[1, 2], window_size=4),
    "deit": _vision("DeiTForImageClassification", "DeiTConfig", image_size=32, patch_size=8, hidden_size=32,
                    num_hidden_layers=2, num_attention_heads=2, intermediate_size=64),
    "beit": _vision("BeitForImageClassification", "BeitConfig", image_size=32, patch_size=8, hidden_size=32,
                    num_hidden_layers=2, num_attention_heads=2, intermediate_size=64),
    "mobilenet-v2": _vision("MobileNetV2ForImageClassification", "MobileNetV2Config", image_size=32,
                            depth_multiplier=0.25),
    "regnet": _vision("RegNetForImageClassification", "RegNetConfig", embedding_size=8, hidden_sizes=[8, 16],
                      depths=[1, 1]),
    "segformer": _vision("SegformerForImageClassification", "SegformerConfig", hidden_sizes=[8, 16, 16, 16],
                         num_attention_heads=[1, 1, 1, 1], depths=[1, 1, 1, 1], decoder_hidden_size=16),
    "mobilevit": _vision("MobileViTForImageClassification", "MobileViTConfig", image_size=32,
                         hidden_sizes=[16, 16, 16], neck_hidden_sizes=[8, 8, 16, 16, 16, 16, 32]),
    "poolformer": _vision("PoolFormerForImageClassification", "PoolFormerConfig", hidden_sizes=[8, 16, 16, 16],
                          depths=[1, 1, 1, 1]),
    "levit": _vision("LevitForImageClassification", "LevitConfig", image_size=32),
    "convnext-v2": _vision("ConvNextV2ForImageClassification", "ConvNextV2Config", hidden_sizes=[8, 16],
                           depths=[1, 1], num_stages=2),
}


def losses(build, make_batch, device: str, steps: int, dtype=torch.float32) -> list[float]:
    """``steps`` AdamW steps of a fresh ``build()`` (seed 0) on ``device`` in ``dtype``; the loss of each."""
    torch.manual_seed(0)
    model = build().train().to(device=device, dtype=dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    out = []
    for _ in range(steps):
        batch = {k: (v.to(dtype) if v.is_floating_point() else v).to(device) for k, v in make_batch(g).items()}
        opt.zero_grad()
        loss = model(**batch).loss
        loss.backward()
        opt.step()
        out.append(loss.item())
    return out


def _close(a: list[float], b: list[float]) -> bool:
    return all(math.isclose(x, y, rel_tol=2e-4, abs_tol=2e-4) for x, y in zip(a, b))


def verdict(cpu: list[float], tpu: list[float], exact) -> str:
    """``equal`` when tpu's losses match CPU's; else, against float64 (``exact()``), ``ill-conditioned, held``
    when tpu is no farther from it than CPU's float32 is, or ``MISMATCH``."""
    if _close(cpu, tpu):
        return "equal"
    reference = exact()
    cpu_err = max(abs(c - r) for c, r in zip(cpu, reference))
    tpu_err = max(abs(t - r) for t, r in zip(tpu, reference))
    if cpu_err > 2e-4 and tpu_err <= 2 * cpu_err:
        return f"ill-conditioned, held (|cpu - f64| {cpu_err:.2g}, |tpu - f64| {tpu_err:.2g})"
    return f"MISMATCH (|cpu - f64| {cpu_err:.2g}, |tpu - f64| {tpu_err:.2g})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--families", default=",".join(FAMILIES))
    args = parser.parse_args()
    rows = []
    for name in args.families.split(","):
        build, make_batch = FAMILIES[name]
        t0, fallbacks = time.perf_counter(), telemetry.counters["cpu_fallbacks"]
        try:
            cpu = losses(build, make_batch, "cpu", args.steps)
            tpu = losses(build, make_batch, "tpu", args.steps)
            result = verdict(cpu, tpu, lambda b=build, m=make_batch: losses(b, m, "cpu", args.steps, torch.float64))
        except Exception as e:  # noqa: BLE001 — a sweep reports every family
            cpu, tpu, result = [], [], f"ERROR {type(e).__name__}: {str(e)[:120]}"
        rows.append((name, result, " ".join(f"{x:.5f}" for x in tpu),
                     f"{telemetry.counters['cpu_fallbacks'] - fallbacks:g}", f"{time.perf_counter() - t0:.1f}"))
        print(*rows[-1], sep="  |  ", flush=True)
    print()
    print(table(f"transformers families, {args.steps} AdamW steps each in one process, fused eager vs CPU float32",
                rows, ("family", "losses", "tpu losses", "CPU fallbacks", "seconds")))
    programs = {c.name: len(c) for c in caches.code_caches() if len(c)}
    print(f"\nprocess memory maps now {code_budget.maps()} (vm.max_map_count {code_budget.limit()}); code-budget "
          f"evictions {telemetry.counters['code_evictions']:g}; programs held: {programs}")


if __name__ == "__main__":
    main()
