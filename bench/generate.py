"""``model.generate`` tokens/s on tpu against PyTorch on the CPU, in one run: cold (first call, empty persistent
compile cache: what a new session pays) and warm (median of later calls), and the programs each built.

Rows per model (tiny random-init Llama and GPT-2 from ``transformers``, one 7-token prompt, greedy):

- ``tpu default cache``: fused eager, ``DynamicCache`` (runtime/growth.py + runtime/padded_attention.py);
- ``tpu static cache``: fused eager, ``cache_implementation="static"`` (``disable_compile=True``);
- ``tpu torch.compile``: static cache with ``transformers``' own ``torch.compile`` of the forward, which on a
  tpu device uses ``backend="tpu"``;
- ``cpu eager``: PyTorch CPU, default cache; ``cpu inductor``: PyTorch CPU, static cache, the forward compiled by
  ``torch.compile`` (Inductor).

Every row's tokens are checked against CPU eager's. Usage::

    python bench/generate.py [--tokens 32] [--models llama,gpt2] [--reps 3] [--width 64]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
# an empty persistent cache, set before torchtpu_lab is imported: "cold" means what a new session pays
os.environ.setdefault("TORCHTPU_LAB_CACHE_DIR", tempfile.mkdtemp(prefix="bench_generate_cache_"))

import torch

import torchtpu_lab
from bench.common import table
from torchtpu_lab import telemetry

PROMPT = 7
VOCAB = 97


def build(kind: str, width: int):
    """A tiny random-init model without an end token (every call generates all it is asked for)."""
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    none = {"bos_token_id": None, "eos_token_id": None, "pad_token_id": None}
    if kind == "llama":
        return LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=width, intermediate_size=2 * width,
                                            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                                            max_position_embeddings=512, **none)).eval()
    return GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=width, n_head=4, vocab_size=VOCAB, n_positions=512,
                                      **none)).eval()


def programs() -> int:
    return int(telemetry.counters["compiles"] + telemetry.counters["disk_loads"])


def run_row(model, prompt, tokens: int, reps: int, kwargs: dict, expected) -> tuple:
    """(cold tokens/s, warm tokens/s, programs built by the first call, by the later ones, tokens equal)."""
    device = next(model.parameters()).device

    def call():
        t0 = time.perf_counter()
        with torch.no_grad():
            out = model.generate(prompt.to(device), max_new_tokens=tokens, do_sample=False, **kwargs)
        if device.type == "tpu":
            torchtpu_lab.sync()
        return out.cpu(), time.perf_counter() - t0

    before = programs()
    out, cold = call()
    first = programs() - before
    equal = expected is None or torch.equal(out, expected)
    before = programs()
    warm = []
    for _ in range(reps):
        out, dt = call()
        warm.append(dt)
        equal = equal and (expected is None or torch.equal(out, expected))
    return tokens / cold, tokens / statistics.median(warm), first, programs() - before, equal, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--models", default="llama,gpt2")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--width", type=int, default=64)
    args = parser.parse_args()
    static = {"cache_implementation": "static", "max_cache_len": 128}
    rows = []
    for kind in args.models.split(","):
        prompt = torch.randint(1, VOCAB, (1, PROMPT), generator=torch.Generator().manual_seed(1))
        cpu_model = build(kind, args.width)
        cpu = run_row(cpu_model, prompt, args.tokens, args.reps, {}, None)
        expected = cpu[-1]
        results = {"cpu eager": cpu}
        try:
            inductor = build(kind, args.width)
            inductor.forward = torch.compile(inductor.forward, backend="inductor")
            results["cpu inductor"] = run_row(inductor, prompt, args.tokens, args.reps,
                                              {**static, "disable_compile": True}, expected)
        except Exception as e:  # noqa: BLE001 — a machine without a C++ compiler still gets the other rows
            results["cpu inductor"] = f"n/a ({type(e).__name__})"
        tpu = build(kind, args.width).to("tpu")
        results["tpu default cache"] = run_row(tpu, prompt, args.tokens, args.reps, {}, expected)
        results["tpu static cache"] = run_row(tpu, prompt, args.tokens, args.reps,
                                              {**static, "disable_compile": True}, expected)
        try:
            results["tpu torch.compile"] = run_row(build(kind, args.width).to("tpu"), prompt, args.tokens,
                                                   args.reps, static, expected)
        except Exception as e:  # noqa: BLE001 — reported in the table, not hidden
            results["tpu torch.compile"] = f"n/a ({type(e).__name__}: {str(e)[:60]})"
        base = cpu[1]
        for name, r in results.items():
            if isinstance(r, str):
                rows.append((kind, name, r, "", "", "", "", ""))
                continue
            cold, warm, first, later, equal = r[:5]
            rows.append((kind, name, f"{cold:.2f}", f"{warm:.2f}", f"{warm / base:.2f}x", f"{warm / cold:.1f}x",
                         f"{first} + {later}", "yes" if equal else "NO"))
        print(table(f"{kind}: {args.tokens} new tokens, prompt {PROMPT}, width {args.width}", rows[-len(results):],
                    ("model", "row", "cold tok/s", "warm tok/s", "warm vs cpu eager", "warm/cold",
                     "programs (first + later)", "tokens = cpu")), flush=True)
    print()
    print(table(f"generate: {args.tokens} new tokens (cold: first call, empty persistent cache; warm: median of "
                f"{args.reps})", rows,
                ("model", "row", "cold tok/s", "warm tok/s", "warm vs cpu eager", "warm/cold",
                 "programs (first + later)", "tokens = cpu")))


if __name__ == "__main__":
    main()
