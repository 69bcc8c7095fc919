"""Generates notebooks/09_huggingface.ipynb."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import badge, code, install_cell, md, write  # noqa: E402

NAME = "09_huggingface.ipynb"

cells = [
    md(badge(NAME) + """

# Hugging Face on `tpu`: fine-tune, then generate with a static cache

A `transformers` model is a PyTorch module, so it moves to `tpu` like any other. This notebook

1. builds a small GPT-2 from a config (random weights: nothing to download),
2. fine-tunes it on `tpu` under `%%tpu_profile`, and checks that steady-state steps compile nothing,
3. generates text with a **static KV cache**, where the number of compiles stays flat as the number of new
   tokens grows, and with `generate`'s default *dynamic* cache, which on `tpu` compiles once per capacity
   bucket, not once per token — for a left-padded batch of prompts too.

With network access, `GPT2LMHeadModel.from_pretrained("gpt2")` (or any checkpoint) works the same way: load on
CPU, then `.to("tpu")`. The install cell adds the `hf` extra (`transformers`), pinning the torch you already have."""),
    code(install_cell(("hf",))),
    code("%load_ext torchtpu_lab"),
    md("""## A small GPT-2 from a config

Two layers, 64-wide, a 97-token vocabulary. `torch.manual_seed` seeds the initial weights."""),
    code("""import torch
import torchtpu_lab
from transformers import GPT2Config, GPT2LMHeadModel

config = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=97, n_positions=64,
                    bos_token_id=0, eos_token_id=0, pad_token_id=0)
torch.manual_seed(0)
model = GPT2LMHeadModel(config).to("tpu")
print(f"{sum(p.numel() for p in model.parameters()):,} parameters on {next(model.parameters()).device}")"""),
    md("""## Fine-tune

The training text is a fixed pattern of tokens (each token is the previous one plus 7, modulo 97), so the model
can learn it in a few dozen steps. `labels=input_ids` makes the model compute the next-token loss itself.
Each step ends with `torchtpu_lab.sync()` (the step boundary); the losses stay on the device until the end."""),
    code("""start = torch.randint(1, 97, (8, 1), generator=torch.Generator().manual_seed(1))
data = (start + 7 * torch.arange(24)) % 97                      # 8 sequences of 24 tokens
batch = data.to("tpu")
opt = torch.optim.AdamW(model.parameters(), lr=3e-3)

def train(steps):
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        opt.step()
        torchtpu_lab.sync()
        losses.append(loss.detach())
    return torch.tensor([l.item() for l in losses])            # already computed: reading them is a copy"""),
    code("""%%tpu_profile --top 3 --no-flame
losses = train(40)
print(f"loss: {losses[0]:.3f} -> {losses[-1]:.3f}")"""),
    md("""The first steps compiled the step's graph (and AdamW's first step, which creates its state). After that
every step reuses them: a second profile of more steps shows no compile at all."""),
    code("""%%tpu_profile --top 3 --no-flame
more = train(10)"""),
    code("""print("compiles in steady state:", _tpu_profile.summary()["compiles"])
print(f"loss now: {more[-1]:.3f}")"""),
    md("""## Generate with a static cache

A decode step needs the keys and values of every earlier token: the KV cache. `transformers`' default cache
grows by one token per step (`torch.cat`), so each step has new shapes (on the `tpu` device it lives in padded
storage, see below). A `StaticCache` is preallocated for `max_cache_len` tokens and written at the current position;
with the tokens written into a preallocated buffer too, each decode step has the same shapes whatever the
position. The position is a *value* (a graph input), not part of the program, so the step compiles once."""),
    code("""from transformers import StaticCache

model.eval()                                                   # no dropout while generating
prompt = data[:1, :6]                                          # the first 6 tokens of a training sequence

def decode(new_tokens, max_len=48):
    cache = StaticCache(config=config, max_cache_len=max_len)
    tokens = torch.zeros(1, max_len, dtype=torch.long, device="tpu")
    n = prompt.shape[1]
    tokens[:, :n] = prompt.to("tpu")
    position = torch.arange(n, device="tpu")
    with torch.no_grad():
        logits = model(tokens[:, :n], cache=cache, cache_position=position).logits
        position = position[-1:] + 1
        for i in range(n, n + new_tokens):
            tokens[:, i] = logits[:, -1].argmax(-1)            # write at a moving position
            logits = model(tokens[:, i:i + 1], cache=cache, cache_position=position).logits
            position = position + 1
            torchtpu_lab.sync()
    return tokens[0, :n + new_tokens].cpu()

from torchtpu_lab import telemetry

def programs():  # compiled by XLA now, or loaded from the disk cache an earlier session filled
    return telemetry.counters["compiles"] + telemetry.counters["disk_loads"]

compiles = {}
for new_tokens in (4, 8, 16):
    before = programs()
    out = decode(new_tokens)
    compiles[new_tokens] = int(programs() - before)
print("new compiles per run:", compiles)
print("generated:", out.tolist())
expected = ((prompt[0, 0] + 7 * torch.arange(len(out))) % 97).tolist()
print("follows the trained pattern:", out.tolist() == expected)"""),
    md("""Only the first run compiled (the prompt's step and the decode step); 8 and 16 tokens reuse them.

## `generate` itself

`model.generate` gives the same tokens. Its loop appends each new token to `input_ids` with `torch.cat`; on the
`tpu` device an append writes into spare capacity (the tensor keeps one padded shape, its length is a value),
so the loop's steps keep their shapes. The default *dynamic* cache grows its keys and values the same way, and
attention (`F.scaled_dot_product_attention`, the model's default) reads the whole padded cache with the length
as an input, masking the padding: one decode program per capacity bucket (capacity doubles), not one per token."""),
    code("""%%tpu_profile --top 3 --no-flame
generated = model.generate(prompt.to("tpu"), max_new_tokens=8, do_sample=False)"""),
    code("""print("same tokens as the static-cache loop:", generated[0].cpu().tolist() == out[:14].tolist())
print("grows-by-one recompiles:", sum("grows by one" in str(c.detail["cause"]) for c in _tpu_profile.compiles))
dynamic = {}
for new_tokens in (4, 8, 16):
    before = programs()
    generated = model.generate(prompt.to("tpu"), max_new_tokens=new_tokens, do_sample=False)
    dynamic[new_tokens] = int(programs() - before)
print("generate(dynamic cache), new compiles per call:", dynamic)
print("same tokens as the static-cache loop:", generated[0].cpu().tolist() == out.tolist())"""),
    md("""With `cache_implementation="static"` the cache is preallocated, and on a `tpu` device `transformers`
compiles the model's forward with `torch.compile(backend="tpu")` (its default for this device). A fixed
`max_cache_len` keeps the cache the same size whatever `max_new_tokens` asks for, so after the first call
nothing compiles again:"""),
    code("""def generate_static(new_tokens):
    before = programs()
    tokens = model.generate(prompt.to("tpu"), max_new_tokens=new_tokens, do_sample=False,
                            cache_implementation="static", max_cache_len=48)
    return int(programs() - before), tokens[0].cpu()

per_call = {}
for new_tokens in (4, 8, 16):
    per_call[new_tokens], tokens = generate_static(new_tokens)
print("generate(static cache), new compiles per call:", per_call)
print("same tokens as the static-cache loop:", tokens.tolist() == out.tolist())"""),
    md("""## A batch of prompts of different lengths

Prompts of different lengths share a batch left-padded, with an `attention_mask` saying which positions are
padding. `transformers` then rebuilds a 4-d attention mask from the grown length every token: a cast, a sum it
reads on the host, `arange(n)`, compares, a gather. On `tpu` each of those ops runs on the padded storage too,
with the length as a value, so a batched decode step is still one program per capacity bucket:"""),
    code("""cpu_model = GPT2LMHeadModel(config).eval()
cpu_model.load_state_dict({name: value.cpu() for name, value in model.state_dict().items()})
prompts = torch.stack([data[1, :6], torch.cat([torch.zeros(3, dtype=torch.long), data[2, :3]])])
mask = torch.ones_like(prompts)
mask[1, :3] = 0                                                # the second prompt is 3 tokens, left-padded

batched = {}
for new_tokens in (4, 8, 16):
    before = programs()
    tokens = model.generate(prompts.to("tpu"), attention_mask=mask.to("tpu"), max_new_tokens=new_tokens,
                            do_sample=False, pad_token_id=0)
    batched[new_tokens] = int(programs() - before)
print("batched generate, new compiles per call:", batched)
want = cpu_model.generate(prompts, attention_mask=mask, max_new_tokens=16, do_sample=False, pad_token_id=0)
print("same tokens as on the CPU:", torch.equal(tokens.cpu(), want))"""),
]

if __name__ == "__main__":
    print("wrote", write(NAME, cells))
