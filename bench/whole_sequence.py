"""Generation loops that run a forward over the whole grown sequence every token, on tpu against PyTorch on the
CPU: nanoGPT's ``generate`` (no KV cache; synced every token, or never synced, as nanoGPT's own loop) and
``transformers``' ``generate(use_cache=False)`` (a batch of one). A sweep to run and report, not a test.

Per row: the programs built by a first call of ``--tokens`` new tokens and by a second call of twice as many
(one per token, or one graph of every token per call length, before bounded shapes reached these loops), the
first call's seconds, whether both calls gave CPU's tokens, and the warm ms per token on tpu and in PyTorch's CPU
eager (one intra-op thread), medians of ``--reps`` calls of the longer length, alternating.

    python bench/whole_sequence.py [--tokens 20] [--reps 5] [--rows nanogpt,nanogpt-unsynced,llama,gpt2]
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
if __name__ == "__main__":  # an empty persistent cache for the sweep (tests import the model, and keep theirs)
    os.environ.setdefault("TORCHTPU_LAB_CACHE_DIR", tempfile.mkdtemp(prefix="bench_whole_sequence_cache_"))

import torch
import torch.nn.functional as F
from torch import nn

import torchtpu_lab
from bench.common import table
from torchtpu_lab import telemetry


class Attention(nn.Module):
    """nanoGPT's causal self-attention: one projection to queries, keys and values, ``sdpa`` with ``is_causal``."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        self.qkv, self.out, self.heads = nn.Linear(width, 3 * width), nn.Linear(width, width), heads

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).contiguous().view(b, t, c))


class NanoGPT(nn.Module):
    """nanoGPT's model, small: token and position embeddings, pre-norm blocks, a head over every position."""

    def __init__(self, width: int, vocab: int = 53, layers: int = 2, heads: int = 4, positions: int = 256):
        super().__init__()
        self.tokens, self.positions = nn.Embedding(vocab, width), nn.Embedding(positions, width)
        self.blocks = nn.ModuleList(nn.ModuleDict({
            "ln1": nn.LayerNorm(width), "attn": Attention(width, heads), "ln2": nn.LayerNorm(width),
            "mlp": nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width)),
        }) for _ in range(layers))
        self.norm, self.head = nn.LayerNorm(width), nn.Linear(width, vocab, bias=False)

    def forward(self, idx):
        pos = torch.arange(0, idx.shape[1], dtype=torch.long, device=idx.device)
        x = self.tokens(idx) + self.positions(pos)
        for block in self.blocks:
            x = x + block["attn"](block["ln1"](x))
            x = x + block["mlp"](block["ln2"](x))
        return self.head(self.norm(x))


@torch.no_grad()
def nanogpt_generate(model, idx, new_tokens: int, sync: bool):
    """nanoGPT's greedy loop: the whole sequence through the model every token, the last position's argmax
    appended; ``sync``: a ``torchtpu_lab.sync()`` every token (on tpu), else nothing is read until the end."""
    for _ in range(new_tokens):
        nxt = model(idx)[:, -1, :].argmax(-1, keepdim=True)
        idx = torch.cat((idx, nxt), dim=1)
        if sync and idx.device.type == "tpu":
            torchtpu_lab.sync()
    return idx


def programs() -> int:
    return int(telemetry.counters["compiles"] + telemetry.counters["disk_loads"])


def _case(row: str):
    """``(cpu model, run(model, n, device))`` for a row."""
    prompt = torch.randint(3, 53, (1, 7), generator=torch.Generator().manual_seed(1))
    if row.startswith("nanogpt"):
        torch.manual_seed(0)
        sync = row == "nanogpt"
        return NanoGPT(64).eval(), lambda m, n, device: nanogpt_generate(m, prompt.to(device), n, sync)
    from bench.generate_models import build

    family = {"llama": "llama (gqa)", "gpt2": "gpt2"}[row]

    def run(m, n, device):
        with torch.no_grad():
            return m.generate(prompt.to(device), max_new_tokens=n, do_sample=False, pad_token_id=1, use_cache=False)

    return build(family), run


def sweep(row: str, tokens: int, reps: int) -> tuple:
    cpu, run = _case(row)
    want = [run(cpu, n, "cpu") for n in (tokens, 2 * tokens)]
    tpu = copy.deepcopy(cpu).to("tpu")
    built, equal, t0 = [], True, time.perf_counter()
    for i, n in enumerate((tokens, 2 * tokens)):
        before = programs()
        equal = equal and torch.equal(run(tpu, n, "tpu").cpu(), want[i])
        built.append(programs() - before)
        first = time.perf_counter() - t0 if i == 0 else first
    times = {"tpu": [], "cpu": []}
    threads = torch.get_num_threads()
    for _ in range(reps):
        for device, model in (("tpu", tpu), ("cpu", cpu)):
            torch.set_num_threads(1 if device == "cpu" else threads)
            t = time.perf_counter()
            run(model, 2 * tokens, device).cpu()
            times[device].append((time.perf_counter() - t) * 1e3 / (2 * tokens))
    torch.set_num_threads(threads)
    tpu_ms, cpu_ms = statistics.median(times["tpu"]), statistics.median(times["cpu"])
    return (row, built[0], built[1], f"{first:.1f}", "yes" if equal else "NO", f"{tpu_ms:.2f}", f"{cpu_ms:.2f}",
            f"{tpu_ms / cpu_ms:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=20)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--rows", default="nanogpt,nanogpt-unsynced,llama,gpt2")
    args = parser.parse_args()
    rows = [sweep(row, args.tokens, args.reps) for row in args.rows.split(",")]
    print(table(f"whole-sequence generation loops, batch 1, greedy: programs by a {args.tokens}-token call, then by a "
                f"{2 * args.tokens}-token call; warm ms per token, medians of {args.reps}", rows,
                ("loop", "programs, first call", "programs, second call", "first call s", "tokens = cpu",
                 "tpu ms/token", "cpu ms/token", "tpu / cpu")))


if __name__ == "__main__":
    main()
